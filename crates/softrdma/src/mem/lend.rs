//! Lending registered bytes to the transmit path: zero-copy sends.
//!
//! A request's payload normally reaches the wire in two copies: from the region into the
//! engine's transmit buffer, and from there into the kernel's socket buffer. Memory the engine
//! keeps alive ([`CopyMode::Plain`](super::copy::CopyMode)) can skip the first: the transport
//! checksums the bytes in place and hands the socket an `iovec` that points into the region.
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
//! Memory the application may unmap at any moment (raw regions, copied with kernel checks) is
//! never lent: the checksum would have to read it unprotected.

use std::sync::Arc;
use std::sync::atomic::Ordering;

use super::region::Mr;

/// Bytes of a region lent to the transmit path; while it lives, the region's backing stays in
/// place (see the module documentation).
pub struct Lent {
    mr: Arc<Mr>,
    ptr: *const u8,
    len: usize,
}

// SAFETY: `ptr` names `len` bytes of a region's backing that stays mapped while the guard
// lives (the region's `lent` count keeps deregistration and backing changes waiting); reading
// them from another thread is what every access does.
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
            mr: Arc::clone(mr),
            ptr,
            len,
        }
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
        if self.len == 0 {
            return;
        }
        // SAFETY: `ptr..ptr+len` was validated inside a live region whose backing the engine
        // keeps mapped (plain memory) and cannot replace or release while this guard is
        // outstanding. The application may write the bytes concurrently, as on any NIC: the
        // checksum then covers some mix of old and new bytes, and a packet whose bytes change
        // before the kernel copies them fails its ICRC at the receiver and is sent again.
        let s = unsafe { std::slice::from_raw_parts(self.ptr, self.len) };
        h.update(s);
    }

    /// The bytes as an `iovec` for `sendmmsg` (valid while `self` lives).
    pub fn iovec(&self) -> libc::iovec {
        libc::iovec {
            iov_base: self.ptr as *mut libc::c_void,
            iov_len: self.len,
        }
    }
}

impl Drop for Lent {
    fn drop(&mut self) {
        self.mr.lent.fetch_sub(1, Ordering::AcqRel);
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
