//! The InfiniBand Communication Manager (IBTA chapter 12) as a sans-IO state machine.
//!
//! One [`Agent`] per device speaks the CM protocol on the device's QP1: it takes CM MADs
//! that arrived ([`Agent::handle_mad`]), the application's requests (listen, connect,
//! accept, reject, disconnect) and the passage of time ([`Agent::handle_timeout`]), and
//! hands out MADs to send ([`Agent::poll_transmit`]) and events ([`Agent::poll_event`]).
//! It never touches a socket or a clock: time is a `u64` of nanoseconds the caller chooses,
//! so the simulator and the unit tests drive it exactly as the device does.
//!
//! What it implements, as Linux's kernel CM does for RC connections over RoCE: REQ → REP →
//! RTU set-up with MRA for a slow listener, REJ (no listener, consumer reject, timeout), DREQ
//! → DREP teardown and time-wait; retries of REQ, REP and DREQ after the response timeouts,
//! duplicates answered from state (a duplicate REQ gets the REP again, a duplicate REP the
//! RTU, a duplicate DREQ the DREP). For rdma_cm's UDP port space it resolves service IDs to
//! UD QPs: SIDR_REQ → SIDR_REP, retried like a REQ, a duplicate SIDR_REQ answered with the
//! same SIDR_REP for a time-wait. Messages must come from the address the connection
//! was made with and carry both communication IDs, so an off-path sender has to guess a
//! random 32-bit ID as well as the peer's address.

mod agent;
mod types;

pub use agent::Agent;
pub use types::{
    AcceptParams, AgentConfig, CmCounters, CmEvent, CmTransmit, ConnId, ConnectParams, Error,
    PeerParams, SidrAnswer, SidrParams,
};
