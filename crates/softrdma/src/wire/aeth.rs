//! ACK Extended Transport Header (IBTA 9.3.5), 4 bytes: syndrome and MSN.

use super::{Result, get_u24, header_view, set_u24};

mod field {
    use crate::wire::Field;
    pub const SYNDROME: usize = 0;
    pub const MSN: Field = 1..4;
}

header_view!(
    /// A view of an AETH.
    Aeth, 4, "AETH"
);

impl<T: AsRef<[u8]>> Aeth<T> {
    /// Raw syndrome byte.
    pub fn syndrome(&self) -> u8 {
        self.buffer.as_ref()[field::SYNDROME]
    }
    /// Message sequence number (24 bits).
    pub fn msn(&self) -> u32 {
        get_u24(self.buffer.as_ref(), field::MSN)
    }
}

/// NAK codes (syndrome bits 4-0 when bits 6-5 are `11`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum NakCode {
    /// PSN sequence error: the requester must go back to the expected PSN.
    PsnSequenceError,
    /// Invalid request.
    InvalidRequest,
    /// Remote access error (key, bounds or rights).
    RemoteAccessError,
    /// Remote operational error.
    RemoteOperationalError,
    /// Invalid RD request.
    InvalidRdRequest,
    /// A reserved code.
    Reserved(u8),
}

impl NakCode {
    /// The 5-bit code.
    pub const fn code(self) -> u8 {
        match self {
            NakCode::PsnSequenceError => 0,
            NakCode::InvalidRequest => 1,
            NakCode::RemoteAccessError => 2,
            NakCode::RemoteOperationalError => 3,
            NakCode::InvalidRdRequest => 4,
            NakCode::Reserved(c) => c & 0x1f,
        }
    }
    /// From the 5-bit code.
    pub const fn from_code(c: u8) -> NakCode {
        match c & 0x1f {
            0 => NakCode::PsnSequenceError,
            1 => NakCode::InvalidRequest,
            2 => NakCode::RemoteAccessError,
            3 => NakCode::RemoteOperationalError,
            4 => NakCode::InvalidRdRequest,
            c => NakCode::Reserved(c),
        }
    }
}

/// The decoded syndrome.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Syndrome {
    /// Positive acknowledgement with a credit count (0x1F: invalid / end-to-end flow control off).
    Ack {
        /// Credit count.
        credits: u8,
    },
    /// Receiver not ready, with the RNR timer code (see [`rnr_timer_ns`]).
    RnrNak {
        /// RNR timer code.
        timer: u8,
    },
    /// Negative acknowledgement.
    Nak(NakCode),
    /// The reserved `10` form.
    Reserved(u8),
}

impl Syndrome {
    /// Decode a syndrome byte. Bit 7 is reserved and ignored.
    pub const fn from_byte(b: u8) -> Syndrome {
        let v = b & 0x1f;
        match (b >> 5) & 3 {
            0 => Syndrome::Ack { credits: v },
            1 => Syndrome::RnrNak { timer: v },
            3 => Syndrome::Nak(NakCode::from_code(v)),
            _ => Syndrome::Reserved(b & 0x7f),
        }
    }
    /// Encode as a syndrome byte.
    pub const fn to_byte(self) -> u8 {
        match self {
            Syndrome::Ack { credits } => credits & 0x1f,
            Syndrome::RnrNak { timer } => 0x20 | (timer & 0x1f),
            Syndrome::Nak(c) => 0x60 | c.code(),
            Syndrome::Reserved(b) => b & 0x7f,
        }
    }
}

/// RNR NAK timer in nanoseconds for a 5-bit code (IBTA table 45).
pub const fn rnr_timer_ns(code: u8) -> u64 {
    const US_X100: [u64; 32] = [
        65536, 1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, 96, 128, 192, 256, 384, 512, 768, 1024,
        1536, 2048, 3072, 4096, 6144, 8192, 12288, 16384, 24576, 32768, 49152,
    ];
    US_X100[(code & 0x1f) as usize] * 10_000
}

/// The AETH as plain values.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AethRepr {
    /// Syndrome.
    pub syndrome: Syndrome,
    /// Message sequence number (24 bits).
    pub msn: u32,
}

impl AethRepr {
    /// Parse; the reserved top bit of the syndrome must be clear.
    #[inline]
    pub fn parse<T: AsRef<[u8]>>(h: &Aeth<T>) -> Result<AethRepr> {
        if h.syndrome() & 0x80 != 0 {
            return Err(super::Error::ReservedBits);
        }
        Ok(AethRepr {
            syndrome: Syndrome::from_byte(h.syndrome()),
            msn: h.msn(),
        })
    }
    /// Emit (the MSN is taken modulo 2^24).
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, h: &mut Aeth<T>) {
        let b = h.buffer.as_mut();
        b[field::SYNDROME] = self.syndrome.to_byte();
        set_u24(b, field::MSN, self.msn & 0x00ff_ffff);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn syndromes_round_trip() {
        for b in 0u8..=0x7f {
            assert_eq!(Syndrome::from_byte(b).to_byte(), b);
        }
        assert_eq!(Syndrome::from_byte(0x1f), Syndrome::Ack { credits: 31 });
        assert_eq!(
            Syndrome::from_byte(0x60),
            Syndrome::Nak(NakCode::PsnSequenceError)
        );
        assert_eq!(
            Syndrome::from_byte(0x62),
            Syndrome::Nak(NakCode::RemoteAccessError)
        );
        assert_eq!(Syndrome::from_byte(0x2e), Syndrome::RnrNak { timer: 14 });
    }

    #[test]
    fn rnr_table() {
        assert_eq!(rnr_timer_ns(0), 655_360_000);
        assert_eq!(rnr_timer_ns(1), 10_000);
        assert_eq!(rnr_timer_ns(14), 1_280_000);
        assert_eq!(rnr_timer_ns(31), 491_520_000);
    }

    #[test]
    fn round_trip() {
        let r = AethRepr {
            syndrome: Syndrome::Nak(NakCode::InvalidRequest),
            msn: 0xabcdef,
        };
        let mut b = [0u8; 4];
        r.emit(&mut Aeth::new_unchecked(&mut b[..]));
        assert_eq!(b, [0x61, 0xab, 0xcd, 0xef]);
        assert_eq!(
            AethRepr::parse(&Aeth::new_checked(&b[..]).unwrap()).unwrap(),
            r
        );
    }
}
