//! Atomic Acknowledge Extended Transport Header (IBTA 9.3.6), 8 bytes: the original value.

use super::{Result, get_u64, header_view, set_u64};

header_view!(
    /// A view of an AtomicAckETH.
    AtomicAckEth, 8, "AtomicAckETH"
);

impl<T: AsRef<[u8]>> AtomicAckEth<T> {
    /// The remote data before the atomic executed.
    pub fn orig(&self) -> u64 {
        get_u64(self.buffer.as_ref(), 0..8)
    }
}

/// The AtomicAckETH as a plain value.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct AtomicAckEthRepr {
    /// Original remote data.
    pub orig: u64,
}

impl AtomicAckEthRepr {
    /// Parse.
    #[inline]
    pub fn parse<T: AsRef<[u8]>>(h: &AtomicAckEth<T>) -> Result<AtomicAckEthRepr> {
        Ok(AtomicAckEthRepr { orig: h.orig() })
    }
    /// Emit.
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, h: &mut AtomicAckEth<T>) {
        set_u64(h.buffer.as_mut(), 0..8, self.orig);
    }
}
