//! The responder's READ and atomic requests (queued as answers, bounded by
//! `max_dest_rd_atomic`; atomics executed once and remembered in the replay cache), and
//! duplicate requests of every kind: re-ACK, READ served again from the requested offset,
//! atomic answered from the cache.

use super::{NO_CREDITS, ReadStream, RecvSide, RespCounters, RespOutcome, Response};
use crate::mem::{Access, AccessCtx, AccessError, AtomicOp, MemoryAccess};
use crate::rc::read_history::ReadRecord;
use crate::rc::requester::packets_for;
use crate::wire::{NakCode, OpKind, Packet, Syndrome};

impl RecvSide {
    /// Room for one more READ/atomic request (the negotiated depth, and the answer queue).
    /// A depth of 0 accepts none (as rxe: the request is NAKed as invalid).
    pub(super) fn rd_atomic_room(&self) -> bool {
        self.rd_atomic_queued.saturating_sub(self.dup_queued) < usize::from(self.max_dest_rd_atomic)
            && self.resp.len() < self.resp_cap
    }

    /// Room for a duplicate READ/atomic: a requester asks again for holes in its response
    /// stream while the original requests are still queued, so duplicates may use twice
    /// the negotiated depth (still bounded).
    fn dup_room(&self) -> bool {
        self.rd_atomic_queued < 2 * usize::from(self.max_dest_rd_atomic)
            && self.resp.len() < self.resp_cap
    }

    pub(super) fn do_read(
        &mut self,
        pkt: &Packet<'_>,
        actx: AccessCtx,
        mem: &dyn MemoryAccess,
        c: &mut RespCounters,
    ) -> RespOutcome {
        let psn = pkt.hdr.bth.psn;
        let Some(reth) = pkt.hdr.reth else {
            return self.nak(psn, NakCode::InvalidRequest, c);
        };
        if !self.access.contains(Access::REMOTE_READ) {
            return self.nak(psn, NakCode::RemoteAccessError, c);
        }
        if u64::from(reth.dma_len) > crate::rc::MAX_MSG_SIZE || !self.rd_atomic_room() {
            return self.nak(psn, NakCode::InvalidRequest, c);
        }
        if reth.dma_len > 0
            && let Err(e) = mem.check(
                actx,
                reth.rkey,
                reth.va,
                u64::from(reth.dma_len),
                Access::REMOTE_READ,
            )
        {
            return self.refused(psn, e, c);
        }
        let msn = self.next_msn();
        // The response's AETH acknowledges every request before this one.
        self.unacked = None;
        self.resp.push_back(Response::Read(ReadStream {
            psn,
            va: reth.va,
            rkey: reth.rkey,
            remaining: reth.dma_len,
            started: false,
            msn,
            dup: false,
        }));
        self.rd_atomic_queued += 1;
        let npkts = packets_for(u64::from(reth.dma_len), self.mtu);
        self.reads.insert(ReadRecord {
            first: psn,
            npkts: npkts.max(1),
            va: reth.va,
            rkey: reth.rkey,
            len: reth.dma_len,
        });
        self.epsn = psn.add(npkts);
        RespOutcome::Ok
    }

    pub(super) fn do_atomic(
        &mut self,
        pkt: &Packet<'_>,
        kind: OpKind,
        actx: AccessCtx,
        mem: &dyn MemoryAccess,
        c: &mut RespCounters,
    ) -> RespOutcome {
        let psn = pkt.hdr.bth.psn;
        let Some(a) = pkt.hdr.atomic_eth else {
            return self.nak(psn, NakCode::InvalidRequest, c);
        };
        if !self.access.contains(Access::REMOTE_ATOMIC) {
            return self.nak(psn, NakCode::RemoteAccessError, c);
        }
        // Misalignment is judged before the key is looked at, so that the NAK code does not
        // tell a key-guessing peer whether its key exists.
        if !self.rd_atomic_room() || !a.va.is_multiple_of(8) {
            return self.nak(psn, NakCode::InvalidRequest, c);
        }
        let op = if kind == OpKind::CompareSwap {
            AtomicOp::CompareSwap {
                compare: a.compare,
                swap: a.swap_add,
            }
        } else {
            AtomicOp::FetchAdd { add: a.swap_add }
        };
        match mem.atomic(actx, a.rkey, a.va, op) {
            Ok(orig) => {
                self.cache.insert(psn, orig);
                let msn = self.next_msn();
                self.unacked = None;
                self.resp.push_back(Response::Atomic {
                    psn,
                    orig,
                    msn,
                    dup: false,
                });
                self.rd_atomic_queued += 1;
                self.epsn = psn.add(1);
                RespOutcome::Ok
            }
            Err(e) => self.refused(psn, e, c),
        }
    }

    pub(super) fn duplicate(
        &mut self,
        pkt: &Packet<'_>,
        kind: OpKind,
        actx: AccessCtx,
        mem: &dyn MemoryAccess,
        c: &mut RespCounters,
    ) {
        c.duplicates += 1;
        let psn = pkt.hdr.bth.psn;
        match kind {
            OpKind::Send | OpKind::Write if pkt.hdr.bth.ack_req => {
                let last = self.epsn.sub(1);
                self.push_ack(last, NO_CREDITS);
            }
            OpKind::ReadRequest => {
                // Served again only as the READ executed at that PSN (same key, a subset of
                // its bytes), re-read from memory; anything else is dropped.
                let Some(reth) = pkt.hdr.reth else { return };
                let repeats = self.reads.find(psn).is_some_and(|r| r.covers(&reth));
                if !repeats {
                    c.duplicates_dropped += 1;
                    return;
                }
                if !self.dup_room() || !self.access.contains(Access::REMOTE_READ) {
                    return;
                }
                if reth.dma_len > 0
                    && let Err(e) = mem.check(
                        actx,
                        reth.rkey,
                        reth.va,
                        u64::from(reth.dma_len),
                        Access::REMOTE_READ,
                    )
                {
                    // A suspended region: the requester waits (RNR) instead of timing out
                    // until its retries run out; any other refusal drops the repeat.
                    if matches!(e, AccessError::Suspended(_)) {
                        c.rnr_naks_sent += 1;
                        let timer = self.min_rnr_timer;
                        self.push_ack(psn, Syndrome::RnrNak { timer });
                    }
                    return;
                }
                let msn = self.msn;
                self.resp.push_back(Response::Read(ReadStream {
                    psn,
                    va: reth.va,
                    rkey: reth.rkey,
                    remaining: reth.dma_len,
                    started: false,
                    msn,
                    dup: true,
                }));
                self.rd_atomic_queued += 1;
                self.dup_queued += 1;
            }
            OpKind::CompareSwap | OpKind::FetchAdd => {
                // Never executed twice: answered from the replay cache, or dropped.
                match self.cache.get(psn) {
                    Some(orig) if self.dup_room() => {
                        c.atomic_replays += 1;
                        let msn = self.msn;
                        self.resp.push_back(Response::Atomic {
                            psn,
                            orig,
                            msn,
                            dup: true,
                        });
                        self.rd_atomic_queued += 1;
                        self.dup_queued += 1;
                    }
                    Some(_) => {}
                    None => c.duplicates_dropped += 1,
                }
            }
            _ => {}
        }
    }
}
