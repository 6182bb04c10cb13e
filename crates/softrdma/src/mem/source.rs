//! The four kinds of memory a region can be made of, and the backing the engine keeps.

use std::any::Any;
use std::fs::File;

use memmap2::{MmapOptions, MmapRaw};

use super::arena::{Arena, ArenaBuf, PageSize};
use super::{MemError, RegError, RemapPolicy};

/// Memory offered for registration.
pub struct MemSource {
    kind: SourceKind,
}

enum SourceKind {
    /// A buffer the API owns until deregistration, which hands it back.
    Owned {
        obj: Box<dyn Any + Send>,
        ptr: *mut u8,
        len: usize,
    },
    /// Memory the caller vouches for (the C ABI's case), with the region's remap policy
    /// (`None`: the device default).
    Raw {
        ptr: *mut u8,
        len: usize,
        remap: Option<RemapPolicy>,
    },
    /// A range of a file (a memfd, like a dmabuf); the engine maps its own view.
    File { file: File, offset: u64, len: usize },
    /// Memory the device allocates from its arena.
    Device { len: usize, page: PageSize },
}

// SAFETY: the raw pointers name memory that is either owned by the boxed `Send` object moving
// with them, or that the caller of the unsafe `raw` constructor promised may be used from any
// thread.
unsafe impl Send for MemSource {}

impl core::fmt::Debug for MemSource {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match &self.kind {
            SourceKind::Owned { ptr, len, .. } => write!(f, "MemSource::Owned({ptr:p}, {len})"),
            SourceKind::Raw { ptr, len, .. } => write!(f, "MemSource::Raw({ptr:p}, {len})"),
            SourceKind::File { offset, len, .. } => write!(f, "MemSource::File(+{offset}, {len})"),
            SourceKind::Device { len, page } => write!(f, "MemSource::Device({len}, {page:?})"),
        }
    }
}

impl MemSource {
    /// A buffer the registration owns (`Vec<u8>`, `Box<[u8]>`, `memmap2::MmapMut`, ...),
    /// handed back by deregistration (see [`Returned::downcast`]). The bytes must stay where
    /// `as_mut` first finds them while the value does not move (true of every heap or mapped
    /// buffer; an inline array is boxed first, so it is true of it too).
    pub fn owned<B: AsMut<[u8]> + Send + 'static>(buf: B) -> MemSource {
        let mut obj = Box::new(buf);
        let s: &mut [u8] = (*obj).as_mut();
        let (ptr, len) = (s.as_mut_ptr(), s.len());
        MemSource {
            kind: SourceKind::Owned { obj, ptr, len },
        }
    }

    /// Raw memory at `ptr` of `len` bytes.
    ///
    /// The engine copies raw memory with kernel-checked copies (unless the device is
    /// configured with [`RawCopy::Plain`](super::RawCopy)), so if the application unmaps,
    /// remaps or discards the pages while they are registered, accesses fail with
    /// [`AccessError::Fault`](super::AccessError::Fault) or, once the coherence watcher has
    /// seen the change, [`AccessError::Invalidated`](super::AccessError::Invalidated)
    /// (or follow the move, see [`MemSource::remap_policy`]), instead of crashing. The one
    /// exception is an atomic whose page is unmapped at the very moment it executes (see
    /// docs/PERFORMANCE.md, "Registration coherence").
    ///
    /// # Safety
    /// Until the region is deregistered (or given a new backing by `resume`/`rereg`), the
    /// `len` bytes at `ptr` may be read and written by the engine from any thread at any time,
    /// and no other memory may be mapped at those addresses while the region is still valid:
    /// an access that runs after an unmap and before the watcher invalidates the region (or
    /// with the watcher off) lands in whatever is mapped there by then. With
    /// [`RawCopy::Plain`](super::RawCopy) the bytes must moreover stay mapped, readable and
    /// writable. (Zero-length memory needs nothing.)
    pub unsafe fn raw(ptr: *mut u8, len: usize) -> MemSource {
        MemSource {
            kind: SourceKind::Raw {
                ptr,
                len,
                remap: None,
            },
        }
    }

    /// Choose what happens to a raw region when the application moves its memory with
    /// `mremap` (see [`RemapPolicy`]); the device default
    /// ([`MemConfig::remap_policy`](super::MemConfig)) applies otherwise. Ignored for the
    /// other kinds of memory, which the application cannot move.
    pub fn remap_policy(mut self, policy: RemapPolicy) -> MemSource {
        if let SourceKind::Raw { remap, .. } = &mut self.kind {
            *remap = Some(policy);
        }
        self
    }

    /// `len` bytes at `offset` of `file` (opened read-write, e.g. a memfd), which the engine
    /// maps with `MAP_SHARED`. The file is handed back by deregistration.
    pub fn file(file: File, offset: u64, len: usize) -> MemSource {
        MemSource {
            kind: SourceKind::File { file, offset, len },
        }
    }

    /// `len` bytes the device allocates (memfd-backed) with pages of `page` size.
    pub fn device(len: usize, page: PageSize) -> MemSource {
        MemSource {
            kind: SourceKind::Device { len, page },
        }
    }

    /// Length in bytes.
    pub fn len(&self) -> usize {
        match &self.kind {
            SourceKind::Owned { len, .. }
            | SourceKind::Raw { len, .. }
            | SourceKind::File { len, .. }
            | SourceKind::Device { len, .. } => *len,
        }
    }

    /// True when the source has no bytes.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Make the memory reachable by the engine (map files, allocate device memory).
    pub(crate) fn into_backing(self, arena: &Arena) -> Result<Backing, RegError> {
        let dangling = core::ptr::NonNull::<u8>::dangling().as_ptr();
        match self.kind {
            SourceKind::Owned { obj, ptr, len } => Ok(Backing {
                ptr,
                len,
                hold: Hold::Owned(obj),
                shrinkable: false,
            }),
            SourceKind::Raw { ptr, len, remap } => Ok(Backing {
                ptr: if len == 0 { dangling } else { ptr },
                len,
                hold: Hold::Raw(remap),
                shrinkable: false,
            }),
            SourceKind::File { file, offset, len } => {
                if len == 0 {
                    return Ok(Backing {
                        ptr: dangling,
                        len,
                        hold: Hold::File(None, file, offset),
                        shrinkable: false,
                    });
                }
                match MmapOptions::new().offset(offset).len(len).map_raw(&file) {
                    Ok(map) => Ok(Backing {
                        ptr: map.as_mut_ptr(),
                        len,
                        shrinkable: !sealed_against_shrinking(&file),
                        hold: Hold::File(Some(map), file, offset),
                    }),
                    Err(e) => Err(RegError::new(
                        MemError::Os {
                            op: "mmap",
                            errno: e.raw_os_error().unwrap_or(0),
                        },
                        Some(MemSource {
                            kind: SourceKind::File { file, offset, len },
                        }),
                    )),
                }
            }
            SourceKind::Device { len, page } => {
                let buf = arena.alloc(len, page)?;
                Ok(Backing {
                    ptr: buf.ptr(),
                    len,
                    hold: Hold::Device(buf),
                    shrinkable: false,
                })
            }
        }
    }
}

/// Whether `file` carries `F_SEAL_SHRINK` (nobody can truncate it any more).
fn sealed_against_shrinking(file: &File) -> bool {
    use std::os::fd::AsRawFd;
    // SAFETY: fcntl(F_GET_SEALS) on a descriptor `file` owns; it reads the seals only.
    let seals = unsafe { libc::fcntl(file.as_raw_fd(), libc::F_GET_SEALS) };
    seals >= 0 && seals & libc::F_SEAL_SHRINK != 0
}

/// What keeps a backing's bytes alive.
enum Hold {
    /// Nothing (a deregistered region).
    Empty,
    /// Nothing: raw memory the application keeps alive, with the remap policy it asked for.
    Raw(Option<RemapPolicy>),
    Owned(Box<dyn Any + Send>),
    File(Option<MmapRaw>, File, u64),
    Device(ArenaBuf),
}

/// The memory behind a region, as the engine reaches it: `len` bytes at `ptr`.
pub(crate) struct Backing {
    ptr: *mut u8,
    len: usize,
    hold: Hold,
    /// A file the application can still truncate under the engine's mapping (not sealed
    /// with `F_SEAL_SHRINK`): its bytes are reached with kernel-checked copies, so that a
    /// truncation makes a peer's access fail instead of raising SIGBUS.
    shrinkable: bool,
}

// SAFETY: the bytes at `ptr` are only touched through validated copies and atomics that
// tolerate concurrent use (see `copy.rs`), and `hold` is only ever moved or dropped with
// exclusive access, never shared through `&`.
unsafe impl Send for Backing {}
// SAFETY: as above; `&Backing` exposes only `ptr`/`len` and the memfd (a `File`, itself Sync).
unsafe impl Sync for Backing {}

impl Backing {
    pub(crate) fn ptr(&self) -> *mut u8 {
        self.ptr
    }
    pub(crate) fn len(&self) -> usize {
        self.len
    }
    /// True for raw memory (which the application may unmap or move under us).
    pub(crate) fn is_raw(&self) -> bool {
        matches!(self.hold, Hold::Raw(_)) && self.len > 0
    }
    /// True when the bytes may vanish under the engine's own mapping (a file not sealed
    /// against shrinking): they must be copied with kernel-checked copies, never lent.
    pub(crate) fn may_vanish(&self) -> bool {
        self.shrinkable && self.len > 0
    }
    /// The remap policy a raw source asked for.
    pub(crate) fn remap_request(&self) -> Option<RemapPolicy> {
        match self.hold {
            Hold::Raw(p) => p,
            _ => None,
        }
    }
    /// Follow raw memory that moved to `ptr` (same length). No-op for other kinds.
    pub(crate) fn rebase(&mut self, ptr: *mut u8) {
        if self.is_raw() {
            self.ptr = ptr;
        }
    }
    /// The memfd of device memory, if that is what this is.
    pub(crate) fn device_file(&self) -> Option<&File> {
        match &self.hold {
            Hold::Device(b) => Some(b.file()),
            _ => None,
        }
    }
    /// Give back what the caller handed over (the owned buffer or the file); unmap the rest.
    pub(crate) fn into_returned(self) -> Returned {
        match self.hold {
            Hold::Owned(obj) => Returned(Some(obj)),
            Hold::File(map, file, _) => {
                drop(map);
                Returned(Some(Box::new(file)))
            }
            Hold::Empty | Hold::Raw(_) | Hold::Device(_) => Returned(None),
        }
    }

    /// Undo [`MemSource::into_backing`] (a registration refused after mapping): the source
    /// as it was offered. Device memory is freed (there is nothing to give back).
    pub(crate) fn into_source(self) -> Option<MemSource> {
        let kind = match self.hold {
            Hold::Owned(obj) => SourceKind::Owned {
                obj,
                ptr: self.ptr,
                len: self.len,
            },
            Hold::Empty => SourceKind::Raw {
                ptr: self.ptr,
                len: 0,
                remap: None,
            },
            Hold::Raw(remap) => SourceKind::Raw {
                ptr: self.ptr,
                len: self.len,
                remap,
            },
            Hold::File(map, file, offset) => {
                drop(map);
                SourceKind::File {
                    file,
                    offset,
                    len: self.len,
                }
            }
            Hold::Device(_) => return None,
        };
        Some(MemSource { kind })
    }

    /// A backing with no bytes (what a deregistered region is left with).
    pub(crate) fn empty() -> Backing {
        Backing {
            ptr: core::ptr::NonNull::<u8>::dangling().as_ptr(),
            len: 0,
            hold: Hold::Empty,
            shrinkable: false,
        }
    }
}

/// What deregistration (or a change of backing) hands back: the owned buffer of
/// [`MemSource::owned`], the `File` of [`MemSource::file`], or nothing.
#[derive(Debug)]
pub struct Returned(Option<Box<dyn Any + Send>>);

impl Returned {
    /// Nothing to hand back.
    pub fn none() -> Returned {
        Returned(None)
    }
    /// True when nothing is handed back.
    pub fn is_none(&self) -> bool {
        self.0.is_none()
    }
    /// The value, if it is a `B`.
    pub fn downcast<B: 'static>(self) -> Result<B, Returned> {
        match self.0 {
            Some(obj) => match obj.downcast::<B>() {
                Ok(b) => Ok(*b),
                Err(obj) => Err(Returned(Some(obj))),
            },
            None => Err(Returned(None)),
        }
    }
}
