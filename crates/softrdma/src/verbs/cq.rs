//! Completion queues and channels.

use std::os::fd::RawFd;
use std::sync::Arc;
use std::time::Duration;

use super::{Device, VerbsError, WcStatus, WorkCompletion};
use crate::net::{ChannelCore, CqCore, PollMode};

/// A completion channel (`ibv_comp_channel`): its file descriptor becomes readable when an
/// armed CQ gets a completion; usable with poll, epoll and async reactors.
#[derive(Clone, Debug)]
pub struct CompChannel {
    pub(crate) core: Arc<ChannelCore>,
    pub(crate) device: Device,
}

impl CompChannel {
    /// The descriptor to wait on with poll/epoll or async code: readable while an event is
    /// pending and, on a busy-poll device, also while datagrams wait on the device's socket.
    /// When it is readable, call [`CompChannel::get_event`] with a zero timeout: it handles
    /// what arrived (so the packet that completes the CQ is handled by the thread that woke,
    /// in that wake-up) and returns the event, or `None` if nothing fired.
    pub fn fd(&self) -> RawFd {
        self.core.raw_fd()
    }

    /// Wait for the next CQ event (`ibv_get_cq_event`); returns the id of the CQ that fired
    /// (compare with [`Cq::id`]), or `None` on timeout.
    pub fn get_event(&self, timeout: Option<Duration>) -> Result<Option<u64>, VerbsError> {
        let engine = self.device.engine();
        if engine.mode() != PollMode::BusyPoll {
            return Ok(self.core.get_event(timeout)?);
        }
        let drive = || engine.progress_as(false, false);
        Ok(self.core.get_event_driving(
            timeout,
            Some((engine.socket_fd(), &drive, engine.socket_waiters())),
        )?)
    }
}

/// A placeholder completion to fill arrays with before polling.
pub const EMPTY_WC: WorkCompletion = WorkCompletion {
    wr_id: 0,
    status: super::WcStatus::Success,
    opcode: super::WcOpcode::Send,
    byte_len: 0,
    imm_data: None,
    invalidated_rkey: None,
    qp_num: 0,
    src_qp: 0,
    solicited: false,
    grh: None,
};

/// A completion queue.
#[derive(Clone, Debug)]
pub struct Cq {
    pub(crate) core: Arc<CqCore>,
    device: Device,
}

impl Cq {
    pub(crate) fn new(device: Device, cqe: usize, channel: Option<Arc<ChannelCore>>) -> Cq {
        Cq {
            core: Arc::new(CqCore::new(cqe, channel)),
            device,
        }
    }

    /// Identifier reported by a completion channel.
    pub fn id(&self) -> u64 {
        self.core.id()
    }

    /// Move up to `wc.len()` completions into `wc` (`ibv_poll_cq`). In busy-poll mode a poll
    /// that finds the CQ empty first receives and processes whatever packets are waiting (one
    /// that finds completions returns them at once: receiving first would cost a system call
    /// on the way to each), except the first two such polls of unarmed CQs after a receive
    /// that emptied the socket, before the application posts (it drains its CQ:
    /// `params::DRAIN_SKIP`); a poll
    /// of an armed CQ (the last look before waiting for its event) does not make the thread a
    /// busy poller, so the engine thread keeps the receive path while it sleeps.
    ///
    /// A completion in error (other than flushed) reports its QP's
    /// [`AsyncEvent::QpFatal`](super::AsyncEvent::QpFatal), once per QP.
    pub fn poll(&self, wc: &mut [WorkCompletion]) -> usize {
        let n = self.poll_once(wc);
        for w in &wc[..n] {
            if !matches!(w.status, WcStatus::Success | WcStatus::WrFlushErr) {
                self.device.engine().endpoint().report_fatal(w.qp_num);
            }
        }
        n
    }

    /// [`Cq::poll`] for a caller that polls in a loop and does nothing else meanwhile (a
    /// benchmark's or a C program's `while (!ibv_poll_cq(...))`): every
    /// [`YIELD_EVERY`](crate::params::YIELD_EVERY)-th empty poll of this thread gives
    /// the CPU to whoever is runnable (the engine thread, or the peer process on a small
    /// machine) instead of spinning through its time slice. `ibv_poll_cq` polls this way.
    pub fn poll_spinning(&self, wc: &mut [WorkCompletion]) -> usize {
        let n = self.poll(wc);
        if n == 0 && empty_poll_yields() {
            std::thread::yield_now();
        }
        n
    }

    fn poll_once(&self, wc: &mut [WorkCompletion]) -> usize {
        if self.device.engine().mode() != PollMode::BusyPoll {
            return self.core.poll(wc);
        }
        let engine = self.device.engine();
        let active = !self.core.is_armed();
        let n = self.core.poll(wc);
        if n > 0 {
            engine.polled(active);
            return n;
        }
        engine.poll_progress(active);
        self.core.poll(wc)
    }

    /// Poll until `n` completions have arrived or `timeout` passes; returns them.
    pub fn wait(&self, n: usize, timeout: Duration) -> Vec<WorkCompletion> {
        let deadline = std::time::Instant::now() + timeout;
        let mut out = Vec::with_capacity(n);
        let mut buf = [EMPTY_WC; 16];
        while out.len() < n && std::time::Instant::now() < deadline {
            let k = self.poll(&mut buf[..(n - out.len()).min(16)]);
            out.extend_from_slice(&buf[..k]);
            if k == 0 {
                if self.device.engine().mode() == PollMode::BusyPoll {
                    std::hint::spin_loop();
                } else {
                    std::thread::sleep(Duration::from_micros(20));
                }
            }
        }
        out
    }

    /// Arm the CQ: the channel fires on the next completion (`ibv_req_notify_cq`), or with
    /// `solicited_only` on the next receive whose message carried the solicited-event bit
    /// (`SendFlags::SOLICITED` at the sender) or completion in error. In
    /// busy-poll mode the caller is taken to be about to sleep until that event: the engine
    /// thread takes the receive path at once (instead of after pollers have been quiet for a
    /// few milliseconds), until the thread polls a CQ that is not armed again.
    pub fn req_notify(&self, solicited_only: bool) {
        self.core.req_notify(solicited_only);
        self.device.engine().poller_sleeping();
    }

    /// True once a completion was lost to a full CQ.
    pub fn overrun(&self) -> bool {
        self.core.overrun()
    }

    /// Change the number of entries to `cqe` (`ibv_resize_cq`): `InvalidArgument` when more
    /// completions than that are waiting (nothing is dropped), or for 0.
    pub fn resize(&self, cqe: u32) -> Result<(), VerbsError> {
        if cqe == 0 || !self.core.resize(cqe as usize) {
            return Err(VerbsError::InvalidArgument(
                "a CQ cannot shrink below its waiting completions, or to 0".into(),
            ));
        }
        Ok(())
    }
}

/// Count an empty poll of this thread; true every [`YIELD_EVERY`](crate::params::YIELD_EVERY)-th.
fn empty_poll_yields() -> bool {
    thread_local! {
        static EMPTY: std::cell::Cell<u32> = const { std::cell::Cell::new(0) };
    }
    EMPTY.with(|e| {
        let n = e.get().wrapping_add(1);
        e.set(n);
        n.is_multiple_of(crate::params::YIELD_EVERY)
    })
}
