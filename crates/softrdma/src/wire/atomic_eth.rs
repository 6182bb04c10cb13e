//! Atomic Extended Transport Header (IBTA 9.3.4), 28 bytes: Compare & Swap and Fetch & Add.

use super::{Result, get_u32, get_u64, header_view, set_u32, set_u64};

mod field {
    use crate::wire::Field;
    pub const VA: Field = 0..8;
    pub const RKEY: Field = 8..12;
    pub const SWAP_ADD: Field = 12..20;
    pub const COMPARE: Field = 20..28;
}

header_view!(
    /// A view of an AtomicETH.
    AtomicEth, 28, "AtomicETH"
);

impl<T: AsRef<[u8]>> AtomicEth<T> {
    /// Virtual address of the 8-byte target.
    pub fn va(&self) -> u64 {
        get_u64(self.buffer.as_ref(), field::VA)
    }
    /// Remote key.
    pub fn rkey(&self) -> u32 {
        get_u32(self.buffer.as_ref(), field::RKEY)
    }
    /// Swap value (Compare & Swap) or addend (Fetch & Add).
    pub fn swap_add(&self) -> u64 {
        get_u64(self.buffer.as_ref(), field::SWAP_ADD)
    }
    /// Compare value (Compare & Swap only).
    pub fn compare(&self) -> u64 {
        get_u64(self.buffer.as_ref(), field::COMPARE)
    }
}

/// The AtomicETH as plain values.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct AtomicEthRepr {
    /// Virtual address.
    pub va: u64,
    /// Remote key.
    pub rkey: u32,
    /// Swap or add data.
    pub swap_add: u64,
    /// Compare data.
    pub compare: u64,
}

impl AtomicEthRepr {
    /// Parse.
    #[inline]
    pub fn parse<T: AsRef<[u8]>>(h: &AtomicEth<T>) -> Result<AtomicEthRepr> {
        Ok(AtomicEthRepr {
            va: h.va(),
            rkey: h.rkey(),
            swap_add: h.swap_add(),
            compare: h.compare(),
        })
    }
    /// Emit.
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, h: &mut AtomicEth<T>) {
        let b = h.buffer.as_mut();
        set_u64(b, field::VA, self.va);
        set_u32(b, field::RKEY, self.rkey);
        set_u64(b, field::SWAP_ADD, self.swap_add);
        set_u64(b, field::COMPARE, self.compare);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip() {
        let r = AtomicEthRepr {
            va: 0x1000,
            rkey: 7,
            swap_add: u64::MAX,
            compare: 1,
        };
        let mut b = [0u8; 28];
        r.emit(&mut AtomicEth::new_unchecked(&mut b[..]));
        assert_eq!(
            AtomicEthRepr::parse(&AtomicEth::new_checked(&b[..]).unwrap()).unwrap(),
            r
        );
        assert!(AtomicEth::new_checked(&b[..27]).is_err());
    }
}
