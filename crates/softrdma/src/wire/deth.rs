//! Datagram Extended Transport Header (IBTA 9.3.2), 8 bytes: UD Q_Key and source QP.

use super::{Error, Result, get_u24, get_u32, header_view, set_u24, set_u32};

mod field {
    use crate::wire::Field;
    pub const QKEY: Field = 0..4;
    pub const RESERVED: usize = 4;
    pub const SRC_QP: Field = 5..8;
}

header_view!(
    /// A view of a DETH.
    Deth, 8, "DETH"
);

impl<T: AsRef<[u8]>> Deth<T> {
    /// Queue key.
    pub fn qkey(&self) -> u32 {
        get_u32(self.buffer.as_ref(), field::QKEY)
    }
    /// Reserved byte.
    pub fn reserved(&self) -> u8 {
        self.buffer.as_ref()[field::RESERVED]
    }
    /// Source QP number.
    pub fn src_qp(&self) -> u32 {
        get_u24(self.buffer.as_ref(), field::SRC_QP)
    }
}

/// The DETH as plain values.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DethRepr {
    /// Queue key.
    pub qkey: u32,
    /// Source QP (24 bits).
    pub src_qp: u32,
}

impl DethRepr {
    /// Parse; the reserved byte must be zero.
    #[inline]
    pub fn parse<T: AsRef<[u8]>>(h: &Deth<T>) -> Result<DethRepr> {
        if h.reserved() != 0 {
            return Err(Error::ReservedBits);
        }
        Ok(DethRepr {
            qkey: h.qkey(),
            src_qp: h.src_qp(),
        })
    }
    /// Emit.
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, h: &mut Deth<T>) -> Result<()> {
        if self.src_qp > 0x00ff_ffff {
            return Err(Error::FieldRange("src_qp"));
        }
        let b = h.buffer.as_mut();
        set_u32(b, field::QKEY, self.qkey);
        b[field::RESERVED] = 0;
        set_u24(b, field::SRC_QP, self.src_qp);
        Ok(())
    }
}
