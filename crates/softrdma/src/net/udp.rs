//! The UDP port a device sends and receives RoCEv2 on: one unconnected socket bound to
//! `<ip>:4791`, with `IP_PMTUDISC_DO` (so the IPv4 identification is 0 and the ICRC can be
//! computed before sending), batched I/O (`sendmmsg`/`recvmmsg`), UDP GSO on send
//! (`UDP_SEGMENT`: one system call carries many equal-sized packets) and GRO on receive
//! (`UDP_GRO`: the kernel hands over runs of equal-sized packets at once).
//!
//! Buffers are allocated once, when a batch is created; sending and receiving allocate nothing.

use std::io;
use std::mem::{size_of, zeroed};
use std::net::SocketAddr;
use std::os::fd::{AsRawFd, RawFd};

use socket2::{Domain, Protocol, SockAddr, Socket, Type};

use crate::mem::{Lent, LentSlice};
use crate::rc::Gather;
use crate::rc::emit::LEND_MAX_PIECES;

/// `UDP_SEGMENT` (linux/udp.h): GSO segment size, as a socket option or a control message.
const UDP_SEGMENT: libc::c_int = 103;
/// `UDP_GRO` (linux/udp.h): receive coalesced datagrams with their segment size.
const UDP_GRO: libc::c_int = 104;
/// The largest UDP payload of one (super-)datagram.
pub const MAX_DATAGRAM: usize = 65_507;
/// The most segments Linux accepts in one GSO send (`UDP_MAX_SEGMENTS`).
pub const MAX_GSO_SEGMENTS: usize = 64;

/// Options for a [`UdpPort`].
#[derive(Clone, Copy, Debug)]
pub struct PortOptions {
    /// Socket send and receive buffer size in bytes (`SO_SNDBUF`/`SO_RCVBUF`; root may exceed
    /// the system maximum through the `FORCE` variants).
    pub buffer_bytes: usize,
    /// Ask the kernel for GRO on receive.
    pub gro: bool,
    /// Non-blocking socket (busy-polling engines).
    pub nonblocking: bool,
}

impl Default for PortOptions {
    fn default() -> Self {
        PortOptions {
            buffer_bytes: 8 << 20,
            gro: true,
            nonblocking: false,
        }
    }
}

/// An unconnected UDP socket bound to a device address.
#[derive(Debug)]
pub struct UdpPort {
    sock: Socket,
    local: SocketAddr,
    gro: bool,
}

fn setsockopt_int(
    fd: RawFd,
    level: libc::c_int,
    name: libc::c_int,
    v: libc::c_int,
) -> io::Result<()> {
    // SAFETY: `fd` is an open socket owned by the caller; the option value is a live c_int whose
    // size is passed alongside it.
    let r = unsafe {
        libc::setsockopt(
            fd,
            level,
            name,
            (&v as *const libc::c_int).cast(),
            size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
    if r == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// How long a send waits for room in a full socket send buffer before it drops the batch
/// (milliseconds).
const SEND_ROOM_WAIT_MS: i32 = 10;

impl UdpPort {
    /// Bind to `addr` (port 4791 for RoCEv2; 0 picks a free port, for tests and baselines).
    pub fn bind(addr: SocketAddr, opts: PortOptions) -> io::Result<UdpPort> {
        let domain = if addr.is_ipv4() {
            Domain::IPV4
        } else {
            Domain::IPV6
        };
        let sock = Socket::new(domain, Type::DGRAM, Some(Protocol::UDP))?;
        if addr.is_ipv6() {
            sock.set_only_v6(true)?;
        }
        let fd = sock.as_raw_fd();
        // Path MTU discovery "do": DF set and, on an unconnected socket, IPv4 ID 0.
        if addr.is_ipv4() {
            setsockopt_int(
                fd,
                libc::IPPROTO_IP,
                libc::IP_MTU_DISCOVER,
                libc::IP_PMTUDISC_DO,
            )?;
        } else {
            setsockopt_int(
                fd,
                libc::IPPROTO_IPV6,
                libc::IPV6_MTU_DISCOVER,
                libc::IPV6_PMTUDISC_DO,
            )?;
        }
        let n = opts.buffer_bytes.min(i32::MAX as usize) as libc::c_int;
        // The FORCE variants pass the system maximum when privileged; fall back otherwise.
        if setsockopt_int(fd, libc::SOL_SOCKET, libc::SO_SNDBUFFORCE, n).is_err() {
            sock.set_send_buffer_size(opts.buffer_bytes)?;
        }
        if setsockopt_int(fd, libc::SOL_SOCKET, libc::SO_RCVBUFFORCE, n).is_err() {
            sock.set_recv_buffer_size(opts.buffer_bytes)?;
        }
        let gro = opts.gro && setsockopt_int(fd, libc::SOL_UDP, UDP_GRO, 1).is_ok();
        sock.set_nonblocking(opts.nonblocking)?;
        sock.bind(&SockAddr::from(addr))?;
        let local = sock
            .local_addr()?
            .as_socket()
            .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidData, "bound address is not IP"))?;
        Ok(UdpPort { sock, local, gro })
    }

    /// The bound address.
    pub fn local_addr(&self) -> SocketAddr {
        self.local
    }

    /// Whether GRO is on (receive batches may hold several segments per datagram).
    pub fn gro(&self) -> bool {
        self.gro
    }

    /// Switch between blocking and non-blocking.
    pub fn set_nonblocking(&self, nb: bool) -> io::Result<()> {
        self.sock.set_nonblocking(nb)
    }

    /// Receive timeout for blocking receives (`None`: wait forever).
    pub fn set_read_timeout(&self, t: Option<std::time::Duration>) -> io::Result<()> {
        self.sock.set_read_timeout(t)
    }

    /// The raw descriptor (for epoll/poll).
    pub fn raw_fd(&self) -> RawFd {
        self.sock.as_raw_fd()
    }

    /// Send every datagram queued in `batch` with as few `sendmmsg` calls as it takes, then
    /// empty the batch. Returns the number of datagrams sent.
    pub fn send(&self, batch: &mut TxBatch) -> io::Result<usize> {
        let total = batch.len;
        let mut done = 0;
        while done < total {
            batch.prepare(done);
            // The system call itself, not libc's wrapper: `sendmmsg` is a cancellation point,
            // and the wrapper's two atomic updates of the thread's cancellation state around
            // every call showed in profiles of the datapath (see `recv`).
            // SAFETY: `prepare` pointed every mmsghdr in `hdrs[done..total]` at iovecs, addresses
            // and control buffers owned by `batch`, which outlives this call and is not touched
            // meanwhile; the count passed is the number of prepared headers.
            let r = unsafe {
                libc::syscall(
                    libc::SYS_sendmmsg,
                    self.sock.as_raw_fd(),
                    batch.hdrs[done..].as_mut_ptr(),
                    (total - done) as libc::c_uint,
                    0,
                )
            };
            if r < 0 {
                let e = io::Error::last_os_error();
                if e.kind() == io::ErrorKind::Interrupted {
                    continue;
                }
                // The socket's send buffer is full (the path is slower than the sender): wait
                // for room a little, as a NIC's send queue waits for the wire, rather than drop
                // what UC and UD would never send again.
                if e.kind() == io::ErrorKind::WouldBlock && self.wait_writable(SEND_ROOM_WAIT_MS) {
                    continue;
                }
                batch.clear();
                return Err(e);
            }
            done += r as usize;
        }
        batch.clear();
        Ok(total)
    }

    /// Wait up to `ms` milliseconds for room in the socket's send buffer.
    fn wait_writable(&self, ms: i32) -> bool {
        let mut p = libc::pollfd {
            fd: self.sock.as_raw_fd(),
            events: libc::POLLOUT,
            revents: 0,
        };
        // SAFETY: one valid pollfd, owned by this frame, for the duration of the call.
        let r = unsafe { libc::poll(&mut p, 1, ms) };
        r == 1 && p.revents & libc::POLLOUT != 0
    }

    /// Receive up to the batch's capacity of datagrams with one `recvmmsg`: waits (in blocking
    /// mode) for the first, then takes whatever else is already queued. Returns how many
    /// arrived; with nothing queued in non-blocking mode the error is `WouldBlock`.
    pub fn recv(&self, batch: &mut RxBatch) -> io::Result<usize> {
        batch.prepare();
        // The system call itself, not libc's wrapper: a busy poller calls it about a million
        // times a second, mostly to find nothing, and the wrapper (a cancellation point)
        // enabled and disabled asynchronous cancellation around each call, two atomic updates
        // that took 6 % of a polling thread's time in profiles. Nothing here relies on
        // cancellation (the engine thread is stopped through its waker).
        // SAFETY: `prepare` pointed each mmsghdr at a buffer, address and control area owned by
        // `batch` with their true lengths; recvmmsg writes only within them.
        let r = unsafe {
            libc::syscall(
                libc::SYS_recvmmsg,
                self.sock.as_raw_fd(),
                batch.hdrs.as_mut_ptr(),
                batch.hdrs.len() as libc::c_uint,
                // Block (in blocking mode) for the first datagram only, then take what is queued.
                libc::MSG_WAITFORONE,
                std::ptr::null_mut::<libc::timespec>(),
            )
        };
        if r < 0 {
            batch.count = 0;
            return Err(io::Error::last_os_error());
        }
        batch.count = r as usize;
        batch.finish();
        Ok(batch.count)
    }
}

/// Control-message space for one `u16` option (UDP_SEGMENT / UDP_GRO).
const CMSG_SPACE: usize = 32;

mod rx;
mod tx;

pub use rx::{Received, RxBatch};
pub use tx::TxBatch;

#[cfg(test)]
mod tests;
