//! The InfiniBand transports (sans-IO): Reliable Connected (requester, responder and
//! completer), with Unreliable Connected and Unreliable Datagram beside it ([`unreliable`])
//! sharing its queues, state machine and completions, as rxe shares them.
//!
//! The protocol engine reads no clock and touches no socket: a driver feeds it packets
//! ([`Qp::handle_packet`]) and time ([`Qp::handle_timeout`]) and drains what it produces:
//! complete RoCEv2 UDP payloads ([`Qp::poll_transmit`]), work completions
//! ([`Qp::poll_completion`]) and the next deadline ([`Qp::poll_timeout`]). Time is a `u64`
//! count of nanoseconds from any origin the driver chooses. Memory is reached only through
//! [`crate::mem::MemoryAccess`], passed into each call that touches it.
//!
//! The shape follows Linux rxe: the requester ([`requester`]) turns send WQEs into request
//! packets, the responder ([`responder`]) executes requests in PSN order and answers them,
//! the completer ([`completer`]) consumes acknowledgements and responses, retransmits
//! (go-back-N) and completes WQEs in posting order. [`Qp`] ties them to the state machine of
//! [`qp_state`].
//!
//! A typical driver loop:
//! ```text
//! qp.post_send(&wr)?;                                   // verbs
//! while let Some(n) = qp.poll_transmit(now, &mem, &mut buf) { socket.send(&buf[..n]) }
//! let pkt = Packet::parse_verified(&rx_ctx, datagram)?; // net layer checks the ICRC
//! if pkt.hdr.bth.dest_qp == qp.qp_num() { qp.handle_packet(now, &pkt, &mem, srq) }
//! if qp.poll_timeout() <= Some(now) { qp.handle_timeout(now) }
//! while let Some(wc) = qp.poll_completion() { cq.push(wc) }
//! ```
//! Packet-pattern choices compared with rxe are documented in `docs/RC-PATTERNS.md`.

pub mod atomic_cache;
pub mod completer;
pub mod emit;
pub mod gather;
pub mod psn_set;
pub mod qp;
pub mod qp_state;
mod read_history;
pub mod requester;
pub mod responder;
pub mod rq;
pub mod sq;
pub mod timer;
pub mod unreliable;
pub mod wr;

pub use crate::params::{ACK_REQ_EVERY, LAZY_ACK_NS, MAX_INFLIGHT_PSNS, MAX_MSG_SIZE};
pub use gather::Gather;
pub use qp::{PostRules, Qp, QpCap, QpCounters, QpInit};
pub use qp_state::{ModifyError, Mtu, QpAttr, QpAttrMask, QpState};
pub use responder::{NAK_SEQ_WINDOW, RespCounters};
pub use rq::Srq;
pub use unreliable::{DatagramSource, UdDest, UnrelCounters};
pub use wr::{
    MAX_SGE, NetworkHdr, RecvWr, SendFlags, SendWr, SgList, Sge, WcOpcode, WcStatus,
    WorkCompletion, WrOpcode,
};

/// Bytes of BTH and extension headers at most (BTH + RETH + ImmDt, or BTH + AtomicETH),
/// plus pad and ICRC: a transmit buffer needs path MTU + this.
pub const MAX_OVERHEAD: usize = 12 + 28 + 4 + 3 + 4;

/// The transport service of a QP (`enum ibv_qp_type`, with its values).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
#[repr(u32)]
pub enum QpType {
    /// `IBV_QPT_RC`: Reliable Connected.
    #[default]
    Rc = 2,
    /// `IBV_QPT_UC`: Unreliable Connected (SEND and RDMA WRITE, no acknowledgements, nothing
    /// resent).
    Uc = 3,
    /// `IBV_QPT_UD`: Unreliable Datagram (one-packet SENDs to any QP named per work request).
    Ud = 4,
}

impl QpType {
    /// The wire transport of its packets.
    pub const fn transport(self) -> crate::wire::Transport {
        match self {
            QpType::Rc => crate::wire::Transport::Rc,
            QpType::Uc => crate::wire::Transport::Uc,
            QpType::Ud => crate::wire::Transport::Ud,
        }
    }
    /// True for UC and UD: no acknowledgements, no retransmission.
    pub const fn is_unreliable(self) -> bool {
        !matches!(self, QpType::Rc)
    }
}

/// The bytes in front of a UD receive's payload: the Global Route Header area, which holds
/// the packet's IP header (an IPv4 header in its last 20 bytes; an IPv6 header fills it).
pub const GRH_LEN: usize = 40;

/// Why a post was refused (the errno of `ibv_post_send`/`ibv_post_recv`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum PostError {
    /// The QP's state does not accept this post (EINVAL).
    #[error("QP state {0:?} does not accept this work request")]
    InvalidState(QpState),
    /// The queue is full (ENOMEM).
    #[error("work queue full")]
    QueueFull,
    /// More SGEs than the QP's cap (EINVAL).
    #[error("{0} SGEs, more than the QP accepts")]
    TooManySge(usize),
    /// Inline data larger than `max_inline_data` (EINVAL).
    #[error("inline data of {0} bytes, more than the QP accepts")]
    InlineTooLong(usize),
    /// A UD message longer than the port's MTU (EINVAL): a datagram is one packet.
    #[error("a UD message of {len} bytes, more than the MTU of {max}")]
    MessageTooLong {
        /// The message's length.
        len: u64,
        /// The MTU.
        max: u32,
    },
    /// A malformed work request (EINVAL), e.g. an atomic whose SGE is not 8 bytes.
    #[error("invalid work request: {0}")]
    InvalidArgument(&'static str),
}

/// Why a QP could not be created.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum CreateError {
    /// A capability out of range (EINVAL).
    #[error("capability {0} out of range")]
    InvalidCap(&'static str),
}
