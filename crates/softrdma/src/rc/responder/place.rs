//! SEND and RDMA WRITE requests: their payload placed (into the receive WQE's buffers, or at
//! the RETH's address), their receive completion, and the checks shared with UC.

use super::*;

impl RecvSide {
    pub(super) fn do_send(
        &mut self,
        pkt: &Packet<'_>,
        pos: Position,
        env: RespEnv<'_>,
    ) -> RespOutcome {
        let RespEnv {
            actx,
            mem,
            mut srq,
            cq,
            cq_cap,
            counters: c,
        } = env;
        let psn = pkt.hdr.bth.psn;
        let (wqe, offset) = match self.msg {
            InMsg::Send { wqe, offset } => (wqe, offset),
            _ => {
                if cq.len() >= cq_cap {
                    return self.rnr(psn, c);
                }
                match self.take_recv(srq.as_deref_mut()) {
                    Some(w) => (w, 0),
                    None => return self.rnr(psn, c),
                }
            }
        };
        let qpn = actx.qpn;
        let end = u64::from(offset) + pkt.payload.len() as u64;
        // A message longer than the largest one (2 GiB) is refused before its offset could
        // wrap, whatever the receive buffers hold.
        if end > wqe.sges.total_len() || end > crate::rc::MAX_MSG_SIZE {
            // The receive completes here (in error): it is no longer in progress.
            self.fail_recv(cq, (qpn, wqe.wr_id), WcStatus::LocLenErr, end as u32);
            return self.nak(psn, NakCode::InvalidRequest, c);
        }
        if let Err(e) = scatter(mem, actx, &wqe.sges, u64::from(offset), pkt.payload) {
            if matches!(e, AccessError::Suspended(_)) {
                // The receive buffer's region is suspended: the peer waits (RNR) and resends
                // from this packet. Before the first packet the receive goes back to its
                // queue; in the middle of the message it stays in progress (`self.msg` still
                // names it and its offset), and the retried packet continues it there.
                if !matches!(self.msg, InMsg::Send { .. }) {
                    self.give_back(wqe, srq);
                }
                return self.rnr(psn, c);
            }
            self.fail_recv(cq, (qpn, wqe.wr_id), WcStatus::LocProtErr, end as u32);
            return self.nak(psn, NakCode::RemoteOperationalError, c);
        }
        if pos.ends() {
            if let Err(code) = self.end_send(pkt, (wqe.wr_id, end as u32), actx, mem, cq) {
                return self.nak(psn, code, c);
            }
        } else {
            self.msg = InMsg::Send {
                wqe,
                offset: end as u32,
            };
        }
        self.finish_packet(pkt);
        RespOutcome::Ok
    }

    pub(super) fn do_write(
        &mut self,
        pkt: &Packet<'_>,
        pos: Position,
        env: RespEnv<'_>,
    ) -> RespOutcome {
        let RespEnv {
            actx,
            mem,
            srq,
            cq,
            cq_cap,
            counters: c,
        } = env;
        let psn = pkt.hdr.bth.psn;
        let (va, rkey, len, offset) = match self.msg.write() {
            Some(w) => w,
            None => match self.write_target(pkt, pos, actx, mem) {
                Ok(reth) => (reth.va, reth.rkey, reth.dma_len, 0),
                Err(Ok(code)) => return self.nak(psn, code, c),
                Err(Err(e)) => return self.refused(psn, e, c),
            },
        };
        let Some(end) = write_end(offset, pkt.payload.len(), len, pos) else {
            return self.nak(psn, NakCode::InvalidRequest, c);
        };
        let imm = pos.ends() && pkt.hdr.immdt.is_some();
        if imm && cq.len() >= cq_cap {
            return self.rnr(psn, c);
        }
        if !pkt.payload.is_empty()
            && let Err(e) = mem.write(
                actx,
                rkey,
                va.wrapping_add(u64::from(offset)),
                pkt.payload,
                Access::REMOTE_WRITE,
            )
        {
            return self.refused(psn, e, c);
        }
        if pos.ends() {
            if imm {
                // The receive is consumed only now; without one the Last packet is RNR NAKed
                // and its (idempotent) placement repeated on the retry.
                let Some(wqe) = self.take_recv(srq) else {
                    return self.rnr(psn, c);
                };
                let mut wc = self.recv_wc(
                    actx.qpn,
                    wqe.wr_id,
                    WcStatus::Success,
                    WcOpcode::RecvRdmaWithImm,
                    len,
                );
                wc.imm_data = pkt.hdr.immdt;
                wc.solicited = pkt.hdr.bth.se;
                cq.push_back(wc);
            }
            self.next_msn();
            self.msg = InMsg::Idle;
        } else {
            self.msg = InMsg::Write {
                va,
                rkey,
                len,
                offset: end as u32,
            };
        }
        self.finish_packet(pkt);
        RespOutcome::Ok
    }

    /// A receive ends in error before its message was placed: its completion carries
    /// `status`, and no message is in progress any more. `wqe` is (QP number, WR ID).
    fn fail_recv(
        &mut self,
        cq: &mut VecDeque<WorkCompletion>,
        wqe: (u32, u64),
        st: WcStatus,
        len: u32,
    ) {
        self.msg = InMsg::Idle;
        cq.push_back(self.recv_wc(wqe.0, wqe.1, st, WcOpcode::Recv, len));
    }

    /// A SEND's last packet was placed: the receive completes (`wqe` is its WR ID and the
    /// message's length) with the immediate data, or the key the SEND invalidates; an
    /// invalidation refused completes it in error and the NAK's code comes back.
    fn end_send(
        &mut self,
        pkt: &Packet<'_>,
        wqe: (u64, u32),
        actx: AccessCtx,
        mem: &dyn MemoryAccess,
        cq: &mut VecDeque<WorkCompletion>,
    ) -> Result<(), NakCode> {
        let mut wc = self.recv_wc(actx.qpn, wqe.0, WcStatus::Success, WcOpcode::Recv, wqe.1);
        wc.imm_data = pkt.hdr.immdt;
        wc.solicited = pkt.hdr.bth.se;
        self.msg = InMsg::Idle;
        if let Some(rkey) = pkt.hdr.ieth {
            if mem.invalidate(actx, rkey, Invalidator::Remote).is_err() {
                wc.status = WcStatus::LocProtErr;
                cq.push_back(wc);
                return Err(NakCode::InvalidRequest);
            }
            wc.invalidated_rkey = Some(rkey);
            self.invalidated.push(rkey);
        }
        cq.push_back(wc);
        self.next_msn();
        Ok(())
    }

    /// The RETH of a WRITE's first (or only) packet, checked: present, remote writes allowed
    /// on the QP, a length that fits the packet, and the target range writable. `Err(Ok(code))`
    /// is a NAK, `Err(Err(e))` memory refusing.
    fn write_target(
        &self,
        pkt: &Packet<'_>,
        pos: Position,
        actx: AccessCtx,
        mem: &dyn MemoryAccess,
    ) -> Result<RethRepr, Result<NakCode, AccessError>> {
        let Some(reth) = pkt.hdr.reth else {
            return Err(Ok(NakCode::InvalidRequest));
        };
        if !self.access.contains(Access::REMOTE_WRITE) {
            return Err(Ok(NakCode::RemoteAccessError));
        }
        if !reth_len_fits(&reth, pos, pkt.payload.len(), self.mtu) {
            return Err(Ok(NakCode::InvalidRequest));
        }
        // A lone packet carrying the whole message (and no immediate, which is checked for
        // room first) is validated by its placement: the same key, range and right, so a
        // separate check would only repeat the lookup.
        let placed_whole = pos == Position::Only && pkt.hdr.immdt.is_none();
        if reth.dma_len > 0 && !placed_whole {
            mem.check(
                actx,
                reth.rkey,
                reth.va,
                u64::from(reth.dma_len),
                Access::REMOTE_WRITE,
            )
            .map_err(Err)?;
        }
        Ok(reth)
    }
}

/// Whether the RETH of a WRITE's first or only packet fits the packet: an only packet
/// carries the whole DMA length, a first packet announces more than one path MTU (`mtu`).
/// Shared by RC and UC.
pub(in crate::rc) fn reth_len_fits(
    reth: &RethRepr,
    pos: Position,
    payload_len: usize,
    mtu: u32,
) -> bool {
    match pos {
        Position::Only => reth.dma_len as usize == payload_len,
        _ => reth.dma_len > mtu,
    }
}

/// Where the payload of a WRITE packet ends in its message of `len` bytes, `offset` of them
/// placed before it: `None` when it runs past the message, or the message's last packet
/// leaves it short. Shared by RC and UC.
pub(in crate::rc) fn write_end(
    offset: u32,
    payload_len: usize,
    len: u32,
    pos: Position,
) -> Option<usize> {
    let end = offset as usize + payload_len;
    (end <= len as usize && (!pos.ends() || end == len as usize)).then_some(end)
}

/// Place `data` into the receive buffers `sges` from message offset `offset` (the caller
/// checked that it fits).
pub(in crate::rc) fn scatter(
    mem: &dyn MemoryAccess,
    actx: AccessCtx,
    sges: &crate::rc::SgList,
    offset: u64,
    data: &[u8],
) -> Result<(), AccessError> {
    sges.for_each_piece(offset, data.len(), |s, soff, doff, n| {
        mem.write(
            actx,
            s.lkey,
            s.addr.wrapping_add(soff),
            &data[doff..doff + n],
            Access::LOCAL_WRITE,
        )
    })
    .map(|_| ())
}
