//! Queue pairs: Reliable Connected, Unreliable Connected and Unreliable Datagram, and the
//! address handles UD work requests name their destination with.

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;

use super::{Access, Cq, Mr, Mw, Pd, Srq, VerbsError};
use crate::net::{QpCell, QpGuard};
use crate::rc::{
    self, QpAttr, QpAttrMask, QpCap, QpState, QpType, RecvWr, SendFlags, SendWr, UdDest, WrOpcode,
};
use crate::wire::AddressVector;

/// What a QP is created with (`ibv_qp_init_attr`).
#[derive(Clone, Debug)]
pub struct QpInitAttr {
    /// Send completions go here.
    pub send_cq: Cq,
    /// Receive completions go here.
    pub recv_cq: Cq,
    /// Take receives from this SRQ instead of an own receive queue.
    pub srq: Option<Srq>,
    /// Queue sizes.
    pub cap: QpCap,
    /// Complete every send WR, signaled or not.
    pub sq_sig_all: bool,
    /// The transport service (RC by default).
    pub qp_type: QpType,
}

impl QpInitAttr {
    /// An RC QP: one CQ for both directions, default capacities.
    pub fn new(cq: &Cq) -> QpInitAttr {
        QpInitAttr {
            send_cq: cq.clone(),
            recv_cq: cq.clone(),
            srq: None,
            cap: QpCap::default(),
            sq_sig_all: false,
            qp_type: QpType::Rc,
        }
    }
    /// The same with another transport service.
    pub fn with_type(mut self, t: QpType) -> QpInitAttr {
        self.qp_type = t;
        self
    }
}

/// An address handle (`ibv_ah`): the path to a remote port, which UD work requests name
/// their destination with ([`Ah::dest`]). It holds its protection domain.
#[derive(Clone, Debug)]
pub struct Ah {
    /// The address vector, with the CRC of its covered headers computed once for every
    /// datagram sent by this handle.
    av: AddressVector,
    _pd: Pd,
}

impl Ah {
    /// The address handle for the port at `remote` (the peer's GID as an IP address; its
    /// device listens on the same UDP port as this one, 4791 unless configured otherwise).
    pub fn new(pd: &Pd, remote: IpAddr) -> Ah {
        Ah {
            av: pd.device().engine().av_to(remote),
            _pd: pd.clone(),
        }
    }
    /// The address handle of the sender of a received datagram, from the GRH area its
    /// receive buffer starts with (`ibv_create_ah_from_wc`); `None` when the area holds no
    /// IP header.
    pub fn from_grh(pd: &Pd, grh: &[u8; rc::GRH_LEN]) -> Option<Ah> {
        let (src, _dst) = rc::unreliable::grh_source(grh)?;
        let src = match src {
            IpAddr::V6(v6) => v6
                .to_ipv4_mapped()
                .filter(|_| pd.device().engine().local_ip().is_ipv4())
                .map_or(IpAddr::V6(v6), IpAddr::V4),
            v4 => v4,
        };
        Some(Ah::new(pd, src))
    }
    /// The remote port's address.
    pub fn remote(&self) -> SocketAddr {
        self.av.dest()
    }
    /// The address vector.
    pub fn av(&self) -> AddressVector {
        self.av
    }
    /// A UD destination through this handle: QP `remote_qpn` with Q_Key `remote_qkey` (a
    /// Q_Key with the high bit set sends the QP's own).
    pub fn dest(&self, remote_qpn: u32, remote_qkey: u32) -> UdDest {
        UdDest::new(self.av, remote_qpn, remote_qkey)
    }
}

/// A queue pair. Dropping it moves it to the error state (its outstanding work requests
/// complete with `WrFlushErr`) and removes it from the device.
#[derive(Debug)]
pub struct Qp {
    cell: Arc<QpCell>,
    pd: Pd,
    _send_cq: Cq,
    _recv_cq: Cq,
    _srq: Option<Srq>,
}

fn random_u32() -> u32 {
    let mut b = [0u8; 4];
    if getrandom::fill(&mut b).is_err() {
        // No entropy source: fall back to the clock (QPNs are then merely unpredictable-ish).
        let t = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default();
        return t.subsec_nanos() ^ (t.as_secs() as u32).rotate_left(13);
    }
    u32::from_ne_bytes(b)
}

/// A random 24-bit PSN, as initial PSNs should be.
pub fn random_psn() -> u32 {
    random_u32() & 0x00ff_ffff
}

impl Qp {
    pub(crate) fn create(pd: &Pd, attr: &QpInitAttr) -> Result<Qp, VerbsError> {
        Qp::create_numbered(pd, attr, None)
    }

    /// Create a QP with number `fixed` (QP1, the connection manager's), or a random one.
    pub(crate) fn create_numbered(
        pd: &Pd,
        attr: &QpInitAttr,
        fixed: Option<u32>,
    ) -> Result<Qp, VerbsError> {
        let engine = pd.device().engine();
        let max_qp = pd.device().query_device().max_qp as usize;
        if engine.qp_count() >= max_qp {
            return Err(VerbsError::NoResources(format!(
                "the device has {max_qp} QPs already"
            )));
        }
        let srq_id = attr.srq.as_ref().map(|s| s.id());
        // Unpredictable QP numbers (not 0 or 1, which are special in InfiniBand).
        let mut qpn = 0;
        if let Some(f) = fixed {
            if engine.has_qp(f) {
                return Err(VerbsError::NoResources(format!("QP {f} exists already")));
            }
            qpn = f;
        }
        for _ in 0..if fixed.is_some() { 0 } else { 64 } {
            let c = random_u32() & 0x00ff_ffff;
            if c > 1 && !engine.has_qp(c) {
                qpn = c;
                break;
            }
        }
        if qpn == 0 {
            return Err(VerbsError::NoResources("no free QP number".into()));
        }
        let mut qp = rc::Qp::new(rc::QpInit {
            qp_num: qpn,
            pd: pd.handle(),
            cap: attr.cap,
            srq: srq_id,
            sq_sig_all: attr.sq_sig_all,
            qp_type: attr.qp_type,
        })?;
        qp.set_send_window(pd.device().config().send_window);
        qp.set_port_mtu(pd.device().config().active_mtu);
        let cell = Arc::new(QpCell::new(
            qp,
            pd.handle(),
            attr.send_cq.core.clone(),
            attr.recv_cq.core.clone(),
            attr.srq.as_ref().map(|s| s.core.clone()),
        ));
        engine.add_qp(cell.clone());
        Ok(Qp {
            cell,
            pd: pd.clone(),
            _send_cq: attr.send_cq.clone(),
            _recv_cq: attr.recv_cq.clone(),
            _srq: attr.srq.clone(),
        })
    }

    /// QP number.
    pub fn qp_num(&self) -> u32 {
        self.cell.qpn
    }

    /// The protection domain.
    pub fn pd(&self) -> &Pd {
        &self.pd
    }

    /// The UDP source port this QP sends from: the device's one socket is bound to its port,
    /// so every QP of a device sends from it (RoCEv2 allows any source port; rxe draws one per
    /// QP for ECMP entropy, which a single socket cannot give).
    pub fn src_port(&self) -> u16 {
        self.pd.device().engine().local_addr().port()
    }

    /// The address vector for a peer at `remote` (`ah_attr` with the peer's GID).
    pub fn av_for(&self, remote: IpAddr) -> AddressVector {
        self.pd.device().engine().av_to(remote)
    }

    /// Modify the QP (`ibv_modify_qp`). With `AV` in the mask, `attr.av` names the peer. A
    /// path MTU above the port's active MTU is clamped to it: packets larger than the port's
    /// MTU could not leave it (`ibv_rc_pingpong -m 4096` on a device whose interface has MTU
    /// 1500 then runs at 1024).
    pub fn modify(&self, attr: &QpAttr, mask: QpAttrMask) -> Result<(), VerbsError> {
        let mut clamped = *attr;
        if mask.contains(QpAttrMask::PATH_MTU) {
            let active = self.pd.device().query_port().active_mtu;
            clamped.path_mtu = clamped.path_mtu.min(active);
        }
        let engine = self.pd.device().engine();
        Ok(engine.modify_qp(&self.cell, &clamped, mask)?)
    }

    /// Bring a fresh QP to RTS towards a peer: RESET→INIT→RTR→RTS with `attr` supplying path
    /// MTU, timeouts, retries, PSNs, the peer's QPN and the access flags (the state fields and
    /// `av` are set here).
    /// The masks are those of [`QpAttrMask::bring_up`] for the QP's type (a UD QP ignores
    /// `remote`: see [`Qp::ready_ud`]).
    pub fn connect(&self, remote: IpAddr, attr: &QpAttr) -> Result<(), VerbsError> {
        let [init, rtr, rts] = QpAttrMask::bring_up(self.qp_type());
        let mut a = *attr;
        a.qp_state = QpState::Init;
        self.modify(&a, init)?;
        a.qp_state = QpState::Rtr;
        if rtr.contains(QpAttrMask::AV) {
            a.av = Some(self.av_for(remote));
        }
        self.modify(&a, rtr)?;
        a.qp_state = QpState::Rts;
        self.modify(&a, rts)
    }

    /// Bring a fresh UD QP to RTS with Q_Key `qkey` (RESET→INIT→RTR→RTS, send PSN `sq_psn`).
    pub fn ready_ud(&self, qkey: u32, sq_psn: u32) -> Result<(), VerbsError> {
        let a = QpAttr {
            qkey,
            sq_psn,
            ..QpAttr::default()
        };
        self.connect(IpAddr::from([0, 0, 0, 0]), &a)
    }

    /// The transport service.
    pub fn qp_type(&self) -> QpType {
        self.cell.lock().qp.qp_type()
    }

    /// Current state and attributes (`ibv_query_qp`).
    pub fn query(&self) -> (QpState, QpAttr) {
        let body = self.cell.lock();
        (body.qp.state(), *body.qp.attr())
    }

    /// Post a send work request (`ibv_post_send`). The packets it makes go out from this
    /// thread before it returns (as far as the send window allows).
    pub fn post_send(&self, wr: &SendWr<'_>) -> Result<(), VerbsError> {
        Ok(self.pd.device().engine().post_send(&self.cell, wr)?)
    }

    /// Post several send work requests; stops at the first refused one and returns its index
    /// with the error (as `bad_wr`).
    pub fn post_send_list(&self, wrs: &[SendWr<'_>]) -> Result<(), (usize, VerbsError)> {
        let engine = self.pd.device().engine();
        engine
            .post_send_list(&self.cell, wrs)
            .map_err(|(i, e)| (i, e.into()))
    }

    /// Post several send work requests under one lock of the QP, transmitted together when
    /// the batch is dropped (`ibv_post_send` with a list: one drive of the transport, and the
    /// packets of all of them in as few system calls as the send window allows). A request
    /// refused by [`PostBatch::post`] leaves the earlier ones posted. While another thread
    /// holds the QP (the engine thread sending), requests are checked and queued in its
    /// inbox instead of waiting for it (see `net::endpoint::inbox`).
    pub fn post_batch(&self) -> PostBatch<'_> {
        PostBatch {
            qp: self,
            body: self.cell.try_lock(),
            posted: false,
            inboxed: 0,
            consumes_receive: false,
        }
    }

    /// Post a receive work request (`ibv_post_recv`).
    pub fn post_recv(&self, wr: &RecvWr<'_>) -> Result<(), VerbsError> {
        if self._srq.is_some() {
            return Err(VerbsError::InvalidArgument(
                "this QP takes its receives from an SRQ".into(),
            ));
        }
        Ok(self.pd.device().engine().post_recv(&self.cell, wr)?)
    }

    /// Post several receive work requests under one lock of the QP (`ibv_post_recv` with a
    /// list); completions the error state makes at once (flushes) reach the CQ when the batch
    /// is dropped. A request refused by [`RecvBatch::post`] leaves the earlier ones posted.
    pub fn post_recv_batch(&self) -> Result<RecvBatch<'_>, VerbsError> {
        if self._srq.is_some() {
            return Err(VerbsError::InvalidArgument(
                "this QP takes its receives from an SRQ".into(),
            ));
        }
        Ok(RecvBatch {
            qp: self,
            body: Some(self.cell.lock()),
        })
    }

    /// Transport counters of this QP.
    pub fn counters(&self) -> rc::QpCounters {
        *self.cell.lock().qp.counters()
    }
}

impl Drop for Qp {
    fn drop(&mut self) {
        self.pd.device().engine().destroy_qp(&self.cell);
    }
}

/// Send work requests being posted together ([`Qp::post_batch`]); dropping it transmits them.
#[derive(Debug)]
pub struct PostBatch<'a> {
    qp: &'a Qp,
    /// The QP, locked (until the batch is dropped); None while another thread held it when
    /// the batch began, and the requests go through its inbox.
    body: Option<QpGuard<'a>>,
    posted: bool,
    /// Requests posted through the QP's inbox.
    inboxed: usize,
    /// A request posted consumes a receive at the peer (SEND kinds, WRITE with immediate).
    consumes_receive: bool,
}

/// A bind of a memory window by a work request ([`PostBatch::bind_mw`]): the window, the
/// R_Key it gets, and the part of a region it grants (`mr` `None` or `length` 0: unbound).
#[derive(Clone, Copy, Debug)]
pub struct MwBind<'a> {
    /// The window.
    pub mw: &'a Mw,
    /// Its key once bound (a type 1 window's from [`Mw::draw_type1_key`]; a type 2
    /// window's differs from its current key in the low 8 bits).
    pub new_rkey: u32,
    /// The region the window lies in.
    pub mr: Option<&'a Mr>,
    /// Start of the window.
    pub addr: u64,
    /// Length of the window.
    pub length: u64,
    /// Remote access it grants.
    pub access: Access,
}

impl PostBatch<'_> {
    /// Post one send work request (`ibv_post_send` for one element of the list).
    pub fn post(&mut self, wr: &SendWr<'_>) -> Result<(), VerbsError> {
        let qp = self.qp;
        if self.body.is_none() && qp.cell.inbox_post(wr) {
            self.inboxed += 1;
        } else {
            // The QP was free when the batch began, or the inbox cannot say (the queue may be
            // full, the request may be refused): the lock gives the exact answer, after the
            // requests the inbox took.
            let body = self.body.get_or_insert_with(|| qp.cell.lock());
            qp.pd
                .device()
                .engine()
                .endpoint()
                .post_locked(&qp.cell, body, wr)?;
            self.posted = true;
        }
        self.consumes_receive |= wr.opcode.consumes_receive();
        Ok(())
    }

    /// Post a `BIND_MW` work request (`ibv_post_send` with `IBV_WR_BIND_MW`, and
    /// `ibv_bind_mw`) and record the bind in the window: it holds the region's handle while
    /// it may refer to it, and answers [`Mw::rkey`] with its new key.
    pub fn bind_mw(
        &mut self,
        wr_id: u64,
        flags: SendFlags,
        bind: &MwBind<'_>,
    ) -> Result<(), VerbsError> {
        let wr = SendWr::new(
            wr_id,
            WrOpcode::BindMw {
                mw_rkey: bind.mw.rkey(),
                new_rkey: bind.new_rkey,
                mr_lkey: bind.mr.map_or(0, Mr::lkey),
                addr: bind.addr,
                length: bind.length,
                access: bind.access,
            },
        )
        .flags(flags);
        self.post(&wr)?;
        let mr = bind.mr.filter(|_| bind.length > 0);
        bind.mw.bound_by_wr(mr, bind.new_rkey);
        Ok(())
    }
}

impl Drop for PostBatch<'_> {
    fn drop(&mut self) {
        let engine = self.qp.pd.device().engine();
        let Some(mut body) = self.body.take() else {
            if self.inboxed > 0 {
                engine.inbox_posted(&self.qp.cell, self.inboxed);
            }
            return;
        };
        if self.inboxed > 0 {
            // Taken in by the locked post that followed them.
            let c = &engine.endpoint().counters;
            c.posts_inboxed
                .fetch_add(self.inboxed as u64, std::sync::atomic::Ordering::Relaxed);
        }
        if !self.posted && self.inboxed == 0 {
            return;
        }
        let now = engine.now();
        // Transmitted now, or left for the poster's next poll (busy-poll mode): then the
        // engine thread is woken once the QP is unlocked, so that it can take the QP.
        let kick = engine.post_done(&self.qp.cell, &mut body, now, self.consumes_receive);
        drop(body);
        if kick {
            engine.kick_for_doorbell();
        }
    }
}

/// Receive work requests being posted together ([`Qp::post_recv_batch`]).
#[derive(Debug)]
pub struct RecvBatch<'a> {
    qp: &'a Qp,
    /// The QP, locked (until the batch is dropped).
    body: Option<QpGuard<'a>>,
}

impl RecvBatch<'_> {
    /// Post one receive work request (`ibv_post_recv` for one element of the list).
    pub fn post(&mut self, wr: &RecvWr<'_>) -> Result<(), VerbsError> {
        let Some(body) = self.body.as_mut() else {
            return Err(VerbsError::InvalidArgument("the batch is closed".into()));
        };
        body.qp.post_recv(wr)?;
        Ok(())
    }
}

impl Drop for RecvBatch<'_> {
    fn drop(&mut self) {
        if let Some(mut body) = self.body.take() {
            // In the error state receives complete at once (flushed): move them to the CQ.
            self.qp
                .pd
                .device()
                .engine()
                .drain_completions(&self.qp.cell, &mut body);
        }
    }
}
