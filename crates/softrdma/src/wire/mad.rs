//! Management datagrams (IBTA 13.4): the 256-byte messages general services such as the
//! Communication Manager exchange in UD datagrams to and from QP1 (the GSI).
//!
//! A MAD is a 24-byte common header and 232 bytes of class data; it is always the whole UD
//! payload. This module has the header; [`super::cm`] the Communication Manager's messages.

use super::{Error, Result, get_u16, get_u32, get_u64, header_view, set_u16, set_u32, set_u64};

/// Length of every MAD in a UD payload.
pub const MAD_LEN: usize = 256;
/// Length of the common MAD header.
pub const MAD_HEADER_LEN: usize = 24;
/// Length of the class data after the header.
pub const MAD_DATA_LEN: usize = MAD_LEN - MAD_HEADER_LEN;
/// The QP number of the General Services Interface.
pub const GSI_QPN: u32 = 1;
/// The Q_Key of QP1 (IBTA 10.2.5; the high bit makes it a controlled key).
pub const GSI_QKEY: u32 = 0x8001_0000;
/// The management base version.
pub const BASE_VERSION: u8 = 1;
/// The management class of the Communication Manager.
pub const CLASS_CM: u8 = 0x07;
/// The CM class version Linux speaks.
pub const CM_CLASS_VERSION: u8 = 2;

/// MAD methods (IBTA 13.4.5).
pub mod method {
    /// Get (a request for an attribute).
    pub const GET: u8 = 0x01;
    /// Set.
    pub const SET: u8 = 0x02;
    /// Send: the CM's messages are all Sends.
    pub const SEND: u8 = 0x03;
    /// The response bit, set on GetResp (0x81).
    pub const RESPONSE: u8 = 0x80;
    /// GetResp.
    pub const GET_RESP: u8 = GET | RESPONSE;
}

/// MAD status bits (IBTA 13.4.7).
pub mod status {
    /// The class version is not supported.
    pub const BAD_VERSION: u16 = 0x0004;
    /// The method is not supported by the class.
    pub const METHOD_UNSUPPORTED: u16 = 0x0008;
    /// The method/attribute combination is not supported.
    pub const METHOD_ATTR_UNSUPPORTED: u16 = 0x000c;
}

mod field {
    use crate::wire::Field;
    pub const BASE_VERSION: usize = 0;
    pub const MGMT_CLASS: usize = 1;
    pub const CLASS_VERSION: usize = 2;
    pub const METHOD: usize = 3;
    pub const STATUS: Field = 4..6;
    pub const CLASS_SPECIFIC: Field = 6..8;
    pub const TID: Field = 8..16;
    pub const ATTR_ID: Field = 16..18;
    pub const RESERVED: Field = 18..20;
    pub const ATTR_MOD: Field = 20..24;
}

header_view!(
    /// A view of a MAD's common header.
    MadHeader, MAD_HEADER_LEN, "MAD header"
);

impl<T: AsRef<[u8]>> MadHeader<T> {
    /// Base version (1).
    pub fn base_version(&self) -> u8 {
        self.buffer.as_ref()[field::BASE_VERSION]
    }
    /// Management class.
    pub fn mgmt_class(&self) -> u8 {
        self.buffer.as_ref()[field::MGMT_CLASS]
    }
    /// Class version.
    pub fn class_version(&self) -> u8 {
        self.buffer.as_ref()[field::CLASS_VERSION]
    }
    /// Method (with the response bit).
    pub fn method(&self) -> u8 {
        self.buffer.as_ref()[field::METHOD]
    }
    /// Status.
    pub fn status(&self) -> u16 {
        get_u16(self.buffer.as_ref(), field::STATUS)
    }
    /// Class-specific word.
    pub fn class_specific(&self) -> u16 {
        get_u16(self.buffer.as_ref(), field::CLASS_SPECIFIC)
    }
    /// Transaction ID.
    pub fn tid(&self) -> u64 {
        get_u64(self.buffer.as_ref(), field::TID)
    }
    /// Attribute ID.
    pub fn attr_id(&self) -> u16 {
        get_u16(self.buffer.as_ref(), field::ATTR_ID)
    }
    /// Attribute modifier.
    pub fn attr_mod(&self) -> u32 {
        get_u32(self.buffer.as_ref(), field::ATTR_MOD)
    }
}

/// A MAD's common header as plain values.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MadHeaderRepr {
    /// Management class.
    pub mgmt_class: u8,
    /// Class version.
    pub class_version: u8,
    /// Method (with the response bit).
    pub method: u8,
    /// Status.
    pub status: u16,
    /// Class-specific word.
    pub class_specific: u16,
    /// Transaction ID.
    pub tid: u64,
    /// Attribute ID.
    pub attr_id: u16,
    /// Attribute modifier.
    pub attr_mod: u32,
}

impl MadHeaderRepr {
    /// Parse; the base version must be 1 (other fields are the class's to judge).
    pub fn parse<T: AsRef<[u8]>>(h: &MadHeader<T>) -> Result<MadHeaderRepr> {
        if h.base_version() != BASE_VERSION {
            return Err(Error::BadMad("base version"));
        }
        Ok(MadHeaderRepr {
            mgmt_class: h.mgmt_class(),
            class_version: h.class_version(),
            method: h.method(),
            status: h.status(),
            class_specific: h.class_specific(),
            tid: h.tid(),
            attr_id: h.attr_id(),
            attr_mod: h.attr_mod(),
        })
    }

    /// Emit (reserved bytes zeroed).
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, h: &mut MadHeader<T>) {
        let b = h.buffer.as_mut();
        b[field::BASE_VERSION] = BASE_VERSION;
        b[field::MGMT_CLASS] = self.mgmt_class;
        b[field::CLASS_VERSION] = self.class_version;
        b[field::METHOD] = self.method;
        set_u16(b, field::STATUS, self.status);
        set_u16(b, field::CLASS_SPECIFIC, self.class_specific);
        set_u64(b, field::TID, self.tid);
        set_u16(b, field::ATTR_ID, self.attr_id);
        set_u16(b, field::RESERVED, 0);
        set_u32(b, field::ATTR_MOD, self.attr_mod);
    }
}

/// The subnet management classes (LID-routed and directed-route): QP0's, never QP1's.
const SMP_CLASSES: [u8; 2] = [0x01, 0x81];

/// What Linux's MAD layer answers to a request nobody on QP1 takes: a Get or Set comes back
/// whole as a GetResp with status "unsupported method/attribute combination" (a
/// ClassPortInfo Get to the CM is one: Linux's CM takes only Send). `None` for anything else
/// (responses, Sends, subnet management MADs, other base versions, short MADs): dropped.
pub fn unmatched_response(req: &[u8]) -> Option<[u8; MAD_LEN]> {
    let b: &[u8; MAD_LEN] = req.get(..MAD_LEN)?.try_into().ok()?;
    let h = MadHeaderRepr::parse(&MadHeader::new_checked(&b[..]).ok()?).ok()?;
    if !(h.method == method::GET || h.method == method::SET) || SMP_CLASSES.contains(&h.mgmt_class)
    {
        return None;
    }
    let mut out = *b;
    out[field::METHOD] = method::GET_RESP;
    set_u16(&mut out, field::STATUS, status::METHOD_ATTR_UNSUPPORTED);
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn header_round_trips_and_refuses_other_base_versions() {
        let r = MadHeaderRepr {
            mgmt_class: CLASS_CM,
            class_version: CM_CLASS_VERSION,
            method: method::SEND,
            status: 0,
            class_specific: 0,
            tid: 0x0000_0002_844a_e558,
            attr_id: 0x0010,
            attr_mod: 0,
        };
        let mut b = [0xffu8; MAD_HEADER_LEN];
        r.emit(&mut MadHeader::new_unchecked(&mut b[..]));
        assert_eq!(
            b,
            [
                1, 7, 2, 3, 0, 0, 0, 0, 0, 0, 0, 2, 0x84, 0x4a, 0xe5, 0x58, 0, 0x10, 0, 0, 0, 0, 0,
                0
            ]
        );
        let h = MadHeader::new_checked(&b[..]).unwrap();
        assert_eq!(MadHeaderRepr::parse(&h).unwrap(), r);
        b[0] = 2;
        let h = MadHeader::new_checked(&b[..]).unwrap();
        assert_eq!(MadHeaderRepr::parse(&h), Err(Error::BadMad("base version")));
        assert!(MadHeader::new_checked(&b[..23]).is_err());
    }

    #[test]
    fn an_unmatched_get_or_set_is_answered_unsupported_and_nothing_else() {
        let mut get = [0u8; MAD_LEN];
        MadHeaderRepr {
            mgmt_class: CLASS_CM,
            class_version: CM_CLASS_VERSION,
            method: method::GET,
            status: 0,
            class_specific: 0,
            tid: 42,
            attr_id: 0x0001, // ClassPortInfo
            attr_mod: 0,
        }
        .emit(&mut MadHeader::new_unchecked(&mut get[..MAD_HEADER_LEN]));
        get[100] = 0x77;
        let resp = unmatched_response(&get).unwrap();
        let h = MadHeaderRepr::parse(&MadHeader::new_checked(&resp[..]).unwrap()).unwrap();
        assert_eq!(
            (h.method, h.status, h.tid, h.attr_id),
            (method::GET_RESP, status::METHOD_ATTR_UNSUPPORTED, 42, 1)
        );
        assert_eq!(resp[100], 0x77, "the request comes back whole");
        let mut set = get;
        set[field::METHOD] = method::SET;
        assert!(unmatched_response(&set).is_some());
        for (at, v) in [
            (field::METHOD, method::SEND),
            (field::METHOD, method::GET_RESP),
            (field::MGMT_CLASS, 0x81),
            (field::MGMT_CLASS, 0x01),
            (field::BASE_VERSION, 2),
        ] {
            let mut m = get;
            m[at] = v;
            assert_eq!(unmatched_response(&m), None, "byte {at} = {v:#x}");
        }
        assert_eq!(unmatched_response(&get[..255]), None);
    }
}
