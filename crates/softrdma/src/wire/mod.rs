//! RoCEv2 wire format: InfiniBand transport headers carried in UDP (destination port 4791).
//!
//! One file per header, each with a zero-copy view (`Bth<T>`, `Reth<T>`, ...) whose
//! `new_checked` validates the length once so accessors never fail, and a plain `*Repr`
//! struct with `parse`/`emit`. The rest of the stack talks `Repr`s; only this module touches
//! bytes. [`opcode`] describes every opcode once; [`packet`] assembles a whole UDP payload
//! (headers, payload, pad, ICRC) and takes one apart; [`icrc`] computes the invariant CRC;
//! [`av`] is the path between two ports that yields both a destination and an ICRC prefix.
//!
//! References: IBTA Architecture Specification vol. 1 (ch. 9, transport layer) and its
//! RoCEv2 annex (A17).

pub mod aeth;
pub mod atomic_ack_eth;
pub mod atomic_eth;
pub mod av;
pub mod bth;
pub mod cm;
pub mod cma;
pub mod deth;
pub mod feth;
pub mod icrc;
pub mod immdt;
pub mod mad;
pub mod opcode;
pub mod packet;
pub mod psn;
pub mod reth;

pub use aeth::{Aeth, AethRepr, NakCode, Syndrome};
pub use atomic_ack_eth::{AtomicAckEth, AtomicAckEthRepr};
pub use atomic_eth::{AtomicEth, AtomicEthRepr};
pub use av::AddressVector;
pub use bth::{Bth, BthRepr};
pub use deth::{Deth, DethRepr};
pub use feth::{Feth, FethRepr};
pub use icrc::{Icrc, IcrcContext, IcrcPrefix, IdDelta, IdDeltas, IpHeader};
pub use immdt::ImmDt;
pub use opcode::{Headers, OpKind, Opcode, OpcodeInfo, Position, Transport};
pub use packet::{HeaderRepr, Packet};
pub use psn::Psn;
pub use reth::{Reth, RethRepr};

/// The UDP destination port of RoCEv2.
pub const ROCE_PORT: u16 = 4791;
/// Length of the invariant CRC that ends every packet.
pub const ICRC_LEN: usize = 4;
/// The default partition key.
pub const DEFAULT_PKEY: u16 = 0xffff;

/// Why bytes could not be taken as a RoCEv2 packet.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum Error {
    /// The buffer ends before a header or the ICRC.
    #[error("truncated: {what} needs {need} bytes, {have} present")]
    Truncated {
        /// What was being read.
        what: &'static str,
        /// Bytes needed.
        need: usize,
        /// Bytes present.
        have: usize,
    },
    /// An opcode this implementation does not know (RD, reserved or vendor opcodes).
    #[error("unknown or unsupported opcode {0:#04x}")]
    UnknownOpcode(u8),
    /// Transport header version other than 0.
    #[error("transport header version {0}, expected 0")]
    BadVersion(u8),
    /// Reserved BTH bits set (the spec requires senders to clear them).
    #[error("reserved BTH bits set")]
    ReservedBits,
    /// Payload and pad are inconsistent with the pad count, or the opcode carries no payload.
    #[error("{opcode}: payload {payload} bytes with pad {pad} is not valid")]
    BadPayload {
        /// Opcode name.
        opcode: &'static str,
        /// Bytes between the headers and the ICRC.
        payload: usize,
        /// The BTH pad count.
        pad: u8,
    },
    /// The carried ICRC differs from the computed one.
    #[error("bad ICRC: carried {carried:#010x}, computed {computed:#010x}")]
    BadIcrc {
        /// ICRC in the packet.
        carried: u32,
        /// ICRC computed over the packet.
        computed: u32,
    },
    /// An IP header that cannot be used for the ICRC.
    #[error("unsupported IP header: {0}")]
    BadIpHeader(&'static str),
    /// A buffer given to `emit` is too small.
    #[error("buffer of {have} bytes too small, {need} needed")]
    BufferTooSmall {
        /// Bytes needed.
        need: usize,
        /// Bytes available.
        have: usize,
    },
    /// A management datagram this implementation refuses (bad version, class, method or
    /// attribute, or a field out of its range).
    #[error("bad MAD: {0}")]
    BadMad(&'static str),
    /// A field value that cannot be encoded (for example a QPN above 24 bits).
    #[error("field {0} out of range")]
    FieldRange(&'static str),
}

/// Result of wire operations.
pub type Result<T> = core::result::Result<T, Error>;

/// A byte range of a header field.
pub(crate) type Field = core::ops::Range<usize>;

#[inline]
pub(crate) fn get_u16(b: &[u8], f: Field) -> u16 {
    u16::from_be_bytes([b[f.start], b[f.start + 1]])
}
#[inline]
pub(crate) fn get_u24(b: &[u8], f: Field) -> u32 {
    u32::from_be_bytes([0, b[f.start], b[f.start + 1], b[f.start + 2]])
}
#[inline]
pub(crate) fn get_u32(b: &[u8], f: Field) -> u32 {
    let mut a = [0u8; 4];
    a.copy_from_slice(&b[f]);
    u32::from_be_bytes(a)
}
#[inline]
pub(crate) fn get_u64(b: &[u8], f: Field) -> u64 {
    let mut a = [0u8; 8];
    a.copy_from_slice(&b[f]);
    u64::from_be_bytes(a)
}
#[inline]
pub(crate) fn set_u16(b: &mut [u8], f: Field, v: u16) {
    b[f].copy_from_slice(&v.to_be_bytes());
}
#[inline]
pub(crate) fn set_u24(b: &mut [u8], f: Field, v: u32) {
    b[f].copy_from_slice(&v.to_be_bytes()[1..]);
}
#[inline]
pub(crate) fn set_u32(b: &mut [u8], f: Field, v: u32) {
    b[f].copy_from_slice(&v.to_be_bytes());
}
#[inline]
pub(crate) fn set_u64(b: &mut [u8], f: Field, v: u64) {
    b[f].copy_from_slice(&v.to_be_bytes());
}

/// Defines a zero-copy header view: the struct, `new_unchecked`, `new_checked` (length checked
/// once, so the accessors never fail), `into_inner` and `as_bytes`.
macro_rules! header_view {
    ($(#[$m:meta])* $name:ident, $len:expr, $what:literal) => {
        $(#[$m])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq)]
        pub struct $name<T: AsRef<[u8]>> {
            buffer: T,
        }

        impl<T: AsRef<[u8]>> $name<T> {
            /// Length of this header in bytes.
            pub const LEN: usize = $len;

            /// Wrap a buffer without checking its length; accessors may panic if it is short.
            pub const fn new_unchecked(buffer: T) -> Self {
                Self { buffer }
            }

            /// Wrap a buffer after checking that it holds the whole header.
            pub fn new_checked(buffer: T) -> $crate::wire::Result<Self> {
                let have = buffer.as_ref().len();
                if have < $len {
                    return Err($crate::wire::Error::Truncated { what: $what, need: $len, have });
                }
                Ok(Self { buffer })
            }

            /// Give the buffer back.
            pub fn into_inner(self) -> T {
                self.buffer
            }

            /// The header's bytes.
            pub fn as_bytes(&self) -> &[u8] {
                &self.buffer.as_ref()[..$len]
            }
        }
    };
}
pub(crate) use header_view;
