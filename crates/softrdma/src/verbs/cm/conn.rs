//! The waiting interface: a listener's requests, a request accepted into a connection, a
//! connection's disconnection.

use super::*;

/// A port being listened on. Dropping it stops listening.
#[derive(Debug)]
pub struct Listener<'a> {
    pub(super) cm: &'a ConnectionManager,
    pub(super) port: u16,
}

impl<'a> Listener<'a> {
    /// The next connection request, waiting up to `timeout`.
    pub fn get_request(&self, timeout: Duration) -> Result<ConnRequest<'a>, CmError> {
        let inner = &self.cm.inner;
        let deadline = Instant::now() + timeout;
        let mut s = lock(&inner.shared);
        loop {
            if let Some(r) = self.take_request(&mut s) {
                return Ok(r);
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(CmError::Timeout);
            }
            s = inner
                .cond
                .wait_timeout(s, left)
                .unwrap_or_else(PoisonError::into_inner)
                .0;
        }
    }

    /// The next connection request, if one is waiting.
    pub fn try_get_request(&self) -> Option<ConnRequest<'a>> {
        self.take_request(&mut lock(&self.cm.inner.shared))
    }

    /// [`Listener::get_request`] for async code: the future ends with the next request.
    pub async fn request(&self) -> ConnRequest<'a> {
        std::future::poll_fn(|cx| {
            let mut s = lock(&self.cm.inner.shared);
            match self.take_request(&mut s) {
                Some(r) => Poll::Ready(r),
                None => {
                    Inner::register(&mut s, cx);
                    Poll::Pending
                }
            }
        })
        .await
    }

    fn take_request(&self, s: &mut Shared) -> Option<ConnRequest<'a>> {
        let (id, peer, params) = s.requests.get_mut(&self.port)?.pop_front()?;
        s.events.insert(id, VecDeque::new());
        Some(ConnRequest {
            cm: self.cm,
            id,
            peer,
            params,
        })
    }
}

impl Drop for Listener<'_> {
    fn drop(&mut self) {
        let mut s = lock(&self.cm.inner.shared);
        let _ = s.agent.unlisten(PortSpace::Tcp.service_id(self.port));
        if let Some(q) = s.requests.remove(&self.port) {
            for (id, _, _) in q {
                let _ = s.agent.reject(id, &[]);
            }
        }
        self.cm.inner.flush(&mut s);
    }
}

/// A connection request: accept or reject it (dropping it rejects).
#[derive(Debug)]
pub struct ConnRequest<'a> {
    cm: &'a ConnectionManager,
    id: ConnId,
    peer: IpAddr,
    params: Box<PeerParams>,
}

impl<'a> ConnRequest<'a> {
    /// Who asks.
    pub fn peer(&self) -> IpAddr {
        self.peer
    }

    /// The requester's private data (after rdma_cm's header).
    pub fn private_data(&self) -> &[u8] {
        self.params
            .private_data
            .get(CMA_HDR_LEN..)
            .unwrap_or_default()
    }

    /// Accept with the fresh RC QP `qp`: it is brought to RTS toward the requester, the REP
    /// sent, and the RTU awaited (up to `timeout`).
    pub fn accept(
        self,
        qp: &Qp,
        param: &ConnParam,
        timeout: Duration,
    ) -> Result<Connection<'a>, CmError> {
        let conn = self.send_rep(qp, param)?;
        let e = conn.cm.inner.wait_event(conn.id, timeout)?;
        conn.on_rtu(e)
    }

    /// [`ConnRequest::accept`] for async code: the future ends when the RTU arrives (or the
    /// connection fails); dropping it before then abandons the connection.
    pub async fn accept_async(self, qp: &Qp, param: &ConnParam) -> Result<Connection<'a>, CmError> {
        let conn = self.send_rep(qp, param)?;
        let e = std::future::poll_fn(|cx| conn.cm.inner.poll_event(conn.id, cx)).await;
        conn.on_rtu(e)
    }

    /// Bring `qp` to RTS toward the requester and send the REP.
    fn send_rep(mut self, qp: &Qp, param: &ConnParam) -> Result<Connection<'a>, CmError> {
        let p = &self.params;
        let rq_psn = random_psn();
        let mtu = mtu_of(p.path_mtu).min(self.cm.inner.dev.config().active_mtu);
        let a = rc_attr(mtu, p, rq_psn, param, p.retry_count);
        qp.connect(self.peer, &a)?;
        let id = std::mem::replace(&mut self.id, 0);
        let conn = Connection {
            cm: self.cm,
            id,
            peer: self.peer,
            private_data: Vec::new(),
        };
        let mut s = lock(&self.cm.inner.shared);
        let now = self.cm.inner.now();
        s.agent.accept(
            now,
            id,
            AcceptParams {
                qpn: qp.qp_num(),
                starting_psn: rq_psn,
                responder_resources: param.responder_resources,
                initiator_depth: param.initiator_depth,
                rnr_retry_count: param.rnr_retry_count.min(7),
                srq: false,
                private_data: param.private_data.clone(),
            },
        )?;
        self.cm.inner.flush(&mut s);
        Ok(conn)
    }

    /// Reject with private data (up to 148 bytes).
    pub fn reject(mut self, private_data: &[u8]) -> Result<(), CmError> {
        let id = std::mem::replace(&mut self.id, 0);
        let mut s = lock(&self.cm.inner.shared);
        s.events.remove(&id);
        s.agent.reject(id, private_data)?;
        self.cm.inner.flush(&mut s);
        Ok(())
    }
}

impl Drop for ConnRequest<'_> {
    fn drop(&mut self) {
        if self.id != 0 {
            let mut s = lock(&self.cm.inner.shared);
            s.events.remove(&self.id);
            let _ = s.agent.destroy(self.id);
            self.cm.inner.flush(&mut s);
        }
    }
}

/// An established connection. Dropping it disconnects (a DREQ, not waited for).
#[derive(Debug)]
pub struct Connection<'a> {
    pub(super) cm: &'a ConnectionManager,
    pub(super) id: ConnId,
    pub(super) peer: IpAddr,
    pub(super) private_data: Vec<u8>,
}

impl Connection<'_> {
    /// The peer.
    pub fn peer(&self) -> IpAddr {
        self.peer
    }

    /// The private data of the peer's REP (active side; empty on the passive side).
    pub fn private_data(&self) -> &[u8] {
        &self.private_data
    }

    /// The active side's answer `e`: on the REP, `qp` to RTS toward the peer and the RTU.
    pub(super) fn on_rep(
        mut self,
        qp: &Qp,
        e: CmEvent,
        rq_psn: u32,
        param: &ConnParam,
    ) -> Result<Self, CmError> {
        match e {
            CmEvent::Established {
                params: Some(rep), ..
            } => {
                let mtu = self.cm.inner.dev.config().active_mtu;
                let a = rc_attr(mtu, &rep, rq_psn, param, param.retry_count.min(7));
                qp.connect(self.peer, &a)?;
                self.cm.raw().establish(self.id)?;
                self.private_data = rep.private_data;
                Ok(self)
            }
            e => Err(self.fail(e)),
        }
    }

    /// The passive side's answer `e`: up on the RTU.
    fn on_rtu(self, e: CmEvent) -> Result<Self, CmError> {
        match e {
            CmEvent::Established { .. } => Ok(self),
            e => Err(self.fail(e)),
        }
    }

    /// The error an unexpected event means; the connection is forgotten.
    fn fail(mut self, e: CmEvent) -> CmError {
        let id = std::mem::replace(&mut self.id, 0);
        let mut s = lock(&self.cm.inner.shared);
        s.events.remove(&id);
        let _ = s.agent.destroy(id);
        self.cm.inner.flush(&mut s);
        match e {
            CmEvent::Rejected {
                reason,
                private_data,
                ..
            } => CmError::Rejected {
                reason,
                private_data,
            },
            CmEvent::Unreachable { .. } => CmError::Unreachable,
            _ => CmError::Disconnected,
        }
    }

    /// Disconnect: DREQ, and wait (up to `timeout`) for the DREP or the peer's own DREQ.
    pub fn disconnect(&self, timeout: Duration) -> Result<(), CmError> {
        self.send_dreq()?;
        self.wait_disconnected(timeout)
    }

    /// [`Connection::disconnect`] for async code.
    pub async fn disconnect_async(&self) -> Result<(), CmError> {
        self.send_dreq()?;
        self.disconnected().await;
        Ok(())
    }

    /// The future of [`Connection::wait_disconnected`]: ends when the connection is down.
    pub async fn disconnected(&self) {
        loop {
            let e = std::future::poll_fn(|cx| self.cm.inner.poll_event(self.id, cx)).await;
            if matches!(
                e,
                CmEvent::Disconnected { .. } | CmEvent::TimewaitExit { .. }
            ) {
                return;
            }
        }
    }

    fn send_dreq(&self) -> Result<(), CmError> {
        let mut s = lock(&self.cm.inner.shared);
        let now = self.cm.inner.now();
        s.agent.disconnect(now, self.id, &[])?;
        self.cm.inner.flush(&mut s);
        Ok(())
    }

    /// Wait (up to `timeout`) until the connection is down (the peer disconnected, or our
    /// DREQ was answered or ran out of retries).
    pub fn wait_disconnected(&self, timeout: Duration) -> Result<(), CmError> {
        let deadline = Instant::now() + timeout;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.cm.inner.wait_event(self.id, left)? {
                CmEvent::Disconnected { .. } => return Ok(()),
                CmEvent::TimewaitExit { .. } => return Ok(()),
                _ => continue,
            }
        }
    }
}

impl Drop for Connection<'_> {
    fn drop(&mut self) {
        if self.id != 0 {
            let mut s = lock(&self.cm.inner.shared);
            s.events.remove(&self.id);
            let _ = s.agent.destroy(self.id);
            self.cm.inner.flush(&mut s);
        }
    }
}
