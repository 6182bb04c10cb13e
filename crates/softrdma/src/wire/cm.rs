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

/// ConnectRequest (IBTA 12.6.5).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Req {
    /// The sender's communication ID.
    pub local_comm_id: u32,
    /// The service the REQ is for (rdma_cm: port space and port).
    pub service_id: u64,
    /// The sender's CA GUID.
    pub local_ca_guid: u64,
    /// Local Q_Key (RD only).
    pub local_qkey: u32,
    /// The sender's QP number.
    pub local_qpn: u32,
    /// READs and atomics the sender accepts at once.
    pub responder_resources: u8,
    /// Local EE context (RD only).
    pub local_eecn: u32,
    /// READs and atomics the sender issues at once.
    pub initiator_depth: u8,
    /// Remote EE context (RD only).
    pub remote_eecn: u32,
    /// How long the receiver may take to answer (4.096 µs × 2^n).
    pub remote_cm_response_timeout: u8,
    /// Transport service type: 0 RC, 1 UC, 3 RD.
    pub transport: u8,
    /// End-to-end flow control.
    pub e2e_flow_control: bool,
    /// Starting PSN: the PSN the sender expects to receive first (the receiver sends from
    /// it; Linux's CM reads REQ and REP this way).
    pub starting_psn: u32,
    /// How long the sender takes to answer.
    pub local_cm_response_timeout: u8,
    /// Transport retry count.
    pub retry_count: u8,
    /// Partition key.
    pub pkey: u16,
    /// Path MTU (the IBTA encoding: 1 = 256 … 5 = 4096).
    pub path_mtu: u8,
    /// RD channel exists.
    pub rdc_exists: bool,
    /// RNR retry count.
    pub rnr_retry_count: u8,
    /// How often the CM retries (0–15).
    pub max_cm_retries: u8,
    /// The sender's QP uses an SRQ.
    pub srq: bool,
    /// Extended transport type.
    pub ext_transport: u8,
    /// The primary path.
    pub primary: CmPath,
    /// The alternate path (all zero when none).
    pub alternate: CmPath,
    /// Private data (92 bytes).
    pub private_data: Vec<u8>,
}

/// MessageReceiptAcknowledgement (IBTA 12.6.6): "your message arrived, answer is coming".
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Mra {
    /// The sender's communication ID.
    pub local_comm_id: u32,
    /// The receiver's communication ID.
    pub remote_comm_id: u32,
    /// The message acknowledged.
    pub message: MsgRef,
    /// How long the sender needs (4.096 µs × 2^n).
    pub service_timeout: u8,
    /// Private data (222 bytes).
    pub private_data: Vec<u8>,
}

/// ConnectReject (IBTA 12.6.7).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Rej {
    /// The sender's communication ID.
    pub local_comm_id: u32,
    /// The receiver's communication ID (0 when rejecting a REQ whose sender is unknown).
    pub remote_comm_id: u32,
    /// The message rejected.
    pub message: MsgRef,
    /// Length of the additional reject information.
    pub ari_len: u8,
    /// Reason ([`rej_reason`]).
    pub reason: u16,
    /// Additional reject information (72 bytes).
    pub ari: [u8; 72],
    /// Private data (148 bytes).
    pub private_data: Vec<u8>,
}

/// ConnectReply (IBTA 12.6.8).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Rep {
    /// The sender's communication ID.
    pub local_comm_id: u32,
    /// The receiver's communication ID.
    pub remote_comm_id: u32,
    /// Local Q_Key.
    pub local_qkey: u32,
    /// The sender's QP number.
    pub local_qpn: u32,
    /// Local EE context.
    pub local_eecn: u32,
    /// Starting PSN: the PSN the sender expects to receive first (the receiver sends from
    /// it; Linux's CM reads REQ and REP this way).
    pub starting_psn: u32,
    /// READs and atomics the sender accepts at once.
    pub responder_resources: u8,
    /// READs and atomics the sender issues at once.
    pub initiator_depth: u8,
    /// Target ACK delay (5 bits).
    pub target_ack_delay: u8,
    /// Failover accepted (2 bits).
    pub failover_accepted: u8,
    /// End-to-end flow control.
    pub e2e_flow_control: bool,
    /// RNR retry count (3 bits).
    pub rnr_retry_count: u8,
    /// The sender's QP uses an SRQ.
    pub srq: bool,
    /// The sender's CA GUID.
    pub local_ca_guid: u64,
    /// Private data (196 bytes).
    pub private_data: Vec<u8>,
}

/// ReadyToUse (12.6.9), DisconnectReply (12.6.11): two communication IDs and private data.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Ids {
    /// The sender's communication ID.
    pub local_comm_id: u32,
    /// The receiver's communication ID.
    pub remote_comm_id: u32,
    /// Private data (224 bytes).
    pub private_data: Vec<u8>,
}

/// DisconnectRequest (IBTA 12.6.10).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Dreq {
    /// The sender's communication ID.
    pub local_comm_id: u32,
    /// The receiver's communication ID.
    pub remote_comm_id: u32,
    /// The receiver's QP number.
    pub remote_qpn: u32,
    /// Private data (220 bytes).
    pub private_data: Vec<u8>,
}

/// ServiceIDResolutionRequest: which UD QP and Q_Key serve a service ID.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SidrReq {
    /// The requester's ID for this resolution (the reply carries it back).
    pub request_id: u32,
    /// Partition key.
    pub pkey: u16,
    /// The service asked for.
    pub service_id: u64,
    /// Private data (216 bytes).
    pub private_data: Vec<u8>,
}

/// ServiceIDResolutionResponse.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SidrRep {
    /// The request's ID.
    pub request_id: u32,
    /// [`sidr_status`].
    pub status: u8,
    /// Bytes of `info` that are valid.
    pub info_len: u8,
    /// The QP serving the service (status SUCCESS).
    pub qpn: u32,
    /// The service.
    pub service_id: u64,
    /// The Q_Key to send to it with.
    pub qkey: u32,
    /// Additional information (a ClassPortInfo for REDIRECT).
    pub info: [u8; 72],
    /// Private data (136 bytes).
    pub private_data: Vec<u8>,
}

/// A CM message.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum CmMessage {
    /// ConnectRequest.
    Req(Box<Req>),
    /// MessageReceiptAcknowledgement.
    Mra(Mra),
    /// ConnectReject.
    Rej(Box<Rej>),
    /// ConnectReply.
    Rep(Rep),
    /// ReadyToUse.
    Rtu(Ids),
    /// DisconnectRequest.
    Dreq(Dreq),
    /// DisconnectReply.
    Drep(Ids),
    /// ServiceIDResolutionRequest.
    SidrReq(Box<SidrReq>),
    /// ServiceIDResolutionResponse.
    SidrRep(Box<SidrRep>),
}

fn private(b: &[u8], id: u16) -> Vec<u8> {
    let info = attr_info(id).map_or(MAD_DATA_LEN, |i| i.private_at);
    b[info..].to_vec()
}

fn put_private(b: &mut [u8], at: usize, data: &[u8]) -> Result<()> {
    let room = b.len() - at;
    if data.len() > room {
        return Err(Error::FieldRange("private_data"));
    }
    b[at..at + data.len()].copy_from_slice(data);
    b[at + data.len()..].fill(0);
    Ok(())
}

impl CmMessage {
    /// The attribute ID this message travels under.
    pub fn attr_id(&self) -> u16 {
        match self {
            CmMessage::Req(_) => attr::REQ,
            CmMessage::Mra(_) => attr::MRA,
            CmMessage::Rej(_) => attr::REJ,
            CmMessage::Rep(_) => attr::REP,
            CmMessage::Rtu(_) => attr::RTU,
            CmMessage::Dreq(_) => attr::DREQ,
            CmMessage::Drep(_) => attr::DREP,
            CmMessage::SidrReq(_) => attr::SIDR_REQ,
            CmMessage::SidrRep(_) => attr::SIDR_REP,
        }
    }

    /// The sender's communication ID (a SIDR_REQ's request ID; 0 for a SIDR_REP).
    pub fn local_comm_id(&self) -> u32 {
        match self {
            CmMessage::SidrReq(m) => m.request_id,
            CmMessage::SidrRep(_) => 0,
            CmMessage::Req(m) => m.local_comm_id,
            CmMessage::Mra(m) => m.local_comm_id,
            CmMessage::Rej(m) => m.local_comm_id,
            CmMessage::Rep(m) => m.local_comm_id,
            CmMessage::Rtu(m) | CmMessage::Drep(m) => m.local_comm_id,
            CmMessage::Dreq(m) => m.local_comm_id,
        }
    }

    /// The receiver's communication ID (0 for a REQ or SIDR_REQ; a SIDR_REP's request ID).
    pub fn remote_comm_id(&self) -> u32 {
        match self {
            CmMessage::Req(_) | CmMessage::SidrReq(_) => 0,
            CmMessage::SidrRep(m) => m.request_id,
            CmMessage::Mra(m) => m.remote_comm_id,
            CmMessage::Rej(m) => m.remote_comm_id,
            CmMessage::Rep(m) => m.remote_comm_id,
            CmMessage::Rtu(m) | CmMessage::Drep(m) => m.remote_comm_id,
            CmMessage::Dreq(m) => m.remote_comm_id,
        }
    }

    /// Parse the class data `b` (at least 232 bytes) of attribute `id`.
    pub fn parse(id: u16, b: &[u8]) -> Result<CmMessage> {
        if b.len() < MAD_DATA_LEN {
            return Err(Error::Truncated {
                what: "CM message",
                need: MAD_DATA_LEN,
                have: b.len(),
            });
        }
        let b = &b[..MAD_DATA_LEN];
        let ids = (get_u32(b, 0..4), get_u32(b, 4..8));
        Ok(match id {
            attr::REQ => CmMessage::Req(Box::new(Req {
                local_comm_id: ids.0,
                service_id: get_u64(b, 8..16),
                local_ca_guid: get_u64(b, 16..24),
                local_qkey: get_u32(b, 28..32),
                local_qpn: get_u24(b, 32..35),
                responder_resources: b[35],
                local_eecn: get_u24(b, 36..39),
                initiator_depth: b[39],
                remote_eecn: get_u24(b, 40..43),
                remote_cm_response_timeout: b[43] >> 3,
                transport: (b[43] >> 1) & 3,
                e2e_flow_control: b[43] & 1 != 0,
                starting_psn: get_u24(b, 44..47),
                local_cm_response_timeout: b[47] >> 3,
                retry_count: b[47] & 7,
                pkey: get_u16(b, 48..50),
                path_mtu: b[50] >> 4,
                rdc_exists: b[50] & 8 != 0,
                rnr_retry_count: b[50] & 7,
                max_cm_retries: b[51] >> 4,
                srq: b[51] & 8 != 0,
                ext_transport: b[51] & 7,
                primary: CmPath::parse(&b[52..52 + CmPath::LEN]),
                alternate: CmPath::parse(&b[96..96 + CmPath::LEN]),
                private_data: private(b, id),
            })),
            attr::MRA => CmMessage::Mra(Mra {
                local_comm_id: ids.0,
                remote_comm_id: ids.1,
                message: MsgRef::from_bits(b[8] >> 6)?,
                service_timeout: b[9] >> 3,
                private_data: private(b, id),
            }),
            attr::REJ => {
                let mut ari = [0u8; 72];
                ari.copy_from_slice(&b[12..84]);
                let ari_len = b[9] >> 1;
                if usize::from(ari_len) > ari.len() {
                    return Err(Error::BadMad("REJ ARI length"));
                }
                CmMessage::Rej(Box::new(Rej {
                    local_comm_id: ids.0,
                    remote_comm_id: ids.1,
                    message: MsgRef::from_bits(b[8] >> 6)?,
                    ari_len,
                    reason: get_u16(b, 10..12),
                    ari,
                    private_data: private(b, id),
                }))
            }
            attr::REP => CmMessage::Rep(Rep {
                local_comm_id: ids.0,
                remote_comm_id: ids.1,
                local_qkey: get_u32(b, 8..12),
                local_qpn: get_u24(b, 12..15),
                local_eecn: get_u24(b, 16..19),
                starting_psn: get_u24(b, 20..23),
                responder_resources: b[24],
                initiator_depth: b[25],
                target_ack_delay: b[26] >> 3,
                failover_accepted: (b[26] >> 1) & 3,
                e2e_flow_control: b[26] & 1 != 0,
                rnr_retry_count: b[27] >> 5,
                srq: b[27] & 0x10 != 0,
                local_ca_guid: get_u64(b, 28..36),
                private_data: private(b, id),
            }),
            attr::RTU | attr::DREP => {
                let m = Ids {
                    local_comm_id: ids.0,
                    remote_comm_id: ids.1,
                    private_data: private(b, id),
                };
                if id == attr::RTU {
                    CmMessage::Rtu(m)
                } else {
                    CmMessage::Drep(m)
                }
            }
            attr::DREQ => CmMessage::Dreq(Dreq {
                local_comm_id: ids.0,
                remote_comm_id: ids.1,
                remote_qpn: get_u24(b, 8..11),
                private_data: private(b, id),
            }),
            attr::SIDR_REQ => CmMessage::SidrReq(Box::new(SidrReq {
                request_id: ids.0,
                pkey: get_u16(b, 4..6),
                service_id: get_u64(b, 8..16),
                private_data: private(b, id),
            })),
            attr::SIDR_REP => {
                let info_len = b[5];
                if usize::from(info_len) > 72 {
                    return Err(Error::BadMad("SIDR_REP info length"));
                }
                let mut info = [0u8; 72];
                info.copy_from_slice(&b[24..96]);
                CmMessage::SidrRep(Box::new(SidrRep {
                    request_id: ids.0,
                    status: b[4],
                    info_len,
                    qpn: get_u24(b, 8..11),
                    service_id: get_u64(b, 12..20),
                    qkey: get_u32(b, 20..24),
                    info,
                    private_data: private(b, id),
                }))
            }
            _ => return Err(Error::BadMad("unsupported CM attribute")),
        })
    }

    /// Emit into the class data `b` (at least 232 bytes): every byte of the 232 is written.
    pub fn emit(&self, b: &mut [u8]) -> Result<()> {
        if b.len() < MAD_DATA_LEN {
            return Err(Error::BufferTooSmall {
                need: MAD_DATA_LEN,
                have: b.len(),
            });
        }
        let b = &mut b[..MAD_DATA_LEN];
        b.fill(0);
        let at = attr_info(self.attr_id()).map_or(MAD_DATA_LEN, |i| i.private_at);
        match self {
            CmMessage::SidrReq(m) => {
                set_u32(b, 0..4, m.request_id);
                set_u16(b, 4..6, m.pkey);
                set_u64(b, 8..16, m.service_id);
                return put_private(b, at, &m.private_data);
            }
            CmMessage::SidrRep(m) => {
                if usize::from(m.info_len) > m.info.len() {
                    return Err(Error::FieldRange("info_len"));
                }
                set_u32(b, 0..4, m.request_id);
                b[4] = m.status;
                b[5] = m.info_len;
                set_u24(b, 8..11, u24(m.qpn, "qpn")?);
                set_u64(b, 12..20, m.service_id);
                set_u32(b, 20..24, m.qkey);
                b[24..96].copy_from_slice(&m.info);
                return put_private(b, at, &m.private_data);
            }
            _ => {}
        }
        set_u32(b, 0..4, self.local_comm_id());
        set_u32(b, 4..8, self.remote_comm_id());
        match self {
            CmMessage::Req(m) => {
                set_u64(b, 8..16, m.service_id);
                set_u64(b, 16..24, m.local_ca_guid);
                set_u32(b, 28..32, m.local_qkey);
                set_u24(b, 32..35, u24(m.local_qpn, "local_qpn")?);
                b[35] = m.responder_resources;
                set_u24(b, 36..39, u24(m.local_eecn, "local_eecn")?);
                b[39] = m.initiator_depth;
                set_u24(b, 40..43, u24(m.remote_eecn, "remote_eecn")?);
                b[43] = (bits(
                    m.remote_cm_response_timeout,
                    5,
                    "remote_cm_response_timeout",
                )? << 3)
                    | (bits(m.transport, 2, "transport")? << 1)
                    | u8::from(m.e2e_flow_control);
                set_u24(b, 44..47, u24(m.starting_psn, "starting_psn")?);
                b[47] = (bits(m.local_cm_response_timeout, 5, "local_cm_response_timeout")? << 3)
                    | bits(m.retry_count, 3, "retry_count")?;
                set_u16(b, 48..50, m.pkey);
                b[50] = (bits(m.path_mtu, 4, "path_mtu")? << 4)
                    | (u8::from(m.rdc_exists) << 3)
                    | bits(m.rnr_retry_count, 3, "rnr_retry_count")?;
                b[51] = (bits(m.max_cm_retries, 4, "max_cm_retries")? << 4)
                    | (u8::from(m.srq) << 3)
                    | bits(m.ext_transport, 3, "ext_transport")?;
                m.primary.emit(&mut b[52..52 + CmPath::LEN])?;
                m.alternate.emit(&mut b[96..96 + CmPath::LEN])?;
                put_private(b, at, &m.private_data)
            }
            CmMessage::Mra(m) => {
                b[8] = m.message.bits() << 6;
                b[9] = bits(m.service_timeout, 5, "service_timeout")? << 3;
                put_private(b, at, &m.private_data)
            }
            CmMessage::Rej(m) => {
                b[8] = m.message.bits() << 6;
                b[9] = bits(m.ari_len, 7, "ari_len")? << 1;
                if usize::from(m.ari_len) > m.ari.len() {
                    return Err(Error::FieldRange("ari_len"));
                }
                set_u16(b, 10..12, m.reason);
                b[12..84].copy_from_slice(&m.ari);
                put_private(b, at, &m.private_data)
            }
            CmMessage::Rep(m) => {
                set_u32(b, 8..12, m.local_qkey);
                set_u24(b, 12..15, u24(m.local_qpn, "local_qpn")?);
                set_u24(b, 16..19, u24(m.local_eecn, "local_eecn")?);
                set_u24(b, 20..23, u24(m.starting_psn, "starting_psn")?);
                b[24] = m.responder_resources;
                b[25] = m.initiator_depth;
                b[26] = (bits(m.target_ack_delay, 5, "target_ack_delay")? << 3)
                    | (bits(m.failover_accepted, 2, "failover_accepted")? << 1)
                    | u8::from(m.e2e_flow_control);
                b[27] =
                    (bits(m.rnr_retry_count, 3, "rnr_retry_count")? << 5) | (u8::from(m.srq) << 4);
                set_u64(b, 28..36, m.local_ca_guid);
                put_private(b, at, &m.private_data)
            }
            CmMessage::Rtu(m) | CmMessage::Drep(m) => put_private(b, at, &m.private_data),
            CmMessage::Dreq(m) => {
                set_u24(b, 8..11, u24(m.remote_qpn, "remote_qpn")?);
                put_private(b, at, &m.private_data)
            }
            CmMessage::SidrReq(_) | CmMessage::SidrRep(_) => Ok(()),
        }
    }
}

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
mod tests {
    use super::*;

    fn req() -> Req {
        Req {
            local_comm_id: 0x58e5_4a84,
            service_id: 0x0106_485d,
            local_ca_guid: 0x5054_00ff_fe77_0003,
            local_qkey: 0,
            local_qpn: 0x26,
            responder_resources: 1,
            local_eecn: 0,
            initiator_depth: 1,
            remote_eecn: 0,
            remote_cm_response_timeout: 20,
            transport: 0,
            e2e_flow_control: false,
            starting_psn: 0x07948e,
            local_cm_response_timeout: 20,
            retry_count: 7,
            pkey: 0xffff,
            path_mtu: 3,
            rdc_exists: false,
            rnr_retry_count: 7,
            max_cm_retries: 15,
            srq: false,
            ext_transport: 0,
            primary: CmPath {
                local_lid: 0xffff,
                remote_lid: 0xffff,
                flow_label: 0x6b3,
                packet_rate: 0x2b,
                hop_limit: 64,
                local_ack_timeout: 19,
                ..CmPath::default()
            },
            alternate: CmPath::default(),
            private_data: vec![7; 92],
        }
    }

    #[test]
    fn every_message_round_trips() {
        let msgs = [
            CmMessage::Req(Box::new(req())),
            CmMessage::Mra(Mra {
                local_comm_id: 1,
                remote_comm_id: 2,
                message: MsgRef::Rep,
                service_timeout: 31,
                private_data: vec![1; 222],
            }),
            CmMessage::Rej(Box::new(Rej {
                local_comm_id: 3,
                remote_comm_id: 4,
                message: MsgRef::Req,
                ari_len: 0,
                reason: rej_reason::CONSUMER_DEFINED,
                ari: [0; 72],
                private_data: vec![2; 148],
            })),
            CmMessage::Rep(Rep {
                local_comm_id: 5,
                remote_comm_id: 6,
                local_qkey: 0,
                local_qpn: 0xabcdef,
                local_eecn: 0,
                starting_psn: 0x123456,
                responder_resources: 16,
                initiator_depth: 16,
                target_ack_delay: 15,
                failover_accepted: 3,
                e2e_flow_control: true,
                rnr_retry_count: 7,
                srq: true,
                local_ca_guid: 42,
                private_data: vec![3; 196],
            }),
            CmMessage::Rtu(Ids {
                local_comm_id: 7,
                remote_comm_id: 8,
                private_data: vec![4; 224],
            }),
            CmMessage::Dreq(Dreq {
                local_comm_id: 9,
                remote_comm_id: 10,
                remote_qpn: 0x26,
                private_data: vec![5; 220],
            }),
            CmMessage::Drep(Ids {
                local_comm_id: 11,
                remote_comm_id: 12,
                private_data: vec![6; 224],
            }),
            CmMessage::SidrReq(Box::new(SidrReq {
                request_id: 13,
                pkey: 0xffff,
                service_id: 0x0000_0000_0111_4a2b,
                private_data: vec![7; 216],
            })),
            CmMessage::SidrRep(Box::new(SidrRep {
                request_id: 14,
                status: sidr_status::SUCCESS,
                info_len: 72,
                qpn: 0xfedcba,
                service_id: 0x0000_0000_0111_4a2b,
                qkey: 0x0123_4567,
                info: [8; 72],
                private_data: vec![9; 136],
            })),
        ];
        for m in msgs {
            let mut b = [0xaau8; MAD_DATA_LEN];
            m.emit(&mut b).unwrap();
            let info = attr_info(m.attr_id()).unwrap();
            assert!(info.supported, "{}", info.name);
            assert_eq!(
                CmMessage::parse(m.attr_id(), &b).unwrap(),
                m,
                "{}",
                info.name
            );
        }
    }

    #[test]
    fn short_private_data_is_padded_and_long_refused() {
        let mut m = req();
        m.private_data = vec![9; 3];
        let mut b = [0xaau8; MAD_DATA_LEN];
        CmMessage::Req(Box::new(m.clone())).emit(&mut b).unwrap();
        assert_eq!(&b[140..143], &[9, 9, 9]);
        assert!(b[143..].iter().all(|&x| x == 0));
        m.private_data = vec![9; 93];
        assert_eq!(
            CmMessage::Req(Box::new(m)).emit(&mut b),
            Err(Error::FieldRange("private_data"))
        );
    }

    #[test]
    fn out_of_range_fields_and_bad_input_are_refused() {
        let mut m = req();
        m.local_qpn = 1 << 24;
        let mut b = [0u8; MAD_DATA_LEN];
        assert_eq!(
            CmMessage::Req(Box::new(m)).emit(&mut b),
            Err(Error::FieldRange("local_qpn"))
        );
        assert!(matches!(
            CmMessage::parse(attr::REQ, &b[..231]),
            Err(Error::Truncated { .. })
        ));
        assert_eq!(
            CmMessage::parse(attr::LAP, &b),
            Err(Error::BadMad("unsupported CM attribute"))
        );
        // A SIDR_REP whose info length is past the info.
        b[5] = 73;
        assert_eq!(
            CmMessage::parse(attr::SIDR_REP, &b),
            Err(Error::BadMad("SIDR_REP info length"))
        );
        b[5] = 0;
        b[8] = 3 << 6;
        assert_eq!(
            CmMessage::parse(attr::MRA, &b),
            Err(Error::BadMad("message reference"))
        );
        // A REJ whose ARI length is past the ARI.
        b[8] = 0;
        b[9] = 73 << 1;
        assert_eq!(
            CmMessage::parse(attr::REJ, &b),
            Err(Error::BadMad("REJ ARI length"))
        );
    }

    #[test]
    fn the_table_covers_the_class_data() {
        for a in ATTRS {
            assert_eq!(a.private_at + a.private_len, MAD_DATA_LEN, "{}", a.name);
        }
        assert!(ATTRS.windows(2).all(|w| w[0].id < w[1].id));
    }
}
