//! The receive side of the engine: progress calls, and batches of datagrams from the port
//! handed to the endpoint.

use std::sync::atomic::Ordering;

use super::{Engine, PollMode, RX_BATCH, RxState};
use crate::net::endpoint::ACK_DELAY;
use crate::params::{
    DRAIN_SKIP, DRAIN_SKIPS, RARE_POLLER_EMPTY_MAX, RARE_POLLER_FINDS, SPINNER_GRACE,
};

impl Engine {
    /// Receive and process what is queued on the socket, if no other thread is doing so.
    /// Returns the number of packets processed. Also runs due timers when `timers` is set.
    pub fn progress(&self, timers: bool) -> usize {
        self.progress_as(timers, true)
    }

    /// [`Engine::progress`]; an `active` poller keeps the engine thread off the receive path
    /// (busy-poll mode), one that is about to sleep until a completion event (its CQ is armed)
    /// does not.
    pub fn progress_as(&self, timers: bool, active: bool) -> usize {
        self.progress_inner(timers, active, false)
    }

    /// The progress of a CQ poll that found the CQ empty ([`Cq::poll`](crate::verbs::Cq::poll)):
    /// [`Engine::progress_as`], except that in busy-poll mode the first `active` polls (of CQs
    /// that are not armed) after such a poll's receive that emptied the socket leave it alone
    /// while the application drains its CQ ([`DRAIN_SKIP`]).
    pub fn poll_progress(&self, active: bool) -> usize {
        self.progress_inner(false, active, true)
    }

    fn progress_inner(&self, timers: bool, active: bool, cq_poll: bool) -> usize {
        // The application's last sign of life before this poll: a poll, a post or a
        // receive batch (see `note_find`).
        let before = self.last_poll.load(Ordering::Relaxed);
        let (now, served) = self.polled_at(active);
        // Not for a poll of an armed CQ: the last look before its thread sleeps receives (and
        // lets held acknowledgements go) as before.
        let draining = cq_poll && active && self.mode == PollMode::BusyPoll;
        if draining && self.skips_socket(now) {
            return 0;
        }
        let Ok(mut rx) = self.rx.try_lock() else {
            return 0;
        };
        // A thread about to sleep holds back no acknowledgement: nobody might send it for a
        // while.
        let defer_acks = self.mode == PollMode::BusyPoll && active;
        let mut done = self.receive_at(&mut rx, defer_acks, active, now);
        if draining && done > 0 && rx.drained {
            // The socket is empty: the application drains what this brought.
            self.drained_at.store(now.max(1), Ordering::Relaxed);
            self.drain_skips.store(0, Ordering::Relaxed);
        }
        if defer_acks && (done > 0 || served) {
            // The poll's own work is no absence: READ requests are answered from it (a
            // 64 KiB response takes 15-20 us to send), and the next poll, measured from this
            // one's start, would look late to `note_find` (a busy READ responder was taken for
            // a rare poller, and the engine thread woken to compete with it).
            self.last_poll.store(self.now(), Ordering::Relaxed);
        }
        // A find by a thread about to wait for its event counts as well (UCX's progress
        // thread: its polls after each wake-up are of armed CQs, and its unarmed ones, which
        // keep the engine thread off the receive path, come before the requests and find
        // nothing); its empty polls do not.
        if defer_acks || (self.mode == PollMode::BusyPoll && done > 0) {
            // Posts since the last poll: the application was busy with the device meanwhile.
            let posted = self.posted.load(Ordering::Relaxed);
            if posted {
                self.posted.store(false, Ordering::Relaxed);
            }
            self.note_find(before, now, done, posted);
        }
        // Active pollers also fire due timers, so that the engine thread can stay asleep
        // instead of preempting them; what is queued goes first (`drain_before_timers`).
        let scan = timers || now >= self.ep.next_timer();
        if scan {
            done += self.drain_before_timers(&mut rx);
        }
        drop(rx);
        if scan {
            self.run_timers();
        }
        done
    }

    /// One pass of a device without an engine thread (see `Device::open_on`): receive, fire
    /// due timers, send what is pending. Returns the packets received and the next instant
    /// something is due (a transport timer, a held acknowledgement).
    pub fn drive_once(&self) -> (usize, Option<u64>) {
        // Timers are scanned once, below, for their next deadline.
        let done = self.progress_as(false, true);
        self.serve_pending_transmit();
        let timers = self.run_timers();
        let acks = {
            let rx = self.rx.lock().unwrap_or_else(|e| e.into_inner());
            rx.work.held_ack_due()
        };
        let next = match (timers, acks) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
        (done, next)
    }

    /// Busy-poll mode: whether an active poll at `now` that found its CQ empty leaves the
    /// socket alone, being one of the first [`DRAIN_SKIPS`] since a receive that emptied it,
    /// within [`DRAIN_SKIP`] and before any post (the application draining its CQ: see
    /// `DRAIN_SKIP`).
    fn skips_socket(&self, now: u64) -> bool {
        let at = self.drained_at.load(Ordering::Relaxed);
        if at == 0 {
            return false;
        }
        if now.saturating_sub(at) > DRAIN_SKIP
            || self.drain_skips.fetch_add(1, Ordering::Relaxed) >= DRAIN_SKIPS
        {
            self.drained_at.store(0, Ordering::Relaxed);
            return false;
        }
        true
    }

    /// Busy-poll mode, after an active poll at `now` that handled `done` packets, or a poll
    /// about to wait for its event that handled some; `before` is the application's previous
    /// active poll or receive batch, `posted` whether it posted sends since. An application
    /// that polls only now and then (UCX's one-sided test servers) finds datagrams that
    /// waited for its poll, while its polls keep the engine thread off the receive path:
    /// every request would wait for the next poll. A find more than
    /// SPINNER_GRACE after `before`, with no post in between, is late; after RARE_POLLER_FINDS
    /// late finds in a row, with fewer than RARE_POLLER_EMPTY_MAX empty polls between them
    /// (a busy poller that was off its CPU spins between its finds), the engine thread is
    /// woken to watch the socket and take what no poll takes within SPINNER_GRACE (it stops
    /// once pollers take the datagrams again: SPINNER_SKIPS).
    fn note_find(&self, before: u64, now: u64, done: usize, posted: bool) {
        let counting = self.late_finds.load(Ordering::Relaxed) != 0;
        if done == 0 {
            // A poller that spins between its finds is a busy one (it was off its CPU):
            // its late finds do not count.
            if counting
                && self.empty_polls.fetch_add(1, Ordering::Relaxed) + 1 >= RARE_POLLER_EMPTY_MAX
            {
                self.late_finds.store(0, Ordering::Relaxed);
            }
            return;
        }
        let late = !posted && before != 0 && now.saturating_sub(before) > SPINNER_GRACE;
        if !late {
            if counting {
                self.late_finds.store(0, Ordering::Relaxed);
            }
            return;
        }
        self.empty_polls.store(0, Ordering::Relaxed);
        if self.late_finds.fetch_add(1, Ordering::Relaxed) + 1 == RARE_POLLER_FINDS {
            self.spinner_wanted.store(true, Ordering::Release);
            self.kick_thread();
        }
    }

    /// The engine thread's side of `note_find`: whether pollers asked it to watch the socket
    /// since it last looked.
    pub(super) fn take_spinner_wish(&self) -> bool {
        self.spinner_wanted.load(Ordering::Relaxed)
            && self.spinner_wanted.swap(false, Ordering::AcqRel)
    }

    /// A poll that found completions waiting (busy-poll mode): it takes them without a
    /// receive (a system call that would only delay them; the next poll that finds the CQ
    /// empty receives), but counts as a poll all the same: an `active` poller keeps the engine
    /// thread off the receive path, and posts left for a poll are sent.
    pub fn polled(&self, active: bool) {
        self.polled_at(active);
    }

    /// What every poll does before it receives ([`Engine::polled`]); returns the clock read,
    /// and whether it sent answers left over from earlier drives.
    fn polled_at(&self, active: bool) -> (u64, bool) {
        // The poller counts as active even when it finds the receive path taken: otherwise an
        // engine thread that stepped in while pollers were quiet would keep it (and compete
        // with spinning pollers for the cores) for as long as they keep finding it taken.
        let now = self.now();
        if active {
            self.poller_active(now);
            self.last_progress.store(now, Ordering::Relaxed);
        }
        let served = self.has_pending_transmit();
        if served {
            self.serve_pending_transmit();
        }
        (now, served)
    }

    /// Receive and handle up to a few batches of datagrams. Plain acknowledgements are held
    /// while a batch is handled, so that a QP sends one (the newest) per batch; with
    /// `defer_acks` (busy-poll mode) they stay held for up to ACK_DELAY, else they go out
    /// at the end of each batch.
    pub(super) fn receive(&self, rx: &mut RxState, defer_acks: bool) -> usize {
        self.receive_at(rx, defer_acks, false, self.now())
    }

    /// [`Engine::receive`] with the clock already read; a `poller` (an application thread)
    /// counts as active at every batch, so that a long receive does not look like a quiet
    /// poller to the engine thread.
    pub(super) fn receive_at(
        &self,
        rx: &mut RxState,
        defer_acks: bool,
        poller: bool,
        now: u64,
    ) -> usize {
        if !defer_acks {
            self.ep.flush_pending_at(&mut rx.work, true, now, self);
        }
        let mut done = 0;
        let mut now = now;
        // Cleared while the rounds' limit could end the loop with datagrams left.
        rx.drained = false;
        for round in 0..8 {
            // An error (`WouldBlock`: nothing queued) received nothing.
            let n = self.port.recv(&mut rx.batch).unwrap_or(0);
            if n == 0 {
                rx.drained = true;
                break;
            }
            self.ep
                .counters
                .rx_datagrams
                .fetch_add(n as u64, Ordering::Relaxed);
            // The caller's clock reading is fresh for the first batch.
            if round > 0 {
                now = self.now();
                if poller {
                    self.poller_active(now);
                }
            }
            for i in 0..n {
                if let Some(d) = rx.batch.get(i) {
                    done += self.ep.handle_datagram(now, &d, &mut rx.work, self);
                }
            }
            if !defer_acks {
                self.ep.flush_pending(&mut rx.work, true, self);
            }
            if n < RX_BATCH {
                rx.drained = true;
                break;
            }
        }
        if defer_acks {
            // Busy-poll mode: a due acknowledgement goes out from a poll that found nothing,
            // in time the poller would spin away anyway. A poll that found packets hands them
            // to the application first (a system call ahead of them delays what it waits
            // for); in a stream that never leaves the socket empty, acknowledgements go out
            // once overdue by another ACK_DELAY. An application's poll that found nothing
            // sends those held for ACK_GRACE: it has seen what arrived and posted no answer to
            // carry them, and the peer may wait for them to complete its sends (two sides each
            // waiting for the other's acknowledgement before posting would otherwise each wait
            // ACK_DELAY: a 4 KiB MPI exchange over UCX's zero-copy sends took 39 us a round).
            if done == 0 && poller {
                self.ep.flush_held_early(&mut rx.work, now, self);
            } else {
                let slack = if done > 0 { ACK_DELAY } else { 0 };
                self.ep
                    .flush_pending_at(&mut rx.work, false, now.saturating_sub(slack), self);
            }
        }
        if done > 0 {
            self.ep
                .counters
                .rx_packets
                .fetch_add(done as u64, Ordering::Relaxed);
        } else {
            // Nothing arrived: time to warm the next receive buffer.
            self.ep.warm_next_recv(&mut rx.work);
        }
        done
    }
}
