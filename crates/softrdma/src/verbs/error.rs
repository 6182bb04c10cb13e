//! Errors of the verbs API, each with the errno libibverbs would report.

use crate::mem::{AccessError, MemError, RegError};
use crate::rc::{CreateError, ModifyError, PostError};

/// Why a verb failed.
#[derive(Debug, thiserror::Error)]
pub enum VerbsError {
    /// Bad argument (EINVAL).
    #[error("invalid argument: {0}")]
    InvalidArgument(String),
    /// A queue or table is full (ENOMEM).
    #[error("out of resources: {0}")]
    NoResources(String),
    /// The object is still in use (EBUSY).
    #[error("busy: {0}")]
    Busy(String),
    /// Not supported (EOPNOTSUPP).
    #[error("not supported: {0}")]
    NotSupported(String),
    /// Registration refused or failed.
    #[error(transparent)]
    Mem(#[from] MemError),
    /// A memory access was refused.
    #[error(transparent)]
    Access(#[from] AccessError),
    /// Posting refused.
    #[error(transparent)]
    Post(#[from] PostError),
    /// Modify QP refused.
    #[error(transparent)]
    Modify(#[from] ModifyError),
    /// QP creation refused.
    #[error(transparent)]
    Create(#[from] CreateError),
    /// An operating-system error.
    #[error(transparent)]
    Io(#[from] std::io::Error),
}

impl VerbsError {
    /// The errno libibverbs would return.
    pub fn errno(&self) -> i32 {
        match self {
            VerbsError::InvalidArgument(_) => libc::EINVAL,
            VerbsError::NoResources(_) => libc::ENOMEM,
            VerbsError::Busy(_) => libc::EBUSY,
            VerbsError::NotSupported(_) => libc::EOPNOTSUPP,
            VerbsError::Mem(e) => match e {
                MemError::RegionBusy { .. } | MemError::PdBusy { .. } => libc::EBUSY,
                MemError::TableFull { .. } | MemError::PinLimit { .. } => libc::ENOMEM,
                // mlock of an unmapped range: the kernel's ibv_reg_mr reports EFAULT.
                MemError::Os { op: "mlock", errno } if *errno == libc::ENOMEM => libc::EFAULT,
                MemError::Os { errno, .. } if *errno > 0 => *errno,
                MemError::Os { .. } => libc::EIO,
                _ => libc::EINVAL,
            },
            VerbsError::Access(_) => libc::EINVAL,
            VerbsError::Post(PostError::QueueFull) => libc::ENOMEM,
            VerbsError::Post(_) => libc::EINVAL,
            VerbsError::Modify(_) => libc::EINVAL,
            VerbsError::Create(_) => libc::EINVAL,
            VerbsError::Io(e) => e.raw_os_error().unwrap_or(libc::EIO),
        }
    }
}

impl From<RegError> for VerbsError {
    fn from(e: RegError) -> VerbsError {
        VerbsError::Mem(e.error)
    }
}
