//! Payloads sent from registered memory without copying them (zero-copy), one lend for many
//! packets.
//!
//! A request or READ response payload from memory the engine keeps mapped is lent to the
//! socket ([`crate::mem::Lent`]): the packet is built around it, and the kernel copies the
//! bytes during `sendmmsg`. Lending validates the range and counts it against the region
//! under the region's locks; done per packet, that bookkeeping cost more than the packet's
//! header. So the first packet of a message lends the rest of its scatter/gather entry at
//! once (the *anchor*), and the following packets of the same message cut their payloads
//! from it, without touching the region, while the guard is still held by the transmit
//! batch they go into. The batch gives its guards back when it is sent, and starts a new
//! *epoch* then; an anchor of an older epoch is not used again.
//!
//! An anchor serves one message (`tag`) within one build run of the engine (which calls
//! [`Gather::forget_anchor`] before each), and only for packets built into a transmit batch
//! ([`crate::net::TxBatch::push_packet_gather`]; other callers lend per packet): between
//! runs, requests from the peer (a SEND with Invalidate) or local work (a Local Invalidate)
//! may change the region, and the next packet then lends again, meeting the change. Within a
//! run, the region's own changes (deregistration, suspension, invalidation from another
//! thread) wait for the batch's guards as they wait for any access in flight.

use crate::mem::{Access, AccessCtx, AccessError, Lent, LentSlice, MemoryAccess};

/// A lend that later packets of the same message may cut their payloads from.
#[derive(Clone, Copy, Debug)]
struct Anchor {
    /// The message it serves (a request's SQ sequence number, or a READ response's tag).
    tag: u64,
    key: u32,
    actx: AccessCtx,
    access: Access,
    /// The IOVA of the first lent byte.
    iova: u64,
    /// All the lent bytes.
    bytes: LentSlice,
    /// The batch epoch it was lent in.
    epoch: u64,
    /// Whether its guard went into the batch (else it is in the gather's `guards`).
    committed: bool,
}

/// The lent payload of the packet being built: after
/// [`Qp::poll_transmit_gather`](super::Qp::poll_transmit_gather) returned a packet of `n`
/// bytes with the gather not empty, the packet on the wire is `buf[..split]`, then the
/// pieces in order, then `buf[split..n]` (pad and ICRC). The guards that keep the pieces'
/// bytes in place are held by the gather until [`Gather::take`] (or a transmit batch) takes
/// them; they must be dropped soon after the send (see [`Lent`]).
#[derive(Debug, Default)]
pub struct Gather {
    /// The payload, in order. Each lies in one of `guards`, or in the anchor's range while
    /// the anchor is set.
    pieces: Vec<LentSlice>,
    /// Guards lent for this packet.
    guards: Vec<Lent>,
    /// Where the payload goes in the packet (the header length).
    pub split: usize,
    /// The epoch of the batch the packet goes into (see the module documentation).
    epoch: u64,
    /// Most bytes a staged lend copies ahead (what the current run may still send).
    stage_room: u64,
    anchor: Option<Anchor>,
}

/// One piece of a payload to lend ([`Gather::lend`]): `len` bytes at `iova` under `key`
/// (checked for `access` in the PD and QP of `actx`), part of message `tag`, with `ahead`
/// more bytes of the same scatter/gather entry that the message's later packets will want.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Piece {
    pub(crate) tag: u64,
    pub(crate) actx: AccessCtx,
    pub(crate) key: u32,
    pub(crate) iova: u64,
    pub(crate) len: usize,
    pub(crate) ahead: u64,
    pub(crate) access: Access,
}

impl Gather {
    /// An empty gather with room for `pieces` pieces per packet.
    pub fn with_capacity(pieces: usize) -> Gather {
        Gather {
            pieces: Vec::with_capacity(pieces),
            guards: Vec::with_capacity(pieces),
            ..Gather::default()
        }
    }

    /// Add a lent range as the next piece of the payload.
    pub fn push(&mut self, l: Lent) {
        self.pieces.push(l.whole());
        self.guards.push(l);
    }

    /// True when no payload byte is lent.
    pub fn is_empty(&self) -> bool {
        self.pieces.is_empty()
    }

    /// Payload pieces.
    pub fn len(&self) -> usize {
        self.pieces.len()
    }

    /// Payload bytes lent.
    pub fn lent_bytes(&self) -> usize {
        self.pieces.iter().map(LentSlice::len).sum()
    }

    /// Drop the pieces (and the guards lent for them).
    pub fn clear(&mut self) {
        self.pieces.clear();
        self.guards.clear();
        // An anchor lent for this packet went with its guard.
        if self.anchor.is_some_and(|a| !a.committed) {
            self.anchor = None;
        }
    }

    /// Take the pieces and their guards (the pieces stay valid while the guards live).
    /// Packets built later lend again.
    pub fn take(&mut self) -> (Vec<LentSlice>, Vec<Lent>) {
        self.anchor = None;
        (
            std::mem::take(&mut self.pieces),
            std::mem::take(&mut self.guards),
        )
    }

    /// Lend nothing more from earlier lends: the next packet lends again. A driver calls it
    /// before each run of transmit polls.
    pub fn forget_anchor(&mut self) {
        self.anchor = None;
    }

    /// Let a staged lend (of memory not lent where it lies) copy at most `bytes` ahead of the
    /// packet being built: what the transport may still send in this run (the send window's
    /// room). The next packet's payload is always staged whole.
    pub(crate) fn set_stage_room(&mut self, bytes: u64) {
        self.stage_room = bytes;
    }

    /// Start a packet that goes into a batch of `epoch`.
    pub(crate) fn begin(&mut self, epoch: u64) {
        self.clear();
        if self.epoch != epoch {
            // The batch let go of its guards (or this is another batch): no anchor is held.
            self.anchor = None;
            self.epoch = epoch;
        }
    }

    /// Move the packet's pieces and guards into a batch (of the epoch given to `begin`, which
    /// then holds the anchor's guard too).
    pub(crate) fn commit(&mut self, mut piece: impl FnMut(LentSlice), mut guard: impl FnMut(Lent)) {
        self.pieces.drain(..).for_each(&mut piece);
        self.guards.drain(..).for_each(&mut guard);
        if let Some(a) = &mut self.anchor {
            a.committed = true;
        }
    }

    /// Feed the payload to a CRC (the packet's ICRC).
    pub(crate) fn crc_update(&self, h: &mut crc32fast::Hasher) {
        for p in &self.pieces {
            // SAFETY: every piece lies in a guard of `self.guards`, or in the anchor's range
            // while the anchor is set: its guard is in `self.guards` (not committed; `clear`
            // drops both together) or in the batch of the anchor's epoch, which keeps it until
            // it starts a new epoch; pieces are cut from an anchor only for a packet `begin`
            // started in the anchor's epoch, and are moved or dropped before the next one.
            unsafe { p.crc_update(h) }
        }
    }

    /// Piece `p` cut from the anchor, when it lies in it (the same message, key, access and
    /// epoch): the common case of a large message's later packets.
    fn cut_from_anchor(&mut self, p: &Piece) -> bool {
        if let Some(a) = &self.anchor
            && a.epoch == self.epoch
            && a.tag == p.tag
            && a.key == p.key
            && a.actx == p.actx
            && a.access == p.access
            && let Some(off) = p.iova.checked_sub(a.iova)
            && let Ok(off) = usize::try_from(off)
            && let Some(s) = a.bytes.sub(off, p.len)
        {
            self.pieces.push(s);
            return true;
        }
        false
    }

    /// Lend `p.len` bytes at `p.iova` under `p.key` for `p.access` as the next piece of
    /// message `p.tag`'s payload, with `p.ahead` more bytes of the same entry that its later
    /// packets will want (lent now too when they can be). `Ok(false)`: the bytes must be
    /// copied (memory that is not lent), nothing was added. Errors are those of
    /// [`MemoryAccess::lend`] for the piece itself.
    pub(crate) fn lend(&mut self, mem: &dyn MemoryAccess, p: Piece) -> Result<bool, AccessError> {
        if self.cut_from_anchor(&p) {
            return Ok(true);
        }
        let Piece {
            tag,
            actx,
            key,
            iova,
            len,
            ahead,
            access,
        } = p;
        let whole = (len as u64).saturating_add(ahead);
        let mut anchored = None;
        let mut in_place = true;
        if ahead > 0 {
            match mem.lend(actx, key, iova, whole, access) {
                Ok(Some(l)) => anchored = Some(l),
                Ok(None) => in_place = false,
                // The rest of the entry may be what fails: lend the piece alone, and fail
                // (or not) as a lend of it does.
                Err(_) => {}
            }
        }
        if !in_place {
            // Memory that is not lent where it lies: stage as much of the entry as this run
            // may send (one checked copy), and cut this packet's payload from it.
            let want = whole.min(self.stage_room.max(len as u64));
            anchored = match mem.stage(actx, key, iova, want, access) {
                Ok(Some(l)) => Some(l),
                Ok(None) => return Ok(false),
                Err(_) if want > len as u64 => None,
                Err(e) => return Err(e),
            };
        }
        let l = match anchored {
            Some(l) if l.len() > len => {
                self.anchor = Some(Anchor {
                    tag,
                    key,
                    actx,
                    access,
                    iova,
                    bytes: l.whole(),
                    epoch: self.epoch,
                    committed: false,
                });
                l
            }
            Some(l) => l,
            None => {
                // In place or staged with one lookup (a small payload of memory that is
                // copied: every post of a C program's 8 bytes by key).
                let lent = if in_place {
                    mem.lend_or_stage(actx, key, iova, len as u64, access)?
                } else {
                    mem.stage(actx, key, iova, len as u64, access)?
                };
                match lent {
                    Some(l) => l,
                    None => return Ok(false),
                }
            }
        };
        let Some(s) = l.whole().sub(0, len) else {
            return Ok(false);
        };
        self.pieces.push(s);
        self.guards.push(l);
        Ok(true)
    }
}
