//! The responder's record of the READ requests it executed, so that a duplicate READ is served
//! again only as the READ it repeats (IBTA 9.7.5.2.2; rxe's `find_resource`).
//!
//! A requester asks again for (part of) a READ whose response it did not receive in full: the
//! duplicate carries a PSN inside the original request's PSN range and a RETH naming the same
//! R_Key and a subset of the original bytes. Anything else behind the expected PSN is not a
//! retransmission and is dropped: without this record a connected peer could send READs with
//! old PSNs and any RETH, search R_Keys and addresses across the whole protection domain
//! without ever drawing a NAK, and skip the message-size limit.

use crate::wire::{Psn, RethRepr as Reth};

/// One executed READ request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct ReadRecord {
    /// PSN of the request.
    pub first: Psn,
    /// Response packets (PSNs) it spans, at least 1.
    pub npkts: u32,
    /// First byte asked for.
    pub va: u64,
    /// R_Key named.
    pub rkey: u32,
    /// Bytes asked for.
    pub len: u32,
}

impl ReadRecord {
    /// Whether `psn` lies in this READ's PSN range.
    fn spans(&self, psn: Psn) -> bool {
        let d = psn.diff(self.first);
        d >= 0 && (d as u32) < self.npkts
    }

    /// Whether `reth` asks for the same key and a subset of this READ's bytes.
    pub fn covers(&self, reth: &Reth) -> bool {
        let Some(off) = reth.va.checked_sub(self.va) else {
            return false;
        };
        reth.rkey == self.rkey
            && off <= u64::from(self.len)
            && u64::from(reth.dma_len) <= u64::from(self.len) - off
    }
}

/// A bounded ring of the most recent READs.
#[derive(Debug)]
pub(super) struct ReadHistory {
    entries: Vec<ReadRecord>,
    cap: usize,
    next: usize,
}

impl ReadHistory {
    /// A history keeping the last `cap` READs (at least 1). Allocates once.
    pub fn new(cap: usize) -> ReadHistory {
        let cap = cap.max(1);
        ReadHistory {
            entries: Vec::with_capacity(cap),
            cap,
            next: 0,
        }
    }

    /// Remember an executed READ.
    pub fn insert(&mut self, r: ReadRecord) {
        if self.entries.len() < self.cap {
            self.entries.push(r);
        } else {
            self.entries[self.next] = r;
        }
        self.next = (self.next + 1) % self.cap;
    }

    /// The READ whose PSN range holds `psn`, if still remembered.
    pub fn find(&self, psn: Psn) -> Option<&ReadRecord> {
        self.entries.iter().find(|r| r.spans(psn))
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

    fn rec(first: u32, npkts: u32) -> ReadRecord {
        ReadRecord {
            first: Psn::new(first),
            npkts,
            va: 0x1000,
            rkey: 0xabcd_0001,
            len: 4096,
        }
    }

    fn reth(va: u64, rkey: u32, dma_len: u32) -> Reth {
        Reth { va, rkey, dma_len }
    }

    #[test]
    fn finds_by_psn_range_across_the_wrap() {
        let mut h = ReadHistory::new(2);
        h.insert(rec(0xff_fffe, 4));
        assert!(h.find(Psn::new(0xff_fffe)).is_some());
        assert!(h.find(Psn::new(1)).is_some());
        assert!(h.find(Psn::new(2)).is_none());
        assert!(h.find(Psn::new(0xff_fffd)).is_none());
        h.insert(rec(10, 1));
        h.insert(rec(20, 1));
        assert!(h.find(Psn::new(0xff_fffe)).is_none(), "oldest forgotten");
        assert!(h.find(Psn::new(10)).is_some());
    }

    #[test]
    fn covers_only_a_subset_under_the_same_key() {
        let r = rec(0, 4);
        assert!(r.covers(&reth(0x1000, r.rkey, 4096)));
        assert!(r.covers(&reth(0x1400, r.rkey, 3072)));
        assert!(r.covers(&reth(0x2000, r.rkey, 0)));
        assert!(!r.covers(&reth(0x1000, r.rkey ^ 1, 4096)), "another key");
        assert!(!r.covers(&reth(0x0fff, r.rkey, 1)), "before the range");
        assert!(!r.covers(&reth(0x1400, r.rkey, 3073)), "past the end");
        assert!(!r.covers(&reth(u64::MAX, r.rkey, u32::MAX)));
    }
}
