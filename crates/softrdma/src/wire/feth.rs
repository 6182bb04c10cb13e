//! FLUSH Extended Transport Header (IBTA 1.5, 9.3.3.1), 4 bytes: selectivity level and
//! placement type of an RDMA FLUSH.

use super::{Error, Result, get_u32, header_view, set_u32};

header_view!(
    /// A view of a FETH.
    Feth, 4, "FETH"
);

impl<T: AsRef<[u8]>> Feth<T> {
    /// The whole word.
    pub fn raw(&self) -> u32 {
        get_u32(self.buffer.as_ref(), 0..4)
    }
}

/// The FETH as plain values: selectivity level (bits 5-4) and placement type (bits 3-0).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct FethRepr {
    /// Selectivity level (0: region range, 1: whole region).
    pub sel: u8,
    /// Placement type (bit 0: global visibility, bit 1: persistence).
    pub plt: u8,
}

impl FethRepr {
    /// Parse; reserved bits must be clear.
    #[inline]
    pub fn parse<T: AsRef<[u8]>>(h: &Feth<T>) -> Result<FethRepr> {
        let w = h.raw();
        if w & !0x3f != 0 {
            return Err(Error::ReservedBits);
        }
        Ok(FethRepr {
            sel: ((w >> 4) & 3) as u8,
            plt: (w & 0xf) as u8,
        })
    }
    /// Emit.
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, h: &mut Feth<T>) {
        set_u32(
            h.buffer.as_mut(),
            0..4,
            (u32::from(self.sel & 3) << 4) | u32::from(self.plt & 0xf),
        );
    }
}
