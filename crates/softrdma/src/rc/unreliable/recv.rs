//! The UC and UD receivers: what each packet places, completes or drops.

use std::collections::VecDeque;

use super::super::responder::{InMsg, RecvSide, RespOutcome, reth_len_fits, scatter, write_end};
use super::super::rq::Srq;
use super::super::wr::{WcOpcode, WcStatus, WorkCompletion};
use super::super::{GRH_LEN, QpType};
use super::{DatagramSource, UnrelCounters, grh_area};
use crate::mem::{Access, AccessCtx, AccessError, MemoryAccess};
use crate::wire::{OpKind, Packet, Position};

/// What a receive touches besides the QP's responder state (UC and UD; RC's responder with
/// its own counters: [`crate::rc::responder::RespEnv`]).
#[allow(missing_debug_implementations)] // holds the memory as a trait object
pub struct RxEnv<'a, 'b, C = UnrelCounters> {
    /// Who accesses memory.
    pub actx: AccessCtx,
    /// The memory.
    pub mem: &'a dyn MemoryAccess,
    /// The SRQ the QP takes receives from, if any.
    pub srq: Option<&'b mut Srq>,
    /// The receive completion queue.
    pub cq: &'b mut VecDeque<WorkCompletion>,
    /// Its bound.
    pub cq_cap: usize,
    /// What was dropped, and why.
    pub counters: &'b mut C,
}

impl RecvSide {
    /// Handle a UC or UD request packet (its opcode's `kind` and `pos`) addressed to this QP
    /// (see the module documentation for what is dropped).
    pub fn handle_unreliable(
        &mut self,
        t: QpType,
        pkt: &Packet<'_>,
        (kind, pos): (OpKind, Position),
        from: Option<&DatagramSource>,
        env: &mut RxEnv<'_, '_>,
    ) -> RespOutcome {
        match t {
            QpType::Ud => self.receive_ud(pkt, (kind, pos), from, env),
            QpType::Uc => self.receive_uc(pkt, (kind, pos), env),
            QpType::Rc => RespOutcome::Ok,
        }
    }

    fn receive_ud(
        &mut self,
        pkt: &Packet<'_>,
        (kind, pos): (OpKind, Position),
        from: Option<&DatagramSource>,
        env: &mut RxEnv<'_, '_>,
    ) -> RespOutcome {
        let (actx, mem) = (env.actx, env.mem);
        let c = &mut *env.counters;
        let (Some(deth), Some(from)) = (pkt.hdr.deth, from) else {
            c.malformed += 1;
            return RespOutcome::Ok;
        };
        if kind != OpKind::Send || pos != Position::Only || pkt.payload.len() > self.mtu as usize {
            c.malformed += 1;
            return RespOutcome::Ok;
        }
        if deth.qkey != self.qkey {
            c.qkey_drops += 1;
            return RespOutcome::Ok;
        }
        if env.cq.len() >= env.cq_cap {
            c.no_recv_drops += 1;
            return RespOutcome::Ok;
        }
        let Some(wqe) = self.take_recv(env.srq.as_deref_mut()) else {
            c.no_recv_drops += 1;
            return RespOutcome::Ok;
        };
        let total = GRH_LEN + pkt.payload.len();
        if wqe.sges.total_len() < total as u64 {
            self.give_back(wqe, env.srq.as_deref_mut());
            c.len_drops += 1;
            return RespOutcome::Ok;
        }
        let grh = grh_area(from);
        let placed = scatter(mem, actx, &wqe.sges, 0, &grh)
            .and_then(|()| scatter(mem, actx, &wqe.sges, GRH_LEN as u64, pkt.payload));
        if let Err(e) = placed {
            return self.placement_failed(wqe, e, total as u32, env);
        }
        let mut wc = self.recv_wc(
            actx.qpn,
            wqe.wr_id,
            WcStatus::Success,
            WcOpcode::Recv,
            total as u32,
        );
        wc.src_qp = deth.src_qp;
        wc.imm_data = pkt.hdr.immdt;
        wc.solicited = pkt.hdr.bth.se;
        wc.grh = Some(from.network());
        env.cq.push_back(wc);
        RespOutcome::Ok
    }

    /// A receive's own memory refused the payload: a suspended region drops the message (the
    /// receive goes back to its queue; no RNR wait on UC and UD); anything else completes
    /// the receive with a local protection error and ends the QP.
    fn placement_failed(
        &mut self,
        wqe: super::super::rq::RecvWqe,
        e: AccessError,
        len: u32,
        env: &mut RxEnv<'_, '_>,
    ) -> RespOutcome {
        self.msg = InMsg::Idle;
        if matches!(e, AccessError::Suspended(_)) {
            self.give_back(wqe, env.srq.as_deref_mut());
            env.counters.suspended_drops += 1;
            return RespOutcome::Ok;
        }
        env.cq.push_back(self.recv_wc(
            env.actx.qpn,
            wqe.wr_id,
            WcStatus::LocProtErr,
            WcOpcode::Recv,
            len,
        ));
        RespOutcome::Fatal
    }

    /// Drop the UC message in progress: a receive it had started goes back to the head of
    /// its queue.
    fn uc_abandon(&mut self, srq: Option<&mut Srq>) {
        if let InMsg::Send { wqe, .. } = std::mem::replace(&mut self.msg, InMsg::Idle) {
            self.give_back(wqe, srq);
        }
    }

    fn receive_uc(
        &mut self,
        pkt: &Packet<'_>,
        (kind, pos): (OpKind, Position),
        env: &mut RxEnv<'_, '_>,
    ) -> RespOutcome {
        let c = &mut *env.counters;
        let psn = pkt.hdr.bth.psn;
        let in_seq = psn == self.epsn
            && !self.uc_drop
            && match (self.msg, pos) {
                (InMsg::Idle, Position::First | Position::Only) => true,
                (InMsg::Send { .. }, Position::Middle | Position::Last) => kind == OpKind::Send,
                (InMsg::Write { .. }, Position::Middle | Position::Last) => kind == OpKind::Write,
                _ => false,
            };
        if !in_seq {
            // A message in progress is cut: drop the rest of it.
            let cut = !matches!(self.msg, InMsg::Idle);
            if cut {
                c.uc_gap_drops += 1;
                self.uc_abandon(env.srq.as_deref_mut());
            }
            if !pos.starts() {
                // The message this packet belongs to lost its start: wait for the next first
                // or only packet, whatever its PSN.
                if !cut && !self.uc_drop {
                    c.uc_gap_drops += 1;
                }
                self.uc_drop = true;
                self.epsn = psn.add(1);
                return RespOutcome::Ok;
            }
            self.uc_drop = false;
        }
        self.epsn = psn.add(1);
        let mtu = self.mtu as usize;
        let len_ok = match pos {
            Position::First | Position::Middle => pkt.payload.len() == mtu,
            _ => pkt.payload.len() <= mtu,
        };
        if !len_ok {
            c.malformed += 1;
            return self.uc_drop_message(env.srq.as_deref_mut());
        }
        match kind {
            OpKind::Send => self.uc_send(pkt, pos, env),
            OpKind::Write => self.uc_write(pkt, pos, env),
            _ => {
                c.malformed += 1;
                self.uc_drop_message(env.srq.as_deref_mut())
            }
        }
    }

    fn uc_drop_message(&mut self, srq: Option<&mut Srq>) -> RespOutcome {
        self.uc_abandon(srq);
        self.uc_drop = true;
        RespOutcome::Ok
    }

    fn uc_send(&mut self, pkt: &Packet<'_>, pos: Position, env: &mut RxEnv<'_, '_>) -> RespOutcome {
        let (wqe, offset) = match self.msg {
            InMsg::Send { wqe, offset } => (wqe, offset),
            _ => {
                let w = if env.cq.len() < env.cq_cap {
                    self.take_recv(env.srq.as_deref_mut())
                } else {
                    None
                };
                match w {
                    Some(w) => (w, 0),
                    None => {
                        env.counters.no_recv_drops += 1;
                        return self.uc_drop_message(env.srq.as_deref_mut());
                    }
                }
            }
        };
        let end = u64::from(offset) + pkt.payload.len() as u64;
        if end > wqe.sges.total_len() || end > super::super::MAX_MSG_SIZE {
            self.msg = InMsg::Send { wqe, offset };
            env.counters.len_drops += 1;
            return self.uc_drop_message(env.srq.as_deref_mut());
        }
        if let Err(e) = scatter(env.mem, env.actx, &wqe.sges, u64::from(offset), pkt.payload) {
            return self.placement_failed(wqe, e, end as u32, env);
        }
        if pos.ends() {
            let mut wc = self.recv_wc(
                env.actx.qpn,
                wqe.wr_id,
                WcStatus::Success,
                WcOpcode::Recv,
                end as u32,
            );
            wc.imm_data = pkt.hdr.immdt;
            wc.solicited = pkt.hdr.bth.se;
            env.cq.push_back(wc);
            self.msg = InMsg::Idle;
        } else {
            self.msg = InMsg::Send {
                wqe,
                offset: end as u32,
            };
        }
        RespOutcome::Ok
    }

    fn uc_write(
        &mut self,
        pkt: &Packet<'_>,
        pos: Position,
        env: &mut RxEnv<'_, '_>,
    ) -> RespOutcome {
        let (actx, mem) = (env.actx, env.mem);
        let c = &mut *env.counters;
        let (va, rkey, len, offset) = match self.msg.write() {
            Some(w) => w,
            None => match self.uc_write_target(pkt, pos, actx, mem) {
                Ok(reth) => (reth.va, reth.rkey, reth.dma_len, 0),
                Err(malformed) => {
                    if malformed {
                        c.malformed += 1;
                    } else {
                        c.access_drops += 1;
                    }
                    return self.uc_drop_message(env.srq.as_deref_mut());
                }
            },
        };
        let Some(end) = write_end(offset, pkt.payload.len(), len, pos) else {
            c.malformed += 1;
            return self.uc_drop_message(env.srq.as_deref_mut());
        };
        if !pkt.payload.is_empty()
            && let Err(e) = mem.write(
                actx,
                rkey,
                va.wrapping_add(u64::from(offset)),
                pkt.payload,
                Access::REMOTE_WRITE,
            )
        {
            // The target changed under the message (suspended, invalidated, unmapped): the
            // rest of it is dropped; the peer's data never completes anything here.
            if matches!(e, AccessError::Suspended(_)) {
                c.suspended_drops += 1;
            } else {
                c.access_drops += 1;
            }
            return self.uc_drop_message(env.srq.as_deref_mut());
        }
        if pos.ends() {
            self.msg = InMsg::Idle;
            if pkt.hdr.immdt.is_some() {
                self.uc_write_imm(pkt, len, env);
            }
        } else {
            self.msg = InMsg::Write {
                va,
                rkey,
                len,
                offset: end as u32,
            };
        }
        RespOutcome::Ok
    }

    /// The RETH of a UC WRITE's first (or only) packet, checked: present with a length that
    /// fits the packet (else `Err(true)`: malformed), and the target writable (else
    /// `Err(false)`: refused).
    fn uc_write_target(
        &self,
        pkt: &Packet<'_>,
        pos: Position,
        actx: AccessCtx,
        mem: &dyn MemoryAccess,
    ) -> Result<crate::wire::RethRepr, bool> {
        let reth = pkt.hdr.reth.ok_or(true)?;
        if !reth_len_fits(&reth, pos, pkt.payload.len(), self.mtu) {
            return Err(true);
        }
        let refused = !self.access.contains(Access::REMOTE_WRITE)
            || (reth.dma_len > 0
                && mem
                    .check(
                        actx,
                        reth.rkey,
                        reth.va,
                        u64::from(reth.dma_len),
                        Access::REMOTE_WRITE,
                    )
                    .is_err());
        if refused { Err(false) } else { Ok(reth) }
    }

    /// A UC WRITE with immediate data of `len` bytes ended: it consumes a receive, whose
    /// completion carries the immediate; without a receive (or CQ room) it is dropped.
    fn uc_write_imm(&mut self, pkt: &Packet<'_>, len: u32, env: &mut RxEnv<'_, '_>) {
        let w = if env.cq.len() < env.cq_cap {
            self.take_recv(env.srq.as_deref_mut())
        } else {
            None
        };
        let Some(wqe) = w else {
            env.counters.no_recv_drops += 1;
            return;
        };
        let mut wc = self.recv_wc(
            env.actx.qpn,
            wqe.wr_id,
            WcStatus::Success,
            WcOpcode::RecvRdmaWithImm,
            len,
        );
        wc.imm_data = pkt.hdr.immdt;
        wc.solicited = pkt.hdr.bth.se;
        env.cq.push_back(wc);
    }
}
