//! A fixed window of PSNs received ahead of the completer: READ response packets and atomic
//! acknowledgements that arrived after a hole in the response stream. The completer places
//! their data at once (placement is idempotent) and remembers them here, so that a lost
//! response costs one re-request of the hole instead of a go-back-N replay of every READ
//! behind it.

pub use crate::params::PSN_SET_WINDOW;
use crate::wire::Psn;

const WORDS: usize = (PSN_SET_WINDOW / 64) as usize;

/// A set of PSNs within `[base, base + PSN_SET_WINDOW)`; `base` is supplied by the caller
/// on every call (the completer's `comp_psn`). A PSN is stored at bit `psn mod window`, so
/// a PSN must be removed before the base moves past it.
#[derive(Clone, Debug)]
pub struct PsnSet {
    words: Box<[u64; WORDS]>,
    len: u32,
}

impl Default for PsnSet {
    fn default() -> Self {
        PsnSet {
            words: Box::new([0; WORDS]),
            len: 0,
        }
    }
}

impl PsnSet {
    fn slot(p: Psn) -> (usize, u64) {
        let i = p.value() & (PSN_SET_WINDOW - 1);
        ((i / 64) as usize, 1u64 << (i % 64))
    }

    /// True when `p` lies in the window that starts at `base`.
    pub fn in_window(base: Psn, p: Psn) -> bool {
        let d = p.diff(base);
        d >= 0 && (d as u32) < PSN_SET_WINDOW
    }

    /// Add `p`. Returns false (and stores nothing) when it is outside the window or
    /// already present.
    pub fn insert(&mut self, base: Psn, p: Psn) -> bool {
        if !Self::in_window(base, p) {
            return false;
        }
        let (w, b) = Self::slot(p);
        if self.words[w] & b != 0 {
            return false;
        }
        self.words[w] |= b;
        self.len += 1;
        true
    }

    /// Whether `p` (in the window starting at `base`) is present.
    pub fn contains(&self, base: Psn, p: Psn) -> bool {
        if self.len == 0 || !Self::in_window(base, p) {
            return false;
        }
        let (w, b) = Self::slot(p);
        self.words[w] & b != 0
    }

    /// Remove `p` and say whether it was present.
    pub fn take(&mut self, base: Psn, p: Psn) -> bool {
        if !self.contains(base, p) {
            return false;
        }
        let (w, b) = Self::slot(p);
        self.words[w] &= !b;
        self.len -= 1;
        true
    }

    /// How many PSNs are stored.
    pub fn len(&self) -> u32 {
        self.len
    }

    /// True when nothing is stored.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Forget everything.
    pub fn clear(&mut self) {
        if self.len > 0 {
            self.words.fill(0);
            self.len = 0;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn window_bounds_and_wrap() {
        let base = Psn::new(0xff_fff0);
        let mut s = PsnSet::default();
        assert!(s.insert(base, base));
        assert!(s.insert(base, base.add(PSN_SET_WINDOW - 1)));
        assert!(!s.insert(base, base.add(PSN_SET_WINDOW)), "past the window");
        assert!(!s.insert(base, base.sub(1)), "before the base");
        assert!(!s.insert(base, base), "twice");
        assert_eq!(s.len(), 2);
        assert!(s.contains(base, base.add(PSN_SET_WINDOW - 1)));
        assert!(s.take(base, base));
        assert!(!s.take(base, base));
        // The base moves past the wrap of the 24-bit space.
        let base2 = base.add(100);
        assert!(s.insert(base2, Psn::new(90)));
        assert!(s.contains(base2, Psn::new(90)));
        s.clear();
        assert!(s.is_empty() && !s.contains(base2, Psn::new(90)));
    }
}
