//! Lending registered bytes to the transmit path: zero-copy sends.
//!
//! A request's payload normally reaches the wire in two copies: from the region into the
//! engine's transmit buffer, and from there into the kernel's socket buffer. Memory the engine
//! keeps alive ([`CopyMode::Plain`](super::copy::CopyMode)) can skip the first: the transport
//! checksums the bytes where they lie (reading them as memory other threads may be writing,
//! [`read_shared`](super::copy::read_shared)) and hands the socket an `iovec` that points
//! into the region.
//! The kernel copies them during `sendmmsg`, after the access has been validated and the
//! region's lock released, so the access stays "in flight" until then through a [`Lent`]
//! guard, which counts in the region's `lent` counter.
//!
//! Operations that change what a region's bytes are or whether they may be read
//! (deregister, invalidate, suspend, resume, re-register) first change the state under the
//! region's write lock, as always, and then wait, holding no lock, until nothing lent from the
//! region is outstanding. Lenders never wait for such an operation while holding a guard (they
//! take only read locks, which the operation has released by then), so the wait ends as soon
//! as the datagrams queued by the lender have been sent: microseconds.
//!
//! Memory the application may unmap at any moment (raw regions, copied with checked copies) is
//! never lent where it lies: the checksum would have to read it unprotected. It is *staged*
//! instead (`Lent::staged`): one checked copy moves as much of a message as the
//! transport is about to send (up to [`STAGE_MAX`] bytes) into a buffer of the engine's, which
//! is then lent like region bytes, so that the packets cut from it cost no system call of
//! their own. A vanished page fails that copy, as it fails any checked copy.

use std::sync::Arc;
use std::sync::atomic::Ordering;

use super::copy;
use super::region::Mr;

/// Most bytes one staged lend copies (the size of a staging buffer): 16 packets at the largest
/// path MTU.
pub const STAGE_MAX: usize = 64 << 10;

/// Staging buffers kept for reuse (a process-wide pool; 4 MiB at most).
const STAGE_POOL: usize = 64;

static STAGE_BUFFERS: std::sync::Mutex<Vec<Box<[u8]>>> = std::sync::Mutex::new(Vec::new());

/// A staging buffer of [`STAGE_MAX`] bytes, back to the pool when dropped.
struct Staging(Box<[u8]>);

impl Staging {
    fn take() -> Staging {
        let pooled = STAGE_BUFFERS
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .pop();
        Staging(pooled.unwrap_or_else(|| vec![0u8; STAGE_MAX].into_boxed_slice()))
    }
}

impl Drop for Staging {
    fn drop(&mut self) {
        let mut pool = STAGE_BUFFERS
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if pool.len() < STAGE_POOL {
            pool.push(std::mem::take(&mut self.0));
        }
    }
}

/// What keeps lent bytes in place.
enum Owner {
    /// Bytes of a region: its `lent` count.
    Region(Arc<Mr>),
    /// A copy of the engine's own.
    Staged { _buf: Staging },
}

/// Bytes of a region lent to the transmit path; while it lives, the region's backing stays in
/// place (see the module documentation). Or a staged copy of them (`Lent::staged`).
pub struct Lent {
    owner: Owner,
    ptr: *const u8,
    len: usize,
}

// SAFETY: `ptr` names `len` bytes of a region's backing that stays mapped while the guard
// lives (the region's `lent` count keeps deregistration and backing changes waiting), or of a
// staging buffer the guard owns; reading them from another thread is what every access does.
unsafe impl Send for Lent {}
// SAFETY: as above; a shared `Lent` only reads.
unsafe impl Sync for Lent {}

impl std::fmt::Debug for Lent {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Lent({:p}, {})", self.ptr, self.len)
    }
}

impl Lent {
    /// Lend `len` bytes at `ptr` of `mr`. Call with the region's state read-locked and the
    /// range validated; the count is raised before the lock is released.
    pub(crate) fn new(mr: &Arc<Mr>, ptr: *const u8, len: usize) -> Lent {
        mr.lent.fetch_add(1, Ordering::AcqRel);
        Lent {
            owner: Owner::Region(Arc::clone(mr)),
            ptr,
            len,
        }
    }

    /// Stage `len` bytes (at most [`STAGE_MAX`]): `fill` copies them into a staging buffer,
    /// which is lent instead of region bytes. `None` when `len` is larger than a buffer; an
    /// error of `fill` is returned as it is.
    pub(crate) fn staged<E>(
        len: usize,
        fill: impl FnOnce(&mut [u8]) -> Result<(), E>,
    ) -> Result<Option<Lent>, E> {
        if len > STAGE_MAX {
            return Ok(None);
        }
        let mut buf = Staging::take();
        let bytes = buf.0.get_mut(..len).unwrap_or_default();
        fill(bytes)?;
        let ptr = buf.0.as_ptr();
        Ok(Some(Lent {
            owner: Owner::Staged { _buf: buf },
            ptr,
            len,
        }))
    }

    /// True for a staged copy (bytes no one else writes).
    fn is_staged(&self) -> bool {
        matches!(self.owner, Owner::Staged { .. })
    }

    /// Bytes lent.
    pub fn len(&self) -> usize {
        self.len
    }

    /// True when no byte is lent.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Feed the bytes to a CRC (the packet's ICRC).
    pub fn crc_update(&self, h: &mut crc32fast::Hasher) {
        // SAFETY: the whole lent range, while its guard (`self`) lives.
        unsafe { self.whole().crc_update(h) }
    }

    /// The bytes as an `iovec` for `sendmmsg` (valid while `self` lives).
    pub fn iovec(&self) -> libc::iovec {
        self.whole().iovec()
    }

    /// All the lent bytes, as a [`LentSlice`] valid while `self` lives.
    pub fn whole(&self) -> LentSlice {
        LentSlice {
            ptr: self.ptr,
            len: self.len,
            private: self.is_staged(),
        }
    }
}

/// Bytes inside a lent range, named without a guard of their own: they stay in place while
/// the [`Lent`] they were cut from lives. Whoever holds one keeps that guard alive as long
/// (a transmit batch holds the guards of every slice it sends). One lend can so cover the
/// payloads of many packets: the region's locks and counts are taken once, not per packet.
#[derive(Clone, Copy, Debug)]
pub struct LentSlice {
    ptr: *const u8,
    len: usize,
    /// Cut from a staged copy: nobody writes the bytes while the guard lives.
    private: bool,
}

// SAFETY: a plain address range; reading through it requires the guard it was cut from
// (`crc_update` is unsafe for that reason), which is `Send` and `Sync` itself.
unsafe impl Send for LentSlice {}
// SAFETY: as above.
unsafe impl Sync for LentSlice {}

impl LentSlice {
    /// Bytes named.
    pub fn len(&self) -> usize {
        self.len
    }

    /// True when no byte is named.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The `len` bytes at `off` of this slice, or `None` when they lie outside it.
    pub fn sub(&self, off: usize, len: usize) -> Option<LentSlice> {
        let end = off.checked_add(len)?;
        (end <= self.len).then(|| LentSlice {
            ptr: self.ptr.wrapping_add(off),
            len,
            private: self.private,
        })
    }

    /// Feed the bytes to a CRC (the packet's ICRC).
    ///
    /// # Safety
    /// The [`Lent`] this slice was cut from must still be alive.
    pub unsafe fn crc_update(&self, h: &mut crc32fast::Hasher) {
        if self.private {
            // SAFETY: bytes of a staging buffer that the guard this slice was cut from owns
            // (alive, per the caller) and that nothing writes after staging.
            h.update(unsafe { std::slice::from_raw_parts(self.ptr, self.len) });
            return;
        }
        // SAFETY: `ptr..ptr+len` lies in a range validated inside a live region whose backing
        // the engine keeps mapped (plain memory) and cannot replace or release while the
        // guard it was cut from is outstanding, which the caller guarantees. The application
        // (or a placement of the engine) may write the bytes concurrently, as on any NIC, so
        // they are copied by byte-wise atomic loads into a buffer first, never read through a
        // slice: the checksum then covers some mix of old and new bytes, and a packet whose
        // bytes change before the kernel copies them fails its ICRC at the receiver and is
        // sent again.
        unsafe { copy::read_shared(self.ptr, self.len, |b| h.update(b)) }
    }

    /// The bytes as an `iovec` for `sendmmsg` (valid while the guard it was cut from lives).
    pub fn iovec(&self) -> libc::iovec {
        libc::iovec {
            iov_base: self.ptr as *mut libc::c_void,
            iov_len: self.len,
        }
    }
}

impl Drop for Lent {
    fn drop(&mut self) {
        if let Owner::Region(mr) = &self.owner {
            mr.lent.fetch_sub(1, Ordering::AcqRel);
        }
    }
}

impl Mr {
    /// Wait until nothing lent from this region is outstanding. Call holding no lock of the
    /// memory table, after changing the region's state under its write lock.
    pub(crate) fn wait_unlent(&self) {
        let mut spins = 0u32;
        while self.lent.load(Ordering::Acquire) != 0 {
            spins += 1;
            if spins < 64 {
                std::hint::spin_loop();
            } else if spins < 256 {
                std::thread::yield_now();
            } else {
                std::thread::sleep(std::time::Duration::from_micros(20));
            }
        }
    }
}
