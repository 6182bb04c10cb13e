//! Completion queues and completion channels at the datapath level: a bounded ring of work
//! completions per CQ, arming (`req_notify_cq`), and channels whose `eventfd` wakes a
//! sleeping consumer and can sit in epoll or an async reactor.

use std::collections::VecDeque;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::sync::atomic::{AtomicBool, AtomicU8, AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::rc::{WcStatus, WorkCompletion};

/// Not armed.
const ARM_NONE: u8 = 0;
/// Armed for the next completion.
const ARM_NEXT: u8 = 1;
/// Armed for the next solicited completion (a receive whose message carried the
/// solicited-event bit) or completion in error.
const ARM_SOLICITED: u8 = 2;

/// A completion channel: CQs that fire queue their id here and bump the eventfd.
#[derive(Debug)]
pub struct ChannelCore {
    fd: OwnedFd,
    /// With [`ChannelCore::watching`]: an epoll instance holding `fd` and a device's socket,
    /// the descriptor the application waits on.
    poll_fd: Option<OwnedFd>,
    /// With [`ChannelCore::watching`]: the socket, whose interest in `poll_fd` is switched
    /// off while application threads busy-poll ([`ChannelCore::watch_socket`]).
    socket: Option<RawFd>,
    /// False while application threads busy-poll: then neither the descriptor nor a thread in
    /// [`ChannelCore::get_event_driving`] watches the socket.
    socket_on: AtomicBool,
    events: Mutex<VecDeque<u64>>,
    cap: usize,
}

impl ChannelCore {
    /// A channel with room for `cap` pending events.
    pub fn new(cap: usize) -> io::Result<ChannelCore> {
        // SAFETY: eventfd has no memory arguments; the flags are valid.
        let fd = unsafe {
            libc::eventfd(
                0,
                libc::EFD_CLOEXEC | libc::EFD_NONBLOCK | libc::EFD_SEMAPHORE,
            )
        };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: `fd` is a fresh descriptor we own.
        let fd = unsafe { OwnedFd::from_raw_fd(fd) };
        Ok(ChannelCore {
            fd,
            poll_fd: None,
            socket: None,
            socket_on: AtomicBool::new(true),
            events: Mutex::new(VecDeque::with_capacity(cap)),
            cap,
        })
    }

    /// A channel whose descriptor ([`ChannelCore::raw_fd`]) is also readable while datagrams
    /// wait on `socket` (a busy-poll device's): an application that sleeps in its own
    /// poll/epoll on it wakes for the packet itself, and a non-blocking
    /// [`ChannelCore::get_event_driving`] then handles the packet (and takes the event it
    /// completes) in that same wake-up, instead of the engine thread waking first to handle
    /// it and then waking the application. The descriptor is an epoll instance holding the
    /// eventfd and `socket`; readable no longer means an event is pending.
    pub fn watching(cap: usize, socket: RawFd) -> io::Result<ChannelCore> {
        let mut ch = ChannelCore::new(cap)?;
        // SAFETY: epoll_create1 has no memory arguments; the flag is valid.
        let ep = unsafe { libc::epoll_create1(libc::EPOLL_CLOEXEC) };
        if ep < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: `ep` is a fresh descriptor we own.
        let ep = unsafe { OwnedFd::from_raw_fd(ep) };
        for fd in [ch.fd.as_raw_fd(), socket] {
            let mut ev = libc::epoll_event {
                events: libc::EPOLLIN as u32,
                u64: fd as u64,
            };
            // SAFETY: valid epoll and target descriptors; `ev` is a live epoll_event.
            if unsafe { libc::epoll_ctl(ep.as_raw_fd(), libc::EPOLL_CTL_ADD, fd, &mut ev) } < 0 {
                return Err(io::Error::last_os_error());
            }
        }
        ch.poll_fd = Some(ep);
        ch.socket = Some(socket);
        Ok(ch)
    }

    /// Whether the descriptor is readable for datagrams waiting on the socket (a channel made
    /// by [`ChannelCore::watching`]; nothing for another). The device switches it off while
    /// an application thread busy-polls: that thread takes the datagrams, and a descriptor
    /// readable for each of them would wake whoever else waits on it (UCX's progress thread
    /// epolls every completion channel) once per datagram, for nothing.
    pub fn watch_socket(&self, on: bool) {
        self.socket_on.store(on, Ordering::Relaxed);
        let (Some(ep), Some(socket)) = (&self.poll_fd, self.socket) else {
            return;
        };
        let mut ev = libc::epoll_event {
            events: if on { libc::EPOLLIN as u32 } else { 0 },
            u64: socket as u64,
        };
        // SAFETY: valid epoll and target descriptors (the socket outlives the channel's use
        // of it: the device holds both); `ev` is a live epoll_event.
        let _ = unsafe { libc::epoll_ctl(ep.as_raw_fd(), libc::EPOLL_CTL_MOD, socket, &mut ev) };
    }

    /// The descriptor to wait on: readable while events are pending (and, for a channel made
    /// by [`ChannelCore::watching`], while datagrams wait on its socket).
    pub fn raw_fd(&self) -> RawFd {
        self.poll_fd.as_ref().unwrap_or(&self.fd).as_raw_fd()
    }

    fn notify(&self, cq: u64) {
        {
            let mut ev = self.events.lock().unwrap_or_else(|e| e.into_inner());
            if ev.len() >= self.cap || ev.contains(&cq) {
                return;
            }
            ev.push_back(cq);
        }
        let one: u64 = 1;
        // SAFETY: writes 8 bytes from a live u64 to our eventfd.
        let _ = unsafe { libc::write(self.fd.as_raw_fd(), (&one as *const u64).cast(), 8) };
    }

    /// True when an event is pending (the fd is readable).
    fn readable(&self) -> bool {
        let mut p = libc::pollfd {
            fd: self.fd.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: one valid pollfd, no wait.
        unsafe { libc::poll(&mut p, 1, 0) == 1 && p.revents & libc::POLLIN != 0 }
    }

    /// Take the next event (the id of a CQ that fired), waiting up to `timeout`
    /// (`None`: forever). Returns `Ok(None)` on timeout.
    pub fn get_event(&self, timeout: Option<Duration>) -> io::Result<Option<u64>> {
        self.get_event_driving(timeout, None)
    }

    /// [`ChannelCore::get_event`], also watching `drive.0` (the device's socket) and calling
    /// `drive.1` (which receives and handles what arrived, returning how many packets it
    /// handled) when it is readable: the waiting thread handles the packet that completes its
    /// CQ itself, one wake-up instead of two (the engine thread's, then this thread's).
    /// `drive.2` counts the threads watching the socket so (the engine thread leaves it to
    /// them: [`Engine::socket_waiters`](crate::net::Engine::socket_waiters)).
    pub fn get_event_driving(
        &self,
        timeout: Option<Duration>,
        drive: Option<(RawFd, &dyn Fn() -> usize, &AtomicU32)>,
    ) -> io::Result<Option<u64>> {
        let deadline = timeout.map(|t| std::time::Instant::now() + t);
        // After a drive that handled nothing (another thread holds the receive path), the
        // socket is not watched for one wait, so that a readable socket cannot spin this loop.
        let mut watch = true;
        // A call that may not wait (a non-blocking descriptor) still drives once: the caller
        // may have woken for a datagram (see `watching`) whose handling fires the event.
        let mut drove = false;
        loop {
            match self.take_event(drive.is_some())? {
                Take::Event(id) => return Ok(Some(id)),
                Take::Again => continue,
                Take::Empty => {}
            }
            let left = deadline.map(|d| d.saturating_duration_since(std::time::Instant::now()));
            if left == Some(Duration::ZERO) {
                if let Some((_, f, _)) = drive
                    && !drove
                {
                    drove = true;
                    if f() > 0 {
                        continue;
                    }
                }
                return Ok(None);
            }
            let mut ms = left.map_or(-1, |t| t.as_millis().clamp(1, i32::MAX as u128) as i32);
            // While a poller is active it takes the datagrams: this thread leaves the socket
            // alone (`watch_socket`) and waits for its event (a thread that waits on a CQ
            // event in its own loop, such as the CM's, would otherwise wake per datagram).
            let socket = drive
                .filter(|_| watch && self.socket_on.load(Ordering::Relaxed))
                .map(|d| d.0);
            if drive.is_some() && !watch {
                ms = if ms < 0 { 1 } else { ms.min(1) };
            }
            let ready = match (socket, drive) {
                (Some(fd), Some((_, _, waiters))) => {
                    waiters.fetch_add(1, Ordering::SeqCst);
                    let r = self.wait_event_or_socket(ms, Some(fd));
                    waiters.fetch_sub(1, Ordering::SeqCst);
                    r?
                }
                _ => self.wait_event_or_socket(ms, None)?,
            };
            watch = true;
            if let Some((_, f, _)) = drive
                && ready
                && f() == 0
            {
                watch = false;
            }
        }
    }

    /// Take an event if one is signalled. The application may have made the eventfd blocking
    /// (libibverbs' channels start so): a thread that also drives the socket (`driving`)
    /// reads it only once it is readable. A `watching` channel hands out its epoll descriptor
    /// instead, so its eventfd stays non-blocking and is read at once.
    fn take_event(&self, driving: bool) -> io::Result<Take> {
        if driving && self.poll_fd.is_none() && !self.readable() {
            return Ok(Take::Empty);
        }
        let mut v: u64 = 0;
        // SAFETY: reads 8 bytes into a live u64 from our eventfd.
        let r = unsafe { libc::read(self.fd.as_raw_fd(), (&mut v as *mut u64).cast(), 8) };
        if r == 8 {
            let mut ev = self.events.lock().unwrap_or_else(|e| e.into_inner());
            return Ok(ev.pop_front().map_or(Take::Again, Take::Event));
        }
        let e = io::Error::last_os_error();
        if e.kind() != io::ErrorKind::WouldBlock {
            return Err(e);
        }
        Ok(Take::Empty)
    }

    /// Wait up to `ms` (-1: forever) for the eventfd and, if given, the device's socket.
    /// Returns true when the socket is readable.
    fn wait_event_or_socket(&self, ms: i32, socket: Option<RawFd>) -> io::Result<bool> {
        let fd = |fd| libc::pollfd {
            fd,
            events: libc::POLLIN,
            revents: 0,
        };
        let mut p = [fd(self.fd.as_raw_fd()), fd(socket.unwrap_or(-1))];
        let nfds = if socket.is_some() { 2 } else { 1 };
        // SAFETY: `nfds` valid pollfds.
        let n = unsafe { libc::poll(p.as_mut_ptr(), nfds, ms) };
        if n < 0 {
            // EINTR too, as `read` on libibverbs' channel gives it: a signal handler (an
            // alarm that ends a benchmark loop) must get its caller back.
            return Err(io::Error::last_os_error());
        }
        Ok(socket.is_some() && p[1].revents != 0)
    }
}

/// What a look at a channel's eventfd found.
enum Take {
    /// The id of a CQ that fired.
    Event(u64),
    /// The eventfd counted an event another reader took: look again.
    Again,
    /// Nothing signalled.
    Empty,
}

static NEXT_CQ_ID: AtomicU64 = AtomicU64::new(1);

/// A completion queue's ring.
#[derive(Debug)]
pub struct CqCore {
    id: u64,
    ring: Mutex<VecDeque<WorkCompletion>>,
    /// Completions in `ring` (changed under its lock): an empty poll, what a busy poller
    /// mostly makes, looks here and takes no lock.
    queued: AtomicUsize,
    /// Entries at most (changed by `resize`, under the ring's lock).
    cap: AtomicUsize,
    overrun: AtomicBool,
    armed: AtomicU8,
    channel: Option<Arc<ChannelCore>>,
}

impl CqCore {
    /// A CQ of `cqe` entries, optionally reporting to `channel`.
    pub fn new(cqe: usize, channel: Option<Arc<ChannelCore>>) -> CqCore {
        CqCore {
            id: NEXT_CQ_ID.fetch_add(1, Ordering::Relaxed),
            // Up to 4096 entries up front; a larger CQ (libfabric asks for 2^18) grows its ring
            // as completions queue up, so that its size costs memory only when used.
            ring: Mutex::new(VecDeque::with_capacity(cqe.min(4096))),
            queued: AtomicUsize::new(0),
            cap: AtomicUsize::new(cqe),
            overrun: AtomicBool::new(false),
            armed: AtomicU8::new(ARM_NONE),
            channel,
        }
    }

    /// Process-unique id (what a channel reports).
    pub fn id(&self) -> u64 {
        self.id
    }

    /// Capacity.
    pub fn capacity(&self) -> usize {
        self.cap.load(Ordering::Relaxed)
    }

    /// Change the capacity to `cqe` entries (`ibv_resize_cq`). Refused (false) when more
    /// completions than that are waiting: none is ever dropped by a resize.
    pub fn resize(&self, cqe: usize) -> bool {
        let r = self.ring.lock().unwrap_or_else(|e| e.into_inner());
        if r.len() > cqe {
            return false;
        }
        self.cap.store(cqe, Ordering::Relaxed);
        true
    }

    /// True once a completion was lost because the ring was full (the CQ is then in error, as
    /// `IBV_EVENT_CQ_ERR` reports).
    pub fn overrun(&self) -> bool {
        self.overrun.load(Ordering::Relaxed)
    }

    /// Add a completion; fires the channel if armed.
    pub fn push(&self, wc: WorkCompletion) {
        {
            let mut r = self.ring.lock().unwrap_or_else(|e| e.into_inner());
            if r.len() >= self.cap.load(Ordering::Relaxed) {
                self.overrun.store(true, Ordering::Relaxed);
                tracing::warn!(cq = self.id, "completion queue overrun");
                return;
            }
            r.push_back(wc);
            self.queued.store(r.len(), Ordering::Release);
        }
        let fires = match self.armed.load(Ordering::Acquire) {
            ARM_NEXT => true,
            ARM_SOLICITED => wc.solicited || wc.status != WcStatus::Success,
            _ => false,
        };
        if fires
            && self.armed.swap(ARM_NONE, Ordering::AcqRel) != ARM_NONE
            && let Some(ch) = &self.channel
        {
            ch.notify(self.id);
        }
    }

    /// Move up to `out.len()` completions into `out`; returns how many.
    pub fn poll(&self, out: &mut [WorkCompletion]) -> usize {
        if self.queued.load(Ordering::Acquire) == 0 {
            return 0;
        }
        let mut r = self.ring.lock().unwrap_or_else(|e| e.into_inner());
        let n = out.len().min(r.len());
        for (slot, wc) in out.iter_mut().zip(r.drain(..n)) {
            *slot = wc;
        }
        self.queued.store(r.len(), Ordering::Release);
        n
    }

    /// Remove the completions of QP `qpn` still waiting (a QP moved to RESET: its earlier
    /// completions are discarded with its queues, as rdma-core's providers clean the CQ);
    /// returns how many.
    pub fn purge_qp(&self, qpn: u32) -> usize {
        let mut r = self.ring.lock().unwrap_or_else(|e| e.into_inner());
        let before = r.len();
        r.retain(|wc| wc.qp_num != qpn);
        self.queued.store(r.len(), Ordering::Release);
        before - r.len()
    }

    /// Completions waiting.
    pub fn len(&self) -> usize {
        self.queued.load(Ordering::Acquire)
    }

    /// True when none is waiting.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Arm for the next completion added (`ibv_req_notify_cq`), or with `solicited_only` for
    /// the next solicited one (a receive whose message carried the solicited-event bit) or
    /// one in error; arming for any completion wins over a solicited-only arming still
    /// pending. As with hardware, completions already waiting do not fire, so a consumer polls
    /// once more after arming.
    pub fn req_notify(&self, solicited_only: bool) {
        if solicited_only {
            let _ = self.armed.compare_exchange(
                ARM_NONE,
                ARM_SOLICITED,
                Ordering::AcqRel,
                Ordering::Acquire,
            );
        } else {
            self.armed.store(ARM_NEXT, Ordering::Release);
        }
    }

    /// True while armed (until a completion fires the channel).
    pub fn is_armed(&self) -> bool {
        self.armed.load(Ordering::Acquire) != ARM_NONE
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::UdpSocket;

    fn readable(fd: RawFd) -> bool {
        let mut p = libc::pollfd {
            fd,
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: one valid pollfd, no wait.
        unsafe { libc::poll(&mut p, 1, 0) == 1 && p.revents & libc::POLLIN != 0 }
    }

    /// A watching channel's descriptor is readable for a waiting datagram only while the
    /// socket is watched: switched off (an application thread busy-polls), a waiter on the
    /// descriptor is not woken for datagrams that thread will take; an event still wakes it.
    #[test]
    fn a_watching_channel_leaves_the_socket_alone_while_switched_off() {
        let rx = UdpSocket::bind("127.0.0.1:0").unwrap();
        let tx = UdpSocket::bind("127.0.0.1:0").unwrap();
        let ch = ChannelCore::watching(8, rx.as_raw_fd()).unwrap();
        assert!(!readable(ch.raw_fd()));
        tx.send_to(b"datagram", rx.local_addr().unwrap()).unwrap();
        let deadline = std::time::Instant::now() + Duration::from_secs(5);
        while !readable(ch.raw_fd()) {
            assert!(
                std::time::Instant::now() < deadline,
                "no wake-up for the datagram"
            );
            std::thread::sleep(Duration::from_millis(1));
        }
        ch.watch_socket(false);
        assert!(
            !readable(ch.raw_fd()),
            "readable for a datagram while switched off"
        );
        ch.notify(7);
        assert!(readable(ch.raw_fd()), "an event must still wake the waiter");
        assert_eq!(ch.get_event(Some(Duration::ZERO)).unwrap(), Some(7));
        assert!(!readable(ch.raw_fd()));
        ch.watch_socket(true);
        assert!(
            readable(ch.raw_fd()),
            "watched again: the waiting datagram wakes it"
        );
    }
}
