//! The checking half of the workload: completions as they arrive, held against what was
//! posted (the invariants listed in [`super`]).

use softrdma::rc::{WcOpcode, WcStatus, WorkCompletion};

use super::{Kind, Sim};
use crate::world::QpRef;

impl Sim {
    fn check_written(&mut self, id: usize) -> bool {
        let op = &self.ops[id];
        let ok = self.w.eps[op.resp.ep].mem.equals(op.dst, 0, &op.data);
        if !ok {
            self.violation(format!(
                "op {id} {:?} ({} B): bytes at the responder differ from the bytes sent",
                op.kind, op.len
            ));
        }
        ok
    }

    fn on_send_wc(&mut self, at: QpRef, wc: WorkCompletion) {
        let id = wc.wr_id as usize;
        let Some(pos) = self
            .sq_order
            .get(&at)
            .and_then(|q| q.iter().position(|&x| x == id))
        else {
            self.violation(format!(
                "completion for unknown or already completed WR {id} on {at:?}: {wc:?}"
            ));
            return;
        };
        // Posting order: everything before it must be unsignaled (implicitly completed).
        let earlier: Vec<usize> = self
            .sq_order
            .get_mut(&at)
            .map(|q| q.drain(..=pos).collect())
            .unwrap_or_default();
        for &e in &earlier[..earlier.len() - 1] {
            if self.ops[e].signaled {
                self.violation(format!(
                    "WR {id} completed before signaled WR {e} (posting order)"
                ));
            }
            self.finish_req(e, WcStatus::Success);
        }
        self.finish_req(id, wc.status);
        if wc.status == WcStatus::Success {
            let op = &self.ops[id];
            let expect_op = match op.kind {
                Kind::Send | Kind::SendImm => WcOpcode::Send,
                Kind::Write | Kind::WriteImm => WcOpcode::RdmaWrite,
                Kind::Read => WcOpcode::RdmaRead,
                Kind::Cas => WcOpcode::CompSwap,
                Kind::FetchAdd => WcOpcode::FetchAdd,
            };
            if wc.opcode != expect_op {
                self.violation(format!(
                    "WR {id}: opcode {:?}, expected {expect_op:?}",
                    wc.opcode
                ));
            }
        }
    }

    fn finish_req(&mut self, id: usize, st: WcStatus) {
        if self.ops[id].req_done {
            self.violation(format!("WR {id} completed twice"));
            return;
        }
        self.ops[id].req_done = true;
        if st != WcStatus::Success {
            self.on_error(id, st);
            return;
        }
        let (kind, req, resp) = (self.ops[id].kind, self.ops[id].req, self.ops[id].resp);
        match kind {
            Kind::Write | Kind::WriteImm => {
                self.check_written(id);
            }
            Kind::Read => {
                let op = &self.ops[id];
                if !self.w.eps[req.ep].mem.equals(op.dst, 0, &op.data) {
                    self.violation(format!(
                        "READ {id} ({} B): bytes read differ from the source",
                        op.len
                    ));
                }
            }
            Kind::Cas => {
                let op = &self.ops[id];
                let (v0, cmp, swap) = op.cas;
                let got = self.w.eps[req.ep].mem.read_u64(op.local, 0);
                let now = self.w.eps[resp.ep].mem.read_u64(op.dst, 0);
                let want = if cmp == v0 { swap } else { v0 };
                if got != v0 || now != want {
                    self.violation(format!("CAS {id}: returned {got:#x} (want {v0:#x}), target {now:#x} (want {want:#x})"));
                }
            }
            Kind::FetchAdd => {
                let op = &self.ops[id];
                let got = self.w.eps[req.ep].mem.read_u64(op.local, 0);
                self.fadd_sum_ok += op.add;
                if !self.fadd_seen.insert(got) {
                    self.violation(format!(
                        "Fetch&Add {id} returned {got} twice: not linearizable"
                    ));
                }
                if got < self.counter.2 {
                    self.violation(format!(
                        "Fetch&Add {id} returned {got}, below the initial value"
                    ));
                }
            }
            Kind::Send | Kind::SendImm => {}
        }
        self.report.ops_ok += 1;
        self.report.bytes += self.ops[id].len as u64;
        self.maybe_release(id);
    }

    fn on_error(&mut self, id: usize, st: WcStatus) {
        let allowed = self.faulty && matches!(st, WcStatus::RetryExcErr | WcStatus::WrFlushErr);
        if !allowed {
            let op = &self.ops[id];
            self.violation(format!(
                "WR {id} {:?} ({} B) failed with {st:?}",
                op.kind, op.len
            ));
        }
        if self.ops[id].kind == Kind::FetchAdd {
            self.fadd_failed = true;
        }
        self.report.ops_err += 1;
        let c = self.ops[id].conn;
        self.conns[c].dead = true;
        // Receives for this op may never complete now.
        self.ops[id].recv_needed = false;
        self.maybe_release(id);
    }

    fn on_recv_wc(&mut self, at: QpRef, wc: WorkCompletion) {
        let q = self.rq_order.entry(at).or_default();
        let Some(id) = q.pop_front() else {
            self.violation(format!(
                "receive completion with no matching SEND on {at:?}: {wc:?}"
            ));
            return;
        };
        if wc.status != WcStatus::Success {
            if !self.faulty || wc.status != WcStatus::WrFlushErr {
                self.violation(format!("receive for op {id} failed: {wc:?}"));
            }
            let c = self.ops[id].conn;
            self.conns[c].dead = true;
            self.ops[id].recv_done = true;
            self.maybe_release(id);
            return;
        }
        if wc.wr_id as usize != id {
            self.violation(format!(
                "receive {} consumed by op {id}: out of order",
                wc.wr_id
            ));
        }
        if self.ops[id].recv_done {
            self.violation(format!("op {id} received twice"));
        }
        let op = &self.ops[id];
        let (kind, len, imm, req, writes_before) =
            (op.kind, op.len, op.imm, op.req, op.writes_before);
        let want_op = if kind == Kind::WriteImm {
            WcOpcode::RecvRdmaWithImm
        } else {
            WcOpcode::Recv
        };
        if wc.opcode != want_op || wc.byte_len as usize != len || wc.imm_data != imm {
            self.violation(format!(
                "op {id} {kind:?}: receive completion {wc:?}, expected {len} B imm {imm:?}"
            ));
        }
        if matches!(kind, Kind::Send | Kind::SendImm | Kind::WriteImm) {
            self.check_written(id);
        }
        // Invariant 1: every earlier WRITE of this direction is placed.
        let earlier: Vec<usize> = self
            .writes
            .get(&req)
            .map(|v| v[..writes_before].to_vec())
            .unwrap_or_default();
        for e in earlier {
            let o = &self.ops[e];
            if !self.w.eps[o.resp.ep].mem.equals(o.dst, 0, &o.data) {
                self.violation(format!(
                    "receive of op {id} completed before earlier WRITE {e} was placed"
                ));
            }
        }
        self.ops[id].recv_done = true;
        self.maybe_release(id);
    }

    /// Free an op's buffers once both sides are done (and no later receive needs its WRITEs).
    fn maybe_release(&mut self, id: usize) {
        let op = &self.ops[id];
        if !op.req_done || (op.recv_needed && !op.recv_done) {
            return;
        }
        if matches!(op.kind, Kind::Write | Kind::WriteImm) {
            // Kept for invariant-1 checks by later receives; freed at the end.
            return;
        }
        let (req, resp, local, dst, kind) = (op.req, op.resp, op.local, op.dst, op.kind);
        let (lk, rk) = if kind == Kind::Read {
            (dst, local)
        } else {
            (local, dst)
        };
        self.w.eps[req.ep].mem.dereg(lk);
        if kind != Kind::FetchAdd {
            self.w.eps[resp.ep].mem.dereg(rk);
        }
        self.ops[id].data = Vec::new();
    }

    /// Unsignaled WRs complete silently: once a QP's send queue is empty, every WR still
    /// listed for it must be unsignaled, and it succeeded.
    fn settle_unsignaled(&mut self) {
        let qps: Vec<QpRef> = self
            .sq_order
            .iter()
            .filter(|(_, q)| !q.is_empty())
            .map(|(r, _)| *r)
            .collect();
        for r in qps {
            if self.w.qp(r).send_queue_len() != 0 {
                continue;
            }
            let ids: Vec<usize> = self
                .sq_order
                .get_mut(&r)
                .map(|q| q.drain(..).collect())
                .unwrap_or_default();
            for id in ids {
                if self.ops[id].signaled {
                    self.violation(format!("signaled WR {id} retired without a completion"));
                }
                self.finish_req(id, WcStatus::Success);
            }
        }
    }

    pub(super) fn check_step(&mut self) {
        while let Some(c) = self.w.completions.pop_front() {
            if c.wc.is_recv() {
                self.on_recv_wc(c.at, c.wc);
            } else {
                self.on_send_wc(c.at, c.wc);
            }
        }
        self.settle_unsignaled();
        for i in 0..self.w.eps.len() {
            if let Err(e) = self.w.eps[i].mem.check_guards() {
                self.violation(e);
            }
        }
        if let Some(e) = self.w.icrc_escape.take() {
            self.violation(e);
        }
        let (ep, key, v0) = self.counter;
        let now = self.w.eps[ep].mem.read_u64(key, 0);
        if now < v0 || now - v0 > self.fadd_sum_all {
            self.violation(format!(
                "counter {now} outside [{v0}, {v0}+{}]",
                self.fadd_sum_all
            ));
        }
    }
}
