//! Memory keys: layout and allocation.
//!
//! An L_Key/R_Key is 32 bits: a 24-bit **index** (bits 31..8) and an 8-bit **tag** (bits 7..0)
//! that the owner may change (`ibv_inc_rkey`). The index is itself two parts: its low bits
//! name a **slot** of the key table (as many bits as the table's size needs), so a lookup is
//! one array access, and the bits above them are a **salt** drawn at random for each key and
//! kept in the slot's entry. Every part is unpredictable: the slot of a new key is drawn at
//! random among the free slots, its salt uniformly, and its tag at random among the tags that
//! slot has not used in the current cycle. A tag is therefore not handed out again on the same
//! slot until all 256 have been used (the key space of that slot has cycled).
//!
//! With the default table of 2^16 - 1 slots, a key carries 32 bits of entropy (16 slot bits,
//! 8 salt bits and 8 tag bits): a peer guessing keys blindly hits one of `n` live keys with
//! probability `n / 2^32` per guess. Randomness comes from the operating system's CSPRNG (`getrandom`),
//! buffered in a small pool; this runs on the registration path, never on the data path.

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

/// Bits of the slot part of a key index for a table of `capacity` slots (indices
/// `1..=capacity`); the index bits above them are salt.
pub const fn slot_bits(capacity: u32) -> u32 {
    32 - capacity.leading_zeros()
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
    /// Free slots, in no particular order; a new key takes a random one.
    free: Vec<u32>,
    /// Per slot (position = slot - 1): tags used in its current cycle.
    used: Vec<TagSet>,
    /// Bits of the key index that name the slot; the rest is salt.
    slot_bits: u32,
    rng: RandomPool,
}

impl KeyAllocator {
    /// An allocator for slots `1..=capacity` (slot 0 is never used, so no key is below 256),
    /// `capacity < 2^24`.
    pub(crate) fn new(capacity: u32) -> KeyAllocator {
        KeyAllocator {
            free: (1..=capacity).collect(),
            used: vec![TagSet::default(); capacity as usize],
            slot_bits: slot_bits(capacity),
            rng: RandomPool::new(),
        }
    }

    /// The slot `key` names (its index without the salt).
    pub(crate) fn slot_of(&self, key: u32) -> u32 {
        key_index(key) & ((1 << self.slot_bits) - 1)
    }

    /// A key index for `slot` with fresh random salt.
    fn salted(&mut self, slot: u32) -> Result<u32, MemError> {
        let salt_bits = 32 - KEY_TAG_BITS - self.slot_bits;
        let salt = if salt_bits == 0 {
            0
        } else {
            self.rng.below(1 << salt_bits)?
        };
        Ok((salt << self.slot_bits) | slot)
    }

    /// A new key on a random free slot.
    pub(crate) fn alloc(&mut self) -> Result<Option<u32>, MemError> {
        if self.free.is_empty() {
            return Ok(None);
        }
        let pos = self.rng.below(self.free.len() as u32)? as usize;
        let slot = self.free.swap_remove(pos);
        match self.fresh_key(slot, None) {
            Ok(key) => Ok(Some(key)),
            Err(e) => {
                self.free.push(slot);
                Err(e)
            }
        }
    }

    /// A new key for the slot of `key` (type 1 window rebind, re-registration): fresh salt
    /// and a fresh tag, never equal to `key`.
    pub(crate) fn retag(&mut self, key: u32) -> Result<u32, MemError> {
        self.fresh_key(self.slot_of(key), Some(key_tag(key)))
    }

    /// Record a tag the consumer chose (type 2 window bind with `ibv_inc_rkey`).
    pub(crate) fn note(&mut self, key: u32) {
        let slot = self.slot_of(key) as usize;
        if let Some(set) = slot.checked_sub(1).and_then(|i| self.used.get_mut(i)) {
            set.insert(key_tag(key));
        }
    }

    /// Return the slot of `key` to the free pool.
    pub(crate) fn release(&mut self, key: u32) {
        self.free.push(self.slot_of(key));
    }

    fn fresh_key(&mut self, slot: u32, avoid: Option<u8>) -> Result<u32, MemError> {
        let tag = self.fresh_tag(slot, avoid)?;
        Ok(make_key(self.salted(slot)?, tag))
    }

    fn fresh_tag(&mut self, slot: u32, avoid: Option<u8>) -> Result<u8, MemError> {
        let Some(set) = (slot as usize)
            .checked_sub(1)
            .and_then(|i| self.used.get_mut(i))
        else {
            return Err(MemError::InvalidKey(make_key(slot, 0)));
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
                .all(|k| a.slot_of(*k) >= 1 && a.slot_of(*k) <= 4096)
        );
    }

    /// With the default table (2^16 - 1 slots) every bit of a key varies: 16 slot bits, 8
    /// salt bits and 8 tag bits. Each of the 32 bits must be set in roughly half of 4,000
    /// keys (a bit that never or always varies is a bit of lost entropy).
    #[test]
    fn every_key_bit_is_random() {
        let mut a = KeyAllocator::new((1 << 16) - 1);
        assert_eq!(a.slot_bits, 16);
        let mut ones = [0u32; 32];
        let n = 4000;
        for _ in 0..n {
            let k = a.alloc().unwrap().unwrap();
            for (b, c) in ones.iter_mut().enumerate() {
                *c += (k >> b) & 1;
            }
            a.release(k);
        }
        for (b, c) in ones.iter().enumerate() {
            assert!(
                (1600..=2400).contains(c),
                "key bit {b} set in {c} of {n} keys"
            );
        }
    }

    /// A re-tagged key keeps its slot but changes salt and tag; a released slot's next key
    /// differs from the old one.
    #[test]
    fn retag_keeps_the_slot() {
        let mut a = KeyAllocator::new(16);
        let k = a.alloc().unwrap().unwrap();
        let salts: std::collections::HashSet<u32> = (0..64)
            .map(|_| {
                let n = a.retag(k).unwrap();
                assert_eq!(a.slot_of(n), a.slot_of(k));
                assert_ne!(n, k);
                key_index(n) >> 5
            })
            .collect();
        assert!(salts.len() > 32, "salt does not vary: {salts:?}");
    }

    #[test]
    fn exhaustion_is_reported() {
        let mut a = KeyAllocator::new(2);
        assert!(a.alloc().unwrap().is_some());
        assert!(a.alloc().unwrap().is_some());
        assert!(a.alloc().unwrap().is_none());
    }
}
