//! The CM: its MAD parser and its state machine (`cm::Agent`) under arbitrary MADs and
//! application calls.
//!
//! Two agents, A (10.0.0.1) and B (10.0.0.2, listening on one service), connect and resolve
//! service IDs (SIDR), exchanging what they send through a harness that can drop, duplicate
//! or corrupt it; a stranger (10.0.0.3) sends arbitrary bytes or corrupted copies of real
//! messages to either. Invariants after every step: nothing panics; whatever parses as a CM
//! MAD re-emits to bytes that parse to the same message; every MAD an agent sends parses
//! (or is the "unsupported" answer to a Get or Set); a MAD from the stranger changes no
//! connection count, timer or event, and is answered (if at all) only to the stranger with
//! a DREP, REJ, SIDR_REP or that answer; events name connections the agent made or
//! reported; the agents hold at most their `max_conns`.
#![no_main]

use std::collections::HashSet;
use std::net::{IpAddr, Ipv4Addr};

use arbitrary::{Arbitrary, Unstructured};
use libfuzzer_sys::fuzz_target;
use softrdma::cm::{
    AcceptParams, Agent, AgentConfig, CmEvent, CmTransmit, ConnId, ConnectParams, SidrAnswer,
    SidrParams,
};
use softrdma::wire::cm::{CmMad, CmPath, attr};
use softrdma::wire::mad::MAD_LEN;

const A: IpAddr = IpAddr::V4(Ipv4Addr::new(10, 0, 0, 1));
const B: IpAddr = IpAddr::V4(Ipv4Addr::new(10, 0, 0, 2));
const STRANGER: IpAddr = IpAddr::V4(Ipv4Addr::new(10, 0, 0, 3));
const SID: u64 = 0x0106_4853;
const MAX_CONNS: usize = 8;

#[derive(Arbitrary, Debug)]
enum Step {
    /// A connects (to B's service or another).
    Connect {
        other_service: bool,
        private_len: u8,
    },
    /// A resolves a service ID (SIDR_REQ; B's service or another).
    Resolve {
        other_service: bool,
        private_len: u8,
    },
    /// Move queued MADs: each delivered, dropped or duplicated by the mask.
    Deliver { drop_mask: u8, dup_mask: u8 },
    /// The stranger sends raw bytes to A or B.
    Raw { to_b: bool, bytes: Vec<u8> },
    /// The stranger (or the real peer) sends a corrupted copy of the last MAD seen.
    Mangle {
        to_b: bool,
        from_peer: bool,
        at: u8,
        xor: u8,
    },
    /// Time passes (up to about a second).
    Wait { micros: u32 },
    /// A sends the RTU of a connection made with a deferred RTU.
    Establish { index: u8 },
    /// B accepts, rejects or ignores its oldest pending request.
    Answer { accept: bool },
    /// Either side disconnects or destroys one of its connections.
    Close {
        b_side: bool,
        index: u8,
        destroy: bool,
    },
}

fn cfg(guid: u64) -> AgentConfig {
    AgentConfig {
        ca_guid: guid,
        response_timeout: 8,
        max_retries: 3,
        timewait_ns: 5_000_000,
        max_conns: MAX_CONNS,
        listen_grace_ns: 2_000_000,
        ..AgentConfig::default()
    }
}

struct Side {
    agent: Agent,
    /// Connections this side made or was told about, still alive.
    known: HashSet<ConnId>,
    pending: Vec<ConnId>,
    /// Connections with the stranger.
    stranger: HashSet<ConnId>,
}

impl Side {
    /// Keep track of the connections an event names; it must name one this side knows.
    fn record(&mut self, e: CmEvent) {
        match e {
            CmEvent::ConnectRequest { conn, .. } | CmEvent::SidrRequest { conn, .. } => {
                assert!(self.known.insert(conn), "a request for a live connection");
                self.pending.push(conn);
            }
            CmEvent::Established { conn, .. } | CmEvent::Disconnected { conn, .. } => {
                assert!(self.known.contains(&conn), "event for unknown {conn}")
            }
            CmEvent::Rejected { conn, .. }
            | CmEvent::Unreachable { conn }
            | CmEvent::TimewaitExit { conn }
            | CmEvent::SidrReply { conn, .. } => {
                assert!(self.known.remove(&conn), "end of unknown {conn}");
                self.pending.retain(|&c| c != conn);
                self.stranger.remove(&conn);
            }
        }
    }
}

struct World {
    a: Side,
    b: Side,
    now: u64,
    queue: Vec<(IpAddr, CmTransmit)>,
    last: Option<[u8; MAD_LEN]>,
}

/// What parses re-emits to the same message.
fn check_parse(bytes: &[u8]) {
    if let Ok(m) = CmMad::parse(bytes) {
        let mut out = [0u8; MAD_LEN];
        m.emit(&mut out).expect("a parsed MAD emits");
        assert_eq!(CmMad::parse(&out).expect("an emitted MAD parses"), m);
    }
}

/// A MAD an agent sent: a CM message that parses, or the "unsupported" answer to a Get or
/// Set (its method GetResp, its status 0x000c). Returns whether it is the latter.
fn check_sent(mad: &[u8; MAD_LEN]) -> bool {
    if CmMad::parse(mad).is_ok() {
        return false;
    }
    assert_eq!(
        (mad[3], u16::from_be_bytes([mad[4], mad[5]])),
        (0x81, 0x000c),
        "an agent sent a MAD that does not parse"
    );
    true
}

fn observe(side: &Side) -> (usize, Option<u64>) {
    (side.agent.conn_count(), side.agent.next_timeout())
}

impl World {
    fn side(&mut self, b: bool) -> &mut Side {
        if b { &mut self.b } else { &mut self.a }
    }

    /// Collect what both sides sent and the events they report; check both.
    fn collect(&mut self) {
        for (from, b) in [(A, false), (B, true)] {
            let side = self.side(b);
            let mut out = Vec::new();
            while let Some(t) = side.agent.poll_transmit() {
                check_sent(&t.mad);
                out.push((from, t));
            }
            while let Some(e) = side.agent.poll_event() {
                side.record(e);
            }
            assert!(side.agent.conn_count() <= MAX_CONNS);
            self.queue.extend(out);
        }
    }

    /// A MAD from the stranger: a REQ may open a connection with it (anyone may connect),
    /// and later MADs may move that connection; nothing else changes, and nothing is sent
    /// anywhere but to the stranger.
    fn stranger_sends(&mut self, to_b: bool, bytes: &[u8]) {
        check_parse(bytes);
        let is_req = CmMad::parse(bytes)
            .is_ok_and(|m| m.msg.attr_id() == attr::REQ || m.msg.attr_id() == attr::SIDR_REQ);
        let now = self.now;
        let side = self.side(to_b);
        let had_own = !side.stranger.is_empty();
        let before = observe(side);
        side.agent.handle_mad(now, STRANGER, bytes);
        let mut events = 0;
        while let Some(e) = side.agent.poll_event() {
            events += 1;
            let conn = match &e {
                CmEvent::ConnectRequest { conn, peer, .. }
                | CmEvent::SidrRequest { conn, peer, .. } => {
                    assert!(is_req && *peer == STRANGER, "{e:?}");
                    side.stranger.insert(*conn);
                    *conn
                }
                e => e.conn(),
            };
            assert!(
                side.stranger.contains(&conn),
                "a stranger's MAD moved {e:?}"
            );
            side.record(e);
        }
        if events == 0 && !had_own {
            if is_req {
                // A REQ for a service nobody listens on is held for a while (a timer).
                assert_eq!(
                    observe(side).0,
                    before.0,
                    "a stranger's REQ made a connection"
                );
            } else {
                assert_eq!(observe(side), before, "a stranger's MAD changed the agent");
            }
        }
        while let Some(t) = side.agent.poll_transmit() {
            assert_eq!(t.dst, STRANGER);
            if check_sent(&t.mad) {
                // The stranger's own Get or Set, answered "unsupported".
                continue;
            }
            let a = CmMad::parse(&t.mad).unwrap().msg.attr_id();
            assert!(
                had_own || a == attr::DREP || a == attr::REJ || a == attr::SIDR_REP,
                "answered a stranger with {a:#x}"
            );
        }
    }

    fn step(&mut self, s: Step) {
        match s {
            Step::Connect {
                other_service,
                private_len,
            } => {
                let p = ConnectParams {
                    peer: B,
                    service_id: if other_service { SID + 1 } else { SID },
                    qpn: 0x100,
                    starting_psn: 1,
                    responder_resources: 1,
                    initiator_depth: 1,
                    path_mtu: 3,
                    retry_count: 7,
                    rnr_retry_count: 7,
                    srq: false,
                    transport: 0,
                    path: CmPath::default(),
                    private_data: vec![0x5a; usize::from(private_len)],
                    defer_rtu: private_len % 2 == 1,
                };
                if let Ok(id) = self.a.agent.connect(self.now, p) {
                    assert!(self.a.known.insert(id));
                }
            }
            Step::Resolve {
                other_service,
                private_len,
            } => {
                let p = SidrParams {
                    peer: B,
                    service_id: if other_service { SID + 1 } else { SID },
                    private_data: vec![0xa5; usize::from(private_len)],
                };
                if let Ok(id) = self.a.agent.sidr_request(self.now, p) {
                    assert!(self.a.known.insert(id));
                }
            }
            Step::Deliver {
                drop_mask,
                dup_mask,
            } => {
                let q = std::mem::take(&mut self.queue);
                for (i, (from, t)) in q.into_iter().enumerate() {
                    let bit = 1u8 << (i % 8);
                    self.last = Some(t.mad);
                    if drop_mask & bit != 0 {
                        continue;
                    }
                    let to_b = t.dst == B;
                    let times = if dup_mask & bit != 0 { 2 } else { 1 };
                    for _ in 0..times {
                        let now = self.now;
                        self.side(to_b).agent.handle_mad(now, from, &t.mad);
                    }
                }
            }
            Step::Raw { to_b, bytes } => self.stranger_sends(to_b, &bytes),
            Step::Mangle {
                to_b,
                from_peer,
                at,
                xor,
            } => {
                let Some(mut m) = self.last else { return };
                m[usize::from(at)] ^= xor;
                if from_peer {
                    check_parse(&m);
                    let (now, from) = (self.now, if to_b { A } else { B });
                    self.side(to_b).agent.handle_mad(now, from, &m);
                } else {
                    self.stranger_sends(to_b, &m);
                }
            }
            Step::Wait { micros } => {
                self.now += u64::from(micros % 1_000_000) * 1000;
                let now = self.now;
                self.a.agent.handle_timeout(now);
                self.b.agent.handle_timeout(now);
            }
            Step::Establish { index } => {
                let mut ids: Vec<_> = self.a.known.iter().copied().collect();
                ids.sort_unstable();
                if let Some(&id) = ids.get(usize::from(index) % ids.len().max(1)) {
                    let _ = self.a.agent.establish(id);
                }
            }
            Step::Answer { accept } => {
                let Some(&id) = self.b.pending.first() else {
                    return;
                };
                self.b.pending.remove(0);
                if accept {
                    let p = AcceptParams {
                        qpn: 0x200,
                        ..AcceptParams::default()
                    };
                    // One of the two applies (a REQ or a SIDR_REQ); an answered resolution
                    // is over for the application.
                    let _ = self.b.agent.accept(self.now, id, p);
                    let a = SidrAnswer {
                        status: 0,
                        qpn: 0x201,
                        qkey: 0x0123_4567,
                        private_data: b"ok".to_vec(),
                    };
                    if self.b.agent.sidr_answer(self.now, id, a).is_ok() {
                        self.b.known.remove(&id);
                        self.b.stranger.remove(&id);
                    }
                } else if self.b.agent.reject(id, b"no").is_ok() {
                    self.b.known.remove(&id);
                    self.b.stranger.remove(&id);
                }
            }
            Step::Close {
                b_side,
                index,
                destroy,
            } => {
                let now = self.now;
                let side = self.side(b_side);
                let mut ids: Vec<_> = side.known.iter().copied().collect();
                ids.sort_unstable();
                let Some(&id) = ids.get(usize::from(index) % ids.len().max(1)) else {
                    return;
                };
                if destroy {
                    side.agent
                        .destroy(id)
                        .expect("a known connection can be destroyed");
                    side.known.remove(&id);
                    side.pending.retain(|&c| c != id);
                    side.stranger.remove(&id);
                } else {
                    let _ = side.agent.disconnect(now, id, b"bye");
                }
            }
        }
        self.collect();
    }
}

fuzz_target!(|data: &[u8]| {
    // Raw bytes straight into the parser first.
    check_parse(data);
    let mut b = Agent::new(cfg(0xb), 2);
    b.listen(SID).unwrap();
    let mut w = World {
        a: Side {
            agent: Agent::new(cfg(0xa), 1),
            known: HashSet::new(),
            pending: Vec::new(),
            stranger: HashSet::new(),
        },
        b: Side {
            agent: b,
            known: HashSet::new(),
            pending: Vec::new(),
            stranger: HashSet::new(),
        },
        now: 1,
        queue: Vec::new(),
        last: None,
    };
    let mut u = Unstructured::new(data);
    for _ in 0..64 {
        let Ok(s) = Step::arbitrary(&mut u) else {
            break;
        };
        w.step(s);
    }
});
