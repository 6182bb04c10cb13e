//! The CM state machine of one device (see the module documentation of [`crate::cm`]).

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet, VecDeque};
use std::net::IpAddr;

use super::types::{
    AcceptParams, AgentConfig, CmCounters, CmEvent, CmTransmit, ConnId, ConnectParams, Error,
    PeerParams, SidrAnswer, SidrParams,
};
use crate::wire;
use crate::wire::cm::{
    CmMad, CmMessage, CmPath, Dreq, Ids, Mra, MsgRef, Rej, Rep, Req, SidrRep, SidrReq, rej_reason,
    sidr_status,
};
use crate::wire::mad::MAD_LEN;

/// 4.096 µs × 2^`exp` in nanoseconds (the IBTA encoding of CM timeouts), capped at 2^31.
pub(crate) fn timeout_ns(exp: u8) -> u64 {
    4096u64 << exp.min(31)
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum State {
    /// Active: REQ sent, waiting for REP (or REJ, MRA).
    ReqSent,
    /// Active: the peer sent MRA; waiting longer.
    MraRcvd,
    /// Passive: REQ reported; waiting for the application.
    ReqRcvd,
    /// Passive: REP sent, waiting for RTU.
    RepSent,
    /// Active: the REP arrived; the RTU waits for [`Agent::establish`] (the application
    /// brings its QP up first).
    RepRcvd,
    Established,
    DreqSent,
    TimeWait,
    /// Active: SIDR_REQ sent, waiting for the SIDR_REP.
    SidrReqSent,
    /// Passive: SIDR_REQ reported; waiting for the application.
    SidrReqRcvd,
    /// Passive: SIDR_REP sent; a duplicate SIDR_REQ gets it again until time-wait ends.
    SidrAnswered,
}

impl State {
    fn name(self) -> &'static str {
        match self {
            State::ReqSent => "REQ sent",
            State::MraRcvd => "MRA received",
            State::ReqRcvd => "REQ received",
            State::RepSent => "REP sent",
            State::RepRcvd => "REP received",
            State::Established => "established",
            State::DreqSent => "DREQ sent",
            State::TimeWait => "time-wait",
            State::SidrReqSent => "SIDR_REQ sent",
            State::SidrReqRcvd => "SIDR_REQ received",
            State::SidrAnswered => "SIDR_REP sent",
        }
    }
}

#[derive(Debug)]
struct Conn {
    state: State,
    peer: IpAddr,
    /// The peer's communication ID (0 until its first message).
    remote_comm_id: u32,
    remote_guid: u64,
    tid: u64,
    remote_qpn: u32,
    /// What a timeout sends again, and what a duplicate is answered with.
    last: Option<CmMessage>,
    retries_left: u8,
    /// The timeout for answers to `last`.
    wait_ns: u64,
    deadline: Option<u64>,
    /// When the active side sent its first REQ.
    started: u64,
    /// Active: send the RTU only on `establish`.
    defer_rtu: bool,
}

impl Conn {
    /// A connection in `state` with `peer` (its ID `remote_comm_id`, 0 until known), the
    /// transaction `tid`, begun at `started`; nothing sent or awaited yet.
    fn new(state: State, peer: IpAddr, remote_comm_id: u32, tid: u64, started: u64) -> Conn {
        Conn {
            state,
            peer,
            remote_comm_id,
            remote_guid: 0,
            tid,
            remote_qpn: 0,
            last: None,
            retries_left: 0,
            wait_ns: 0,
            deadline: None,
            started,
            defer_rtu: false,
        }
    }
}

/// REQs held for a listener at most (more are rejected at once).
const MAX_HELD: usize = 1024;

/// The CM of one device.
#[derive(Debug)]
pub struct Agent {
    cfg: AgentConfig,
    rng: u64,
    conns: BTreeMap<ConnId, Conn>,
    /// Passive connections by (peer, its communication ID, its CA GUID): duplicate REQs.
    by_remote: HashMap<(IpAddr, u32, u64), ConnId>,
    listeners: HashSet<u64>,
    /// REQs for services nobody listens on yet, with when they are rejected.
    held: Vec<(u64, IpAddr, u64, Req)>,
    /// (deadline, connection) of every connection with a deadline.
    timers: BTreeSet<(u64, ConnId)>,
    tx: VecDeque<CmTransmit>,
    events: VecDeque<CmEvent>,
    counters: CmCounters,
}

impl Agent {
    /// A new agent; `seed` (non-zero; the device draws it at random) makes its communication
    /// IDs and transaction IDs.
    pub fn new(cfg: AgentConfig, seed: u64) -> Agent {
        Agent {
            cfg: AgentConfig {
                max_retries: cfg.max_retries.min(15),
                response_timeout: cfg.response_timeout.min(31),
                mra_service_timeout: cfg.mra_service_timeout.min(31),
                ..cfg
            },
            rng: seed | 1,
            conns: BTreeMap::new(),
            by_remote: HashMap::new(),
            listeners: HashSet::new(),
            held: Vec::new(),
            timers: BTreeSet::new(),
            tx: VecDeque::new(),
            events: VecDeque::new(),
            counters: CmCounters::default(),
        }
    }

    /// The configuration.
    pub fn config(&self) -> &AgentConfig {
        &self.cfg
    }

    /// What the agent counted.
    pub fn counters(&self) -> CmCounters {
        self.counters
    }

    /// Connections the agent holds (time-wait included).
    pub fn conn_count(&self) -> usize {
        self.conns.len()
    }

    /// Whether a connection has sent its DREQ and waits for the DREP.
    pub fn is_disconnecting(&self, conn: ConnId) -> bool {
        self.conns
            .get(&conn)
            .is_some_and(|c| c.state == State::DreqSent)
    }

    /// The peer of a connection.
    pub fn peer(&self, conn: ConnId) -> Option<IpAddr> {
        self.conns.get(&conn).map(|c| c.peer)
    }

    fn next_random(&mut self) -> u64 {
        // xorshift64*: the IDs need to be unpredictable to an off-path sender only as far as
        // the seed is; the device seeds it from the OS.
        let mut x = self.rng;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.rng = x;
        x.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    fn new_comm_id(&mut self) -> ConnId {
        loop {
            let id = self.next_random() as u32;
            if id != 0 && !self.conns.contains_key(&id) {
                return id;
            }
        }
    }

    /// Listen on `service_id`: REQs for it become `ConnectRequest` events.
    pub fn listen(&mut self, service_id: u64) -> Result<(), Error> {
        if !self.listeners.insert(service_id) {
            return Err(Error::ServiceInUse);
        }
        // REQs that came early, in the order they came.
        let (mine, rest) = std::mem::take(&mut self.held)
            .into_iter()
            .partition(|h| h.3.service_id == service_id);
        self.held = rest;
        for (_, from, tid, req) in mine {
            self.on_req(0, from, tid, req);
        }
        Ok(())
    }

    /// Stop listening on `service_id` (connections already requested stay).
    pub fn unlisten(&mut self, service_id: u64) -> Result<(), Error> {
        if !self.listeners.remove(&service_id) {
            return Err(Error::NotListening);
        }
        Ok(())
    }

    /// The next event, if any.
    pub fn poll_event(&mut self) -> Option<CmEvent> {
        self.events.pop_front()
    }

    /// The next MAD to send, if any.
    pub fn poll_transmit(&mut self) -> Option<CmTransmit> {
        self.tx.pop_front()
    }

    /// When `handle_timeout` has something to do next.
    pub fn next_timeout(&self) -> Option<u64> {
        let held = self.held.iter().map(|h| h.0).min();
        match (self.timers.first().map(|&(t, _)| t), held) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    fn send(&mut self, dst: IpAddr, tid: u64, msg: CmMessage) {
        let mut mad = [0u8; MAD_LEN];
        // Every message the agent builds fits (the public entry points check private data).
        if (CmMad { tid, msg }).emit(&mut mad).is_ok() {
            self.counters.sent += 1;
            self.tx.push_back(CmTransmit { dst, mad });
        }
    }

    fn set_deadline(&mut self, id: ConnId, deadline: Option<u64>) {
        let Some(c) = self.conns.get_mut(&id) else {
            return;
        };
        if let Some(old) = c.deadline.take() {
            self.timers.remove(&(old, id));
        }
        c.deadline = deadline;
        if let Some(t) = deadline {
            self.timers.insert((t, id));
        }
    }

    fn remove(&mut self, id: ConnId) {
        self.set_deadline(id, None);
        if let Some(c) = self.conns.remove(&id)
            && self
                .by_remote
                .get(&(c.peer, c.remote_comm_id, c.remote_guid))
                == Some(&id)
        {
            self.by_remote
                .remove(&(c.peer, c.remote_comm_id, c.remote_guid));
        }
    }

    /// Send `msg` on connection `id` as the message to repeat until answered.
    fn send_awaiting(&mut self, now: u64, id: ConnId, msg: CmMessage, wait_ns: u64, retries: u8) {
        let Some(c) = self.conns.get_mut(&id) else {
            return;
        };
        c.last = Some(msg.clone());
        c.retries_left = retries;
        c.wait_ns = wait_ns;
        let (peer, tid) = (c.peer, c.tid);
        self.send(peer, tid, msg);
        self.set_deadline(id, Some(now.saturating_add(wait_ns)));
    }

    fn enter_timewait(&mut self, now: u64, id: ConnId, private_data: Vec<u8>) {
        if let Some(c) = self.conns.get_mut(&id) {
            c.state = State::TimeWait;
            c.retries_left = 0;
        }
        self.set_deadline(id, Some(now.saturating_add(self.cfg.timewait_ns)));
        self.events.push_back(CmEvent::Disconnected {
            conn: id,
            private_data,
        });
    }

    /// Connect: send a REQ. The connection's events follow (`Established`, `Rejected`,
    /// `Unreachable`).
    pub fn connect(&mut self, now: u64, p: ConnectParams) -> Result<ConnId, Error> {
        if self.conns.len() >= self.cfg.max_conns {
            return Err(Error::TooManyConns);
        }
        let id = self.new_comm_id();
        let tid = self.next_random();
        let req = CmMessage::Req(Box::new(Req {
            local_comm_id: id,
            service_id: p.service_id,
            local_ca_guid: self.cfg.ca_guid,
            local_qkey: 0,
            local_qpn: p.qpn,
            responder_resources: p.responder_resources,
            local_eecn: 0,
            initiator_depth: p.initiator_depth,
            remote_eecn: 0,
            remote_cm_response_timeout: self.cfg.response_timeout,
            transport: p.transport,
            e2e_flow_control: false,
            starting_psn: p.starting_psn,
            local_cm_response_timeout: self.cfg.response_timeout,
            retry_count: p.retry_count,
            pkey: wire::DEFAULT_PKEY,
            path_mtu: p.path_mtu,
            rdc_exists: false,
            rnr_retry_count: p.rnr_retry_count,
            max_cm_retries: self.cfg.max_retries,
            srq: p.srq,
            ext_transport: 0,
            primary: p.path,
            alternate: CmPath::default(),
            private_data: p.private_data,
        }));
        let conn = Conn {
            defer_rtu: p.defer_rtu,
            ..Conn::new(State::ReqSent, p.peer, 0, tid, now)
        };
        self.open_active(now, id, conn, req)
    }

    /// Start active connection (or resolution) `id`: refuse `msg` if it cannot be sent
    /// before any state exists, then send it, awaiting an answer with the usual retries.
    fn open_active(
        &mut self,
        now: u64,
        id: ConnId,
        conn: Conn,
        msg: CmMessage,
    ) -> Result<ConnId, Error> {
        CmMad {
            tid: conn.tid,
            msg: msg.clone(),
        }
        .emit(&mut [0u8; MAD_LEN])?;
        self.conns.insert(id, conn);
        let wait = timeout_ns(self.cfg.response_timeout);
        self.send_awaiting(now, id, msg, wait, self.cfg.max_retries);
        Ok(id)
    }

    /// Accept a connection reported by `ConnectRequest`: send the REP. `Established`
    /// follows when the RTU arrives.
    pub fn accept(&mut self, now: u64, id: ConnId, a: AcceptParams) -> Result<(), Error> {
        let c = self.conns.get(&id).ok_or(Error::UnknownConn)?;
        if c.state != State::ReqRcvd {
            return Err(Error::WrongState(c.state.name()));
        }
        let (peer_timeout, peer_retries) = match &c.last {
            Some(CmMessage::Req(r)) => (r.local_cm_response_timeout, r.max_cm_retries),
            _ => (self.cfg.response_timeout, self.cfg.max_retries),
        };
        let rep = CmMessage::Rep(Rep {
            local_comm_id: id,
            remote_comm_id: c.remote_comm_id,
            local_qkey: 0,
            local_qpn: a.qpn,
            local_eecn: 0,
            starting_psn: a.starting_psn,
            responder_resources: a.responder_resources,
            initiator_depth: a.initiator_depth,
            target_ack_delay: 0,
            failover_accepted: 0,
            e2e_flow_control: false,
            rnr_retry_count: a.rnr_retry_count,
            srq: a.srq,
            local_ca_guid: self.cfg.ca_guid,
            private_data: a.private_data,
        });
        CmMad {
            tid: c.tid,
            msg: rep.clone(),
        }
        .emit(&mut [0u8; MAD_LEN])?;
        if let Some(c) = self.conns.get_mut(&id) {
            c.state = State::RepSent;
        }
        let wait = timeout_ns(peer_timeout.max(self.cfg.response_timeout).min(31));
        let retries = peer_retries.min(self.cfg.max_retries);
        self.send_awaiting(now, id, rep, wait, retries);
        Ok(())
    }

    /// Reject a connection reported by `ConnectRequest` (REJ "consumer defined" with
    /// `private_data`, up to 148 bytes). The connection is gone.
    pub fn reject(&mut self, id: ConnId, private_data: &[u8]) -> Result<(), Error> {
        self.reject_with(id, rej_reason::CONSUMER_DEFINED, private_data)
    }

    /// [`Agent::reject`] with another REJ reason (`wire::cm::rej_reason`): e.g. invalid
    /// service ID for a request whose listener went away before it was delivered.
    pub fn reject_with(
        &mut self,
        id: ConnId,
        reason: u16,
        private_data: &[u8],
    ) -> Result<(), Error> {
        let c = self.conns.get(&id).ok_or(Error::UnknownConn)?;
        if c.state == State::SidrReqRcvd {
            // A resolution is refused with a SIDR_REP "rejected" (rdma_reject on a UDP id;
            // "not supported" for the reason invalid service ID).
            let status = if reason == rej_reason::INVALID_SERVICE_ID {
                sidr_status::SID_NOT_SUPPORTED
            } else {
                sidr_status::REJECT
            };
            let answer = SidrAnswer {
                status,
                qpn: 0,
                qkey: 0,
                private_data: private_data.to_vec(),
            };
            // Time-wait counts from the SIDR_REQ's arrival (a duplicate extends it).
            let at = c.started;
            return self.sidr_answer(at, id, answer);
        }
        if c.state != State::ReqRcvd {
            return Err(Error::WrongState(c.state.name()));
        }
        let rej = rej(
            id,
            c.remote_comm_id,
            MsgRef::Req,
            reason,
            private_data.to_vec(),
        );
        CmMad {
            tid: c.tid,
            msg: rej.clone(),
        }
        .emit(&mut [0u8; MAD_LEN])?;
        let (peer, tid) = (c.peer, c.tid);
        self.send(peer, tid, rej);
        self.remove(id);
        Ok(())
    }

    /// Disconnect: send a DREQ (up to 220 bytes of private data). `Disconnected` follows
    /// when the DREP arrives or the retries run out. Disconnecting what is already
    /// disconnecting is not an error.
    pub fn disconnect(&mut self, now: u64, id: ConnId, private_data: &[u8]) -> Result<(), Error> {
        let c = self.conns.get(&id).ok_or(Error::UnknownConn)?;
        match c.state {
            State::Established | State::RepSent | State::RepRcvd => {}
            State::DreqSent | State::TimeWait => return Ok(()),
            s => return Err(Error::WrongState(s.name())),
        }
        let dreq = CmMessage::Dreq(Dreq {
            local_comm_id: id,
            remote_comm_id: c.remote_comm_id,
            remote_qpn: c.remote_qpn,
            private_data: private_data.to_vec(),
        });
        CmMad {
            tid: c.tid,
            msg: dreq.clone(),
        }
        .emit(&mut [0u8; MAD_LEN])?;
        if let Some(c) = self.conns.get_mut(&id) {
            c.state = State::DreqSent;
        }
        let wait = timeout_ns(self.cfg.response_timeout);
        self.send_awaiting(now, id, dreq, wait, self.cfg.max_retries);
        Ok(())
    }

    /// Send the RTU of a connection whose REP arrived (made with `defer_rtu`): the
    /// application has brought its QP up. Establishing what is established is not an error.
    pub fn establish(&mut self, id: ConnId) -> Result<(), Error> {
        let c = self.conns.get(&id).ok_or(Error::UnknownConn)?;
        match c.state {
            State::Established => Ok(()),
            State::RepRcvd => {
                let rtu = CmMessage::Rtu(Ids {
                    local_comm_id: id,
                    remote_comm_id: c.remote_comm_id,
                    private_data: Vec::new(),
                });
                let (peer, tid) = (c.peer, c.tid);
                self.set_established(id);
                self.send(peer, tid, rtu);
                Ok(())
            }
            s => Err(Error::WrongState(s.name())),
        }
    }

    /// The application is done with a connection: whatever state it is in, the peer is told
    /// (a REJ for a REQ not yet answered or a connection not yet up, a DREQ, sent once, for
    /// one that is up) and the agent forgets it; no more events come for it.
    pub fn destroy(&mut self, id: ConnId) -> Result<(), Error> {
        let c = self.conns.get(&id).ok_or(Error::UnknownConn)?;
        let (peer, tid) = (c.peer, c.tid);
        let msg = match c.state {
            State::ReqSent | State::MraRcvd => Some(rej(
                id,
                c.remote_comm_id,
                MsgRef::Req,
                rej_reason::TIMEOUT,
                Vec::new(),
            )),
            State::ReqRcvd => Some(rej(
                id,
                c.remote_comm_id,
                MsgRef::Req,
                rej_reason::CONSUMER_DEFINED,
                Vec::new(),
            )),
            State::RepRcvd => Some(rej(
                id,
                c.remote_comm_id,
                MsgRef::Rep,
                rej_reason::CONSUMER_DEFINED,
                Vec::new(),
            )),
            State::RepSent | State::Established => Some(CmMessage::Dreq(Dreq {
                local_comm_id: id,
                remote_comm_id: c.remote_comm_id,
                remote_qpn: c.remote_qpn,
                private_data: Vec::new(),
            })),
            State::DreqSent | State::TimeWait | State::SidrReqSent | State::SidrAnswered => None,
            // As Linux: a resolution destroyed unanswered is refused.
            State::SidrReqRcvd => {
                let m = self.sidr_rep_of(c, sidr_status::REJECT, 0, 0, Vec::new());
                Some(m)
            }
        };
        if let Some(m) = msg {
            self.send(peer, tid, m);
        }
        self.remove(id);
        Ok(())
    }

    /// Let time pass: send again what is unanswered, give up on what ran out of retries,
    /// end time-waits.
    pub fn handle_timeout(&mut self, now: u64) {
        let (due, keep) = std::mem::take(&mut self.held)
            .into_iter()
            .partition(|h| h.0 <= now);
        self.held = keep;
        for (_, from, tid, req) in due {
            self.counters.no_listener += 1;
            let m = rej(
                0,
                req.local_comm_id,
                MsgRef::Req,
                rej_reason::INVALID_SERVICE_ID,
                Vec::new(),
            );
            self.send(from, tid, m);
        }
        while let Some(&(t, id)) = self.timers.first() {
            if t > now {
                break;
            }
            self.set_deadline(id, None);
            let Some(c) = self.conns.get_mut(&id) else {
                continue;
            };
            match c.state {
                State::TimeWait => {
                    self.remove(id);
                    self.events.push_back(CmEvent::TimewaitExit { conn: id });
                }
                State::ReqSent
                | State::MraRcvd
                | State::RepSent
                | State::DreqSent
                | State::SidrReqSent
                    if c.retries_left > 0 =>
                {
                    c.retries_left -= 1;
                    let (peer, tid, wait) = (c.peer, c.tid, c.wait_ns);
                    if c.state == State::MraRcvd {
                        c.state = State::ReqSent;
                    }
                    if let Some(m) = c.last.clone() {
                        self.counters.retries += 1;
                        self.send(peer, tid, m);
                    }
                    self.set_deadline(id, Some(now.saturating_add(wait)));
                }
                State::DreqSent => self.enter_timewait(now, id, Vec::new()),
                State::ReqSent | State::MraRcvd | State::RepSent => {
                    let message = if c.state == State::RepSent {
                        MsgRef::Rep
                    } else {
                        MsgRef::Req
                    };
                    let m = rej(
                        id,
                        c.remote_comm_id,
                        message,
                        rej_reason::TIMEOUT,
                        Vec::new(),
                    );
                    let (peer, tid) = (c.peer, c.tid);
                    self.counters.timeouts += 1;
                    self.send(peer, tid, m);
                    self.remove(id);
                    self.events.push_back(CmEvent::Unreachable { conn: id });
                }
                State::SidrReqSent => {
                    self.counters.timeouts += 1;
                    self.remove(id);
                    self.events.push_back(CmEvent::Unreachable { conn: id });
                }
                State::SidrAnswered => self.remove(id),
                State::ReqRcvd | State::Established | State::RepRcvd | State::SidrReqRcvd => {}
            }
        }
    }
}

fn rej(local: u32, remote: u32, message: MsgRef, reason: u16, private_data: Vec<u8>) -> CmMessage {
    CmMessage::Rej(Box::new(Rej {
        local_comm_id: local,
        remote_comm_id: remote,
        message,
        ari_len: 0,
        reason,
        ari: [0; 72],
        private_data,
    }))
}

mod incoming;
mod sidr;

#[cfg(test)]
mod tests;
