//! The Communication Manager's messages (IBTA 12.6, 12.11): REQ, MRA, REJ, REP, RTU, DREQ,
//! DREP and the service ID resolution pair SIDR_REQ/SIDR_REP (rdma_cm's UDP port space), the
//! class data of CM MADs (management class 0x07, method Send).
//!
//! [`CmMessage::parse`] takes the 232 bytes after the MAD header and the attribute ID;
//! [`CmMessage::emit`] writes them back, reserved bits zero. Private data is always the whole
//! area the message has for it (the CM does not carry its length), so a parsed message hands
//! it over in full and an emitted one is padded with zeros. The one table [`ATTRS`] names every
//! attribute, its length of private data and where it starts.

use super::mad::{
    CLASS_CM, CM_CLASS_VERSION, MAD_DATA_LEN, MAD_HEADER_LEN, MAD_LEN, MadHeader, MadHeaderRepr,
    method,
};
use super::{
    Error, Result, get_u16, get_u24, get_u32, get_u64, set_u16, set_u24, set_u32, set_u64,
};

/// CM attribute IDs (IBTA table 12.6.1).
pub mod attr {
    /// ClassPortInfo.
    pub const CLASS_PORT_INFO: u16 = 0x0001;
    /// ConnectRequest.
    pub const REQ: u16 = 0x0010;
    /// MessageReceiptAcknowledgement.
    pub const MRA: u16 = 0x0011;
    /// ConnectReject.
    pub const REJ: u16 = 0x0012;
    /// ConnectReply.
    pub const REP: u16 = 0x0013;
    /// ReadyToUse.
    pub const RTU: u16 = 0x0014;
    /// DisconnectRequest.
    pub const DREQ: u16 = 0x0015;
    /// DisconnectReply.
    pub const DREP: u16 = 0x0016;
    /// ServiceIDResolutionRequest.
    pub const SIDR_REQ: u16 = 0x0017;
    /// ServiceIDResolutionResponse.
    pub const SIDR_REP: u16 = 0x0018;
    /// LoadAlternatePath.
    pub const LAP: u16 = 0x0019;
    /// AlternatePathResponse.
    pub const APR: u16 = 0x001a;
}

/// One CM attribute: its name and where its private data lies in the class data.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AttrInfo {
    /// Attribute ID.
    pub id: u16,
    /// The name Wireshark and the specification use.
    pub name: &'static str,
    /// Offset of the private data in the class data.
    pub private_at: usize,
    /// Length of the private data.
    pub private_len: usize,
    /// softrdma's CM parses and emits it.
    pub supported: bool,
}

const fn a(id: u16, name: &'static str, at: usize, supported: bool) -> AttrInfo {
    AttrInfo {
        id,
        name,
        private_at: at,
        private_len: MAD_DATA_LEN - at,
        supported,
    }
}

/// Every CM attribute, in ID order.
pub const ATTRS: [AttrInfo; 11] = [
    AttrInfo {
        id: attr::CLASS_PORT_INFO,
        name: "ClassPortInfo",
        private_at: MAD_DATA_LEN,
        private_len: 0,
        supported: false,
    },
    a(attr::REQ, "ConnectRequest", 140, true),
    a(attr::MRA, "MsgRcptAck", 10, true),
    a(attr::REJ, "ConnectReject", 84, true),
    a(attr::REP, "ConnectReply", 36, true),
    a(attr::RTU, "ReadyToUse", 8, true),
    a(attr::DREQ, "DisconnectRequest", 12, true),
    a(attr::DREP, "DisconnectReply", 8, true),
    a(attr::SIDR_REQ, "ServiceIDResReq", 16, true),
    a(attr::SIDR_REP, "ServiceIDResReqResp", 96, true),
    a(attr::LAP, "LoadAlternatePath", 136, false),
];

/// The table entry of attribute `id`.
pub fn attr_info(id: u16) -> Option<&'static AttrInfo> {
    ATTRS.iter().find(|a| a.id == id)
}

/// The message a REJ or MRA refers to (IBTA 12.6.7, 12.6.6).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MsgRef {
    /// The REQ.
    Req,
    /// The REP.
    Rep,
    /// Another message (LAP).
    Other,
}

impl MsgRef {
    fn from_bits(b: u8) -> Result<MsgRef> {
        match b {
            0 => Ok(MsgRef::Req),
            1 => Ok(MsgRef::Rep),
            2 => Ok(MsgRef::Other),
            _ => Err(Error::BadMad("message reference")),
        }
    }
    fn bits(self) -> u8 {
        match self {
            MsgRef::Req => 0,
            MsgRef::Rep => 1,
            MsgRef::Other => 2,
        }
    }
}

/// REJ reasons (IBTA table 12.6.7.2) that softrdma sends or tells apart.
pub mod rej_reason {
    /// No QP available.
    pub const NO_QP: u16 = 1;
    /// No resources.
    pub const NO_RESOURCES: u16 = 3;
    /// Timeout (the REJ a CM sends when its own REQ or REP ran out of retries).
    pub const TIMEOUT: u16 = 4;
    /// Unsupported request.
    pub const UNSUPPORTED: u16 = 5;
    /// Invalid communication ID.
    pub const INVALID_COMM_ID: u16 = 6;
    /// Invalid communication instance.
    pub const INVALID_COMM_INSTANCE: u16 = 7;
    /// Invalid service ID: nobody listens on it.
    pub const INVALID_SERVICE_ID: u16 = 8;
    /// Invalid transport service type.
    pub const INVALID_TRANSPORT_TYPE: u16 = 9;
    /// Stale connection.
    pub const STALE_CONN: u16 = 10;
    /// Invalid GID.
    pub const INVALID_GID: u16 = 12;
    /// Invalid MTU.
    pub const INVALID_MTU: u16 = 26;
    /// Consumer defined: the application rejected, with private data.
    pub const CONSUMER_DEFINED: u16 = 28;
    /// Invalid class version.
    pub const INVALID_CLASS_VERSION: u16 = 31;
}

/// SIDR_REP status values (IBTA table 12.11.2).
pub mod sidr_status {
    /// The QP and Q_Key are valid.
    pub const SUCCESS: u8 = 0;
    /// Nobody serves the service ID.
    pub const SID_NOT_SUPPORTED: u8 = 1;
    /// The service provider refused.
    pub const REJECT: u8 = 2;
    /// No QP available.
    pub const NO_QP: u8 = 3;
    /// Ask elsewhere (the additional information says where).
    pub const REDIRECT: u8 = 4;
    /// The class version is not supported.
    pub const UNSUPPORTED_VERSION: u8 = 5;
}

/// One path of a REQ (primary or alternate; IBTA 12.6.5).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CmPath {
    /// Local port LID (0xffff on RoCE).
    pub local_lid: u16,
    /// Remote port LID.
    pub remote_lid: u16,
    /// Local port GID.
    pub local_gid: [u8; 16],
    /// Remote port GID.
    pub remote_gid: [u8; 16],
    /// Flow label (20 bits).
    pub flow_label: u32,
    /// Packet rate (6 bits).
    pub packet_rate: u8,
    /// Traffic class.
    pub traffic_class: u8,
    /// Hop limit.
    pub hop_limit: u8,
    /// Service level (4 bits).
    pub sl: u8,
    /// Subnet local.
    pub subnet_local: bool,
    /// Local ACK timeout (5 bits).
    pub local_ack_timeout: u8,
}

impl CmPath {
    const LEN: usize = 44;

    fn parse(b: &[u8]) -> CmPath {
        let w = get_u32(b, 36..40);
        CmPath {
            local_lid: get_u16(b, 0..2),
            remote_lid: get_u16(b, 2..4),
            local_gid: gid(b, 4),
            remote_gid: gid(b, 20),
            flow_label: w >> 12,
            packet_rate: (w & 0x3f) as u8,
            traffic_class: b[40],
            hop_limit: b[41],
            sl: b[42] >> 4,
            subnet_local: b[42] & 0x08 != 0,
            local_ack_timeout: b[43] >> 3,
        }
    }

    fn emit(&self, b: &mut [u8]) -> Result<()> {
        if self.flow_label > 0xf_ffff {
            return Err(Error::FieldRange("flow_label"));
        }
        set_u16(b, 0..2, self.local_lid);
        set_u16(b, 2..4, self.remote_lid);
        b[4..20].copy_from_slice(&self.local_gid);
        b[20..36].copy_from_slice(&self.remote_gid);
        set_u32(
            b,
            36..40,
            (self.flow_label << 12) | u32::from(bits(self.packet_rate, 6, "packet_rate")?),
        );
        b[40] = self.traffic_class;
        b[41] = self.hop_limit;
        b[42] = (bits(self.sl, 4, "sl")? << 4) | (u8::from(self.subnet_local) << 3);
        b[43] = bits(self.local_ack_timeout, 5, "local_ack_timeout")? << 3;
        Ok(())
    }
}

fn gid(b: &[u8], at: usize) -> [u8; 16] {
    let mut g = [0u8; 16];
    g.copy_from_slice(&b[at..at + 16]);
    g
}

/// `v` if it fits in `n` bits.
fn bits(v: u8, n: u32, what: &'static str) -> Result<u8> {
    if u32::from(v) >> n != 0 {
        return Err(Error::FieldRange(what));
    }
    Ok(v)
}

fn u24(v: u32, what: &'static str) -> Result<u32> {
    if v > 0x00ff_ffff {
        return Err(Error::FieldRange(what));
    }
    Ok(v)
}

mod message;

pub use message::{CmMessage, Dreq, Ids, Mra, Rej, Rep, Req, SidrRep, SidrReq};

/// A whole CM MAD: the transaction ID of its header and the message.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CmMad {
    /// Transaction ID (a response carries its request's).
    pub tid: u64,
    /// The message.
    pub msg: CmMessage,
}

impl CmMad {
    /// Parse a UD payload: a 256-byte MAD of the CM class, version 2, method Send (longer
    /// payloads are cut to 256 bytes, as a GSI does).
    pub fn parse(b: &[u8]) -> Result<CmMad> {
        if b.len() < MAD_LEN {
            return Err(Error::Truncated {
                what: "MAD",
                need: MAD_LEN,
                have: b.len(),
            });
        }
        let h = MadHeaderRepr::parse(&MadHeader::new_checked(b)?)?;
        if h.mgmt_class != CLASS_CM {
            return Err(Error::BadMad("management class"));
        }
        if h.class_version != CM_CLASS_VERSION {
            return Err(Error::BadMad("CM class version"));
        }
        if h.method != method::SEND {
            return Err(Error::BadMad("CM method"));
        }
        let msg = CmMessage::parse(h.attr_id, &b[MAD_HEADER_LEN..MAD_LEN])?;
        Ok(CmMad { tid: h.tid, msg })
    }

    /// Emit the 256-byte MAD into `b`; returns 256.
    pub fn emit(&self, b: &mut [u8]) -> Result<usize> {
        if b.len() < MAD_LEN {
            return Err(Error::BufferTooSmall {
                need: MAD_LEN,
                have: b.len(),
            });
        }
        MadHeaderRepr {
            mgmt_class: CLASS_CM,
            class_version: CM_CLASS_VERSION,
            method: method::SEND,
            status: 0,
            class_specific: 0,
            tid: self.tid,
            attr_id: self.msg.attr_id(),
            attr_mod: 0,
        }
        .emit(&mut MadHeader::new_unchecked(&mut b[..MAD_HEADER_LEN]));
        self.msg.emit(&mut b[MAD_HEADER_LEN..MAD_LEN])?;
        Ok(MAD_LEN)
    }
}

#[cfg(test)]
mod tests;
