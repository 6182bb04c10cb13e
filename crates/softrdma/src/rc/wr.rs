//! Work requests, scatter/gather entries and work completions, in the verbs vocabulary
//! (`ibv_send_wr`, `ibv_recv_wr`, `ibv_sge`, `ibv_wc`, `ibv_wc_status`).

use crate::mem::Access;
pub use crate::params::MAX_SGE;

/// One scatter/gather entry (`ibv_sge`): `length` bytes at `addr` under local key `lkey`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct Sge {
    /// Start address (an IOVA of the region `lkey` names).
    pub addr: u64,
    /// Length in bytes.
    pub length: u32,
    /// Local key of the region.
    pub lkey: u32,
}

/// A scatter/gather list stored inline (at most [`MAX_SGE`] entries).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SgList {
    sges: [Sge; MAX_SGE],
    len: u8,
}

impl SgList {
    /// Copy a slice of entries; `None` when there are more than [`MAX_SGE`].
    pub fn from_slice(s: &[Sge]) -> Option<SgList> {
        if s.len() > MAX_SGE {
            return None;
        }
        let mut l = SgList::default();
        l.sges[..s.len()].copy_from_slice(s);
        l.len = s.len() as u8;
        Some(l)
    }

    /// The entries.
    pub fn as_slice(&self) -> &[Sge] {
        &self.sges[..usize::from(self.len)]
    }

    /// True when an entry's L_Key is one `names` picks.
    pub fn names_key(&self, names: &dyn Fn(u32) -> bool) -> bool {
        self.as_slice().iter().any(|s| names(s.lkey))
    }

    /// Sum of the entry lengths.
    pub fn total_len(&self) -> u64 {
        self.as_slice().iter().map(|s| u64::from(s.length)).sum()
    }

    /// Walk `len` bytes starting `offset` bytes into the list, calling `f(sge, offset in sge,
    /// offset in the walked range, bytes)` for each piece. Returns false if the list is too
    /// short.
    pub(crate) fn for_each_piece<E>(
        &self,
        offset: u64,
        len: usize,
        mut f: impl FnMut(&Sge, u64, usize, usize) -> Result<(), E>,
    ) -> Result<bool, E> {
        let mut skip = offset;
        let mut done = 0usize;
        for s in self.as_slice() {
            if done == len {
                break;
            }
            let sl = u64::from(s.length);
            if skip >= sl {
                skip -= sl;
                continue;
            }
            let n = ((sl - skip) as usize).min(len - done);
            f(s, skip, done, n)?;
            done += n;
            skip = 0;
        }
        Ok(done == len)
    }
}

/// `ibv_send_flags`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct SendFlags(pub u32);

impl SendFlags {
    /// No flag.
    pub const NONE: SendFlags = SendFlags(0);
    /// `IBV_SEND_FENCE`: wait for earlier READ and atomic WRs to complete.
    pub const FENCE: SendFlags = SendFlags(1);
    /// `IBV_SEND_SIGNALED`: generate a completion on success.
    pub const SIGNALED: SendFlags = SendFlags(2);
    /// `IBV_SEND_SOLICITED`: set the solicited event bit.
    pub const SOLICITED: SendFlags = SendFlags(4);
    /// `IBV_SEND_INLINE`: the payload is copied at post time (see [`SendWr::inline_data`]).
    pub const INLINE: SendFlags = SendFlags(8);

    /// True when every bit of `o` is set.
    pub const fn contains(self, o: SendFlags) -> bool {
        self.0 & o.0 == o.0
    }
}

impl core::ops::BitOr for SendFlags {
    type Output = SendFlags;
    fn bitor(self, o: SendFlags) -> SendFlags {
        SendFlags(self.0 | o.0)
    }
}

/// What a send work request does (`ibv_wr_opcode` with its per-opcode fields).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WrOpcode {
    /// `IBV_WR_SEND`
    Send,
    /// `IBV_WR_SEND_WITH_IMM`
    SendWithImm {
        /// Immediate data (carried as-is).
        imm: u32,
    },
    /// `IBV_WR_SEND_WITH_INV`: the responder invalidates `rkey` before completing.
    SendWithInv {
        /// Remote key to invalidate.
        rkey: u32,
    },
    /// `IBV_WR_RDMA_WRITE`
    RdmaWrite {
        /// Remote address.
        remote_addr: u64,
        /// Remote key.
        rkey: u32,
    },
    /// `IBV_WR_RDMA_WRITE_WITH_IMM`
    RdmaWriteWithImm {
        /// Remote address.
        remote_addr: u64,
        /// Remote key.
        rkey: u32,
        /// Immediate data.
        imm: u32,
    },
    /// `IBV_WR_RDMA_READ`
    RdmaRead {
        /// Remote address.
        remote_addr: u64,
        /// Remote key.
        rkey: u32,
    },
    /// `IBV_WR_ATOMIC_CMP_AND_SWP`: the original value lands in the single 8-byte SGE.
    AtomicCmpAndSwp {
        /// Remote address (8-aligned).
        remote_addr: u64,
        /// Remote key.
        rkey: u32,
        /// Compare value.
        compare: u64,
        /// Swap value.
        swap: u64,
    },
    /// `IBV_WR_ATOMIC_FETCH_AND_ADD`
    AtomicFetchAndAdd {
        /// Remote address (8-aligned).
        remote_addr: u64,
        /// Remote key.
        rkey: u32,
        /// Addend.
        add: u64,
    },
    /// `IBV_WR_LOCAL_INV`
    LocalInv {
        /// Key to invalidate.
        rkey: u32,
    },
    /// `IBV_WR_BIND_MW` (type 2 window).
    BindMw {
        /// Current key of the window.
        mw_rkey: u32,
        /// Key after binding (differs only in the low 8 bits).
        new_rkey: u32,
        /// Local key of the parent region.
        mr_lkey: u32,
        /// Start of the window.
        addr: u64,
        /// Length of the window.
        length: u64,
        /// Rights granted through the window.
        access: Access,
    },
}

impl WrOpcode {
    /// True for READ and the atomics (bounded by `max_rd_atomic`, waited for by a fence).
    pub const fn is_rd_atomic(&self) -> bool {
        matches!(
            self,
            WrOpcode::RdmaRead { .. }
                | WrOpcode::AtomicCmpAndSwp { .. }
                | WrOpcode::AtomicFetchAndAdd { .. }
        )
    }
    /// True for the atomics.
    pub const fn is_atomic(&self) -> bool {
        matches!(
            self,
            WrOpcode::AtomicCmpAndSwp { .. } | WrOpcode::AtomicFetchAndAdd { .. }
        )
    }
    /// True when the request consumes a receive at the responder (SEND kinds, WRITE with
    /// immediate).
    pub const fn consumes_receive(&self) -> bool {
        matches!(
            self,
            WrOpcode::Send
                | WrOpcode::SendWithImm { .. }
                | WrOpcode::SendWithInv { .. }
                | WrOpcode::RdmaWriteWithImm { .. }
        )
    }
    /// True for work executed locally without packets (LOCAL_INV, BIND_MW).
    pub const fn is_local(&self) -> bool {
        matches!(self, WrOpcode::LocalInv { .. } | WrOpcode::BindMw { .. })
    }
    /// True when the SGEs are a source of payload (SEND and WRITE kinds).
    pub const fn carries_payload(&self) -> bool {
        matches!(
            self,
            WrOpcode::Send
                | WrOpcode::SendWithImm { .. }
                | WrOpcode::SendWithInv { .. }
                | WrOpcode::RdmaWrite { .. }
                | WrOpcode::RdmaWriteWithImm { .. }
        )
    }
    /// The completion opcode.
    pub const fn wc_opcode(&self) -> WcOpcode {
        match self {
            WrOpcode::Send | WrOpcode::SendWithImm { .. } | WrOpcode::SendWithInv { .. } => {
                WcOpcode::Send
            }
            WrOpcode::RdmaWrite { .. } | WrOpcode::RdmaWriteWithImm { .. } => WcOpcode::RdmaWrite,
            WrOpcode::RdmaRead { .. } => WcOpcode::RdmaRead,
            WrOpcode::AtomicCmpAndSwp { .. } => WcOpcode::CompSwap,
            WrOpcode::AtomicFetchAndAdd { .. } => WcOpcode::FetchAdd,
            WrOpcode::LocalInv { .. } => WcOpcode::LocalInv,
            WrOpcode::BindMw { .. } => WcOpcode::BindMw,
        }
    }
}

/// A send work request (`ibv_send_wr`). Borrowed: posting copies what it needs.
#[derive(Clone, Copy, Debug)]
pub struct SendWr<'a> {
    /// Caller's identifier, returned in the completion.
    pub wr_id: u64,
    /// Operation.
    pub opcode: WrOpcode,
    /// Flags.
    pub send_flags: SendFlags,
    /// Local buffers: the payload source (SEND, WRITE) or destination (READ, atomic).
    pub sg_list: &'a [Sge],
    /// Inline payload (`IBV_SEND_INLINE`): when present it is copied at post time and
    /// `sg_list` is ignored. At most the QP's `max_inline_data` bytes.
    pub inline_data: Option<&'a [u8]>,
    /// UD: the destination (`wr.ud`: address handle, remote QPN and Q_Key); required on a UD
    /// QP, ignored on RC and UC.
    pub ud: Option<super::UdDest>,
}

impl<'a> SendWr<'a> {
    /// A signaled work request with no SGEs.
    pub fn new(wr_id: u64, opcode: WrOpcode) -> SendWr<'a> {
        SendWr {
            wr_id,
            opcode,
            send_flags: SendFlags::SIGNALED,
            sg_list: &[],
            inline_data: None,
            ud: None,
        }
    }
    /// With these SGEs.
    pub fn sg(mut self, sg_list: &'a [Sge]) -> SendWr<'a> {
        self.sg_list = sg_list;
        self
    }
    /// With these flags (replacing the default `SIGNALED`).
    pub fn flags(mut self, f: SendFlags) -> SendWr<'a> {
        self.send_flags = f;
        self
    }
    /// To this UD destination.
    pub fn ud(mut self, dest: super::UdDest) -> SendWr<'a> {
        self.ud = Some(dest);
        self
    }
    /// With inline payload.
    pub fn inline(mut self, data: &'a [u8]) -> SendWr<'a> {
        self.inline_data = Some(data);
        self.send_flags = self.send_flags | SendFlags::INLINE;
        self
    }
}

/// A receive work request (`ibv_recv_wr`).
#[derive(Clone, Copy, Debug)]
pub struct RecvWr<'a> {
    /// Caller's identifier.
    pub wr_id: u64,
    /// Where incoming SEND payload is scattered.
    pub sg_list: &'a [Sge],
}

/// `enum ibv_wc_status`, with its numeric values.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(u32)]
pub enum WcStatus {
    /// `IBV_WC_SUCCESS`
    Success = 0,
    /// `IBV_WC_LOC_LEN_ERR`: a message longer than the receive buffer, or bad local lengths.
    LocLenErr = 1,
    /// `IBV_WC_LOC_QP_OP_ERR`: an internal QP consistency error (malformed WQE).
    LocQpOpErr = 2,
    /// `IBV_WC_LOC_EEC_OP_ERR` (RD only; never produced).
    LocEecOpErr = 3,
    /// `IBV_WC_LOC_PROT_ERR`: a local key check failed.
    LocProtErr = 4,
    /// `IBV_WC_WR_FLUSH_ERR`: the QP was in error; the WR was not executed.
    WrFlushErr = 5,
    /// `IBV_WC_MW_BIND_ERR`
    MwBindErr = 6,
    /// `IBV_WC_BAD_RESP_ERR`: an unexpected response opcode.
    BadRespErr = 7,
    /// `IBV_WC_LOC_ACCESS_ERR`: a local protection error on an incoming RDMA WRITE with
    /// immediate or on placement.
    LocAccessErr = 8,
    /// `IBV_WC_REM_INV_REQ_ERR`: NAK invalid request.
    RemInvReqErr = 9,
    /// `IBV_WC_REM_ACCESS_ERR`: NAK remote access error.
    RemAccessErr = 10,
    /// `IBV_WC_REM_OP_ERR`: NAK remote operational error.
    RemOpErr = 11,
    /// `IBV_WC_RETRY_EXC_ERR`: transport retry counter exceeded.
    RetryExcErr = 12,
    /// `IBV_WC_RNR_RETRY_EXC_ERR`: RNR retry counter exceeded.
    RnrRetryExcErr = 13,
    /// `IBV_WC_LOC_RDD_VIOL_ERR` (RD only; never produced).
    LocRddViolErr = 14,
    /// `IBV_WC_REM_INV_RD_REQ_ERR` (RD only; never produced).
    RemInvRdReqErr = 15,
    /// `IBV_WC_REM_ABORT_ERR`
    RemAbortErr = 16,
    /// `IBV_WC_INV_EECN_ERR` (RD only; never produced).
    InvEecnErr = 17,
    /// `IBV_WC_INV_EEC_STATE_ERR` (RD only; never produced).
    InvEecStateErr = 18,
    /// `IBV_WC_FATAL_ERR`
    FatalErr = 19,
    /// `IBV_WC_RESP_TIMEOUT_ERR`
    RespTimeoutErr = 20,
    /// `IBV_WC_GENERAL_ERR`
    GeneralErr = 21,
}

/// `enum ibv_wc_opcode`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(u32)]
pub enum WcOpcode {
    /// `IBV_WC_SEND`
    Send = 0,
    /// `IBV_WC_RDMA_WRITE`
    RdmaWrite = 1,
    /// `IBV_WC_RDMA_READ`
    RdmaRead = 2,
    /// `IBV_WC_COMP_SWAP`
    CompSwap = 3,
    /// `IBV_WC_FETCH_ADD`
    FetchAdd = 4,
    /// `IBV_WC_BIND_MW`
    BindMw = 5,
    /// `IBV_WC_LOCAL_INV`
    LocalInv = 6,
    /// `IBV_WC_RECV`
    Recv = 128,
    /// `IBV_WC_RECV_RDMA_WITH_IMM`
    RecvRdmaWithImm = 129,
}

impl WcOpcode {
    /// True for receive-side completions.
    pub const fn is_recv(self) -> bool {
        matches!(self, WcOpcode::Recv | WcOpcode::RecvRdmaWithImm)
    }
}

/// A work completion (`ibv_wc`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct WorkCompletion {
    /// The WR's identifier.
    pub wr_id: u64,
    /// Outcome.
    pub status: WcStatus,
    /// What completed (for flushed receives: `Recv`).
    pub opcode: WcOpcode,
    /// Bytes received (receives) or read (READ); 8 for atomics.
    pub byte_len: u32,
    /// Immediate data (`IBV_WC_WITH_IMM`).
    pub imm_data: Option<u32>,
    /// Key invalidated by a SEND with Invalidate (`IBV_WC_WITH_INV`).
    pub invalidated_rkey: Option<u32>,
    /// The local QP number.
    pub qp_num: u32,
    /// The peer's QP number (receives).
    pub src_qp: u32,
    /// The message carried the solicited-event bit (receives; a CQ armed for solicited
    /// completions only fires on these and on errors).
    pub solicited: bool,
    /// The receive buffer starts with the 40-byte GRH area (`IBV_WC_GRH`: UD receives), which
    /// holds the header of this network protocol (the kernel's `network_hdr_type`).
    pub grh: Option<NetworkHdr>,
}

/// The network header a RoCEv2 datagram arrived with, which the GRH area of a UD receive holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NetworkHdr {
    /// IPv4: its 20-byte header in the second half of the GRH area.
    Ipv4,
    /// IPv6: its 40-byte header fills the GRH area.
    Ipv6,
}

impl WorkCompletion {
    /// True for receive-side completions.
    pub fn is_recv(&self) -> bool {
        self.opcode.is_recv()
    }
}
