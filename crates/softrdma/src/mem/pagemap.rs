//! Reference counts of pinned pages, kept as an interval map.
//!
//! A registration of N pages touches O(number of overlapping intervals) entries instead of N,
//! so pinning a 1 GiB region costs a few map operations on top of the `mlock` itself.
//! Intervals are disjoint, half-open page ranges `[start, end)` with a non-zero count; adjacent
//! intervals with equal counts are merged after each change.

use std::collections::BTreeMap;

/// Half-open range of page numbers.
pub(crate) type PageRange = (u64, u64);

/// Page number → (end page, reference count) for every page pinned at least once.
#[derive(Default, Debug)]
pub(crate) struct PageMap {
    map: BTreeMap<u64, (u64, u32)>,
    pages: u64,
}

impl PageMap {
    /// An empty map.
    pub(crate) const fn new() -> PageMap {
        PageMap {
            map: BTreeMap::new(),
            pages: 0,
        }
    }

    /// Number of pages with a non-zero count.
    pub(crate) fn pages(&self) -> u64 {
        self.pages
    }

    /// Number of intervals (for tests and sanity checks).
    #[cfg(test)]
    pub(crate) fn intervals(&self) -> usize {
        self.map.len()
    }

    /// Pages of `[s, e)` whose count is zero, as coalesced ranges.
    pub(crate) fn gaps(&self, s: u64, e: u64) -> Vec<PageRange> {
        let mut out = Vec::new();
        let mut cursor = s;
        for (a, b) in self.overlapping(s, e) {
            if cursor < a {
                out.push((cursor, a));
            }
            cursor = cursor.max(b);
        }
        if cursor < e {
            out.push((cursor, e));
        }
        out
    }

    /// Count of page `p` (0 when absent).
    #[cfg(test)]
    pub(crate) fn count(&self, p: u64) -> u32 {
        match self.map.range(..=p).next_back() {
            Some((_, &(b, c))) if b > p => c,
            _ => 0,
        }
    }

    /// Add one reference to every page of `[s, e)`.
    pub(crate) fn add(&mut self, s: u64, e: u64) {
        if s >= e {
            return;
        }
        self.split(s);
        self.split(e);
        let inside: Vec<(u64, u64)> = self.map.range(s..e).map(|(&a, &(b, _))| (a, b)).collect();
        let mut cursor = s;
        for (a, b) in inside {
            if cursor < a {
                self.map.insert(cursor, (a, 1));
                self.pages += a - cursor;
            }
            if let Some(v) = self.map.get_mut(&a) {
                v.1 = v.1.saturating_add(1);
            }
            cursor = b;
        }
        if cursor < e {
            self.map.insert(cursor, (e, 1));
            self.pages += e - cursor;
        }
        self.merge_around(s, e);
    }

    /// Remove one reference from every page of `[s, e)` (which must all be counted) and
    /// return the coalesced ranges whose count reached zero.
    pub(crate) fn sub(&mut self, s: u64, e: u64) -> Vec<PageRange> {
        let mut freed: Vec<PageRange> = Vec::new();
        if s >= e {
            return freed;
        }
        self.split(s);
        self.split(e);
        let inside: Vec<u64> = self.map.range(s..e).map(|(&a, _)| a).collect();
        for a in inside {
            let Some(&(b, c)) = self.map.get(&a) else {
                continue;
            };
            debug_assert!(c > 0);
            if c <= 1 {
                self.map.remove(&a);
                self.pages -= b - a;
                match freed.last_mut() {
                    Some(last) if last.1 == a => last.1 = b,
                    _ => freed.push((a, b)),
                }
            } else if let Some(v) = self.map.get_mut(&a) {
                v.1 = c - 1;
            }
        }
        self.merge_around(s, e);
        freed
    }

    /// Intervals overlapping `[s, e)`, clipped to it, in order.
    fn overlapping(&self, s: u64, e: u64) -> impl Iterator<Item = (u64, u64)> + '_ {
        let before = self
            .map
            .range(..s)
            .next_back()
            .filter(|(_, (b, _))| *b > s)
            .map(|(_, &(b, _))| (s, b.min(e)));
        let within = self.map.range(s..e).map(move |(&a, &(b, _))| (a, b.min(e)));
        before.into_iter().chain(within)
    }

    /// Make `p` an interval boundary.
    fn split(&mut self, p: u64) {
        let hit = self
            .map
            .range(..p)
            .next_back()
            .filter(|(_, (b, _))| *b > p)
            .map(|(&a, &(b, c))| (a, b, c));
        if let Some((a, b, c)) = hit {
            self.map.insert(a, (p, c));
            self.map.insert(p, (b, c));
        }
    }

    /// Merge equal-count neighbours from the interval before `s` through the one at `e`.
    fn merge_around(&mut self, s: u64, e: u64) {
        let start = self
            .map
            .range(..s)
            .next_back()
            .map(|(&a, _)| a)
            .unwrap_or(s);
        let keys: Vec<u64> = self.map.range(start..=e).map(|(&a, _)| a).collect();
        let mut prev: Option<u64> = None;
        for a in keys {
            let Some(&(b, c)) = self.map.get(&a) else {
                continue;
            };
            if let Some(p) = prev
                && let Some(&(pb, pc)) = self.map.get(&p)
                && pb == a
                && pc == c
            {
                self.map.remove(&a);
                self.map.insert(p, (b, c));
                continue;
            }
            prev = Some(a);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn overlap_counts_once() {
        let mut m = PageMap::default();
        assert_eq!(m.gaps(10, 20), vec![(10, 20)]);
        m.add(10, 20);
        assert_eq!(m.gaps(5, 25), vec![(5, 10), (20, 25)]);
        m.add(15, 25);
        assert_eq!(m.pages(), 15);
        assert_eq!(m.count(16), 2);
        assert_eq!(m.sub(10, 20), vec![(10, 15)]);
        assert_eq!(m.sub(15, 25), vec![(15, 25)]);
        assert_eq!(m.pages(), 0);
        assert_eq!(m.intervals(), 0);
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(256))]
        /// The interval map agrees with a page-by-page model for any add/sub sequence.
        #[test]
        fn matches_model(ops in proptest::collection::vec((0u64..64, 1u64..16, any::<bool>()), 1..60)) {
            let mut m = PageMap::default();
            let mut model = [0u32; 80];
            let mut live: Vec<(u64, u64)> = Vec::new();
            for (s, n, add) in ops {
                if add || live.is_empty() {
                    let (s, e) = (s, s + n);
                    let gaps = m.gaps(s, e);
                    let model_gaps: u64 = (s..e).filter(|p| model[*p as usize] == 0).count() as u64;
                    prop_assert_eq!(gaps.iter().map(|(a, b)| b - a).sum::<u64>(), model_gaps);
                    m.add(s, e);
                    for p in s..e { model[p as usize] += 1; }
                    live.push((s, e));
                } else {
                    let (s, e) = live.swap_remove((s as usize) % live.len());
                    let freed = m.sub(s, e);
                    let mut expect = Vec::new();
                    for p in s..e {
                        model[p as usize] -= 1;
                        if model[p as usize] == 0 { expect.push(p); }
                    }
                    let got: Vec<u64> = freed.iter().flat_map(|&(a, b)| a..b).collect();
                    prop_assert_eq!(got, expect);
                }
                for p in 0..80u64 { prop_assert_eq!(m.count(p), model[p as usize]); }
                prop_assert_eq!(m.pages(), model.iter().filter(|c| **c > 0).count() as u64);
            }
            for (s, e) in live { m.sub(s, e); }
            prop_assert_eq!(m.pages(), 0);
            prop_assert_eq!(m.intervals(), 0);
        }
    }
}
