//! A queue pair: the state machine of [`super::qp_state`] around the requester, responder and
//! completer, with bounded work and completion queues. RC QPs run the reliable transport; UC
//! and UD QPs share the queues, states and completions and run [`super::unreliable`] instead.

use std::collections::VecDeque;

mod region_use;
mod transmit;

use super::completer::CompCounters;
use super::qp_state::{QpAttr, QpAttrMask, QpState, check_modify};
use super::requester::ReqOutput;
use super::responder::{Fatal, RecvSide, RespCounters, RespOutcome};
use super::rq::{RecvWqe, Srq};
use super::sq::SendSide;
use super::timer::{ack_timeout_ns, earliest};
use super::unreliable::DatagramSource;
use super::wr::{RecvWr, SendWr, SgList, Sge, WcOpcode, WcStatus, WorkCompletion};
use super::{
    CreateError, MAX_MSG_SIZE, MAX_OVERHEAD, MAX_SGE, ModifyError, PostError, QpType, qp_state::Mtu,
};
use crate::mem::{AccessCtx, MemoryAccess};
use crate::wire::{AddressVector, Packet, Psn};

/// Queue sizes (`ibv_qp_cap`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct QpCap {
    /// Send queue depth (also the bound of the send completion queue).
    pub max_send_wr: u32,
    /// Receive queue depth (also the bound of the receive completion queue).
    pub max_recv_wr: u32,
    /// SGEs per send WR (at most [`MAX_SGE`]).
    pub max_send_sge: u32,
    /// SGEs per receive WR (at most [`MAX_SGE`]).
    pub max_recv_sge: u32,
    /// Inline bytes per send WR.
    pub max_inline_data: u32,
}

impl Default for QpCap {
    fn default() -> QpCap {
        QpCap {
            max_send_wr: 128,
            max_recv_wr: 128,
            max_send_sge: 4,
            max_recv_sge: 4,
            max_inline_data: 256,
        }
    }
}

/// What a QP is created with (`ibv_qp_init_attr`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct QpInit {
    /// The local QP number (24 bits; chosen by the caller, ideally unpredictable).
    pub qp_num: u32,
    /// Protection domain.
    pub pd: u32,
    /// Queue sizes.
    pub cap: QpCap,
    /// Take receives from the SRQ with this id instead of an own receive queue.
    pub srq: Option<u32>,
    /// Complete every send WR, signaled or not.
    pub sq_sig_all: bool,
    /// The transport service.
    pub qp_type: QpType,
}

/// What deciding whether a send work request may be posted takes from a QP ([`Qp::post_rules`]):
/// its state, queue caps, type and MTU. A snapshot of them lets a poster check a request while
/// another thread holds the QP (the device core's post inbox).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PostRules {
    /// The QP's state.
    pub state: QpState,
    /// SGEs per send WR.
    pub max_send_sge: u32,
    /// Inline bytes per send WR.
    pub max_inline_data: u32,
    /// Outstanding READs and atomics it may issue.
    pub max_rd_atomic: u8,
    /// The transport service.
    pub qp_type: QpType,
    /// The port's MTU in bytes (a UD message's limit).
    pub port_mtu: u32,
}

impl PostRules {
    /// Posting is allowed in this state (RTS, SQD, and the error state, where the request
    /// completes flushed).
    pub fn check_state(&self) -> Result<(), PostError> {
        if matches!(self.state, QpState::Rts | QpState::Sqd | QpState::Err) {
            Ok(())
        } else {
            Err(PostError::InvalidState(self.state))
        }
    }

    /// Check a send work request against these rules (everything but the queue's room):
    /// returns its scatter/gather list and its payload length.
    pub fn check(&self, wr: &SendWr<'_>) -> Result<(SgList, u64), PostError> {
        self.check_state()?;
        if wr.sg_list.len() > self.max_send_sge as usize {
            return Err(PostError::TooManySge(wr.sg_list.len()));
        }
        let sges = SgList::from_slice(wr.sg_list).ok_or(PostError::TooManySge(wr.sg_list.len()))?;
        let len = match (wr.inline_data, wr.opcode.carries_payload()) {
            (Some(d), true) => {
                if d.len() > self.max_inline_data as usize {
                    return Err(PostError::InlineTooLong(d.len()));
                }
                d.len() as u64
            }
            (Some(_), false) => {
                return Err(PostError::InvalidArgument(
                    "inline data on a non-payload WR",
                ));
            }
            (None, _) => sges.total_len(),
        };
        if len > MAX_MSG_SIZE {
            return Err(PostError::InvalidArgument("message longer than 2^31 bytes"));
        }
        if wr.opcode.is_atomic() && (sges.as_slice().len() != 1 || sges.as_slice()[0].length != 8) {
            return Err(PostError::InvalidArgument("an atomic needs one 8-byte SGE"));
        }
        if wr.opcode.is_rd_atomic() && self.max_rd_atomic == 0 {
            return Err(PostError::InvalidArgument("max_rd_atomic is 0"));
        }
        super::unreliable::check_post(self.qp_type, wr, len, self.port_mtu)?;
        Ok((sges, len))
    }
}

/// Run-time counters, like a NIC's hardware counters.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct QpCounters {
    /// Packets produced by `poll_transmit`.
    pub packets_sent: u64,
    /// Packets given to `handle_packet`.
    pub packets_received: u64,
    /// Packets dropped (wrong QP, state, or transport).
    pub packets_dropped: u64,
    /// Completer counters.
    pub comp: CompCounters,
    /// Responder counters.
    pub resp: RespCounters,
    /// What UC and UD receivers dropped.
    pub unrel: super::UnrelCounters,
}

/// A queue pair.
#[derive(Debug)]
pub struct Qp {
    qp_type: QpType,
    /// The port's active MTU: a UD QP's messages are at most this long.
    port_mtu: Mtu,
    qpn: u32,
    pd: u32,
    cap: QpCap,
    sq_sig_all: bool,
    state: QpState,
    attr: QpAttr,
    send: SendSide,
    recv: RecvSide,
    send_cq: VecDeque<WorkCompletion>,
    recv_cq: VecDeque<WorkCompletion>,
    counters: QpCounters,
    /// When the acknowledgement nobody asked for is sent (see [`super::LAZY_ACK_NS`]).
    lazy_ack_at: Option<u64>,
}

impl Qp {
    /// Create a QP in the RESET state. Every queue is allocated here, once.
    pub fn new(init: QpInit) -> Result<Qp, CreateError> {
        let c = init.cap;
        if init.qp_num > Psn::MASK {
            return Err(CreateError::InvalidCap("qp_num"));
        }
        if c.max_send_wr == 0 || c.max_send_wr > 1 << 16 {
            return Err(CreateError::InvalidCap("max_send_wr"));
        }
        if c.max_recv_wr > 1 << 16 || (c.max_recv_wr == 0 && init.srq.is_none()) {
            return Err(CreateError::InvalidCap("max_recv_wr"));
        }
        if c.max_send_sge as usize > MAX_SGE || c.max_recv_sge as usize > MAX_SGE {
            return Err(CreateError::InvalidCap("max_sge"));
        }
        if c.max_inline_data > 4096 {
            return Err(CreateError::InvalidCap("max_inline_data"));
        }
        let recv_cq = (c.max_recv_wr.max(1)) as usize;
        Ok(Qp {
            qp_type: init.qp_type,
            port_mtu: Mtu::Mtu1024,
            qpn: init.qp_num,
            pd: init.pd,
            cap: c,
            sq_sig_all: init.sq_sig_all,
            state: QpState::Reset,
            attr: QpAttr::default(),
            send: SendSide::new(
                c.max_send_wr as usize,
                c.max_inline_data as usize,
                init.sq_sig_all,
            ),
            recv: RecvSide::new(c.max_recv_wr as usize, c.max_recv_sge as usize, init.srq),
            send_cq: VecDeque::with_capacity(c.max_send_wr as usize),
            recv_cq: VecDeque::with_capacity(recv_cq),
            counters: QpCounters::default(),
            lazy_ack_at: None,
        })
    }

    /// Bring a fresh QP to RTS: RESET→INIT→RTR→RTS with the masks of
    /// [`QpAttrMask::bring_up`] for its type, from `attr` (which must carry the address
    /// vector for RC and UC, the Q_Key for UD; its state field is ignored).
    pub fn connect(&mut self, attr: &QpAttr) -> Result<(), ModifyError> {
        let [init, rtr, rts] = QpAttrMask::bring_up(self.qp_type);
        for (state, mask) in [
            (QpState::Init, init),
            (QpState::Rtr, rtr),
            (QpState::Rts, rts),
        ] {
            self.modify(
                &QpAttr {
                    qp_state: state,
                    ..*attr
                },
                mask,
            )?;
        }
        Ok(())
    }

    /// The local QP number.
    pub fn qp_num(&self) -> u32 {
        self.qpn
    }
    /// The transport service.
    pub fn qp_type(&self) -> QpType {
        self.qp_type
    }
    /// Set the port's active MTU, which bounds a UD QP's messages (UD has no path MTU
    /// attribute; default 1024).
    pub fn set_port_mtu(&mut self, mtu: Mtu) {
        self.port_mtu = mtu;
        if self.qp_type == QpType::Ud {
            self.send.mtu = mtu.bytes();
            self.recv.mtu = mtu.bytes();
        }
    }
    /// The MTU messages are cut to: the path MTU (RC, UC) or the port's (UD).
    fn mtu(&self) -> Mtu {
        match self.qp_type {
            QpType::Ud => self.port_mtu,
            _ => self.attr.path_mtu,
        }
    }
    /// Current state.
    pub fn state(&self) -> QpState {
        self.state
    }
    /// Current attributes (`ibv_query_qp`).
    pub fn attr(&self) -> &QpAttr {
        &self.attr
    }
    /// Counters.
    pub fn counters(&self) -> &QpCounters {
        &self.counters
    }
    /// Set the send window: the most unacknowledged PSNs in flight, 1 to 2^22 (default
    /// [`super::MAX_INFLIGHT_PSNS`], as rxe). A wider window keeps a fast path full between
    /// acknowledgements; go-back-N then resends more after a loss.
    pub fn set_send_window(&mut self, psns: u32) {
        self.send.max_inflight = psns.clamp(1, 1 << 22) as i32;
    }

    /// Size a transmit buffer must have: path MTU plus headers, pad and ICRC.
    pub fn max_packet_len(&self) -> usize {
        self.mtu().bytes() as usize + MAX_OVERHEAD
    }
    /// Send WRs posted and not yet completed.
    pub fn send_queue_len(&self) -> usize {
        self.send.sq.len()
    }
    /// The send queue's depth: how many WRs may be posted and not yet completed.
    pub fn send_queue_capacity(&self) -> usize {
        self.send.sq.capacity()
    }
    /// The PSN the responder expects next (its ePSN): a request below it is a duplicate, one
    /// above it out of sequence. Drivers that build requests against the responder's state
    /// (tests, fuzzers) read it here.
    pub fn expected_psn(&self) -> Psn {
        self.recv.epsn
    }
    /// Receives posted to the QP's own receive queue and not yet consumed.
    pub fn recv_queue_len(&self) -> usize {
        self.recv.rq.len()
    }

    /// Where the next incoming message would land: the first entry of the receive it would
    /// take (this QP's own queue, or `srq`'s head), with the QP's access context; `None` when
    /// no receive is posted or the entry is empty. A hint for warming the cache
    /// ([`MemoryAccess::warm`]): nothing is taken or checked.
    pub fn next_recv_buffer(&self, srq: Option<&Srq>) -> Option<(AccessCtx, Sge)> {
        let w = self.recv.next_recv(srq)?;
        let first = *w.sges.as_slice().first()?;
        (first.length > 0).then(|| (self.actx(), first))
    }

    fn actx(&self) -> AccessCtx {
        AccessCtx {
            pd: self.pd,
            qpn: self.qpn,
        }
    }

    /// `ibv_modify_qp`.
    pub fn modify(&mut self, attr: &QpAttr, mask: QpAttrMask) -> Result<(), ModifyError> {
        let to = check_modify(self.qp_type, self.state, attr, mask)?;
        let has = |m| mask.contains(m);
        self.attr.take_masked(attr, mask);
        if has(QpAttrMask::RQ_PSN) {
            self.recv.epsn = Psn::new(attr.rq_psn);
        }
        if has(QpAttrMask::SQ_PSN) {
            self.send.set_sq_psn(Psn::new(attr.sq_psn));
        }
        self.attr.qp_state = to;
        self.attr.cur_qp_state = to;
        self.configure(mask);
        let from = self.state;
        self.state = to;
        match to {
            QpState::Reset if from != QpState::Reset => self.reset(),
            QpState::Err if from != QpState::Err => self.enter_error(),
            _ => {}
        }
        Ok(())
    }

    /// Hand the attributes to the requester and responder after a modify with `mask` (a
    /// retry count set anew restarts its countdown).
    fn configure(&mut self, mask: QpAttrMask) {
        let a = self.attr;
        let mtu = match self.qp_type {
            QpType::Ud => self.port_mtu.bytes(),
            _ => a.path_mtu.bytes(),
        };
        let unreliable = self.qp_type.is_unreliable();
        let s = &mut self.send;
        s.mtu = mtu;
        // Nothing is acknowledged on UC and UD: no retransmission timer.
        s.timeout_ns = if unreliable {
            None
        } else {
            ack_timeout_ns(a.timeout)
        };
        s.retry_cnt = a.retry_cnt;
        s.rnr_retry = a.rnr_retry;
        s.max_rd_atomic = a.max_rd_atomic;
        s.dest_qpn = a.dest_qp_num;
        if mask.contains(QpAttrMask::RETRY_CNT) {
            s.retry_left = a.retry_cnt;
        }
        if mask.contains(QpAttrMask::RNR_RETRY) {
            s.rnr_left = a.rnr_retry;
        }
        let r = &mut self.recv;
        r.mtu = mtu;
        r.qkey = a.qkey;
        r.access = a.qp_access_flags;
        r.min_rnr_timer = a.min_rnr_timer;
        r.max_dest_rd_atomic = a.max_dest_rd_atomic;
        r.dest_qpn = a.dest_qp_num;
    }

    fn reset(&mut self) {
        let depth = self.cap.max_send_wr as usize;
        self.send.sq.clear();
        self.send.req_seq = self.send.sq.tail;
        self.send.req_pkt = 0;
        self.send.halted = false;
        self.send.retrans_deadline = None;
        self.send.rnr_deadline = None;
        self.send.nak_retry_psn = None;
        self.send.cwnd = i32::MAX;
        self.send.rd_seen.clear();
        self.send.rereq.clear();
        self.recv.reset();
        self.lazy_ack_at = None;
        self.send_cq.clear();
        self.recv_cq.clear();
        self.attr = QpAttr::default();
        debug_assert!(self.send_cq.capacity() >= depth);
    }

    fn enter_error(&mut self) {
        self.state = QpState::Err;
        self.attr.qp_state = QpState::Err;
        self.send.flush();
        let in_progress = self.recv.enter_error();
        self.lazy_ack_at = None;
        self.retire();
        self.flush_recv(in_progress);
    }

    /// Complete the receive of a SEND in progress (taken from the RQ or the SRQ) and then the
    /// RQ's posted receives with `WR_FLUSH_ERR`.
    fn flush_recv(&mut self, in_progress: Option<RecvWqe>) {
        let cap = self.recv_cq.capacity().max(1);
        let mut first = in_progress;
        while self.recv_cq.len() < cap {
            let Some(w) = first.take().or_else(|| self.recv.rq.pop()) else {
                break;
            };
            self.recv_cq.push_back(WorkCompletion {
                wr_id: w.wr_id,
                status: WcStatus::WrFlushErr,
                opcode: WcOpcode::Recv,
                byte_len: 0,
                imm_data: None,
                invalidated_rkey: None,
                qp_num: self.qpn,
                src_qp: self.attr.dest_qp_num,
                solicited: false,
                grh: None,
            });
        }
    }

    fn retire(&mut self) {
        let cap = self.cap.max_send_wr as usize;
        if self
            .send
            .retire(self.qpn, self.sq_sig_all, &mut self.send_cq, cap)
            .is_some()
            && self.state != QpState::Err
        {
            self.enter_error();
        }
    }

    /// What deciding whether a send work request may be posted takes from this QP.
    pub fn post_rules(&self) -> PostRules {
        PostRules {
            state: self.state,
            max_send_sge: self.cap.max_send_sge,
            max_inline_data: self.cap.max_inline_data,
            max_rd_atomic: self.attr.max_rd_atomic,
            qp_type: self.qp_type,
            port_mtu: self.port_mtu.bytes(),
        }
    }

    /// `ibv_post_send`. In the error state the WR is accepted and completes with
    /// `WR_FLUSH_ERR`.
    pub fn post_send(&mut self, wr: &SendWr<'_>) -> Result<(), PostError> {
        let rules = self.post_rules();
        rules.check_state()?;
        if self.send.sq.is_full() {
            return Err(PostError::QueueFull);
        }
        let (sges, len) = rules.check(wr)?;
        let err = self.state == QpState::Err;
        let w = self.send.sq.push();
        w.wr_id = wr.wr_id;
        w.op = wr.opcode;
        w.flags = wr.send_flags;
        w.sges = sges;
        w.len = if wr.opcode.is_atomic() { 8 } else { len as u32 };
        w.signaled = wr.send_flags.contains(super::SendFlags::SIGNALED);
        w.ud = if self.qp_type == QpType::Ud {
            wr.ud
        } else {
            None
        };
        if let Some(d) = wr.inline_data {
            w.inline.extend_from_slice(d);
            w.use_inline = true;
        }
        if err {
            w.done = Some(WcStatus::WrFlushErr);
            self.retire();
        }
        Ok(())
    }

    /// `ibv_post_recv` (QPs without an SRQ). In the error state the WR completes with
    /// `WR_FLUSH_ERR`.
    pub fn post_recv(&mut self, wr: &RecvWr<'_>) -> Result<(), PostError> {
        if self.recv.srq_id.is_some() {
            return Err(PostError::InvalidArgument("QP uses an SRQ"));
        }
        if self.state == QpState::Reset {
            return Err(PostError::InvalidState(self.state));
        }
        // A receive a message in progress holds still occupies its slot (as in rxe): a UC
        // message that is cut gives it back to the head of the queue.
        if self.recv.holds_rq_wqe() && self.recv.rq.len() + 1 >= self.cap.max_recv_wr as usize {
            return Err(PostError::QueueFull);
        }
        self.recv.rq.post(wr)?;
        if self.state == QpState::Err {
            self.flush_recv(None);
        }
        Ok(())
    }

    /// Feed one packet (already ICRC-verified and parsed by the driver) addressed to this QP.
    /// `srq` is the shared receive queue the QP was created with, if any.
    pub fn handle_packet(
        &mut self,
        now: u64,
        pkt: &Packet<'_>,
        mem: &dyn MemoryAccess,
        srq: Option<&mut Srq>,
    ) {
        self.handle_packet_from(now, pkt, None, mem, srq);
    }

    /// [`Qp::handle_packet`], saying where the packet came from: a UD receive needs it (the
    /// GRH area of its buffer holds the packet's IP header, and a UD QP drops datagrams whose
    /// origin it is not told).
    pub fn handle_packet_from(
        &mut self,
        now: u64,
        pkt: &Packet<'_>,
        from: Option<&DatagramSource>,
        mem: &dyn MemoryAccess,
        srq: Option<&mut Srq>,
    ) {
        self.handle_one(now, pkt, from, mem, srq);
        self.send.debug_check();
    }

    fn handle_one(
        &mut self,
        now: u64,
        pkt: &Packet<'_>,
        from: Option<&DatagramSource>,
        mem: &dyn MemoryAccess,
        srq: Option<&mut Srq>,
    ) {
        self.counters.packets_received += 1;
        let Some(info) = self.admit(pkt) else {
            self.counters.packets_dropped += 1;
            return;
        };
        let actx = self.actx();
        if self.qp_type.is_unreliable() {
            if !info.is_request() {
                self.counters.packets_dropped += 1;
                return;
            }
            let cq_cap = self.recv_cq.capacity().max(1);
            let mut env = super::unreliable::RxEnv {
                actx,
                mem,
                srq,
                cq: &mut self.recv_cq,
                cq_cap,
                counters: &mut self.counters.unrel,
            };
            let out = self.recv.handle_unreliable(
                self.qp_type,
                pkt,
                (info.kind, info.position),
                from,
                &mut env,
            );
            if out == RespOutcome::Fatal {
                self.enter_error();
            }
            return;
        }
        if info.is_request() {
            let cap = self.recv_cq.capacity().max(1);
            let out = self.recv.handle_request(
                pkt,
                info.kind,
                info.position,
                super::responder::RespEnv {
                    actx,
                    mem,
                    srq,
                    cq: &mut self.recv_cq,
                    cq_cap: cap,
                    counters: &mut self.counters.resp,
                },
            );
            if out == RespOutcome::Fatal {
                self.enter_error();
            }
            // Due LAZY_ACK_NS after the first request left unacknowledged.
            let due = self.lazy_ack_at.unwrap_or(now + super::LAZY_ACK_NS);
            self.lazy_ack_at = self.recv.unacked().map(|_| due);
        } else if self.state != QpState::Rtr {
            let r =
                self.send
                    .handle_response(now, pkt, info.kind, actx, mem, &mut self.counters.comp);
            self.retire();
            if r.is_err() {
                self.retire();
            }
        }
    }

    /// What packet `pkt` is, when this QP takes it: a known opcode of its transport, for
    /// it, in a state that receives. A request that comes in the error state after an
    /// access violation is answered with the violation's NAK on the way (see
    /// `RecvSide::abort_for_region`; UC and UD send no NAKs).
    fn admit(&mut self, pkt: &Packet<'_>) -> Option<&'static crate::wire::OpcodeInfo> {
        let info = pkt.hdr.bth.opcode.info()?;
        let live = matches!(
            self.state,
            QpState::Rtr | QpState::Rts | QpState::Sqd | QpState::Sqe
        );
        let ours = info.transport == self.qp_type.transport() && pkt.hdr.bth.dest_qp == self.qpn;
        if live && ours {
            return Some(info);
        }
        if self.state == QpState::Err && ours && info.is_request() && self.qp_type == QpType::Rc {
            self.recv.answer_violation(pkt.hdr.bth.psn);
        }
        None
    }

    /// The next instant `handle_timeout` must be called, if any.
    pub fn poll_timeout(&self) -> Option<u64> {
        if !matches!(self.state, QpState::Rts | QpState::Sqd) {
            return self.lazy_ack_at;
        }
        earliest(
            earliest(self.send.retrans_deadline, self.send.rnr_deadline),
            self.lazy_ack_at,
        )
    }

    /// Let time pass: queue the acknowledgement nobody asked for once it is due, and fire the
    /// retransmission or RNR timer if due.
    pub fn handle_timeout(&mut self, now: u64) {
        if self.lazy_ack_at.is_some_and(|t| t <= now) {
            self.ack_now();
        }
        if !matches!(self.state, QpState::Rts | QpState::Sqd) {
            return;
        }
        let _ = self.send.handle_timeout(now, &mut self.counters.comp);
        self.retire();
        self.send.debug_check();
    }

    /// Queue the acknowledgement of requests executed without AckReq now, rather than when
    /// it is due (before the QP goes away, or when its driver is about to sleep).
    pub fn ack_now(&mut self) {
        self.lazy_ack_at = None;
        self.recv.ack_unacked(&mut self.counters.resp);
    }

    /// The next completion, send side first.
    pub fn poll_completion(&mut self) -> Option<WorkCompletion> {
        self.poll_send_completion()
            .or_else(|| self.poll_recv_completion())
    }

    /// The next send-queue completion (posting order).
    pub fn poll_send_completion(&mut self) -> Option<WorkCompletion> {
        let wc = self.send_cq.pop_front();
        self.retire();
        wc
    }

    /// True when the receive completions not yet moved to the CQ fill their queue, which
    /// holds as many as the RQ has WQEs (one with an SRQ): the next receive would be refused
    /// (RNR NAK) though a receive WQE waits. The caller moves them first
    /// ([`Endpoint::handle_packet`](crate::net::Endpoint::handle_packet)).
    pub fn recv_completions_full(&self) -> bool {
        self.recv_cq.len() >= self.recv_cq.capacity().max(1)
    }

    /// The next receive completion.
    pub fn poll_recv_completion(&mut self) -> Option<WorkCompletion> {
        let wc = self.recv_cq.pop_front();
        if self.state == QpState::Err {
            self.flush_recv(None);
        }
        wc
    }
}
