//! The two 4-byte trailing headers: Immediate Data (ImmDt, IBTA 9.3.7) and the Invalidate
//! ETH (IETH, 9.3.8) that carries the R_Key to invalidate. Both are one opaque 32-bit word,
//! carried as-is (big-endian on the wire, like every other field).

use super::{get_u32, header_view, set_u32};

header_view!(
    /// A view of an ImmDt or IETH.
    ImmDt, 4, "ImmDt/IETH"
);

impl<T: AsRef<[u8]>> ImmDt<T> {
    /// The 32-bit value.
    pub fn value(&self) -> u32 {
        get_u32(self.buffer.as_ref(), 0..4)
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> ImmDt<T> {
    /// Set the 32-bit value.
    pub fn set_value(&mut self, v: u32) {
        set_u32(self.buffer.as_mut(), 0..4, v)
    }
}
