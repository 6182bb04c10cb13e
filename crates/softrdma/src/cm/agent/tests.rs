//! Two agents over a lossy, duplicating, reordering "network" driven step by step.

use std::net::{IpAddr, Ipv4Addr};

use super::*;
use crate::wire::cm::attr;
use crate::wire::mad::MAD_HEADER_LEN;

const A: IpAddr = IpAddr::V4(Ipv4Addr::new(10, 0, 0, 1));
const B: IpAddr = IpAddr::V4(Ipv4Addr::new(10, 0, 0, 2));
const SID: u64 = 0x0106_4853;

/// What the network does with the n-th MAD (counted over both directions).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Fate {
    Deliver,
    Drop,
    Duplicate,
    /// Held back and delivered after the next MAD.
    Delay,
}

struct Net {
    a: Agent,
    b: Agent,
    now: u64,
    sent: usize,
    fate: Box<dyn FnMut(usize, u16) -> Fate>,
    held: Option<CmTransmit>,
    a_events: Vec<CmEvent>,
    b_events: Vec<CmEvent>,
    /// B accepts every REQ (else it leaves them pending).
    b_accepts: bool,
    b_qpn: u32,
}

fn cfg(guid: u64) -> AgentConfig {
    AgentConfig {
        ca_guid: guid,
        response_timeout: 10, // about 4 ms
        max_retries: 5,
        timewait_ns: 10_000_000,
        ..AgentConfig::default()
    }
}

fn attr_of(t: &CmTransmit) -> u16 {
    u16::from_be_bytes([t.mad[16], t.mad[17]])
}

impl Net {
    fn new(fate: impl FnMut(usize, u16) -> Fate + 'static) -> Net {
        let mut b = Agent::new(cfg(0xb), 22);
        b.listen(SID).unwrap();
        Net {
            a: Agent::new(cfg(0xa), 11),
            b,
            now: 1_000,
            sent: 0,
            fate: Box::new(fate),
            held: None,
            a_events: Vec::new(),
            b_events: Vec::new(),
            b_accepts: true,
            b_qpn: 0x200,
        }
    }

    fn deliver(&mut self, t: CmTransmit, from: IpAddr) {
        if t.dst == B {
            self.b.handle_mad(self.now, from, &t.mad);
        } else {
            self.a.handle_mad(self.now, from, &t.mad);
        }
    }

    /// Move every queued MAD once, handle events; returns whether anything moved.
    fn pump(&mut self) -> bool {
        let mut moved = false;
        loop {
            let next = match self.a.poll_transmit() {
                Some(t) => Some((t, A)),
                None => self.b.poll_transmit().map(|t| (t, B)),
            };
            let Some((t, from)) = next else {
                break;
            };
            moved = true;
            let fate = (self.fate)(self.sent, attr_of(&t));
            self.sent += 1;
            match fate {
                Fate::Deliver => self.deliver(t, from),
                Fate::Drop => {}
                Fate::Duplicate => {
                    self.deliver(t.clone(), from);
                    self.deliver(t, from);
                }
                Fate::Delay => {
                    if let Some(h) = self.held.replace(t) {
                        self.deliver(h, from);
                    }
                    continue;
                }
            }
            if let Some(h) = self.held.take() {
                let hf = if h.dst == B { A } else { B };
                self.deliver(h, hf);
            }
        }
        while let Some(e) = self.a.poll_event() {
            self.a_events.push(e);
            moved = true;
        }
        while let Some(e) = self.b.poll_event() {
            if let CmEvent::ConnectRequest { conn, .. } = &e
                && self.b_accepts
            {
                let p = AcceptParams {
                    qpn: self.b_qpn,
                    starting_psn: 0x1234,
                    responder_resources: 4,
                    initiator_depth: 4,
                    rnr_retry_count: 7,
                    srq: false,
                    private_data: b"rep".to_vec(),
                };
                self.b_qpn += 1;
                self.b.accept(self.now, *conn, p).unwrap();
            }
            if let CmEvent::SidrRequest { conn, .. } = &e
                && self.b_accepts
            {
                let a = SidrAnswer {
                    status: sidr_status::SUCCESS,
                    qpn: self.b_qpn,
                    qkey: 0x0123_4567,
                    private_data: b"sidr".to_vec(),
                };
                self.b_qpn += 1;
                self.b.sidr_answer(self.now, *conn, a).unwrap();
            }
            self.b_events.push(e);
            moved = true;
        }
        moved
    }

    /// Run until nothing moves and no timer is pending (or `limit` ns pass).
    fn run(&mut self, limit: u64) {
        let end = self.now + limit;
        loop {
            while self.pump() {}
            let next = match (self.a.next_timeout(), self.b.next_timeout()) {
                (Some(x), Some(y)) => x.min(y),
                (Some(x), None) | (None, Some(x)) => x,
                (None, None) => break,
            };
            if next > end {
                break;
            }
            self.now = self.now.max(next);
            self.a.handle_timeout(self.now);
            self.b.handle_timeout(self.now);
        }
    }
}

fn connect_params(qpn: u32) -> ConnectParams {
    ConnectParams {
        peer: B,
        service_id: SID,
        qpn,
        starting_psn: 0x777,
        responder_resources: 2,
        initiator_depth: 3,
        path_mtu: 5,
        retry_count: 7,
        rnr_retry_count: 6,
        srq: false,
        transport: 0,
        path: CmPath::default(),
        private_data: b"hello".to_vec(),
        defer_rtu: false,
    }
}

fn kinds(ev: &[CmEvent]) -> Vec<&'static str> {
    ev.iter()
        .map(|e| match e {
            CmEvent::ConnectRequest { .. } => "request",
            CmEvent::Established { .. } => "established",
            CmEvent::Rejected { .. } => "rejected",
            CmEvent::Unreachable { .. } => "unreachable",
            CmEvent::Disconnected { .. } => "disconnected",
            CmEvent::TimewaitExit { .. } => "timewait-exit",
            CmEvent::SidrRequest { .. } => "sidr-request",
            CmEvent::SidrReply { .. } => "sidr-reply",
        })
        .collect()
}

/// Connect, disconnect from `a_disconnects`' side, run to the end; both sides saw the whole
/// life of the connection and hold nothing afterwards.
fn full_life(fate: impl FnMut(usize, u16) -> Fate + 'static, a_disconnects: bool) -> Net {
    let mut n = Net::new(fate);
    let id = n.a.connect(n.now, connect_params(0x100)).unwrap();
    n.run(1_000_000_000);
    assert_eq!(kinds(&n.a_events), ["established"], "{:?}", n.a_events);
    assert_eq!(kinds(&n.b_events), ["request", "established"]);
    let CmEvent::Established {
        params: Some(rep), ..
    } = &n.a_events[0]
    else {
        panic!()
    };
    assert_eq!((rep.qpn, rep.starting_psn), (0x200, 0x1234));
    assert_eq!(&rep.private_data[..3], b"rep");
    let CmEvent::ConnectRequest { conn, peer, params } = &n.b_events[0] else {
        panic!()
    };
    assert_eq!(*peer, A);
    assert_eq!(
        (params.qpn, params.starting_psn, params.path_mtu),
        (0x100, 0x777, 5)
    );
    assert_eq!(&params.private_data[..5], b"hello");
    let b_id = *conn;
    if a_disconnects {
        n.a.disconnect(n.now, id, b"bye").unwrap();
    } else {
        n.b.disconnect(n.now, b_id, b"bye").unwrap();
    }
    n.run(10_000_000_000);
    assert_eq!(
        kinds(&n.a_events),
        ["established", "disconnected", "timewait-exit"]
    );
    assert_eq!(
        kinds(&n.b_events),
        ["request", "established", "disconnected", "timewait-exit"]
    );
    assert_eq!((n.a.conn_count(), n.b.conn_count()), (0, 0));
    assert_eq!((n.a.next_timeout(), n.b.next_timeout()), (None, None));
    n
}

#[test]
fn connect_and_disconnect_from_either_side() {
    let n = full_life(|_, _| Fate::Deliver, true);
    // REQ REP RTU DREQ DREP, nothing more.
    assert_eq!(n.sent, 5);
    assert_eq!(n.a.counters().retries + n.b.counters().retries, 0);
    let n = full_life(|_, _| Fate::Deliver, false);
    assert_eq!(n.sent, 5);
}

#[test]
fn every_message_lost_duplicated_or_reordered_once() {
    for fate in [Fate::Drop, Fate::Duplicate, Fate::Delay] {
        for k in 0..5 {
            for a_disc in [true, false] {
                let mut hit = false;
                let n = full_life(
                    move |i, _| {
                        if i == k && !hit {
                            hit = true;
                            fate
                        } else {
                            Fate::Deliver
                        }
                    },
                    a_disc,
                );
                if fate == Fate::Drop {
                    assert!(
                        n.a.counters().retries + n.b.counters().retries >= 1,
                        "message {k} lost, nothing resent"
                    );
                }
            }
        }
    }
}

#[test]
fn each_kind_of_message_lost_several_times_still_completes() {
    for kind in [attr::REQ, attr::REP, attr::RTU, attr::DREQ, attr::DREP] {
        let mut drops = 0;
        full_life(
            move |_, a| {
                if a == kind && drops < 3 {
                    drops += 1;
                    Fate::Drop
                } else {
                    Fate::Deliver
                }
            },
            true,
        );
    }
}

#[test]
fn no_listener_is_rejected_with_invalid_service_id() {
    let mut n = Net::new(|_, _| Fate::Deliver);
    let mut p = connect_params(1);
    p.service_id = SID + 1;
    let id = n.a.connect(n.now, p).unwrap();
    n.run(1_000_000_000);
    assert_eq!(
        n.a_events,
        [CmEvent::Rejected {
            conn: id,
            reason: rej_reason::INVALID_SERVICE_ID,
            private_data: vec![0; 148]
        }]
    );
    assert!(n.b_events.is_empty());
    assert_eq!(n.b.counters().no_listener, 1);
    assert_eq!((n.a.conn_count(), n.b.conn_count()), (0, 0));
}

#[test]
fn consumer_reject_carries_private_data() {
    let mut n = Net::new(|_, _| Fate::Deliver);
    n.b_accepts = false;
    n.a.connect(n.now, connect_params(1)).unwrap();
    n.run(1_000);
    let CmEvent::ConnectRequest { conn, .. } = n.b_events[0] else {
        panic!()
    };
    n.b.reject(conn, b"no thanks").unwrap();
    assert_eq!(n.b.reject(conn, b""), Err(Error::UnknownConn));
    n.run(1_000_000_000);
    let CmEvent::Rejected {
        reason,
        private_data,
        ..
    } = &n.a_events[0]
    else {
        panic!("{:?}", n.a_events)
    };
    assert_eq!(*reason, rej_reason::CONSUMER_DEFINED);
    assert_eq!(&private_data[..9], b"no thanks");
    assert_eq!((n.a.conn_count(), n.b.conn_count()), (0, 0));
}

#[test]
fn a_slow_listener_sends_mra_and_the_connection_still_comes_up() {
    let mut n = Net::new(|_, _| Fate::Deliver);
    n.b_accepts = false;
    n.a.connect(n.now, connect_params(1)).unwrap();
    // Let the REQ be retried: B answers the duplicate with an MRA, A waits longer.
    n.run(5_000_000);
    let CmEvent::ConnectRequest { conn, .. } = n.b_events[0] else {
        panic!()
    };
    assert!(n.b.counters().duplicates >= 1);
    assert_eq!(n.b_events.len(), 1, "a duplicate REQ is reported once");
    let retries = n.a.counters().retries;
    n.now += 50_000_000;
    n.a.handle_timeout(n.now);
    assert_eq!(
        n.a.counters().retries,
        retries,
        "the MRA stopped the retries"
    );
    n.b.accept(n.now, conn, AcceptParams::default()).unwrap();
    n.run(1_000_000_000);
    assert_eq!(kinds(&n.a_events), ["established"]);
    assert_eq!(kinds(&n.b_events), ["request", "established"]);
}

#[test]
fn a_dead_peer_ends_in_unreachable_or_disconnected() {
    // REQ into the void.
    let mut n = Net::new(|_, _| Fate::Drop);
    let id = n.a.connect(n.now, connect_params(1)).unwrap();
    n.run(10_000_000_000);
    assert_eq!(n.a_events, [CmEvent::Unreachable { conn: id }]);
    assert_eq!(n.a.counters().retries, 5);
    assert_eq!(n.a.conn_count(), 0);

    // Up, then the peer dies: DREQ retries, then time-wait.
    let flag = std::rc::Rc::new(std::cell::Cell::new(false));
    let f2 = flag.clone();
    let mut n = Net::new(move |_, _| if f2.get() { Fate::Drop } else { Fate::Deliver });
    let id = n.a.connect(n.now, connect_params(1)).unwrap();
    n.run(1_000_000_000);
    flag.set(true);
    n.a.disconnect(n.now, id, b"").unwrap();
    n.run(10_000_000_000);
    assert_eq!(
        kinds(&n.a_events),
        ["established", "disconnected", "timewait-exit"]
    );

    // A passive side whose REP is never answered.
    let mut n = Net::new(|_, a| {
        if a == attr::REP {
            Fate::Drop
        } else {
            Fate::Deliver
        }
    });
    n.a.connect(n.now, connect_params(1)).unwrap();
    n.run(10_000_000_000);
    assert!(
        kinds(&n.b_events).contains(&"unreachable"),
        "{:?}",
        n.b_events
    );
    assert!(kinds(&n.a_events).iter().all(|&k| k != "established"));
    assert_eq!((n.a.conn_count(), n.b.conn_count()), (0, 0));
}

#[test]
fn a_storm_of_a_thousand_requests() {
    let mut n = Net::new(|_, _| Fate::Deliver);
    let ids: Vec<_> = (0..1000)
        .map(|i| n.a.connect(n.now, connect_params(0x1000 + i)).unwrap())
        .collect();
    n.run(1_000_000_000);
    assert_eq!(n.a_events.len(), 1000);
    assert!(kinds(&n.a_events).iter().all(|&k| k == "established"));
    assert_eq!(
        kinds(&n.b_events)
            .iter()
            .filter(|&&k| k == "established")
            .count(),
        1000
    );
    // Every remote QPN was handed out once.
    let mut qpns: Vec<u32> = n
        .a_events
        .iter()
        .map(|e| match e {
            CmEvent::Established {
                params: Some(p), ..
            } => p.qpn,
            _ => 0,
        })
        .collect();
    qpns.sort_unstable();
    qpns.dedup();
    assert_eq!(qpns.len(), 1000);
    for id in ids {
        n.a.disconnect(n.now, id, b"").unwrap();
    }
    n.run(10_000_000_000);
    assert_eq!((n.a.conn_count(), n.b.conn_count()), (0, 0));
    assert_eq!(n.a.counters().retries + n.b.counters().retries, 0);
}

#[test]
fn max_conns_rejects_with_no_resources() {
    let mut n = Net::new(|_, _| Fate::Deliver);
    n.b = Agent::new(
        AgentConfig {
            max_conns: 2,
            ..cfg(0xb)
        },
        5,
    );
    n.b.listen(SID).unwrap();
    for i in 0..3 {
        n.a.connect(n.now, connect_params(i)).unwrap();
    }
    n.run(1_000_000_000);
    let rejected: Vec<_> = n
        .a_events
        .iter()
        .filter_map(|e| match e {
            CmEvent::Rejected { reason, .. } => Some(*reason),
            _ => None,
        })
        .collect();
    assert_eq!(rejected, [rej_reason::NO_RESOURCES]);
}

/// A snapshot of what an agent holds, to show that junk changes nothing.
fn snapshot(a: &Agent) -> String {
    format!(
        "{:?} {:?} {:?} {:?}",
        a.conns,
        a.timers,
        a.listeners,
        a.by_remote.len()
    )
}

#[test]
fn invalid_truncated_and_stray_mads_change_nothing() {
    let mut n = Net::new(|_, _| Fate::Deliver);
    let id = n.a.connect(n.now, connect_params(1)).unwrap();
    n.run(1_000_000_000);
    let (sa, sb) = (snapshot(&n.a), snapshot(&n.b));
    let mut good = [0u8; MAD_LEN];
    // An RTU from B to A, well formed, as a template.
    let b_id = match &n.b_events[0] {
        CmEvent::ConnectRequest { conn, .. } => *conn,
        _ => panic!(),
    };
    CmMad {
        tid: 1,
        msg: CmMessage::Rtu(Ids {
            local_comm_id: b_id,
            remote_comm_id: id,
            private_data: Vec::new(),
        }),
    }
    .emit(&mut good)
    .unwrap();
    let mut junk: Vec<Vec<u8>> = vec![
        Vec::new(),
        good[..255].to_vec(),
        good[..MAD_HEADER_LEN].to_vec(),
        vec![0xff; MAD_LEN],
    ];
    for (at, v) in [(0, 2u8), (1, 0x81), (2, 1), (3, 0x81), (17, 0x99)] {
        let mut m = good.to_vec();
        m[at] = v;
        junk.push(m);
    }
    for m in &junk {
        n.a.handle_mad(n.now, B, m);
    }
    assert_eq!(n.a.counters().bad, junk.len() as u64);
    // Well formed but stray: wrong sender, wrong IDs, unknown connection.
    let c = IpAddr::V4(Ipv4Addr::new(10, 0, 0, 3));
    n.a.handle_mad(n.now, c, &good);
    let mut wrong = good;
    wrong[MAD_HEADER_LEN] ^= 1; // the sender's ID
    n.a.handle_mad(n.now, B, &wrong);
    let mut unknown = good;
    unknown[MAD_HEADER_LEN + 4] ^= 1; // our ID
    n.a.handle_mad(n.now, B, &unknown);
    assert_eq!(n.a.counters().stray, 3);
    assert!(n.a.poll_transmit().is_none() && n.a.poll_event().is_none());
    assert_eq!((snapshot(&n.a), snapshot(&n.b)), (sa.clone(), sb));

    // A stray DREQ still gets a DREP (the peer stops retrying), and nothing else changes.
    let mut dreq = [0u8; MAD_LEN];
    CmMad {
        tid: 9,
        msg: CmMessage::Dreq(Dreq {
            local_comm_id: 77,
            remote_comm_id: 78,
            remote_qpn: 1,
            private_data: Vec::new(),
        }),
    }
    .emit(&mut dreq)
    .unwrap();
    n.a.handle_mad(n.now, c, &dreq);
    let t = n.a.poll_transmit().unwrap();
    assert_eq!((t.dst, attr_of(&t)), (c, attr::DREP));
    assert!(n.a.poll_transmit().is_none());
    assert_eq!(snapshot(&n.a), sa);
}

#[test]
fn requests_in_the_wrong_state_are_refused() {
    let mut n = Net::new(|_, _| Fate::Deliver);
    assert_eq!(n.b.listen(SID), Err(Error::ServiceInUse));
    assert_eq!(n.a.unlisten(SID), Err(Error::NotListening));
    let id = n.a.connect(n.now, connect_params(1)).unwrap();
    assert_eq!(
        n.a.accept(n.now, id, AcceptParams::default()),
        Err(Error::WrongState("REQ sent"))
    );
    assert_eq!(
        n.a.disconnect(n.now, id, b""),
        Err(Error::WrongState("REQ sent"))
    );
    assert_eq!(n.a.disconnect(n.now, 0, b""), Err(Error::UnknownConn));
    let mut p = connect_params(1);
    p.private_data = vec![0; 93];
    assert!(matches!(n.a.connect(n.now, p), Err(Error::Wire(_))));
    assert_eq!(n.a.conn_count(), 1);
    n.run(1_000_000_000);
    assert!(n.a.disconnect(n.now, id, &[0; 221]).is_err());
    n.a.disconnect(n.now, id, b"").unwrap();
    n.a.disconnect(n.now, id, b"").unwrap();
    // Destroying tells the peer and forgets.
    n.a.destroy(id).unwrap();
    assert_eq!(n.a.destroy(id), Err(Error::UnknownConn));
}

#[test]
fn a_req_just_before_the_listen_waits_for_it_and_a_late_one_is_rejected() {
    let grace = AgentConfig {
        listen_grace_ns: 10_000_000,
        ..cfg(0xb)
    };
    let mut n = Net::new(|_, _| Fate::Deliver);
    n.b = Agent::new(grace, 3);
    n.a.connect(n.now, connect_params(1)).unwrap();
    n.pump();
    assert!(
        n.b_events.is_empty() && n.a_events.is_empty(),
        "held, not rejected"
    );
    n.now += 5_000_000;
    n.b.handle_timeout(n.now);
    n.b.listen(SID).unwrap();
    n.run(1_000_000_000);
    assert_eq!(kinds(&n.a_events), ["established"]);
    assert_eq!(n.b.counters().no_listener, 0);

    // Nobody listens within the grace: REJ, invalid service ID.
    let mut n = Net::new(|_, _| Fate::Deliver);
    n.b = Agent::new(grace, 4);
    n.a.connect(n.now, connect_params(1)).unwrap();
    n.run(1_000_000_000);
    assert!(matches!(
        n.a_events[..],
        [CmEvent::Rejected {
            reason: rej_reason::INVALID_SERVICE_ID,
            ..
        }]
    ));
    assert_eq!((n.b.counters().no_listener, n.b.conn_count()), (1, 0));
}

#[test]
fn a_connect_rejected_for_want_of_a_listener_tries_again_within_its_grace() {
    let grace = AgentConfig {
        connect_grace_ns: 100_000_000,
        connect_retry_ns: 20_000_000,
        ..cfg(0xa)
    };
    // B rejects at once (no listen grace), then listens 50 ms later: A's REQ goes again.
    let mut n = Net::new(|_, _| Fate::Deliver);
    n.a = Agent::new(grace, 5);
    n.b = Agent::new(cfg(0xb), 6);
    n.a.connect(n.now, connect_params(1)).unwrap();
    n.pump();
    assert!(n.a_events.is_empty(), "{:?}", n.a_events);
    assert_eq!(n.b.counters().no_listener, 1);
    n.now += 50_000_000;
    n.b.listen(SID).unwrap();
    n.a.handle_timeout(n.now);
    n.run(1_000_000_000);
    assert_eq!(kinds(&n.a_events), ["established"]);

    // Nobody ever listens: after the grace the REJ is reported.
    let mut n = Net::new(|_, _| Fate::Deliver);
    n.a = Agent::new(grace, 7);
    n.b = Agent::new(cfg(0xb), 8);
    n.a.connect(n.now, connect_params(1)).unwrap();
    n.run(1_000_000_000);
    assert!(matches!(
        n.a_events[..],
        [CmEvent::Rejected {
            reason: rej_reason::INVALID_SERVICE_ID,
            ..
        }]
    ));
    assert!(n.b.counters().no_listener >= 4, "{:?}", n.b.counters());
    assert_eq!(n.a.conn_count(), 0);
}

#[test]
fn a_deferred_rtu_goes_on_establish_and_a_lost_one_is_resent() {
    // The first RTU is lost: B resends its REP, A (established by then) the RTU.
    let mut n = Net::new(|i, a| {
        if a == attr::RTU && i < 3 {
            Fate::Drop
        } else {
            Fate::Deliver
        }
    });
    let mut p = connect_params(1);
    p.defer_rtu = true;
    let id = n.a.connect(n.now, p).unwrap();
    while n.pump() {}
    assert_eq!(kinds(&n.a_events), ["established"]);
    assert_eq!(kinds(&n.b_events), ["request"], "no RTU before establish");
    assert_eq!(n.a.disconnect(n.now, 0, b""), Err(Error::UnknownConn));
    n.a.establish(id).unwrap();
    n.a.establish(id).unwrap();
    n.run(1_000_000_000);
    assert_eq!(kinds(&n.b_events), ["request", "established"]);
    assert!(n.b.counters().retries >= 1);
    // Destroyed before establish: the peer gets a REJ for its REP.
    let mut n = Net::new(|_, _| Fate::Deliver);
    let mut p = connect_params(1);
    p.defer_rtu = true;
    let id = n.a.connect(n.now, p).unwrap();
    while n.pump() {}
    n.a.destroy(id).unwrap();
    n.run(1_000_000_000);
    assert_eq!(kinds(&n.b_events), ["request", "rejected"]);
    assert_eq!((n.a.conn_count(), n.b.conn_count()), (0, 0));
}

fn sidr_params() -> SidrParams {
    SidrParams {
        peer: B,
        service_id: SID,
        private_data: b"udp".to_vec(),
    }
}

/// Resolve SID at B; A gets one reply with B's QP and Q_Key, B one request, and both hold
/// nothing once B's time-wait is over.
fn resolve(fate: impl FnMut(usize, u16) -> Fate + 'static) -> Net {
    let mut n = Net::new(fate);
    let id = n.a.sidr_request(n.now, sidr_params()).unwrap();
    n.run(10_000_000_000);
    assert_eq!(kinds(&n.a_events), ["sidr-reply"], "{:?}", n.a_events);
    assert_eq!(kinds(&n.b_events), ["sidr-request"], "{:?}", n.b_events);
    let CmEvent::SidrReply {
        conn,
        peer,
        status,
        qpn,
        qkey,
        private_data,
    } = &n.a_events[0]
    else {
        panic!()
    };
    assert_eq!((*conn, *peer, *status), (id, B, sidr_status::SUCCESS));
    assert_eq!((*qpn, *qkey), (0x200, 0x0123_4567));
    assert_eq!(&private_data[..4], b"sidr");
    let CmEvent::SidrRequest {
        peer,
        service_id,
        private_data,
        ..
    } = &n.b_events[0]
    else {
        panic!()
    };
    assert_eq!((*peer, *service_id), (A, SID));
    assert_eq!(private_data.len(), 216);
    assert_eq!(&private_data[..3], b"udp");
    assert_eq!((n.a.conn_count(), n.b.conn_count()), (0, 0));
    assert_eq!((n.a.next_timeout(), n.b.next_timeout()), (None, None));
    n
}

#[test]
fn a_service_id_resolves_to_the_peers_ud_qp() {
    let n = resolve(|_, _| Fate::Deliver);
    // SIDR_REQ and SIDR_REP, nothing more.
    assert_eq!(n.sent, 2);
}

#[test]
fn sidr_with_each_message_lost_duplicated_or_reordered_once() {
    for fate in [Fate::Drop, Fate::Duplicate, Fate::Delay] {
        for k in 0..2 {
            let mut hit = false;
            let n = resolve(move |i, _| {
                if i == k && !hit {
                    hit = true;
                    fate
                } else {
                    Fate::Deliver
                }
            });
            if fate == Fate::Drop {
                assert!(
                    n.a.counters().retries >= 1,
                    "message {k} lost, nothing resent"
                );
            }
        }
    }
    // The SIDR_REP lost three times: the duplicate SIDR_REQs get it again, the application
    // hears of the request once.
    let mut drops = 0;
    let n = resolve(move |_, a| {
        if a == attr::SIDR_REP && drops < 3 {
            drops += 1;
            Fate::Drop
        } else {
            Fate::Deliver
        }
    });
    assert_eq!(n.b.counters().duplicates, 3);
}

#[test]
fn sidr_refusals_and_silence() {
    // Nobody listens: "not supported" at once.
    let mut n = Net::new(|_, _| Fate::Deliver);
    let mut p = sidr_params();
    p.service_id = SID + 1;
    n.a.sidr_request(n.now, p).unwrap();
    n.run(1_000_000_000);
    assert!(
        matches!(
            n.a_events[..],
            [CmEvent::SidrReply {
                status: sidr_status::SID_NOT_SUPPORTED,
                qpn: 0,
                ..
            }]
        ),
        "{:?}",
        n.a_events
    );
    // The application refuses (reject) or goes away (destroy): REJECT with its data.
    for destroy in [false, true] {
        let mut n = Net::new(|_, _| Fate::Deliver);
        n.b_accepts = false;
        n.a.sidr_request(n.now, sidr_params()).unwrap();
        n.run(1_000_000);
        let Some(CmEvent::SidrRequest { conn, .. }) = n.b_events.first().cloned() else {
            panic!("{:?}", n.b_events)
        };
        // A REQ-only call does not apply.
        assert!(matches!(
            n.b.accept(n.now, conn, AcceptParams::default()),
            Err(Error::WrongState(_))
        ));
        if destroy {
            n.b.destroy(conn).unwrap();
        } else {
            n.b.reject(conn, b"no").unwrap();
        }
        n.run(1_000_000_000);
        let [
            CmEvent::SidrReply {
                status,
                private_data,
                ..
            },
        ] = &n.a_events[..]
        else {
            panic!("{:?}", n.a_events)
        };
        assert_eq!(*status, sidr_status::REJECT);
        assert_eq!(&private_data[..2], if destroy { b"\0\0" } else { b"no" });
        assert_eq!((n.a.conn_count(), n.b.conn_count()), (0, 0));
    }
    // Nobody answers: Unreachable after the retries, and nothing sent after it.
    let mut n = Net::new(|_, _| Fate::Drop);
    let id = n.a.sidr_request(n.now, sidr_params()).unwrap();
    n.run(10_000_000_000);
    assert_eq!(n.a_events, [CmEvent::Unreachable { conn: id }]);
    assert_eq!(n.a.counters().retries, 5);
    assert_eq!(n.a.conn_count(), 0);
    // A SIDR_REP from another address, or for no resolution, changes nothing.
    let mut n = Net::new(|_, _| Fate::Drop);
    let id = n.a.sidr_request(n.now, sidr_params()).unwrap();
    let mut mad = [0u8; MAD_LEN];
    let rep = |request_id| CmMad {
        tid: 1,
        msg: CmMessage::SidrRep(Box::new(SidrRep {
            request_id,
            status: 0,
            info_len: 0,
            qpn: 9,
            service_id: SID,
            qkey: 9,
            info: [0; 72],
            private_data: Vec::new(),
        })),
    };
    rep(id).emit(&mut mad).unwrap();
    n.a.handle_mad(n.now, IpAddr::V4(Ipv4Addr::new(10, 0, 0, 9)), &mad);
    rep(id ^ 1).emit(&mut mad).unwrap();
    n.a.handle_mad(n.now, B, &mad);
    assert!(n.a.poll_event().is_none());
    assert_eq!(n.a.counters().stray, 2);
    assert_eq!(n.a.conn_count(), 1);
}
