//! Reliable Connected queue pairs.

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;

use super::{Cq, Pd, Srq, VerbsError};
use crate::net::{QpCell, QpGuard};
use crate::rc::{self, QpAttr, QpAttrMask, QpCap, QpState, RecvWr, SendWr};
use crate::wire::IcrcContext;

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
}

impl QpInitAttr {
    /// One CQ for both directions, default capacities.
    pub fn new(cq: &Cq) -> QpInitAttr {
        QpInitAttr {
            send_cq: cq.clone(),
            recv_cq: cq.clone(),
            srq: None,
            cap: QpCap::default(),
            sq_sig_all: false,
        }
    }
}

/// A Reliable Connected queue pair. Dropping it moves it to the error state (its outstanding
/// work requests complete with `WrFlushErr`) and removes it from the device.
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
        for _ in 0..64 {
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
        })?;
        qp.set_send_window(pd.device().config().send_window);
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
    pub fn av_for(&self, remote: IpAddr) -> IcrcContext {
        let e = self.pd.device().engine();
        let mut ctx = e.path_to(remote, self.src_port());
        ctx.dst_port = e.local_addr().port();
        ctx
    }

    /// Modify the QP (`ibv_modify_qp`). With `AV` in the mask, `attr.av` names the peer.
    pub fn modify(&self, attr: &QpAttr, mask: QpAttrMask) -> Result<(), VerbsError> {
        let engine = self.pd.device().engine();
        let mut body = self.cell.lock();
        body.qp.modify(attr, mask)?;
        if mask.contains(QpAttrMask::AV)
            && let Some(av) = attr.av
        {
            let ip = match av.ip {
                crate::wire::IpHeader::V4 { dst, .. } => IpAddr::V4(dst),
                crate::wire::IpHeader::V6 { dst, .. } => match dst.to_ipv4_mapped() {
                    Some(v4) if engine.local_ip().is_ipv4() => IpAddr::V4(v4),
                    _ => IpAddr::V6(dst),
                },
            };
            body.peer = Some(SocketAddr::new(ip, av.dst_port));
            // A new peer: its source port is latched anew.
            body.peer_src_port = None;
        }
        let now = engine.now();
        engine.drive(&self.cell, &mut body, now);
        engine.mark_active(now);
        Ok(())
    }

    /// Bring a fresh QP to RTS towards a peer: RESET→INIT→RTR→RTS with `attr` supplying path
    /// MTU, timeouts, retries, PSNs, the peer's QPN and the access flags (the state fields and
    /// `av` are set here).
    pub fn connect(&self, remote: IpAddr, attr: &QpAttr) -> Result<(), VerbsError> {
        let mut a = *attr;
        a.qp_state = QpState::Init;
        self.modify(&a, QpAttrMask::TO_INIT)?;
        a.qp_state = QpState::Rtr;
        a.av = Some(self.av_for(remote));
        self.modify(&a, QpAttrMask::TO_RTR)?;
        a.qp_state = QpState::Rts;
        self.modify(&a, QpAttrMask::TO_RTS)
    }

    /// Current state and attributes (`ibv_query_qp`).
    pub fn query(&self) -> (QpState, QpAttr) {
        let body = self.cell.lock();
        (body.qp.state(), *body.qp.attr())
    }

    /// Post a send work request (`ibv_post_send`). The packets it makes go out from this
    /// thread before it returns (as far as the send window allows).
    pub fn post_send(&self, wr: &SendWr<'_>) -> Result<(), VerbsError> {
        let engine = self.pd.device().engine();
        let mut body = self.cell.lock();
        body.qp.post_send(wr)?;
        let now = engine.now();
        engine.drive(&self.cell, &mut body, now);
        Ok(())
    }

    /// Post several send work requests; stops at the first refused one and returns its index
    /// with the error (as `bad_wr`).
    pub fn post_send_list(&self, wrs: &[SendWr<'_>]) -> Result<(), (usize, VerbsError)> {
        let engine = self.pd.device().engine();
        let mut body = self.cell.lock();
        let mut res = Ok(());
        for (i, wr) in wrs.iter().enumerate() {
            if let Err(e) = body.qp.post_send(wr) {
                res = Err((i, e.into()));
                break;
            }
        }
        let now = engine.now();
        engine.drive(&self.cell, &mut body, now);
        engine.mark_active(now);
        res
    }

    /// Post several send work requests under one lock of the QP, transmitted together when
    /// the batch is dropped (`ibv_post_send` with a list: one drive of the transport, and the
    /// packets of all of them in as few system calls as the send window allows). A request
    /// refused by [`PostBatch::post`] leaves the earlier ones posted.
    pub fn post_batch(&self) -> PostBatch<'_> {
        PostBatch {
            qp: self,
            body: self.cell.lock(),
            posted: false,
        }
    }

    /// Post a receive work request (`ibv_post_recv`).
    pub fn post_recv(&self, wr: &RecvWr<'_>) -> Result<(), VerbsError> {
        if self._srq.is_some() {
            return Err(VerbsError::InvalidArgument(
                "this QP takes its receives from an SRQ".into(),
            ));
        }
        let engine = self.pd.device().engine();
        let mut body = self.cell.lock();
        body.qp.post_recv(wr)?;
        // In the error state the receive completes at once (flushed): move it to the CQ.
        engine.drain_completions(&self.cell, &mut body);
        Ok(())
    }

    /// Transport counters of this QP.
    pub fn counters(&self) -> rc::QpCounters {
        *self.cell.lock().qp.counters()
    }
}

impl Drop for Qp {
    fn drop(&mut self) {
        let engine = self.pd.device().engine();
        engine.remove_qp(self.cell.qpn);
        let mut body = self.cell.lock();
        // The peer may be waiting for an acknowledgement this QP holds back (busy-poll mode).
        engine.flush_held(&mut body);
        let attr = QpAttr {
            qp_state: QpState::Err,
            ..*body.qp.attr()
        };
        let _ = body.qp.modify(&attr, QpAttrMask::STATE);
        let now = engine.now();
        engine.drive(&self.cell, &mut body, now);
    }
}

/// Send work requests being posted together ([`Qp::post_batch`]); dropping it transmits them.
#[derive(Debug)]
pub struct PostBatch<'a> {
    qp: &'a Qp,
    body: QpGuard<'a>,
    posted: bool,
}

impl PostBatch<'_> {
    /// Post one send work request (`ibv_post_send` for one element of the list).
    pub fn post(&mut self, wr: &SendWr<'_>) -> Result<(), VerbsError> {
        self.body.qp.post_send(wr)?;
        self.posted = true;
        Ok(())
    }
}

impl Drop for PostBatch<'_> {
    fn drop(&mut self) {
        if self.posted {
            let engine = self.qp.pd.device().engine();
            let now = engine.now();
            engine.drive(&self.qp.cell, &mut self.body, now);
        }
    }
}
