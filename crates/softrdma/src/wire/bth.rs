//! Base Transport Header (IBTA 9.2), 12 bytes, present in every packet.

use super::{Error, Opcode, Psn, Result, get_u16, get_u24, header_view, set_u16, set_u24};

mod field {
    use crate::wire::Field;
    pub const OPCODE: usize = 0;
    pub const FLAGS: usize = 1; // SE | MigReq | PadCnt(2) | TVer(4)
    pub const PKEY: Field = 2..4;
    pub const RESV8A: usize = 4; // FECN | BECN | reserved(6)
    pub const DEST_QP: Field = 5..8;
    pub const ACK: usize = 8; // AckReq | reserved(7)
    pub const PSN: Field = 9..12;
}

const SE: u8 = 0x80;
const MIG_REQ: u8 = 0x40;
const FECN: u8 = 0x80;
const BECN: u8 = 0x40;
const ACK_REQ: u8 = 0x80;

header_view!(
    /// A view of a BTH.
    Bth, 12, "BTH"
);

impl<T: AsRef<[u8]>> Bth<T> {
    /// OpCode.
    pub fn opcode(&self) -> Opcode {
        Opcode(self.buffer.as_ref()[field::OPCODE])
    }
    /// Solicited Event.
    pub fn se(&self) -> bool {
        self.buffer.as_ref()[field::FLAGS] & SE != 0
    }
    /// Migration request.
    pub fn mig_req(&self) -> bool {
        self.buffer.as_ref()[field::FLAGS] & MIG_REQ != 0
    }
    /// Pad count: bytes appended to the payload to reach a multiple of 4.
    pub fn pad_cnt(&self) -> u8 {
        (self.buffer.as_ref()[field::FLAGS] >> 4) & 3
    }
    /// Transport header version (0).
    pub fn tver(&self) -> u8 {
        self.buffer.as_ref()[field::FLAGS] & 0x0f
    }
    /// Partition key.
    pub fn pkey(&self) -> u16 {
        get_u16(self.buffer.as_ref(), field::PKEY)
    }
    /// Forward explicit congestion notification (set by the network; not covered by the ICRC).
    pub fn fecn(&self) -> bool {
        self.buffer.as_ref()[field::RESV8A] & FECN != 0
    }
    /// Backward explicit congestion notification (not covered by the ICRC).
    pub fn becn(&self) -> bool {
        self.buffer.as_ref()[field::RESV8A] & BECN != 0
    }
    /// The six reserved bits of byte 4 and the seven of byte 8, which senders clear.
    pub fn reserved(&self) -> u16 {
        let b = self.buffer.as_ref();
        (u16::from(b[field::RESV8A] & 0x3f) << 7) | u16::from(b[field::ACK] & 0x7f)
    }
    /// Destination QP number (24 bits).
    pub fn dest_qp(&self) -> u32 {
        get_u24(self.buffer.as_ref(), field::DEST_QP)
    }
    /// Acknowledge request.
    pub fn ack_req(&self) -> bool {
        self.buffer.as_ref()[field::ACK] & ACK_REQ != 0
    }
    /// Packet sequence number.
    pub fn psn(&self) -> Psn {
        Psn::new(get_u24(self.buffer.as_ref(), field::PSN))
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Bth<T> {
    /// Write every field; reserved bits are cleared.
    fn write(&mut self, r: &BthRepr) {
        let b = self.buffer.as_mut();
        b[field::OPCODE] = r.opcode.0;
        b[field::FLAGS] = (if r.se { SE } else { 0 })
            | (if r.mig_req { MIG_REQ } else { 0 })
            | ((r.pad_cnt & 3) << 4)
            | (r.tver & 0x0f);
        set_u16(b, field::PKEY, r.pkey);
        b[field::RESV8A] = (if r.fecn { FECN } else { 0 }) | (if r.becn { BECN } else { 0 });
        set_u24(b, field::DEST_QP, r.dest_qp);
        b[field::ACK] = if r.ack_req { ACK_REQ } else { 0 };
        set_u24(b, field::PSN, r.psn.value());
    }
}

/// The BTH as plain values.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BthRepr {
    /// OpCode.
    pub opcode: Opcode,
    /// Solicited Event.
    pub se: bool,
    /// Migration request.
    pub mig_req: bool,
    /// Pad count (0-3).
    pub pad_cnt: u8,
    /// Transport header version (0).
    pub tver: u8,
    /// Partition key.
    pub pkey: u16,
    /// FECN.
    pub fecn: bool,
    /// BECN.
    pub becn: bool,
    /// Destination QP (24 bits).
    pub dest_qp: u32,
    /// Acknowledge request.
    pub ack_req: bool,
    /// Packet sequence number.
    pub psn: Psn,
}

impl BthRepr {
    /// A BTH with the defaults rxe uses: MigReq set, P_Key 0xFFFF, no congestion marks.
    pub fn new(opcode: Opcode, dest_qp: u32, psn: Psn) -> BthRepr {
        BthRepr {
            opcode,
            se: false,
            mig_req: true,
            pad_cnt: 0,
            tver: 0,
            pkey: super::DEFAULT_PKEY,
            fecn: false,
            becn: false,
            dest_qp,
            ack_req: false,
            psn,
        }
    }

    /// Parse a BTH. Checks the version and that reserved bits are clear.
    #[inline]
    pub fn parse<T: AsRef<[u8]>>(h: &Bth<T>) -> Result<BthRepr> {
        if h.tver() != 0 {
            return Err(Error::BadVersion(h.tver()));
        }
        if h.reserved() != 0 {
            return Err(Error::ReservedBits);
        }
        Ok(BthRepr {
            opcode: h.opcode(),
            se: h.se(),
            mig_req: h.mig_req(),
            pad_cnt: h.pad_cnt(),
            tver: h.tver(),
            pkey: h.pkey(),
            fecn: h.fecn(),
            becn: h.becn(),
            dest_qp: h.dest_qp(),
            ack_req: h.ack_req(),
            psn: h.psn(),
        })
    }

    /// Emit into a view. Fails if the QPN does not fit 24 bits.
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, h: &mut Bth<T>) -> Result<()> {
        if self.dest_qp > 0x00ff_ffff {
            return Err(Error::FieldRange("dest_qp"));
        }
        h.write(self);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // An RC SEND Only BTH with MigReq and AckReq set, as Linux rxe sends them.
    const SEND_ONLY: [u8; 12] = [
        0x04, 0x40, 0xff, 0xff, 0x00, 0x00, 0x00, 0x11, 0x80, 0x0e, 0x8a, 0x3c,
    ];

    #[test]
    fn parse_emit_round_trip() {
        let v = Bth::new_checked(&SEND_ONLY[..]).unwrap();
        let r = BthRepr::parse(&v).unwrap();
        assert_eq!(r.opcode, Opcode(4));
        assert!(r.mig_req && r.ack_req && !r.se);
        assert_eq!(r.dest_qp, 0x11);
        assert_eq!(r.psn, Psn::new(0x0e8a3c));
        let mut out = [0u8; 12];
        r.emit(&mut Bth::new_unchecked(&mut out[..])).unwrap();
        assert_eq!(out, SEND_ONLY);
    }

    #[test]
    fn short_and_reserved_are_errors() {
        assert!(matches!(
            Bth::new_checked(&SEND_ONLY[..11]),
            Err(Error::Truncated { .. })
        ));
        let mut b = SEND_ONLY;
        b[8] |= 1;
        assert_eq!(
            BthRepr::parse(&Bth::new_unchecked(&b[..])),
            Err(Error::ReservedBits)
        );
        let mut b = SEND_ONLY;
        b[1] |= 1;
        assert_eq!(
            BthRepr::parse(&Bth::new_unchecked(&b[..])),
            Err(Error::BadVersion(1))
        );
    }

    #[test]
    fn qpn_out_of_range_is_refused() {
        let r = BthRepr::new(Opcode(4), 1 << 24, Psn::new(0));
        let mut out = [0u8; 12];
        assert_eq!(
            r.emit(&mut Bth::new_unchecked(&mut out[..])),
            Err(Error::FieldRange("dest_qp"))
        );
    }
}
