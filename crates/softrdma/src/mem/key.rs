//! Memory keys: layout and allocation.
//!
//! An L_Key/R_Key is 32 bits: a 24-bit **index** (bits 31..8) that names a slot of the key
//! table, so a lookup is one array access, and an 8-bit **tag** (bits 7..0) that the owner may
//! change (`ibv_inc_rkey`). Both parts are unpredictable: the index of a new key is drawn at
//! random among the free slots, and its tag at random among the tags that slot has not used in
//! the current cycle. A tag is therefore not handed out again on the same index until all 256
//! have been used (the key space of that index has cycled). Randomness comes from the operating
//! system's CSPRNG (`getrandom`), buffered in a small pool; this runs on the registration path,
//! never on the data path.

use super::MemError;

/// Bits of the tag part of a key.
pub const KEY_TAG_BITS: u32 = 8;
/// Largest index a key can carry (24 bits).
pub const MAX_KEY_INDEX: u32 = (1 << (32 - KEY_TAG_BITS)) - 1;

/// The index part of `key` (its slot in the key table).
pub const fn key_index(key: u32) -> u32 {
    key >> KEY_TAG_BITS
}

/// The tag part of `key` (the 8 bits the owner may change).
pub const fn key_tag(key: u32) -> u8 {
    key as u8
}

/// Compose a key from its index and tag.
pub const fn make_key(index: u32, tag: u8) -> u32 {
    (index << KEY_TAG_BITS) | tag as u32
}

/// Bytes from the OS CSPRNG, fetched in blocks to amortise the system call.
pub(crate) struct RandomPool {
    buf: [u8; 256],
    pos: usize,
}

impl RandomPool {
    pub(crate) fn new() -> RandomPool {
        RandomPool {
            buf: [0; 256],
            pos: 256,
        }
    }

    /// A uniformly random u32 from the CSPRNG.
    pub(crate) fn next_u32(&mut self) -> Result<u32, MemError> {
        if self.pos + 4 > self.buf.len() {
            getrandom::fill(&mut self.buf).map_err(|e| MemError::Os {
                op: "getrandom",
                errno: e.raw_os_error().unwrap_or(0),
            })?;
            self.pos = 0;
        }
        let mut b = [0u8; 4];
        b.copy_from_slice(&self.buf[self.pos..self.pos + 4]);
        // Consumed bytes are wiped so they cannot be recovered from the pool later.
        self.buf[self.pos..self.pos + 4].fill(0);
        self.pos += 4;
        Ok(u32::from_ne_bytes(b))
    }

    /// A random value in `0..n` (`n > 0`), by rejection so it is unbiased.
    pub(crate) fn below(&mut self, n: u32) -> Result<u32, MemError> {
        debug_assert!(n > 0);
        let n = n.max(1);
        let zone = u32::MAX - (u32::MAX % n);
        loop {
            let r = self.next_u32()?;
            if r < zone {
                return Ok(r % n);
            }
        }
    }
}

/// Tags one index has handed out in the current cycle (a 256-bit set).
#[derive(Clone, Copy, Default)]
struct TagSet([u64; 4]);

impl TagSet {
    fn contains(&self, t: u8) -> bool {
        self.0[(t >> 6) as usize] & (1 << (t & 63)) != 0
    }
    fn insert(&mut self, t: u8) {
        self.0[(t >> 6) as usize] |= 1 << (t & 63);
    }
    fn len(&self) -> u32 {
        self.0.iter().map(|w| w.count_ones()).sum()
    }
    /// The `k`-th tag (0-based, ascending) not in the set.
    fn nth_free(&self, k: u32) -> Option<u8> {
        let mut k = k;
        for t in 0..=255u8 {
            if !self.contains(t) {
                if k == 0 {
                    return Some(t);
                }
                k -= 1;
            }
        }
        None
    }
}

/// Hands out key indices and tags. Lives under the table's allocation mutex.
pub(crate) struct KeyAllocator {
    /// Free indices, in no particular order; a new key takes a random one.
    free: Vec<u32>,
    /// Per index (position = index - 1): tags used in its current cycle.
    used: Vec<TagSet>,
    rng: RandomPool,
}

impl KeyAllocator {
    /// An allocator for indices `1..=capacity` (index 0 is never used, so no key is below 256).
    pub(crate) fn new(capacity: u32) -> KeyAllocator {
        KeyAllocator {
            free: (1..=capacity).collect(),
            used: vec![TagSet::default(); capacity as usize],
            rng: RandomPool::new(),
        }
    }

    /// A new key on a random free index.
    pub(crate) fn alloc(&mut self) -> Result<Option<u32>, MemError> {
        if self.free.is_empty() {
            return Ok(None);
        }
        let pos = self.rng.below(self.free.len() as u32)? as usize;
        let index = self.free.swap_remove(pos);
        match self.fresh_tag(index, None) {
            Ok(tag) => Ok(Some(make_key(index, tag))),
            Err(e) => {
                self.free.push(index);
                Err(e)
            }
        }
    }

    /// A new key for the index of `key` (type 1 window rebind), never equal to `key`.
    pub(crate) fn retag(&mut self, key: u32) -> Result<u32, MemError> {
        let index = key_index(key);
        let tag = self.fresh_tag(index, Some(key_tag(key)))?;
        Ok(make_key(index, tag))
    }

    /// Record a tag the consumer chose (type 2 window bind with `ibv_inc_rkey`).
    pub(crate) fn note(&mut self, key: u32) {
        if let Some(set) = self.used.get_mut(key_index(key) as usize - 1) {
            set.insert(key_tag(key));
        }
    }

    /// Return an index to the free pool.
    pub(crate) fn release(&mut self, key: u32) {
        self.free.push(key_index(key));
    }

    fn fresh_tag(&mut self, index: u32, avoid: Option<u8>) -> Result<u8, MemError> {
        let Some(set) = self.used.get_mut(index as usize - 1) else {
            return Err(MemError::InvalidKey(make_key(index, 0)));
        };
        if set.len() >= 256 {
            // The key space of this index has cycled: start again, except the tag in use.
            *set = TagSet::default();
            if let Some(a) = avoid {
                set.insert(a);
            }
        }
        let free = 256 - set.len();
        let k = self.rng.below(free)?;
        let tag = set.nth_free(k).unwrap_or(0);
        set.insert(tag);
        Ok(tag)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn layout_round_trips() {
        let k = make_key(0x12_3456, 0x9a);
        assert_eq!(k, 0x1234_569a);
        assert_eq!(key_index(k), 0x12_3456);
        assert_eq!(key_tag(k), 0x9a);
    }

    #[test]
    fn tags_do_not_repeat_until_cycle() {
        let mut a = KeyAllocator::new(1);
        let mut seen = std::collections::HashSet::new();
        let mut key = a.alloc().unwrap().unwrap();
        seen.insert(key_tag(key));
        for _ in 0..255 {
            a.release(key);
            key = a.alloc().unwrap().unwrap();
            assert!(
                seen.insert(key_tag(key)),
                "tag reused before the cycle ended"
            );
        }
        assert_eq!(seen.len(), 256);
        // Cycled: the next key differs from the current one.
        let next = a.retag(key).unwrap();
        assert_ne!(next, key);
    }

    #[test]
    fn keys_are_not_sequential() {
        let mut a = KeyAllocator::new(4096);
        let keys: Vec<u32> = (0..64).map(|_| a.alloc().unwrap().unwrap()).collect();
        let sequential = keys
            .windows(2)
            .filter(|w| w[1].wrapping_sub(w[0]) == 1 || key_index(w[1]) == key_index(w[0]) + 1)
            .count();
        assert!(sequential < 4, "keys look sequential: {keys:x?}");
        let set: std::collections::HashSet<_> = keys.iter().map(|k| key_index(*k)).collect();
        assert_eq!(set.len(), 64);
        assert!(
            keys.iter()
                .all(|k| key_index(*k) >= 1 && key_index(*k) <= 4096)
        );
    }

    #[test]
    fn exhaustion_is_reported() {
        let mut a = KeyAllocator::new(2);
        assert!(a.alloc().unwrap().is_some());
        assert!(a.alloc().unwrap().is_some());
        assert!(a.alloc().unwrap().is_none());
    }
}
