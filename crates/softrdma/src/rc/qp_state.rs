//! The QP state machine and its attributes, with the rules of `ibv_modify_qp` for RC, UC and
//! UD QPs (IBTA 11.2.1.2 / the kernel's `qp_state_table`): which transitions exist, which
//! attributes each requires and which it accepts.

use super::QpType;
use crate::mem::Access;
pub use crate::params::MAX_RD_ATOMIC;
use crate::wire::{AddressVector, Psn};

/// `enum ibv_qp_state`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(u32)]
pub enum QpState {
    /// `IBV_QPS_RESET`
    Reset = 0,
    /// `IBV_QPS_INIT`: receives may be posted.
    Init = 1,
    /// `IBV_QPS_RTR`: the responder runs.
    Rtr = 2,
    /// `IBV_QPS_RTS`: the requester runs too.
    Rts = 3,
    /// `IBV_QPS_SQD`: the requester starts no new WR.
    Sqd = 4,
    /// `IBV_QPS_SQE` (send queue error; UC/UD only, never entered by RC).
    Sqe = 5,
    /// `IBV_QPS_ERR`: everything outstanding is flushed.
    Err = 6,
}

/// `enum ibv_mtu`: path MTU.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[repr(u32)]
pub enum Mtu {
    /// 256 bytes.
    Mtu256 = 1,
    /// 512 bytes.
    Mtu512 = 2,
    /// 1024 bytes.
    Mtu1024 = 3,
    /// 2048 bytes.
    Mtu2048 = 4,
    /// 4096 bytes.
    Mtu4096 = 5,
}

impl Mtu {
    /// All values, smallest first.
    pub const ALL: [Mtu; 5] = [
        Mtu::Mtu256,
        Mtu::Mtu512,
        Mtu::Mtu1024,
        Mtu::Mtu2048,
        Mtu::Mtu4096,
    ];

    /// Bytes.
    pub const fn bytes(self) -> u32 {
        128 << (self as u32)
    }
    /// From a byte count (256-4096, a power of two).
    pub fn from_bytes(b: u32) -> Option<Mtu> {
        Mtu::ALL.into_iter().find(|m| m.bytes() == b)
    }
}

/// `enum ibv_qp_attr_mask`, with its bit values.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct QpAttrMask(pub u32);

impl QpAttrMask {
    /// `IBV_QP_STATE`
    pub const STATE: QpAttrMask = QpAttrMask(1);
    /// `IBV_QP_CUR_STATE`
    pub const CUR_STATE: QpAttrMask = QpAttrMask(1 << 1);
    /// `IBV_QP_EN_SQD_ASYNC_NOTIFY`
    pub const EN_SQD_ASYNC_NOTIFY: QpAttrMask = QpAttrMask(1 << 2);
    /// `IBV_QP_ACCESS_FLAGS`
    pub const ACCESS_FLAGS: QpAttrMask = QpAttrMask(1 << 3);
    /// `IBV_QP_PKEY_INDEX`
    pub const PKEY_INDEX: QpAttrMask = QpAttrMask(1 << 4);
    /// `IBV_QP_PORT`
    pub const PORT: QpAttrMask = QpAttrMask(1 << 5);
    /// `IBV_QP_QKEY` (UD only)
    pub const QKEY: QpAttrMask = QpAttrMask(1 << 6);
    /// `IBV_QP_AV`: the path to the peer ([`QpAttr::av`]).
    pub const AV: QpAttrMask = QpAttrMask(1 << 7);
    /// `IBV_QP_PATH_MTU`
    pub const PATH_MTU: QpAttrMask = QpAttrMask(1 << 8);
    /// `IBV_QP_TIMEOUT`
    pub const TIMEOUT: QpAttrMask = QpAttrMask(1 << 9);
    /// `IBV_QP_RETRY_CNT`
    pub const RETRY_CNT: QpAttrMask = QpAttrMask(1 << 10);
    /// `IBV_QP_RNR_RETRY`
    pub const RNR_RETRY: QpAttrMask = QpAttrMask(1 << 11);
    /// `IBV_QP_RQ_PSN`
    pub const RQ_PSN: QpAttrMask = QpAttrMask(1 << 12);
    /// `IBV_QP_MAX_QP_RD_ATOMIC`
    pub const MAX_QP_RD_ATOMIC: QpAttrMask = QpAttrMask(1 << 13);
    /// `IBV_QP_ALT_PATH`
    pub const ALT_PATH: QpAttrMask = QpAttrMask(1 << 14);
    /// `IBV_QP_MIN_RNR_TIMER`
    pub const MIN_RNR_TIMER: QpAttrMask = QpAttrMask(1 << 15);
    /// `IBV_QP_SQ_PSN`
    pub const SQ_PSN: QpAttrMask = QpAttrMask(1 << 16);
    /// `IBV_QP_MAX_DEST_RD_ATOMIC`
    pub const MAX_DEST_RD_ATOMIC: QpAttrMask = QpAttrMask(1 << 17);
    /// `IBV_QP_PATH_MIG_STATE`
    pub const PATH_MIG_STATE: QpAttrMask = QpAttrMask(1 << 18);
    /// `IBV_QP_CAP`
    pub const CAP: QpAttrMask = QpAttrMask(1 << 19);
    /// `IBV_QP_DEST_QPN`
    pub const DEST_QPN: QpAttrMask = QpAttrMask(1 << 20);

    /// What RESET→INIT takes when bringing up a connection (as the rdma-core examples do).
    pub const TO_INIT: QpAttrMask = QpAttrMask::STATE
        .with(QpAttrMask::PKEY_INDEX)
        .with(QpAttrMask::PORT)
        .with(QpAttrMask::ACCESS_FLAGS);
    /// What INIT→RTR takes: the path and the peer.
    pub const TO_RTR: QpAttrMask = QpAttrMask::STATE
        .with(QpAttrMask::AV)
        .with(QpAttrMask::PATH_MTU)
        .with(QpAttrMask::DEST_QPN)
        .with(QpAttrMask::RQ_PSN)
        .with(QpAttrMask::MAX_DEST_RD_ATOMIC)
        .with(QpAttrMask::MIN_RNR_TIMER);
    /// What RTR→RTS takes: the send side's timers, retries and PSN.
    pub const TO_RTS: QpAttrMask = QpAttrMask::STATE
        .with(QpAttrMask::SQ_PSN)
        .with(QpAttrMask::TIMEOUT)
        .with(QpAttrMask::RETRY_CNT)
        .with(QpAttrMask::RNR_RETRY)
        .with(QpAttrMask::MAX_QP_RD_ATOMIC);

    /// What RESET→INIT, INIT→RTR and RTR→RTS take when bringing up a QP of type `t`: the
    /// masks above for RC; for UC the same without the RC-only attributes (no READ/atomic
    /// depths, no RNR timer, no timeouts or retries); for UD the Q_Key, no path and only the
    /// send PSN.
    pub const fn bring_up(t: QpType) -> [QpAttrMask; 3] {
        use QpAttrMask as M;
        match t {
            QpType::Rc => [M::TO_INIT, M::TO_RTR, M::TO_RTS],
            QpType::Uc => [
                M::TO_INIT,
                M::STATE
                    .with(M::AV)
                    .with(M::PATH_MTU)
                    .with(M::DEST_QPN)
                    .with(M::RQ_PSN),
                M::STATE.with(M::SQ_PSN),
            ],
            QpType::Ud => [
                M::STATE.with(M::PKEY_INDEX).with(M::PORT).with(M::QKEY),
                M::STATE,
                M::STATE.with(M::SQ_PSN),
            ],
        }
    }

    /// True when every bit of `o` is set.
    pub const fn contains(self, o: QpAttrMask) -> bool {
        self.0 & o.0 == o.0
    }
    /// Union.
    pub const fn with(self, o: QpAttrMask) -> QpAttrMask {
        QpAttrMask(self.0 | o.0)
    }
    /// The name of the lowest set bit (for error messages).
    pub fn first_name(self) -> &'static str {
        const NAMES: [&str; 21] = [
            "STATE",
            "CUR_STATE",
            "EN_SQD_ASYNC_NOTIFY",
            "ACCESS_FLAGS",
            "PKEY_INDEX",
            "PORT",
            "QKEY",
            "AV",
            "PATH_MTU",
            "TIMEOUT",
            "RETRY_CNT",
            "RNR_RETRY",
            "RQ_PSN",
            "MAX_QP_RD_ATOMIC",
            "ALT_PATH",
            "MIN_RNR_TIMER",
            "SQ_PSN",
            "MAX_DEST_RD_ATOMIC",
            "PATH_MIG_STATE",
            "CAP",
            "DEST_QPN",
        ];
        NAMES
            .get(self.0.trailing_zeros() as usize)
            .copied()
            .unwrap_or("?")
    }
}

impl core::ops::BitOr for QpAttrMask {
    type Output = QpAttrMask;
    fn bitor(self, o: QpAttrMask) -> QpAttrMask {
        self.with(o)
    }
}

/// `struct ibv_qp_attr`, the fields an RC QP uses. Only the fields named by the mask given to
/// [`crate::rc::Qp::modify`] are read.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct QpAttr {
    /// Target state.
    pub qp_state: QpState,
    /// Expected current state (checked when `CUR_STATE` is in the mask).
    pub cur_qp_state: QpState,
    /// Remote rights the responder grants (`REMOTE_WRITE`, `REMOTE_READ`, `REMOTE_ATOMIC`).
    pub qp_access_flags: Access,
    /// P_Key index (only index 0, P_Key 0xFFFF, exists).
    pub pkey_index: u16,
    /// Port number (1).
    pub port_num: u8,
    /// The path to the peer (stands for `ah_attr`): where packets go and the IP/UDP context
    /// their ICRC covers.
    pub av: Option<AddressVector>,
    /// Path MTU.
    pub path_mtu: Mtu,
    /// Local ACK timeout: 4.096 us x 2^timeout; 0 means infinite (0-31).
    pub timeout: u8,
    /// Transport retries (0-7).
    pub retry_cnt: u8,
    /// RNR retries (0-7; 7 means retry forever).
    pub rnr_retry: u8,
    /// First PSN the responder expects.
    pub rq_psn: u32,
    /// First PSN the requester sends.
    pub sq_psn: u32,
    /// READ/atomic requests this QP may have outstanding as requester.
    pub max_rd_atomic: u8,
    /// READ/atomic requests this QP accepts outstanding as responder.
    pub max_dest_rd_atomic: u8,
    /// RNR timer code the responder puts in its RNR NAKs (0-31).
    pub min_rnr_timer: u8,
    /// The peer QP number (24 bits).
    pub dest_qp_num: u32,
    /// Q_Key (UD): datagrams carrying another are dropped; a work request whose Q_Key has the
    /// high bit set sends with this one.
    pub qkey: u32,
}

impl QpAttr {
    /// Take the attributes `mask` names from `from` (the state fields excepted).
    pub fn take_masked(&mut self, from: &QpAttr, mask: QpAttrMask) {
        let has = |m| mask.contains(m);
        if has(QpAttrMask::ACCESS_FLAGS) {
            self.qp_access_flags = from.qp_access_flags;
        }
        if has(QpAttrMask::AV) {
            self.av = from.av;
        }
        if has(QpAttrMask::PATH_MTU) {
            self.path_mtu = from.path_mtu;
        }
        if has(QpAttrMask::TIMEOUT) {
            self.timeout = from.timeout;
        }
        if has(QpAttrMask::RETRY_CNT) {
            self.retry_cnt = from.retry_cnt;
        }
        if has(QpAttrMask::RNR_RETRY) {
            self.rnr_retry = from.rnr_retry;
        }
        if has(QpAttrMask::RQ_PSN) {
            self.rq_psn = from.rq_psn;
        }
        if has(QpAttrMask::SQ_PSN) {
            self.sq_psn = from.sq_psn;
        }
        if has(QpAttrMask::MAX_QP_RD_ATOMIC) {
            self.max_rd_atomic = from.max_rd_atomic;
        }
        if has(QpAttrMask::MAX_DEST_RD_ATOMIC) {
            self.max_dest_rd_atomic = from.max_dest_rd_atomic;
        }
        if has(QpAttrMask::MIN_RNR_TIMER) {
            self.min_rnr_timer = from.min_rnr_timer;
        }
        if has(QpAttrMask::DEST_QPN) {
            self.dest_qp_num = from.dest_qp_num;
        }
        if has(QpAttrMask::QKEY) {
            self.qkey = from.qkey;
        }
    }
}

impl Default for QpAttr {
    fn default() -> QpAttr {
        QpAttr {
            qp_state: QpState::Reset,
            cur_qp_state: QpState::Reset,
            qp_access_flags: Access::NONE,
            pkey_index: 0,
            port_num: 1,
            av: None,
            path_mtu: Mtu::Mtu1024,
            timeout: 14,
            retry_cnt: 7,
            rnr_retry: 7,
            rq_psn: 0,
            sq_psn: 0,
            max_rd_atomic: 1,
            max_dest_rd_atomic: 1,
            min_rnr_timer: 12,
            dest_qp_num: 0,
            qkey: 0,
        }
    }
}

/// Why `modify` refused.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ModifyError {
    /// The transition does not exist.
    #[error("invalid transition {from:?} -> {to:?}")]
    InvalidTransition {
        /// Current state.
        from: QpState,
        /// Requested state.
        to: QpState,
    },
    /// `CUR_STATE` given and different from the real current state.
    #[error("current state is {actual:?}, caller said {claimed:?}")]
    CurStateMismatch {
        /// The real state.
        actual: QpState,
        /// The state claimed.
        claimed: QpState,
    },
    /// A required attribute is missing from the mask.
    #[error("attribute {0} required for this transition")]
    MissingAttr(&'static str),
    /// An attribute this transition does not accept is in the mask.
    #[error("attribute {0} not accepted by this transition")]
    UnexpectedAttr(&'static str),
    /// An attribute value is out of range.
    #[error("attribute {0} has an invalid value")]
    InvalidValue(&'static str),
}

/// Required and optional attributes of a transition of a QP of type `t`; `None` when it does
/// not exist.
pub fn transition_rules(t: QpType, from: QpState, to: QpState) -> Option<(QpAttrMask, QpAttrMask)> {
    use QpAttrMask as M;
    use QpState::*;
    let none = M(0);
    let (rc, uc, ud) = (t == QpType::Rc, t == QpType::Uc, t == QpType::Ud);
    // What each service adds to the common optional attributes.
    let pick = |r: M, c: M, d: M| match t {
        QpType::Rc => r,
        QpType::Uc => c,
        QpType::Ud => d,
    };
    Some(match (from, to) {
        (_, Reset) | (_, Err) => (none, none),
        (Reset, Init) => (
            M::PKEY_INDEX | M::PORT | pick(M::ACCESS_FLAGS, M::ACCESS_FLAGS, M::QKEY),
            none,
        ),
        (Init, Init) => (
            none,
            M::PKEY_INDEX | M::PORT | pick(M::ACCESS_FLAGS, M::ACCESS_FLAGS, M::QKEY),
        ),
        (Init, Rtr) if ud => (none, M::PKEY_INDEX | M::QKEY),
        (Init, Rtr) => (
            M::AV
                | M::PATH_MTU
                | M::DEST_QPN
                | M::RQ_PSN
                | if rc {
                    M::MAX_DEST_RD_ATOMIC | M::MIN_RNR_TIMER
                } else {
                    none
                },
            M::ALT_PATH | M::ACCESS_FLAGS | M::PKEY_INDEX,
        ),
        (Rtr, Rts) if ud => (M::SQ_PSN, M::CUR_STATE | M::QKEY),
        (Rtr, Rts) if uc => (
            M::SQ_PSN,
            M::CUR_STATE | M::ALT_PATH | M::ACCESS_FLAGS | M::PATH_MIG_STATE,
        ),
        (Rtr, Rts) => (
            M::TIMEOUT | M::RETRY_CNT | M::RNR_RETRY | M::SQ_PSN | M::MAX_QP_RD_ATOMIC,
            M::CUR_STATE | M::ALT_PATH | M::ACCESS_FLAGS | M::MIN_RNR_TIMER | M::PATH_MIG_STATE,
        ),
        (Rts, Rts) | (Sqd, Rts) => (
            none,
            M::CUR_STATE
                | pick(
                    M::ACCESS_FLAGS | M::ALT_PATH | M::PATH_MIG_STATE | M::MIN_RNR_TIMER,
                    M::ACCESS_FLAGS | M::ALT_PATH | M::PATH_MIG_STATE,
                    M::QKEY,
                ),
        ),
        (Rts, Sqd) => (none, M::EN_SQD_ASYNC_NOTIFY),
        (Sqd, Sqd) => (
            none,
            pick(
                M::CUR_STATE
                    | M::AV
                    | M::ALT_PATH
                    | M::ACCESS_FLAGS
                    | M::PKEY_INDEX
                    | M::PORT
                    | M::TIMEOUT
                    | M::RETRY_CNT
                    | M::RNR_RETRY
                    | M::MAX_QP_RD_ATOMIC
                    | M::MAX_DEST_RD_ATOMIC
                    | M::MIN_RNR_TIMER
                    | M::PATH_MIG_STATE
                    | M::PATH_MTU,
                M::AV | M::ALT_PATH | M::ACCESS_FLAGS | M::PKEY_INDEX | M::PATH_MIG_STATE,
                M::PKEY_INDEX | M::QKEY,
            ),
        ),
        // Only UC and UD QPs have a send-queue error state.
        (Sqe, Rts) if !rc => (none, M::CUR_STATE | pick(none, M::ACCESS_FLAGS, M::QKEY)),
        _ => return None,
    })
}

/// Check a modify request of a QP of type `t` against the rules and the attribute ranges.
pub fn check_modify(
    t: QpType,
    cur: QpState,
    attr: &QpAttr,
    mask: QpAttrMask,
) -> Result<QpState, ModifyError> {
    let to = if mask.contains(QpAttrMask::STATE) {
        attr.qp_state
    } else {
        cur
    };
    if mask.contains(QpAttrMask::CUR_STATE) && attr.cur_qp_state != cur {
        return Err(ModifyError::CurStateMismatch {
            actual: cur,
            claimed: attr.cur_qp_state,
        });
    }
    let (req, opt) =
        transition_rules(t, cur, to).ok_or(ModifyError::InvalidTransition { from: cur, to })?;
    let given = QpAttrMask(mask.0 & !QpAttrMask::STATE.0);
    let missing = QpAttrMask(req.0 & !given.0);
    if missing.0 != 0 {
        return Err(ModifyError::MissingAttr(missing.first_name()));
    }
    let extra = QpAttrMask(given.0 & !(req.0 | opt.0));
    // To RESET and ERR every attribute is ignored (as in rdma-core), so extras are accepted.
    if extra.0 != 0 && !matches!(to, QpState::Reset | QpState::Err) {
        return Err(ModifyError::UnexpectedAttr(extra.first_name()));
    }
    match VALUE_CHECKS
        .iter()
        .find(|(m, _, ok)| given.contains(*m) && !ok(attr))
    {
        Some((_, name, _)) => Err(ModifyError::InvalidValue(name)),
        None => Ok(to),
    }
}

/// Whether an attribute's value is in range.
type AttrCheck = fn(&QpAttr) -> bool;

/// The attribute ranges: an attribute a modify names must pass its check (the device has one
/// port and one P_Key; timers are 5-bit codes, retry counts 3-bit; QPNs and PSNs 24 bits).
const VALUE_CHECKS: &[(QpAttrMask, &str, AttrCheck)] = &[
    (QpAttrMask::AV, "av", |a| a.av.is_some()),
    (QpAttrMask::PKEY_INDEX, "pkey_index", |a| a.pkey_index == 0),
    (QpAttrMask::PORT, "port_num", |a| a.port_num == 1),
    (QpAttrMask::TIMEOUT, "timeout", |a| a.timeout <= 31),
    (QpAttrMask::RETRY_CNT, "retry_cnt", |a| a.retry_cnt <= 7),
    (QpAttrMask::RNR_RETRY, "rnr_retry", |a| a.rnr_retry <= 7),
    (QpAttrMask::MIN_RNR_TIMER, "min_rnr_timer", |a| {
        a.min_rnr_timer <= 31
    }),
    (QpAttrMask::MAX_QP_RD_ATOMIC, "max_rd_atomic", |a| {
        a.max_rd_atomic <= MAX_RD_ATOMIC
    }),
    (QpAttrMask::MAX_DEST_RD_ATOMIC, "max_dest_rd_atomic", |a| {
        a.max_dest_rd_atomic <= MAX_RD_ATOMIC
    }),
    (QpAttrMask::DEST_QPN, "dest_qp_num", |a| {
        a.dest_qp_num <= Psn::MASK
    }),
    (QpAttrMask::RQ_PSN, "rq_psn", |a| a.rq_psn <= Psn::MASK),
    (QpAttrMask::SQ_PSN, "sq_psn", |a| a.sq_psn <= Psn::MASK),
    // ON_DEMAND is a region's flag; rdma-core's tests hand the same flags to the QP, and the
    // kernel's drivers let it through: accepted, and it changes nothing for a QP.
    (QpAttrMask::ACCESS_FLAGS, "qp_access_flags", |a| {
        let allowed = Access::LOCAL_WRITE
            | Access::REMOTE_WRITE
            | Access::REMOTE_READ
            | Access::REMOTE_ATOMIC
            | Access::ON_DEMAND;
        a.qp_access_flags.0 & !allowed.0 == 0
    }),
];

#[cfg(test)]
mod tests {
    use super::*;
    use QpAttrMask as M;

    #[test]
    fn rules_follow_ibv_modify_qp() {
        let a = QpAttr::default();
        let init = M::STATE | M::PKEY_INDEX | M::PORT | M::ACCESS_FLAGS;
        let to = |s| QpAttr { qp_state: s, ..a };
        assert_eq!(
            check_modify(QpType::Rc, QpState::Reset, &to(QpState::Init), init),
            Ok(QpState::Init)
        );
        assert_eq!(
            check_modify(
                QpType::Rc,
                QpState::Reset,
                &to(QpState::Init),
                M::STATE | M::PORT | M::ACCESS_FLAGS
            ),
            Err(ModifyError::MissingAttr("PKEY_INDEX"))
        );
        assert_eq!(
            check_modify(QpType::Rc, QpState::Reset, &to(QpState::Rts), M::STATE),
            Err(ModifyError::InvalidTransition {
                from: QpState::Reset,
                to: QpState::Rts
            })
        );
        assert_eq!(
            check_modify(
                QpType::Rc,
                QpState::Init,
                &to(QpState::Init),
                M::STATE | M::SQ_PSN
            ),
            Err(ModifyError::UnexpectedAttr("SQ_PSN"))
        );
        assert_eq!(
            check_modify(
                QpType::Rc,
                QpState::Rts,
                &to(QpState::Err),
                M::STATE | M::SQ_PSN
            ),
            Ok(QpState::Err)
        );
        let rts =
            M::STATE | M::TIMEOUT | M::RETRY_CNT | M::RNR_RETRY | M::SQ_PSN | M::MAX_QP_RD_ATOMIC;
        assert_eq!(
            check_modify(QpType::Rc, QpState::Rtr, &to(QpState::Rts), rts),
            Ok(QpState::Rts)
        );
        let bad = QpAttr {
            retry_cnt: 8,
            ..to(QpState::Rts)
        };
        assert_eq!(
            check_modify(QpType::Rc, QpState::Rtr, &bad, rts),
            Err(ModifyError::InvalidValue("retry_cnt"))
        );
        assert_eq!(Mtu::Mtu4096.bytes(), 4096);
        assert_eq!(Mtu::from_bytes(512), Some(Mtu::Mtu512));
    }
}
