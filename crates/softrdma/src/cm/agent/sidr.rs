//! Service ID resolution (SIDR): a SIDR_REQ sent and retried like a REQ, a SIDR_REP
//! received, and the passive side's answer, repeated for duplicates until its time-wait ends.

use super::*;

impl Agent {
    /// Resolve a service ID to the peer's UD QP: send a SIDR_REQ, retried like a REQ.
    /// `SidrReply` follows (or `Unreachable` when every retry goes unanswered).
    pub fn sidr_request(&mut self, now: u64, p: SidrParams) -> Result<ConnId, Error> {
        if self.conns.len() >= self.cfg.max_conns {
            return Err(Error::TooManyConns);
        }
        let id = self.new_comm_id();
        let tid = self.next_random();
        let req = CmMessage::SidrReq(Box::new(SidrReq {
            request_id: id,
            pkey: wire::DEFAULT_PKEY,
            service_id: p.service_id,
            private_data: p.private_data,
        }));
        let conn = Conn::new(State::SidrReqSent, p.peer, 0, tid, now);
        self.open_active(now, id, conn, req)
    }

    /// Answer a resolution reported by `SidrRequest` with a SIDR_REP; the SIDR_REP is
    /// repeated for duplicate SIDR_REQs during the time-wait, then the resolution is gone.
    pub fn sidr_answer(&mut self, now: u64, id: ConnId, a: SidrAnswer) -> Result<(), Error> {
        let c = self.conns.get(&id).ok_or(Error::UnknownConn)?;
        if c.state != State::SidrReqRcvd {
            return Err(Error::WrongState(c.state.name()));
        }
        let rep = self.sidr_rep_of(c, a.status, a.qpn, a.qkey, a.private_data);
        CmMad {
            tid: c.tid,
            msg: rep.clone(),
        }
        .emit(&mut [0u8; MAD_LEN])?;
        let (peer, tid) = (c.peer, c.tid);
        if let Some(c) = self.conns.get_mut(&id) {
            c.state = State::SidrAnswered;
            c.last = Some(rep.clone());
        }
        self.send(peer, tid, rep);
        self.set_deadline(id, Some(now.saturating_add(self.cfg.timewait_ns)));
        Ok(())
    }

    /// The SIDR_REP answering passive resolution `c` (whose `last` is its SIDR_REQ).
    pub(super) fn sidr_rep_of(
        &self,
        c: &Conn,
        status: u8,
        qpn: u32,
        qkey: u32,
        private_data: Vec<u8>,
    ) -> CmMessage {
        let service_id = match &c.last {
            Some(CmMessage::SidrReq(r)) => r.service_id,
            _ => 0,
        };
        CmMessage::SidrRep(Box::new(SidrRep {
            request_id: c.remote_comm_id,
            status,
            info_len: 0,
            qpn: if status == sidr_status::SUCCESS {
                qpn
            } else {
                0
            },
            service_id,
            qkey: if status == sidr_status::SUCCESS {
                qkey
            } else {
                0
            },
            info: [0; 72],
            private_data,
        }))
    }

    /// A SIDR_REQ: a duplicate of one being decided is dropped, of one answered gets the
    /// same SIDR_REP; one for a service nobody listens on is answered "not supported" at
    /// once (as Linux does); otherwise a new resolution is reported.
    pub(super) fn on_sidr_req(&mut self, now: u64, from: IpAddr, tid: u64, req: SidrReq) {
        if let Some(&id) = self.by_remote.get(&(from, req.request_id, 0)) {
            self.counters.duplicates += 1;
            let Some(c) = self.conns.get(&id) else {
                return;
            };
            if c.state == State::SidrAnswered
                && let Some(rep) = c.last.clone()
            {
                let (peer, ctid) = (c.peer, c.tid);
                self.send(peer, ctid, rep);
                let until = now.saturating_add(self.cfg.timewait_ns);
                self.set_deadline(id, Some(until));
            }
            return;
        }
        let refuse = |status| {
            CmMessage::SidrRep(Box::new(SidrRep {
                request_id: req.request_id,
                status,
                info_len: 0,
                qpn: 0,
                service_id: req.service_id,
                qkey: 0,
                info: [0; 72],
                private_data: Vec::new(),
            }))
        };
        if !self.listeners.contains(&req.service_id) {
            self.counters.no_listener += 1;
            self.send(from, tid, refuse(sidr_status::SID_NOT_SUPPORTED));
            return;
        }
        if self.conns.len() >= self.cfg.max_conns {
            self.send(from, tid, refuse(sidr_status::NO_QP));
            return;
        }
        let id = self.new_comm_id();
        let conn = Conn::new(State::SidrReqRcvd, from, req.request_id, tid, now);
        self.conns.insert(id, conn);
        self.by_remote.insert((from, req.request_id, 0), id);
        self.events.push_back(CmEvent::SidrRequest {
            conn: id,
            peer: from,
            service_id: req.service_id,
            private_data: req.private_data.clone(),
        });
        if let Some(c) = self.conns.get_mut(&id) {
            // Kept for the answer's service ID.
            c.last = Some(CmMessage::SidrReq(Box::new(req)));
        }
    }

    /// A SIDR_REP for a resolution of ours. "Not supported" within the connect grace means
    /// nobody listens yet: the SIDR_REQ goes again shortly, as a REQ does after such a REJ.
    pub(super) fn on_sidr_rep(&mut self, now: u64, id: ConnId, state: State, rep: SidrRep) {
        if state != State::SidrReqSent {
            self.counters.stray += 1;
            return;
        }
        let Some(c) = self.conns.get_mut(&id) else {
            return;
        };
        if rep.status == sidr_status::SID_NOT_SUPPORTED
            && now.saturating_sub(c.started) < self.cfg.connect_grace_ns
        {
            c.retries_left = c.retries_left.max(1);
            let at = now.saturating_add(self.cfg.connect_retry_ns);
            self.set_deadline(id, Some(at));
            return;
        }
        let peer = c.peer;
        self.remove(id);
        self.events.push_back(CmEvent::SidrReply {
            conn: id,
            peer,
            status: rep.status,
            qpn: rep.qpn,
            qkey: rep.qkey,
            private_data: rep.private_data,
        });
    }
}
