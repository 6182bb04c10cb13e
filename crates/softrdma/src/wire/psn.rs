//! 24-bit packet sequence numbers (IBTA 9.7.1).

use core::fmt;

/// A packet sequence number: 24 bits, compared within a 2^23 window.
#[derive(Clone, Copy, Default, PartialEq, Eq, Hash)]
pub struct Psn(u32);

impl Psn {
    /// The mask of the 24-bit PSN space.
    pub const MASK: u32 = 0x00ff_ffff;

    /// A PSN from the low 24 bits of `v`.
    pub const fn new(v: u32) -> Psn {
        Psn(v & Self::MASK)
    }

    /// The PSN as an integer below 2^24.
    pub const fn value(self) -> u32 {
        self.0
    }

    /// `self + n` modulo 2^24.
    pub const fn add(self, n: u32) -> Psn {
        Psn(self.0.wrapping_add(n) & Self::MASK)
    }

    /// `self - n` modulo 2^24.
    pub const fn sub(self, n: u32) -> Psn {
        Psn(self.0.wrapping_sub(n) & Self::MASK)
    }

    /// Signed distance from `other` to `self`: positive when `self` is after `other`.
    /// Exact while the two are less than 2^23 apart.
    pub const fn diff(self, other: Psn) -> i32 {
        ((self.0.wrapping_sub(other.0)) << 8) as i32 >> 8
    }

    /// True when `self` comes strictly after `other`.
    pub const fn is_after(self, other: Psn) -> bool {
        self.diff(other) > 0
    }

    /// True when `self` comes strictly before `other`.
    pub const fn is_before(self, other: Psn) -> bool {
        self.diff(other) < 0
    }
}

impl fmt::Debug for Psn {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Psn({})", self.0)
    }
}

impl fmt::Display for Psn {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wraps_and_compares_across_zero() {
        let top = Psn::new(0xff_fffe);
        assert_eq!(top.add(3), Psn::new(1));
        assert!(Psn::new(1).is_after(top));
        assert!(top.is_before(Psn::new(1)));
        assert_eq!(Psn::new(1).diff(top), 3);
        assert_eq!(top.diff(Psn::new(1)), -3);
        assert_eq!(Psn::new(0).sub(1), Psn::new(0xff_ffff));
        assert_eq!(Psn::new(0x1ff_ffff).value(), 0xff_ffff);
    }

    #[test]
    fn window_is_half_the_space() {
        let a = Psn::new(0);
        assert!(Psn::new(0x7f_ffff).is_after(a));
        assert!(Psn::new(0x80_0000).is_before(a));
        assert!(!a.is_after(a) && !a.is_before(a));
    }
}
