//! What the CM agent takes and gives: its configuration, the parameters of a connection,
//! events, MADs to send, errors and counters.

use std::net::IpAddr;

use crate::wire;
use crate::wire::cm::CmPath;
use crate::wire::mad::MAD_LEN;

/// A connection of the agent: its local communication ID.
pub type ConnId = u32;

/// How the agent behaves.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AgentConfig {
    /// The device's CA GUID, sent in REQ and REP.
    pub ca_guid: u64,
    /// The CM response timeout this side advertises and waits for answers with
    /// (4.096 µs × 2^n; 16, the default, is about 268 ms).
    pub response_timeout: u8,
    /// How often REQ, REP and DREQ are sent again before giving up (at most 15).
    pub max_retries: u8,
    /// How long a connection stays in time-wait after a disconnect, answering duplicates.
    pub timewait_ns: u64,
    /// The service timeout an MRA asks for while the application decides on a REQ.
    pub mra_service_timeout: u8,
    /// Connections at most (a REQ beyond draws REJ "no resources").
    pub max_conns: usize,
    /// How long a REQ for a service nobody listens on is held before it is rejected
    /// (invalid service ID): a listen within that time takes it. 0 rejects at once, as Linux
    /// does; the device uses 200 ms, because a peer may connect again the moment a
    /// previous connection's handshake ends, before the application listens again.
    pub listen_grace_ns: u64,
    /// For how long after a connect a REJ "invalid service ID" (nobody listens yet) makes the
    /// REQ go again (after [`AgentConfig::connect_retry_ns`]) instead of ending the connection:
    /// a server that listens again right after a previous connection's handshake may not be
    /// listening yet. 0 (the default) reports the REJ at once, as Linux does.
    pub connect_grace_ns: u64,
    /// The pause before such a REQ goes again.
    pub connect_retry_ns: u64,
}

impl Default for AgentConfig {
    fn default() -> Self {
        AgentConfig {
            ca_guid: 0,
            response_timeout: 16,
            max_retries: 15,
            timewait_ns: 1_000_000_000,
            mra_service_timeout: 22,
            max_conns: 65_536,
            listen_grace_ns: 0,
            connect_grace_ns: 0,
            connect_retry_ns: 20_000_000,
        }
    }
}

/// What an active side asks for in its REQ.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ConnectParams {
    /// The peer's IP address (its QP1 is there).
    pub peer: IpAddr,
    /// The service connected to.
    pub service_id: u64,
    /// The local QP number.
    pub qpn: u32,
    /// The PSN the local QP expects to receive first (the peer sends from it).
    pub starting_psn: u32,
    /// READs and atomics the local QP accepts at once.
    pub responder_resources: u8,
    /// READs and atomics the local QP issues at once.
    pub initiator_depth: u8,
    /// Path MTU (IBTA encoding, 1 = 256 … 5 = 4096).
    pub path_mtu: u8,
    /// Transport retry count (0–7).
    pub retry_count: u8,
    /// RNR retry count (0–7).
    pub rnr_retry_count: u8,
    /// The local QP uses an SRQ.
    pub srq: bool,
    /// 0 for RC, 1 for UC.
    pub transport: u8,
    /// The primary path (GIDs, flow label, hop limit, ACK timeout).
    pub path: CmPath,
    /// The REQ's private data (up to 92 bytes).
    pub private_data: Vec<u8>,
    /// Send the RTU only when the application calls `establish` (after bringing its QP to
    /// RTS, so that the peer's first packets find it ready; librdmacm's order), instead of
    /// as soon as the REP arrives.
    pub defer_rtu: bool,
}

/// What the passive side answers with in its REP.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct AcceptParams {
    /// The local QP number.
    pub qpn: u32,
    /// The PSN the local QP expects to receive first (the peer sends from it).
    pub starting_psn: u32,
    /// READs and atomics the local QP accepts at once.
    pub responder_resources: u8,
    /// READs and atomics the local QP issues at once.
    pub initiator_depth: u8,
    /// RNR retry count (0–7).
    pub rnr_retry_count: u8,
    /// The local QP uses an SRQ.
    pub srq: bool,
    /// The REP's private data (up to 196 bytes).
    pub private_data: Vec<u8>,
}

/// What the peer said about its QP, in its REQ or REP.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PeerParams {
    /// The peer's QP number.
    pub qpn: u32,
    /// The PSN the peer expects to receive first: the local QP sends from it.
    pub starting_psn: u32,
    /// READs and atomics the peer accepts at once.
    pub responder_resources: u8,
    /// READs and atomics the peer issues at once.
    pub initiator_depth: u8,
    /// Path MTU (REQ; a REP carries none and repeats the REQ's).
    pub path_mtu: u8,
    /// Transport retry count (REQ).
    pub retry_count: u8,
    /// RNR retry count.
    pub rnr_retry_count: u8,
    /// The peer's QP uses an SRQ.
    pub srq: bool,
    /// 0 for RC, 1 for UC (REQ).
    pub transport: u8,
    /// The primary path as the REQ gives it (local = the peer's side).
    pub path: CmPath,
    /// The service (REQ).
    pub service_id: u64,
    /// The whole private-data area of the message.
    pub private_data: Vec<u8>,
}

/// What an active side asks for in a SIDR_REQ (rdma_cm's UDP port space: which UD QP serves
/// a service).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SidrParams {
    /// The peer's IP address (its QP1 is there).
    pub peer: IpAddr,
    /// The service asked for.
    pub service_id: u64,
    /// The SIDR_REQ's private data (up to 216 bytes).
    pub private_data: Vec<u8>,
}

/// What a passive side answers a SIDR_REQ with.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SidrAnswer {
    /// `wire::cm::sidr_status` (SUCCESS gives the QP and Q_Key).
    pub status: u8,
    /// The UD QP serving the service.
    pub qpn: u32,
    /// The Q_Key to send to it with.
    pub qkey: u32,
    /// The SIDR_REP's private data (up to 136 bytes).
    pub private_data: Vec<u8>,
}

/// What happened, for the application.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum CmEvent {
    /// A REQ for a service this side listens on; answer with `accept` or `reject`.
    ConnectRequest {
        /// The new connection.
        conn: ConnId,
        /// Where the REQ came from.
        peer: IpAddr,
        /// The REQ's parameters.
        params: Box<PeerParams>,
    },
    /// The connection is up (active: the REP arrived and the RTU went out; passive: the RTU
    /// arrived).
    Established {
        /// The connection.
        conn: ConnId,
        /// The REP's parameters on the active side.
        params: Option<Box<PeerParams>>,
    },
    /// The peer rejected the REQ or REP.
    Rejected {
        /// The connection (gone now).
        conn: ConnId,
        /// The REJ's reason (`wire::cm::rej_reason`).
        reason: u16,
        /// The REJ's private data.
        private_data: Vec<u8>,
    },
    /// The peer never answered the REQ or REP (the connection is gone).
    Unreachable {
        /// The connection.
        conn: ConnId,
    },
    /// The connection is down: a DREQ arrived, ours was answered or ran out of retries, or
    /// the peer rejected an established connection. Time-wait follows.
    Disconnected {
        /// The connection.
        conn: ConnId,
        /// The DREQ's or DREP's private data (empty when the local side gave up).
        private_data: Vec<u8>,
    },
    /// Time-wait is over; the connection is gone.
    TimewaitExit {
        /// The connection.
        conn: ConnId,
    },
    /// A SIDR_REQ for a service this side listens on; answer with `sidr_answer` (or
    /// `reject`, or `destroy`: both answer REJECT).
    SidrRequest {
        /// The resolution (gone once answered).
        conn: ConnId,
        /// Where the SIDR_REQ came from.
        peer: IpAddr,
        /// The service asked for.
        service_id: u64,
        /// The SIDR_REQ's private data (all 216 bytes).
        private_data: Vec<u8>,
    },
    /// The SIDR_REP of a `sidr_request` arrived (the resolution is gone now; a peer that
    /// never answers ends in `Unreachable`).
    SidrReply {
        /// The resolution.
        conn: ConnId,
        /// Where the SIDR_REP came from.
        peer: IpAddr,
        /// `wire::cm::sidr_status`.
        status: u8,
        /// The peer's UD QP (status SUCCESS).
        qpn: u32,
        /// Its Q_Key.
        qkey: u32,
        /// The SIDR_REP's private data (all 136 bytes).
        private_data: Vec<u8>,
    },
}

impl CmEvent {
    /// The connection (or resolution) the event is about.
    pub fn conn(&self) -> ConnId {
        match self {
            CmEvent::ConnectRequest { conn, .. }
            | CmEvent::Established { conn, .. }
            | CmEvent::Rejected { conn, .. }
            | CmEvent::Unreachable { conn }
            | CmEvent::Disconnected { conn, .. }
            | CmEvent::TimewaitExit { conn }
            | CmEvent::SidrRequest { conn, .. }
            | CmEvent::SidrReply { conn, .. } => *conn,
        }
    }
}

/// A MAD to send to QP1 at `dst`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CmTransmit {
    /// The peer.
    pub dst: IpAddr,
    /// The whole MAD.
    pub mad: [u8; MAD_LEN],
}

/// Why a request of the application was refused.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum Error {
    /// No such connection (never made, or gone).
    #[error("unknown connection")]
    UnknownConn,
    /// The connection is not in a state that allows this.
    #[error("not allowed in the connection's state ({0})")]
    WrongState(&'static str),
    /// Somebody already listens on this service.
    #[error("the service ID is in use")]
    ServiceInUse,
    /// Nobody listens on this service.
    #[error("not listening on this service ID")]
    NotListening,
    /// The agent holds `max_conns` connections.
    #[error("too many connections")]
    TooManyConns,
    /// A message could not be built (private data too long, a field out of range).
    #[error("{0}")]
    Wire(#[from] wire::Error),
}

/// What the agent counted.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CmCounters {
    /// MADs handed to `handle_mad`.
    pub received: u64,
    /// MADs queued for sending.
    pub sent: u64,
    /// MADs that did not parse as CM messages (dropped).
    pub bad: u64,
    /// Gets and Sets (e.g. of ClassPortInfo) answered "unsupported method/attribute", as
    /// Linux's MAD layer answers what no agent takes.
    pub unsupported: u64,
    /// Messages for no connection of ours, or from the wrong address or with the wrong
    /// communication ID (dropped, or answered as Linux does: DREP for DREQ, REJ for REP).
    pub stray: u64,
    /// Duplicate messages (answered from state or dropped).
    pub duplicates: u64,
    /// Messages sent again after a timeout.
    pub retries: u64,
    /// REQs and REPs given up on after every retry.
    pub timeouts: u64,
    /// REQs rejected (and SIDR_REQs answered "not supported") because nobody listens on
    /// their service.
    pub no_listener: u64,
}
