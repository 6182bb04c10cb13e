//! The responder's replay cache of atomic results: a retransmitted Compare&Swap or
//! Fetch&Add is answered from here and never executed twice (IBTA 9.7.5.2.3).

use crate::wire::Psn;

/// A bounded ring of `(psn, original value)` for the most recent atomics.
#[derive(Debug)]
pub struct AtomicCache {
    entries: Vec<(Psn, u64)>,
    cap: usize,
    next: usize,
}

impl AtomicCache {
    /// A cache keeping the last `cap` results (at least 1). Allocates once.
    pub fn new(cap: usize) -> AtomicCache {
        let cap = cap.max(1);
        AtomicCache {
            entries: Vec::with_capacity(cap),
            cap,
            next: 0,
        }
    }

    /// Remember the result of the atomic at `psn`.
    pub fn insert(&mut self, psn: Psn, orig: u64) {
        if self.entries.len() < self.cap {
            self.entries.push((psn, orig));
        } else {
            self.entries[self.next] = (psn, orig);
        }
        self.next = (self.next + 1) % self.cap;
    }

    /// The result of the atomic at `psn`, if still cached.
    pub fn get(&self, psn: Psn) -> Option<u64> {
        self.entries.iter().find(|e| e.0 == psn).map(|e| e.1)
    }

    /// Forget everything (QP reset).
    pub fn clear(&mut self) {
        self.entries.clear();
        self.next = 0;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keeps_the_most_recent() {
        let mut c = AtomicCache::new(2);
        c.insert(Psn::new(1), 10);
        c.insert(Psn::new(2), 20);
        c.insert(Psn::new(3), 30);
        assert_eq!(c.get(Psn::new(1)), None);
        assert_eq!(c.get(Psn::new(2)), Some(20));
        assert_eq!(c.get(Psn::new(3)), Some(30));
    }
}
