//! The low-level interface of a connection manager: the agent's own calls, with events
//! delivered to a hook (what a C `librdmacm` is built on).

use super::*;

/// The low-level interface of a [`ConnectionManager`] (what a C `librdmacm` is built on):
/// the agent's own calls, with events delivered to the hook instead of waited for.
#[derive(Debug)]
pub struct RawCm<'a> {
    cm: &'a ConnectionManager,
}

impl ConnectionManager {
    /// Where the events of connections made through [`ConnectionManager::raw`] go.
    pub fn set_hook(&self, hook: Option<CmHook>) {
        lock(&self.inner.shared).hook = hook;
    }

    /// The low-level interface.
    pub fn raw(&self) -> RawCm<'_> {
        RawCm { cm: self }
    }

    /// The device's address, GID and active MTU, for building REQs.
    pub fn path_to(&self, dst: IpAddr) -> CmPath {
        CmPath {
            local_lid: 0xffff,
            remote_lid: 0xffff,
            local_gid: gid_of(self.inner.dev.addr()),
            remote_gid: gid_of(dst),
            hop_limit: 64,
            local_ack_timeout: 14,
            ..CmPath::default()
        }
    }
}

impl RawCm<'_> {
    fn with<T>(
        &self,
        f: impl FnOnce(&mut Agent, u64) -> Result<T, crate::cm::Error>,
    ) -> Result<T, CmError> {
        let inner = &self.cm.inner;
        let mut s = lock(&inner.shared);
        let now = inner.now();
        let r = f(&mut s.agent, now);
        inner.flush(&mut s);
        Ok(r?)
    }

    /// Listen on a service ID; its requests go to the hook.
    pub fn listen(&self, service_id: u64) -> Result<(), CmError> {
        // Marked first: REQs held for this service come out of the listen itself.
        let fresh = lock(&self.cm.inner.shared).raw_services.insert(service_id);
        let r = self.with(|a, _| a.listen(service_id));
        if r.is_err() && fresh {
            lock(&self.cm.inner.shared).raw_services.remove(&service_id);
        }
        r
    }

    /// Stop listening on a service ID.
    pub fn unlisten(&self, service_id: u64) -> Result<(), CmError> {
        lock(&self.cm.inner.shared).raw_services.remove(&service_id);
        self.with(|a, _| a.unlisten(service_id))
    }

    /// Send a REQ.
    pub fn connect(&self, p: ConnectParams) -> Result<ConnId, CmError> {
        self.with(|a, now| a.connect(now, p))
    }

    /// Send the REP of a request.
    pub fn accept(&self, id: ConnId, p: AcceptParams) -> Result<(), CmError> {
        self.with(|a, now| a.accept(now, id, p))
    }

    /// Reject a request.
    pub fn reject(&self, id: ConnId, private_data: &[u8]) -> Result<(), CmError> {
        self.with(|a, _| a.reject(id, private_data))
    }

    /// Send a DREQ.
    pub fn disconnect(&self, id: ConnId, private_data: &[u8]) -> Result<(), CmError> {
        self.with(|a, now| a.disconnect(now, id, private_data))
    }

    /// Forget a connection (telling the peer as `cm::Agent::destroy` does).
    pub fn destroy(&self, id: ConnId) -> Result<(), CmError> {
        self.with(|a, _| a.destroy(id))
    }

    /// Send a SIDR_REQ (rdma_cm's UDP port space); `SidrReply` or `Unreachable` goes to the
    /// hook.
    pub fn sidr_request(&self, p: SidrParams) -> Result<ConnId, CmError> {
        self.with(|a, now| a.sidr_request(now, p))
    }

    /// Answer a `SidrRequest` with a SIDR_REP.
    pub fn sidr_answer(&self, id: ConnId, answer: SidrAnswer) -> Result<(), CmError> {
        self.with(|a, now| a.sidr_answer(now, id, answer))
    }

    /// Send the RTU of a connection made with `defer_rtu` (its QP is up now).
    pub fn establish(&self, id: ConnId) -> Result<(), CmError> {
        self.with(|a, _| a.establish(id))
    }

    /// Whether the connection has sent its DREQ and waits for the DREP.
    pub fn is_disconnecting(&self, id: ConnId) -> bool {
        lock(&self.cm.inner.shared).agent.is_disconnecting(id)
    }
}

impl Drop for ConnectionManager {
    fn drop(&mut self) {
        self.inner.stop.store(true, Ordering::Release);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}
