//! The transmit batch: datagrams built in place (GSO groups of equal segments), with payload
//! pieces lent from registered memory, sent by one `sendmmsg`.

use super::*;

/// One outgoing datagram in a [`TxBatch`]: `nseg` packets of `seg` bytes (the last may be
/// shorter), `len` bytes in all, made of `pieces[first..end]`.
#[derive(Clone, Copy, Debug, Default)]
struct Span {
    len: usize,
    seg: u16,
    nseg: u16,
    first: usize,
    end: usize,
}

/// A piece of a datagram: bytes of the arena, or bytes lent from a registered region (kept in
/// place by one of the batch's guards).
#[derive(Clone, Copy, Debug)]
enum Piece {
    Arena { start: usize, len: usize },
    Lent(LentSlice),
}

/// Lent pieces a batch holds at most before it must be sent (a quarter of a MiB of payload at
/// the largest path MTU: four GSO datagrams per system call): lent bytes stay in place, and
/// changes to their regions wait, until the batch is sent.
const MAX_LENT: usize = 64;

/// Epochs of transmit batches: a batch starts a new one whenever it lets go of its guards.
static NEXT_EPOCH: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);

fn next_epoch() -> u64 {
    NEXT_EPOCH.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
}

/// A transmit arena's bytes. Large arenas are anonymous mappings of their own: their pages
/// stay the kernel's shared zero page until written, so a QP that only ever sends small
/// packets costs a page or two of them, not the whole arena. (A heap allocation of that size,
/// below the allocator's mmap threshold, is zeroed by `calloc`: 64 KiB written per QP, about
/// half of connection set-up time with thousands of QPs.)
enum Arena {
    Heap(Vec<u8>),
    Mapped(memmap2::MmapMut),
}

impl Arena {
    /// Arenas from this size up are mapped.
    const MAP_FROM: usize = 16 << 10;

    fn new(bytes: usize) -> Arena {
        if bytes >= Arena::MAP_FROM
            && let Ok(m) = memmap2::MmapMut::map_anon(bytes)
        {
            return Arena::Mapped(m);
        }
        Arena::Heap(vec![0; bytes])
    }
}

impl std::ops::Deref for Arena {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        match self {
            Arena::Heap(v) => v,
            Arena::Mapped(m) => m,
        }
    }
}

impl std::ops::DerefMut for Arena {
    fn deref_mut(&mut self) -> &mut [u8] {
        match self {
            Arena::Heap(v) => v,
            Arena::Mapped(m) => m,
        }
    }
}

/// A reusable batch of outgoing datagrams. Packets are built in place in its arena
/// ([`TxBatch::push_packet`]), or built there around a payload lent from registered memory
/// ([`TxBatch::push_packet_gather`]), which the kernel then copies straight from the region;
/// consecutive packets to the same destination are coalesced into one GSO datagram when their
/// sizes allow (all but the last of one size, at most [`MAX_GSO_SEGMENTS`], at most
/// [`MAX_DATAGRAM`] bytes).
pub struct TxBatch {
    arena: Arena,
    spans: Vec<Span>,
    pieces: Vec<Piece>,
    /// Guards of the lent pieces (one may cover several pieces).
    lent: Vec<Lent>,
    /// Lent pieces queued.
    nlent: usize,
    /// Changes whenever `lent` is let go of (see [`crate::rc::Gather`]).
    epoch: u64,
    addrs: Vec<SockAddr>,
    dsts: Vec<SocketAddr>,
    iovs: Vec<libc::iovec>,
    cmsgs: Vec<[u8; CMSG_SPACE]>,
    pub(super) hdrs: Vec<libc::mmsghdr>,
    pub(super) len: usize,
    used: usize,
    gso: bool,
    /// Datagrams before this index take no more segments ([`TxBatch::end_datagram`]).
    closed: usize,
}

impl std::fmt::Debug for TxBatch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TxBatch")
            .field("len", &self.len)
            .field("bytes", &self.used)
            .finish()
    }
}

// SAFETY: the raw pointers inside the mmsghdr/iovec arrays only ever point into this batch's
// own vectors, or at bytes its `Lent` guards keep in place, and are rebuilt before every use;
// moving the batch to another thread is sound.
unsafe impl Send for TxBatch {}

impl TxBatch {
    /// A batch of at most `datagrams` datagrams holding at most `bytes` bytes in all.
    pub fn new(datagrams: usize, bytes: usize) -> TxBatch {
        let unspecified: SocketAddr = ([0, 0, 0, 0], 0).into();
        // Every datagram has an arena piece, and every lent packet adds a lent piece and an
        // arena piece (its tail).
        let pieces = datagrams + 2 * MAX_LENT;
        TxBatch {
            arena: Arena::new(bytes),
            spans: vec![Span::default(); datagrams],
            pieces: Vec::with_capacity(pieces),
            lent: Vec::with_capacity(MAX_LENT),
            nlent: 0,
            epoch: next_epoch(),
            addrs: vec![SockAddr::from(unspecified); datagrams],
            dsts: vec![unspecified; datagrams],
            // SAFETY: iovec and mmsghdr are plain C structs for which all-zero is a valid value.
            iovs: vec![unsafe { zeroed() }; pieces],
            cmsgs: vec![[0; CMSG_SPACE]; datagrams],
            // SAFETY: as above.
            hdrs: vec![unsafe { zeroed() }; datagrams],
            len: 0,
            used: 0,
            gso: true,
            closed: 0,
        }
    }

    /// Allow or forbid coalescing packets into GSO datagrams (on by default).
    pub fn set_gso(&mut self, on: bool) {
        self.gso = on;
    }

    /// Datagrams queued.
    pub fn len(&self) -> usize {
        self.len
    }

    /// True when nothing is queued.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Bytes the batch holds when every buffer it reserved is in use: the arena and the
    /// per-datagram and per-piece bookkeeping (for footprint bounds).
    pub fn reserved_bytes(&self) -> usize {
        self.arena.len()
            + self.spans.len() * size_of::<Span>()
            + self.pieces.capacity() * size_of::<Piece>()
            + self.lent.capacity() * size_of::<Lent>()
            + self.addrs.len() * size_of::<SockAddr>()
            + self.dsts.len() * size_of::<SocketAddr>()
            + self.iovs.len() * size_of::<libc::iovec>()
            + self.cmsgs.len() * CMSG_SPACE
            + self.hdrs.len() * size_of::<libc::mmsghdr>()
    }

    /// Bytes still free in the arena.
    pub fn free_bytes(&self) -> usize {
        self.arena.len() - self.used
    }

    /// Drop everything queued (and let go of lent bytes).
    pub fn clear(&mut self) {
        self.len = 0;
        self.closed = 0;
        self.used = 0;
        self.pieces.clear();
        self.nlent = 0;
        if !self.lent.is_empty() {
            self.lent.clear();
            self.epoch = next_epoch();
        }
    }

    /// Queue a copy of `data` to `dst` as one datagram; `segment` > 0 asks for GSO with that
    /// segment size. Returns false, queueing nothing, when the batch is full.
    pub fn push(&mut self, dst: SocketAddr, data: &[u8], segment: u16) -> bool {
        if self.len == self.spans.len() || data.len() > self.free_bytes() {
            return false;
        }
        let start = self.used;
        self.arena[start..start + data.len()].copy_from_slice(data);
        let (seg, nseg) = if segment > 0 && usize::from(segment) < data.len() {
            (segment, data.len().div_ceil(usize::from(segment)) as u16)
        } else {
            (data.len().min(u16::MAX as usize) as u16, 1)
        };
        self.open_span(dst, data.len(), seg, nseg);
        self.add_arena(start, data.len());
        true
    }

    /// Start a datagram (its pieces follow).
    fn open_span(&mut self, dst: SocketAddr, len: usize, seg: u16, nseg: u16) {
        let at = self.pieces.len();
        self.spans[self.len] = Span {
            len,
            seg,
            nseg,
            first: at,
            end: at,
        };
        self.dsts[self.len] = dst;
        self.len += 1;
    }

    /// Append `len` arena bytes at `start` to the last datagram (merged with its last piece
    /// when they are contiguous).
    fn add_arena(&mut self, start: usize, len: usize) {
        let s = &mut self.spans[self.len - 1];
        if s.end > s.first
            && let Some(Piece::Arena { start: ps, len: pl }) = self.pieces.last_mut()
            && *ps + *pl == start
        {
            *pl += len;
        } else {
            self.pieces.push(Piece::Arena { start, len });
            s.end += 1;
        }
        self.used = self.used.max(start + len);
    }

    /// Build one packet to `dst` in place: `build` gets up to `max` bytes and returns how many
    /// it wrote (0: nothing to send). Returns `None` when the batch has no room for `max` more
    /// bytes or another datagram, else `Some((len, k))`: the packet's length and its segment
    /// index in the datagram it joined (k > 0 when coalesced into a GSO datagram, whose k-th
    /// segment the kernel sends with IPv4 identification k).
    pub fn push_packet(
        &mut self,
        dst: SocketAddr,
        max: usize,
        build: impl FnOnce(&mut [u8]) -> usize,
    ) -> Option<(usize, u16)> {
        let mut none = Gather::default();
        self.push_packet_gather(dst, max, &mut none, |buf, _| build(buf))
            .map(|(n, _, k)| (n, k))
    }

    /// [`TxBatch::push_packet`] for a packet whose payload may be lent: `build` gets the
    /// arena space and `gather` (empty), and returns the bytes it wrote to the arena; with
    /// `gather.pieces` left non-empty, the packet is the arena bytes up to `gather.split`, the
    /// pieces, then the rest of the arena bytes (see [`Gather`]), and the batch keeps the
    /// pieces until it is sent or cleared. Returns `Some((wire length, arena length, k))`.
    pub fn push_packet_gather(
        &mut self,
        dst: SocketAddr,
        max: usize,
        gather: &mut Gather,
        build: impl FnOnce(&mut [u8], &mut Gather) -> usize,
    ) -> Option<(usize, usize, u16)> {
        // A free datagram slot is required even when the packet may join the last datagram, so
        // that a packet once built is always queued.
        if !self.has_room(max) {
            return None;
        }
        let start = self.used;
        let joinable = self.gso && self.len > self.closed && {
            let s = self.spans[self.len - 1];
            self.dsts[self.len - 1] == dst
                && usize::from(s.nseg) < MAX_GSO_SEGMENTS
                && s.len == usize::from(s.seg) * usize::from(s.nseg)
                && s.len + max <= MAX_DATAGRAM
        };
        gather.begin(self.epoch);
        let n = build(&mut self.arena[start..start + max], gather).min(max);
        if n == 0 {
            gather.clear();
            return Some((0, 0, 0));
        }
        let wire = n + gather.lent_bytes();
        let k = match joinable {
            true if wire <= usize::from(self.spans[self.len - 1].seg) => {
                let s = &mut self.spans[self.len - 1];
                s.len += wire;
                s.nseg += 1;
                s.nseg - 1
            }
            _ => {
                self.open_span(dst, wire, wire.min(u16::MAX as usize) as u16, 1);
                0
            }
        };
        if gather.is_empty() {
            self.add_arena(start, n);
        } else {
            let split = gather.split.min(n);
            self.add_arena(start, split);
            let span = &mut self.spans[self.len - 1];
            let (pieces, lent, nlent) = (&mut self.pieces, &mut self.lent, &mut self.nlent);
            gather.commit(
                |p| {
                    pieces.push(Piece::Lent(p));
                    *nlent += 1;
                    span.end += 1;
                },
                |g| lent.push(g),
            );
            // The tail is never merged into the header before it: the pieces sit between.
            self.pieces.push(Piece::Arena {
                start: start + split,
                len: n - split,
            });
            self.spans[self.len - 1].end += 1;
            self.used = start + n;
        }
        Some((wire, n, k))
    }

    /// Let the next packet start a datagram of its own rather than join the last one as a
    /// GSO segment.
    pub fn end_datagram(&mut self) {
        self.closed = self.len;
    }

    /// The last `n` bytes of the arena: the packet just pushed (its arena bytes).
    pub fn last_packet_mut(&mut self, n: usize) -> &mut [u8] {
        let end = self.used;
        &mut self.arena[end.saturating_sub(n)..end]
    }

    /// Take back the last packet pushed, of `n` bytes all in the arena (not lent).
    pub fn pop_last_packet(&mut self, n: usize) {
        if self.len == 0 || n > self.used {
            return;
        }
        let Some(Piece::Arena { len: pl, .. }) = self.pieces.last_mut() else {
            return;
        };
        if *pl < n {
            return;
        }
        *pl -= n;
        if *pl == 0 {
            self.pieces.pop();
            self.spans[self.len - 1].end -= 1;
        }
        let s = &mut self.spans[self.len - 1];
        if s.nseg > 1 && s.len >= n {
            s.nseg -= 1;
            s.len -= n;
        } else {
            self.len -= 1;
        }
        self.used -= n;
    }

    /// Packets queued (a GSO datagram counts each segment).
    pub fn packets(&self) -> usize {
        self.spans[..self.len]
            .iter()
            .map(|s| usize::from(s.nseg))
            .sum()
    }

    /// True when a packet of up to `max` bytes (and up to `LEND_MAX_PIECES` lent pieces) can
    /// be pushed without a flush.
    pub fn has_room(&self, max: usize) -> bool {
        max <= self.free_bytes()
            && self.len < self.spans.len()
            && self.nlent + LEND_MAX_PIECES <= MAX_LENT
    }

    /// The queued datagrams as they would go out: bytes, segment size, segments.
    #[cfg(test)]
    pub(super) fn datagrams(&mut self) -> Vec<(Vec<u8>, u16, u16)> {
        self.gathered()
            .into_iter()
            .map(|(_, bytes, seg, nseg)| (bytes, seg, nseg))
            .collect()
    }

    /// Take the queued datagrams, their pieces gathered into one buffer each (what a memory
    /// port sends, or a test's recording [`EndpointIo`](crate::net::EndpointIo)): destination, bytes and segment size (the whole length for a lone
    /// packet). The batch is empty afterwards.
    pub fn take_datagrams(&mut self) -> Vec<(SocketAddr, Vec<u8>, usize)> {
        let out = self
            .gathered()
            .into_iter()
            .map(|(dst, bytes, seg, nseg)| {
                let seg = if nseg > 1 {
                    usize::from(seg)
                } else {
                    bytes.len()
                };
                (dst, bytes, seg)
            })
            .collect();
        self.clear();
        out
    }

    /// The queued datagrams, gathered: destination, bytes, segment size, segments.
    fn gathered(&mut self) -> Vec<(SocketAddr, Vec<u8>, u16, u16)> {
        self.prepare(0);
        (0..self.len)
            .map(|i| {
                let s = self.spans[i];
                let mut bytes = Vec::with_capacity(s.len);
                for v in &self.iovs[s.first..s.end] {
                    // SAFETY: `prepare` pointed every iovec at live arena bytes or at bytes a
                    // `Lent` of this batch keeps in place, with their true lengths.
                    let b =
                        unsafe { std::slice::from_raw_parts(v.iov_base.cast::<u8>(), v.iov_len) };
                    bytes.extend_from_slice(b);
                }
                (self.dsts[i], bytes, s.seg, s.nseg)
            })
            .collect()
    }

    pub(super) fn prepare(&mut self, from: usize) {
        if self.iovs.len() < self.pieces.len() {
            // SAFETY: iovec is a plain C struct for which all-zero is a valid value.
            self.iovs.resize(self.pieces.len(), unsafe { zeroed() });
        }
        for i in from..self.len {
            let Span {
                seg,
                nseg,
                first,
                end,
                ..
            } = self.spans[i];
            for k in first..end {
                self.iovs[k] = match self.pieces[k] {
                    Piece::Arena { start, len } => libc::iovec {
                        iov_base: self.arena[start..].as_mut_ptr().cast(),
                        iov_len: len,
                    },
                    Piece::Lent(p) => p.iovec(),
                };
            }
            if self.addrs[i].as_socket() != Some(self.dsts[i]) {
                self.addrs[i] = SockAddr::from(self.dsts[i]);
            }
            let h = &mut self.hdrs[i].msg_hdr;
            h.msg_name = self.addrs[i].as_ptr() as *mut libc::c_void;
            h.msg_namelen = self.addrs[i].len();
            h.msg_iov = self.iovs[first..].as_mut_ptr();
            h.msg_iovlen = end - first;
            h.msg_flags = 0;
            if nseg > 1 {
                let c = &mut self.cmsgs[i];
                h.msg_control = c.as_mut_ptr().cast();
                // SAFETY: CMSG_SPACE of a u16 is a constant no larger than CMSG_SPACE bytes.
                h.msg_controllen = unsafe { libc::CMSG_SPACE(size_of::<u16>() as u32) } as usize;
                // SAFETY: msg_control points at `c`, large enough for one cmsghdr carrying a u16,
                // so CMSG_FIRSTHDR is non-null and CMSG_DATA stays inside `c`.
                unsafe {
                    let cm = libc::CMSG_FIRSTHDR(h);
                    (*cm).cmsg_level = libc::SOL_UDP;
                    (*cm).cmsg_type = UDP_SEGMENT;
                    (*cm).cmsg_len = libc::CMSG_LEN(size_of::<u16>() as u32) as usize;
                    std::ptr::write_unaligned(libc::CMSG_DATA(cm).cast::<u16>(), seg);
                }
            } else {
                h.msg_control = std::ptr::null_mut();
                h.msg_controllen = 0;
            }
        }
    }
}
