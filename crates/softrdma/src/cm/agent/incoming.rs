//! What arrives: a CM MAD handed to the agent, dispatched by message to the state of the
//! connection it names.

use super::*;

impl Agent {
    /// A MAD arrived on QP1 from `from`. Anything that is not a valid CM message for a
    /// connection of this agent from its peer is dropped and counted, changing nothing.
    pub fn handle_mad(&mut self, now: u64, from: IpAddr, payload: &[u8]) {
        self.counters.received += 1;
        let Ok(mad) = CmMad::parse(payload) else {
            if let Some(mad) = wire::mad::unmatched_response(payload) {
                // A Get or Set (e.g. ClassPortInfo): answered as Linux's MAD layer does.
                self.counters.unsupported += 1;
                self.counters.sent += 1;
                self.tx.push_back(CmTransmit { dst: from, mad });
                return;
            }
            self.counters.bad += 1;
            return;
        };
        match mad.msg {
            CmMessage::Req(req) => self.on_req(now, from, mad.tid, *req),
            CmMessage::SidrReq(req) => self.on_sidr_req(now, from, mad.tid, *req),
            msg => self.on_reply(now, from, mad.tid, msg),
        }
    }

    pub(super) fn on_req(&mut self, now: u64, from: IpAddr, tid: u64, req: Req) {
        if let Some(&id) = self
            .by_remote
            .get(&(from, req.local_comm_id, req.local_ca_guid))
        {
            self.counters.duplicates += 1;
            let Some(c) = self.conns.get(&id) else {
                return;
            };
            let (peer, ctid, remote) = (c.peer, c.tid, c.remote_comm_id);
            match c.state {
                // Still deciding: ask for patience.
                State::ReqRcvd => {
                    let mra = CmMessage::Mra(Mra {
                        local_comm_id: id,
                        remote_comm_id: remote,
                        message: MsgRef::Req,
                        service_timeout: self.cfg.mra_service_timeout,
                        private_data: Vec::new(),
                    });
                    self.send(peer, ctid, mra);
                }
                // The REP was lost.
                State::RepSent => {
                    if let Some(rep) = c.last.clone() {
                        self.send(peer, ctid, rep);
                    }
                }
                _ => {}
            }
            return;
        }
        let refuse = |reason| rej(0, req.local_comm_id, MsgRef::Req, reason, Vec::new());
        if !self.listeners.contains(&req.service_id) {
            let dup =
                |h: &(u64, IpAddr, u64, Req)| h.1 == from && h.3.local_comm_id == req.local_comm_id;
            if self.held.iter().any(dup) {
                self.counters.duplicates += 1;
                return;
            }
            if self.cfg.listen_grace_ns > 0 && self.held.len() < MAX_HELD {
                let until = now.saturating_add(self.cfg.listen_grace_ns);
                self.held.push((until, from, tid, req));
                return;
            }
            self.counters.no_listener += 1;
            self.send(from, tid, refuse(rej_reason::INVALID_SERVICE_ID));
            return;
        }
        if req.transport > 1 {
            self.send(from, tid, refuse(rej_reason::INVALID_TRANSPORT_TYPE));
            return;
        }
        if self.conns.len() >= self.cfg.max_conns {
            self.send(from, tid, refuse(rej_reason::NO_RESOURCES));
            return;
        }
        let id = self.new_comm_id();
        let params = Box::new(PeerParams {
            qpn: req.local_qpn,
            starting_psn: req.starting_psn,
            responder_resources: req.responder_resources,
            initiator_depth: req.initiator_depth,
            path_mtu: req.path_mtu,
            retry_count: req.retry_count,
            rnr_retry_count: req.rnr_retry_count,
            srq: req.srq,
            transport: req.transport,
            path: req.primary,
            service_id: req.service_id,
            private_data: req.private_data.clone(),
        });
        self.conns.insert(
            id,
            Conn {
                remote_guid: req.local_ca_guid,
                remote_qpn: req.local_qpn,
                // Kept for the peer's timeouts (see `accept`).
                last: Some(CmMessage::Req(Box::new(req.clone()))),
                ..Conn::new(State::ReqRcvd, from, req.local_comm_id, tid, 0)
            },
        );
        self.by_remote
            .insert((from, req.local_comm_id, req.local_ca_guid), id);
        self.events.push_back(CmEvent::ConnectRequest {
            conn: id,
            peer: from,
            params,
        });
    }

    /// Every message but REQ names our communication ID: it must be a connection of ours,
    /// from its peer, with the peer's ID once known.
    pub(super) fn on_reply(&mut self, now: u64, from: IpAddr, tid: u64, msg: CmMessage) {
        let id = msg.remote_comm_id();
        let known = self.conns.get(&id).is_some_and(|c| {
            c.peer == from && (c.remote_comm_id == 0 || c.remote_comm_id == msg.local_comm_id())
        });
        if !known {
            self.counters.stray += 1;
            self.answer_stray(from, tid, &msg);
            return;
        }
        let Some(c) = self.conns.get(&id) else {
            return;
        };
        let state = c.state;
        match msg {
            CmMessage::Rep(rep) => self.on_rep(id, state, rep),
            CmMessage::Mra(mra) => self.on_mra(now, id, state, &mra),
            CmMessage::Rej(r) => self.on_rej(now, id, state, *r),
            CmMessage::Rtu(_) => {
                if state == State::RepSent {
                    self.set_established(id);
                    self.events.push_back(CmEvent::Established {
                        conn: id,
                        params: None,
                    });
                } else {
                    self.counters.duplicates += 1;
                }
            }
            CmMessage::Dreq(d) => self.on_dreq(now, id, state, d),
            CmMessage::SidrRep(r) => self.on_sidr_rep(now, id, state, *r),
            CmMessage::Drep(d) => {
                if state == State::DreqSent {
                    self.enter_timewait(now, id, d.private_data);
                } else {
                    self.counters.duplicates += 1;
                }
            }
            CmMessage::Req(_) | CmMessage::SidrReq(_) => {}
        }
    }

    /// As Linux: a DREQ for no connection still gets a DREP (so the peer stops sending it),
    /// a REP one a REJ; anything else is dropped.
    pub(super) fn answer_stray(&mut self, from: IpAddr, tid: u64, msg: &CmMessage) {
        let ids = (msg.remote_comm_id(), msg.local_comm_id());
        match msg {
            CmMessage::Dreq(_) => self.send(
                from,
                tid,
                CmMessage::Drep(Ids {
                    local_comm_id: ids.0,
                    remote_comm_id: ids.1,
                    private_data: Vec::new(),
                }),
            ),
            CmMessage::Rep(_) => self.send(
                from,
                tid,
                rej(
                    ids.0,
                    ids.1,
                    MsgRef::Rep,
                    rej_reason::INVALID_COMM_ID,
                    Vec::new(),
                ),
            ),
            _ => {}
        }
    }

    pub(super) fn set_established(&mut self, id: ConnId) {
        if let Some(c) = self.conns.get_mut(&id) {
            c.state = State::Established;
            c.last = None;
        }
        self.set_deadline(id, None);
    }

    pub(super) fn on_rep(&mut self, id: ConnId, state: State, rep: Rep) {
        let Some(c) = self.conns.get_mut(&id) else {
            return;
        };
        let rtu = CmMessage::Rtu(Ids {
            local_comm_id: id,
            remote_comm_id: rep.local_comm_id,
            private_data: Vec::new(),
        });
        match state {
            State::ReqSent | State::MraRcvd => {
                c.remote_comm_id = rep.local_comm_id;
                c.remote_guid = rep.local_ca_guid;
                c.remote_qpn = rep.local_qpn;
                let (peer, tid) = (c.peer, c.tid);
                let (path_mtu, retry_count, path) = match &c.last {
                    Some(CmMessage::Req(r)) => (r.path_mtu, r.retry_count, r.primary),
                    _ => (0, 0, CmPath::default()),
                };
                if c.defer_rtu {
                    c.state = State::RepRcvd;
                    c.last = None;
                    self.set_deadline(id, None);
                } else {
                    self.set_established(id);
                    self.send(peer, tid, rtu);
                }
                self.events.push_back(CmEvent::Established {
                    conn: id,
                    params: Some(Box::new(PeerParams {
                        qpn: rep.local_qpn,
                        starting_psn: rep.starting_psn,
                        responder_resources: rep.responder_resources,
                        initiator_depth: rep.initiator_depth,
                        path_mtu,
                        retry_count,
                        rnr_retry_count: rep.rnr_retry_count,
                        srq: rep.srq,
                        transport: 0,
                        path,
                        service_id: 0,
                        private_data: rep.private_data,
                    })),
                });
            }
            // Our RTU was lost: send it again.
            State::Established => {
                self.counters.duplicates += 1;
                let (peer, tid) = (c.peer, c.tid);
                self.send(peer, tid, rtu);
            }
            _ => self.counters.duplicates += 1,
        }
    }

    pub(super) fn on_mra(&mut self, now: u64, id: ConnId, state: State, mra: &Mra) {
        let extend = matches!(
            (state, mra.message),
            (State::ReqSent | State::MraRcvd, MsgRef::Req) | (State::RepSent, MsgRef::Rep)
        );
        if !extend {
            self.counters.duplicates += 1;
            return;
        }
        let wait =
            timeout_ns(mra.service_timeout).saturating_add(timeout_ns(self.cfg.response_timeout));
        if let Some(c) = self.conns.get_mut(&id)
            && state != State::RepSent
        {
            c.state = State::MraRcvd;
            c.remote_comm_id = mra.local_comm_id;
        }
        self.set_deadline(id, Some(now.saturating_add(wait)));
    }

    pub(super) fn on_rej(&mut self, now: u64, id: ConnId, state: State, r: Rej) {
        if matches!(state, State::ReqSent | State::MraRcvd)
            && r.reason == rej_reason::INVALID_SERVICE_ID
            && let Some(c) = self.conns.get_mut(&id)
            && now.saturating_sub(c.started) < self.cfg.connect_grace_ns
        {
            // Nobody listens yet: the REQ goes again shortly (the peer kept no state).
            c.state = State::ReqSent;
            c.remote_comm_id = 0;
            c.retries_left = c.retries_left.max(1);
            let at = now.saturating_add(self.cfg.connect_retry_ns);
            self.set_deadline(id, Some(at));
            return;
        }
        match state {
            State::ReqSent | State::MraRcvd | State::RepSent | State::ReqRcvd | State::RepRcvd => {
                self.remove(id);
                self.events.push_back(CmEvent::Rejected {
                    conn: id,
                    reason: r.reason,
                    private_data: r.private_data,
                });
            }
            State::Established | State::DreqSent => self.enter_timewait(now, id, Vec::new()),
            State::TimeWait => self.counters.duplicates += 1,
            State::SidrReqSent | State::SidrReqRcvd | State::SidrAnswered => {
                self.counters.stray += 1
            }
        }
    }

    pub(super) fn on_dreq(&mut self, now: u64, id: ConnId, state: State, d: Dreq) {
        let Some(c) = self.conns.get(&id) else {
            return;
        };
        let drep = CmMessage::Drep(Ids {
            local_comm_id: id,
            remote_comm_id: c.remote_comm_id,
            private_data: Vec::new(),
        });
        let (peer, tid) = (c.peer, c.tid);
        match state {
            State::Established | State::DreqSent | State::RepSent | State::RepRcvd => {
                if state == State::RepSent {
                    // The RTU was lost but the peer is done already: it was up.
                    self.events.push_back(CmEvent::Established {
                        conn: id,
                        params: None,
                    });
                }
                self.send(peer, tid, drep);
                self.enter_timewait(now, id, d.private_data);
            }
            State::TimeWait => {
                self.counters.duplicates += 1;
                self.send(peer, tid, drep);
            }
            _ => self.counters.stray += 1,
        }
    }
}
