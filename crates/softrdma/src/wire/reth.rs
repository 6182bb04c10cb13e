//! RDMA Extended Transport Header (IBTA 9.3.3), 16 bytes: the remote address of a WRITE,
//! READ, FLUSH or ATOMIC WRITE.

use super::{Result, get_u32, get_u64, header_view, set_u32, set_u64};

mod field {
    use crate::wire::Field;
    pub const VA: Field = 0..8;
    pub const RKEY: Field = 8..12;
    pub const DMA_LEN: Field = 12..16;
}

header_view!(
    /// A view of a RETH.
    Reth, 16, "RETH"
);

impl<T: AsRef<[u8]>> Reth<T> {
    /// Virtual address (or offset, for zero-based regions).
    pub fn va(&self) -> u64 {
        get_u64(self.buffer.as_ref(), field::VA)
    }
    /// Remote key.
    pub fn rkey(&self) -> u32 {
        get_u32(self.buffer.as_ref(), field::RKEY)
    }
    /// Length of the whole message in bytes.
    pub fn dma_len(&self) -> u32 {
        get_u32(self.buffer.as_ref(), field::DMA_LEN)
    }
}

/// The RETH as plain values.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RethRepr {
    /// Virtual address.
    pub va: u64,
    /// Remote key.
    pub rkey: u32,
    /// DMA length.
    pub dma_len: u32,
}

impl RethRepr {
    /// Parse.
    #[inline]
    pub fn parse<T: AsRef<[u8]>>(h: &Reth<T>) -> Result<RethRepr> {
        Ok(RethRepr {
            va: h.va(),
            rkey: h.rkey(),
            dma_len: h.dma_len(),
        })
    }
    /// Emit.
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, h: &mut Reth<T>) {
        let b = h.buffer.as_mut();
        set_u64(b, field::VA, self.va);
        set_u32(b, field::RKEY, self.rkey);
        set_u32(b, field::DMA_LEN, self.dma_len);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip() {
        let r = RethRepr {
            va: 0x0000_7f00_1234_5678,
            rkey: 0xdead_beef,
            dma_len: 65536,
        };
        let mut b = [0u8; 16];
        r.emit(&mut Reth::new_unchecked(&mut b[..]));
        assert_eq!(&b[..8], &0x0000_7f00_1234_5678u64.to_be_bytes());
        assert_eq!(
            RethRepr::parse(&Reth::new_checked(&b[..]).unwrap()).unwrap(),
            r
        );
        assert!(Reth::new_checked(&b[..15]).is_err());
    }
}
