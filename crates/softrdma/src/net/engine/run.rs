//! The engine thread's loop: tear down the users of invalidated regions, send a held
//! acknowledgement that fell due, fire due timers, decide how long to sleep and on what, sleep,
//! and then either take the receive path (its turn) or leave it to the pollers.

use super::*;
use crate::params::ENGINE_IDLE as IDLE;

/// What the loop remembers from one wake-up to the next.
#[derive(Debug)]
struct Loop {
    /// Busy-poll mode: the socket woke this thread but a poller had the packets (it was active
    /// again, or still inside a long receive); the next wait does not watch the socket, so
    /// that a steady stream of packets cannot keep waking the thread to spin against the
    /// pollers for the cores.
    woken_for_nothing: bool,
    /// Pollers had gone quiet but the receive path was taken: nobody may push the waker
    /// again, so the next wait is short.
    retry: bool,
    /// Busy-poll mode: this thread found datagrams nobody had polled for (the application
    /// waits without calling verbs, spinning on memory for a WRITE): it watches the socket
    /// and takes what pollers leave for SPINNER_GRACE, until SPINNER_SKIPS wake-ups in a row
    /// find pollers taking the datagrams again.
    spinner: bool,
    /// Watching for an application that polls only now and then (`note_find`), not for a
    /// memory spinner: its thread is not on a CPU between its polls, so this thread keeps
    /// receiving after a take-over (`spin_receive`) as for an application that never polls.
    rare_poller: bool,
    skips: u32,
    /// Take-overs in a row that found datagrams waiting (see SPINNER_TAKEOVERS).
    takeovers: u32,
    /// The last wake-up for the socket found a poller polling: the next wait leaves the
    /// socket alone for SPINNER_GRACE (it stays readable until the poller takes it).
    nap: bool,
    /// Posts left for a poll (`post_done`): their count at the last look, and the looks in a
    /// row that left them to an active poller.
    doorbells_seen: u64,
    doorbell_naps: u32,
    /// Busy-poll mode: when an acknowledgement this thread held (receiving for a memory
    /// spinner) falls due (u64::MAX: none).
    ack_due: u64,
}

impl Default for Loop {
    fn default() -> Loop {
        Loop {
            woken_for_nothing: false,
            retry: false,
            spinner: false,
            rare_poller: false,
            skips: 0,
            takeovers: 0,
            nap: false,
            doorbells_seen: 0,
            doorbell_naps: 0,
            ack_due: u64::MAX,
        }
    }
}

impl Engine {
    /// The engine thread's loop: until stopped, wait for packets (blocking mode) or for the
    /// next timer, then make progress.
    pub fn run(&self) {
        let mut st = Loop::default();
        while !self.stop.load(Ordering::Acquire) {
            self.ep.tear_down_users(self);
            if self.now() >= st.ack_due {
                st.ack_due = self.release_due_ack();
            }
            let next = self.fire_due_timers();
            let (wait, watch_socket) = self.plan_wait(&mut st, next);
            let ready = self.sleep(wait, watch_socket);
            self.after_wake(&mut st, ready);
        }
    }

    /// A held acknowledgement fell due and no post carried it in time: send it now (a poller
    /// holding the receive path sends it itself). Returns when the next held one is due.
    fn release_due_ack(&self) -> u64 {
        match self.rx.try_lock() {
            Ok(mut rx) => {
                let now = self.now();
                self.ep.flush_pending_at(&mut rx.work, false, now, self);
                held_ack_due(&rx)
            }
            Err(_) => u64::MAX,
        }
    }

    /// Scan the QPs' timers if the earliest deadline is due (drives lower it whenever they arm
    /// one): a wake-up for a packet costs nothing per QP of the device. Returns the earliest
    /// deadline.
    fn fire_due_timers(&self) -> Option<u64> {
        let due = self.ep.next_timer();
        if self.now() < due {
            return Some(due);
        }
        if let Some(mut rx) = self.thread_rx(self.pollers_quiet()) {
            self.drain_before_timers(&mut rx);
        }
        self.run_timers()
    }

    /// How long to sleep, and whether on the socket too.
    fn plan_wait(&self, st: &mut Loop, next: Option<u64>) -> (u64, bool) {
        // Polls keep finding datagrams that waited for them (`note_find`): watch the socket
        // as for a memory spinner.
        if self.take_spinner_wish() {
            self.late_finds.store(0, Ordering::Relaxed);
            if !st.spinner {
                self.start_watching(st);
            }
            st.rare_poller = true;
        }
        let now = self.now();
        let wait = next.map_or(IDLE, |t| t.saturating_sub(now)).min(IDLE);
        let (watching, leave_to_poller, doorbell_nap) = self.doorbell_plan(st, now);
        // Answers left over from budgeted drives: look at the socket, do not sleep.
        let wait = if self.has_pending_transmit() && !leave_to_poller {
            0
        } else {
            wait
        };
        // In busy-poll mode pollers receive; the thread steps in only when nobody has
        // polled for a while, and otherwise sleeps instead of competing for packets.
        let watch_socket = match self.mode {
            PollMode::Blocking => true,
            PollMode::BusyPoll => {
                !self.socket_waited_on()
                    && ((st.spinner && !st.nap)
                        || (!st.woken_for_nothing && self.quiet_for(now, POLLER_ACTIVE)))
            }
        };
        // While pollers are active they fire timers themselves, and keep pushing the
        // waker back: the thread sleeps until they have gone quiet (or `stop`).
        let wait = match (watch_socket, st.retry) {
            (true, _) => wait,
            // Each wake-up in a row that found a poller taking the datagrams doubles the
            // next nap (up to POLLER_ACTIVE), so that an active poller costs few of them.
            (false, _) if st.nap => (SPINNER_GRACE << st.skips.min(5)).min(POLLER_ACTIVE),
            (false, true) => ENGINE_RETRY,
            (false, false) => IDLE,
        };
        let wait = match (watching, leave_to_poller) {
            (true, true) => wait.min(doorbell_nap),
            (true, false) => 0,
            (false, _) => wait,
        };
        st.nap = false;
        // While this thread keeps the timers (it watches the socket), a timer armed
        // before it would wake kicks it; one armed between reading the deadline above and
        // this is seen here.
        let wait = if watch_socket {
            let now = self.now();
            self.timer_watch.store(now + wait, Ordering::SeqCst);
            wait.min(self.ep.next_timer().saturating_sub(now))
        } else {
            wait
        };
        (
            wait.min(st.ack_due.saturating_sub(self.now())),
            watch_socket,
        )
    }

    /// Posts left for a poll while a poller polls are its to send: this thread looks again
    /// after a nap (DOORBELL_GRACE, doubled at each look that found the poller still sending
    /// them, up to DOORBELL_NAP_MAX), and sends them once pollers have been quiet for
    /// DOORBELL_GRACE. Returns whether it watches them, whether it leaves them to the poller
    /// for now, and the nap.
    fn doorbell_plan(&self, st: &mut Loop, now: u64) -> (bool, bool, u64) {
        let watching = self.doorbell_watch_on(&mut st.doorbells_seen);
        let leave_to_poller = watching && !self.quiet_for(now, DOORBELL_GRACE);
        let nap = (DOORBELL_GRACE << st.doorbell_naps).min(DOORBELL_NAP_MAX);
        st.doorbell_naps = if leave_to_poller {
            (st.doorbell_naps + 1).min(8)
        } else {
            0
        };
        (watching, leave_to_poller, nap)
    }

    /// Sleep up to `wait` ns on the waker, the kick and (`watch_socket`) the socket. Returns
    /// true when the socket is readable.
    fn sleep(&self, wait: u64, watch_socket: bool) -> bool {
        let ts = libc::timespec {
            tv_sec: (wait / 1_000_000_000) as i64,
            tv_nsec: (wait % 1_000_000_000) as i64,
        };
        let fd = |fd| libc::pollfd {
            fd,
            events: libc::POLLIN,
            revents: 0,
        };
        let mut fds = [
            fd(self.waker.as_raw_fd()),
            fd(self.kick.as_raw_fd()),
            fd(self.port.raw_fd()),
        ];
        let nfds = if watch_socket { 3 } else { 2 };
        // SAFETY: `fds` holds `nfds` valid pollfds and `ts` is a valid timeout.
        let n = unsafe { libc::ppoll(fds.as_mut_ptr(), nfds, &ts, std::ptr::null()) };
        self.timer_watch.store(0, Ordering::SeqCst);
        for fd in &fds[..2] {
            if n > 0 && fd.revents != 0 {
                let mut ticks = [0u8; 8];
                // SAFETY: reads at most 8 bytes into a live buffer from our timerfd or
                // eventfd (both non-blocking: nothing to read is an error we ignore).
                let _ = unsafe { libc::read(fd.fd, ticks.as_mut_ptr().cast(), 8) };
            }
        }
        self.ep
            .counters
            .thread_wakeups
            .fetch_add(1, Ordering::Relaxed);
        n > 0 && fds[2].revents != 0
    }

    /// After a wake-up (`ready`: the socket is readable): receive when it is this thread's
    /// turn (always in blocking mode, and in busy-poll mode once pollers have gone quiet:
    /// competing with an active poller only adds lock hand-offs and reorders nothing for the
    /// better), else leave the receive path to the pollers.
    fn after_wake(&self, st: &mut Loop, ready: bool) {
        let pollers_quiet = self.pollers_quiet();
        // A memory-spinning application: the datagram is this thread's once no poller has
        // polled a CQ for SPINNER_GRACE (one polling now takes it itself).
        let spinner_turn = st.spinner
            && ready
            && self
                .now()
                .saturating_sub(self.last_progress.load(Ordering::Relaxed))
                > SPINNER_GRACE;
        if st.spinner && ready && !spinner_turn && !pollers_quiet {
            st.skips += 1;
            st.spinner = st.skips < SPINNER_SKIPS;
            st.nap = true;
            if !st.spinner {
                st.takeovers = 0;
            }
        }
        // While pollers are active they hold the receive path (and send held ACKs when
        // due); this thread keeps off the receive lock, so that being preempted while
        // holding it can never stall them.
        st.woken_for_nothing = false;
        st.retry = false;
        let turn = (pollers_quiet || spinner_turn) && !self.socket_waited_on();
        match self.thread_rx(turn) {
            Some(rx) => self.take_over(st, rx, pollers_quiet),
            None => self.leave_to_pollers(st, ready, pollers_quiet, spinner_turn),
        }
    }

    /// This thread has the receive path: receive, and in busy-poll mode keep receiving while
    /// datagrams come and nobody polls; notice an application that waits by spinning on
    /// memory.
    fn take_over(&self, st: &mut Loop, mut rx: MutexGuard<'_, RxState>, pollers_quiet: bool) {
        let busy = self.mode == PollMode::BusyPoll;
        // Progress without marking a poller active.
        self.ep
            .counters
            .thread_receives
            .fetch_add(1, Ordering::Relaxed);
        // Standing in for a memory spinner, the thread holds acknowledgements as a poller
        // does: the application's next post (its answer, once it sees the data) carries them
        // in its datagram. Sent at once, they made the peer's completion arrive apart from
        // the data it waits for next, which then nobody polled for: a ping-pong fell into a
        // mode where this thread received every message (about 6,000 wake-ups per 5,000
        // iterations of ib_write_lat, 16-150 us each instead of 4) and stayed there.
        let mut found = self.receive(&mut rx, busy && st.spinner);
        if busy && found > 0 && (pollers_quiet || (st.spinner && st.rare_poller)) {
            found += self.spin_receive(&mut rx);
        }
        st.ack_due = held_ack_due(&rx);
        drop(rx);
        // Busy-poll mode: datagrams waited for a take-over, round after round (the
        // application waits without polling): watch the socket for it from now on. While
        // watching, a datagram taken when no thread had even posted for SPINNER_GRACE
        // confirms it; one a busy poster left behind does not.
        if busy {
            let idle = self.quiet_for(self.now(), SPINNER_GRACE);
            if st.spinner {
                if found > 0 && idle {
                    st.skips = 0;
                }
            } else if pollers_quiet && found > 0 {
                st.takeovers += 1;
                if st.takeovers >= SPINNER_TAKEOVERS {
                    self.start_watching(st);
                }
            } else if pollers_quiet {
                st.takeovers = 0;
            }
        }
        // One round of left-over answers between two receives.
        self.serve_pending_transmit();
    }

    /// Busy-poll mode: from now on watch the socket and take what pollers leave for
    /// SPINNER_GRACE (counted in `spinner_watches`).
    fn start_watching(&self, st: &mut Loop) {
        self.ep
            .counters
            .spinner_watches
            .fetch_add(1, Ordering::Relaxed);
        st.spinner = true;
        st.rare_poller = false;
        st.skips = 0;
    }

    /// A poller holds the receive path (a poller inside a long receive has not marked itself
    /// active for a while), or was active again by the time this thread ran.
    fn leave_to_pollers(&self, st: &mut Loop, ready: bool, quiet: bool, spinner_turn: bool) {
        // Posts left for a poll (`post_done`) or answers left over: sent now if no poller got
        // to them first (posts left for a poll: once pollers have been quiet for
        // DOORBELL_GRACE). A QP still locked (its poster is about to let go, or posts again)
        // is tried again a few times.
        let serve = !self.doorbell_watch.load(Ordering::SeqCst)
            || self.quiet_for(self.now(), DOORBELL_GRACE);
        for _ in 0..if serve { DOORBELL_RETRIES } else { 0 } {
            self.serve_pending_transmit();
            if !self.has_pending_transmit() {
                break;
            }
            std::thread::yield_now();
        }
        st.woken_for_nothing = ready || quiet;
        st.retry = quiet;
        // Watching for a memory spinner, but a poller had the receive path: that poller takes
        // the datagrams; nap as after a skip.
        if spinner_turn {
            st.skips += 1;
            st.spinner = st.skips < SPINNER_SKIPS;
            st.nap = true;
        }
    }
}

/// When the earliest acknowledgement held on the receive path falls due (u64::MAX: none).
fn held_ack_due(rx: &RxState) -> u64 {
    rx.work.held_ack_due().unwrap_or(u64::MAX)
}
