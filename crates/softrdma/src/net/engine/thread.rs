//! The engine thread and the polling heuristics: its loop (waiting for the socket, its waker
//! and kick, and the earliest timer), and the hand-over of the receive path between busy
//! pollers and the thread.

use super::*;

impl Engine {
    /// A poller is active at `now`: the engine thread stays off the receive path, and asleep
    /// (its wake-up is pushed back every WAKER_PUSH, so that it fires only after pollers have
    /// been quiet for a few milliseconds).
    pub(super) fn poller_active(&self, now: u64) {
        self.last_poll.store(now, Ordering::Relaxed);
        let armed = self.waker_armed.load(Ordering::Relaxed);
        // 0: never armed (or disarmed by `poller_sleeping`), even within WAKER_PUSH of the
        // engine's start.
        if self.mode == PollMode::BusyPoll
            && (armed == 0 || now.saturating_sub(armed) >= WAKER_PUSH)
        {
            self.waker_armed.store(now, Ordering::Relaxed);
            self.wake_in(WAKER_DELAY);
            // A poller takes the datagrams now: completion channels stop waking their waiters
            // for them (this branch runs at once after `poller_sleeping`, then every
            // WAKER_PUSH).
            self.set_channels_watch(false);
        }
    }

    /// Register a completion channel whose descriptor watches the socket (busy-poll mode).
    pub fn add_watching_channel(&self, ch: &Arc<crate::net::cq::ChannelCore>) {
        let mut v = self.channels.lock().unwrap_or_else(|e| e.into_inner());
        v.retain(|w| w.strong_count() > 0);
        ch.watch_socket(self.channels_watch.load(Ordering::Acquire));
        v.push(Arc::downgrade(ch));
    }

    /// Switch the socket interest of every watching completion channel (only on a change).
    fn set_channels_watch(&self, on: bool) {
        if self.channels_watch.load(Ordering::Relaxed) == on {
            return;
        }
        let v = self.channels.lock().unwrap_or_else(|e| e.into_inner());
        // Under the list's lock, so that two switches cannot leave channels in the older one.
        if self.channels_watch.swap(on, Ordering::AcqRel) == on {
            return;
        }
        for ch in v.iter().filter_map(std::sync::Weak::upgrade) {
            ch.watch_socket(on);
        }
    }

    /// An application thread is about to sleep until a completion event (it armed a CQ):
    /// in busy-poll mode nobody would receive meanwhile until the engine thread's wake-up
    /// fires (milliseconds), so pollers count as quiet from now and the thread is woken to
    /// take the receive path at once. A poll after this (of a CQ that is not armed) makes the
    /// poller active again.
    pub fn poller_sleeping(&self) {
        if self.mode != PollMode::BusyPoll {
            return;
        }
        self.last_poll.store(0, Ordering::Relaxed);
        // The next active poll pushes the wake-up back at once.
        self.waker_armed.store(0, Ordering::Relaxed);
        // The sleeper may wait on a completion channel's descriptor: it wakes for a datagram
        // itself until a poller is active again.
        self.set_channels_watch(true);
        self.kick_thread();
    }

    /// (Re)arm the engine thread's wake-up to fire `ns` from now.
    pub(super) fn wake_in(&self, ns: u64) {
        let spec = libc::itimerspec {
            it_interval: libc::timespec {
                tv_sec: 0,
                tv_nsec: 0,
            },
            it_value: libc::timespec {
                tv_sec: (ns / 1_000_000_000) as libc::time_t,
                tv_nsec: (ns % 1_000_000_000).max(1) as libc::c_long,
            },
        };
        // SAFETY: `spec` is a valid itimerspec and the old value is not asked for.
        let _ = unsafe {
            libc::timerfd_settime(self.waker.as_raw_fd(), 0, &spec, std::ptr::null_mut())
        };
    }

    /// Wake the engine thread at once (its eventfd).
    pub(super) fn kick_thread(&self) {
        let one: u64 = 1;
        // SAFETY: writes 8 bytes from a live u64 to our own eventfd; a full counter (never
        // reached: the engine thread drains it) would only make this write fail.
        let _ = unsafe { libc::write(self.kick.as_raw_fd(), (&one as *const u64).cast(), 8) };
    }

    /// Take what is queued on the socket before a timer scan (bounded): a thread that was
    /// off the CPU wakes up late both to its timers and to the acknowledgements that would
    /// have stopped them, and a scan first would retransmit what the peer has already
    /// acknowledged (with thousands of QPs, a storm of them). Returns the packets handled.
    pub(super) fn drain_before_timers(&self, rx: &mut RxState) -> usize {
        /// Receive calls at most (each takes up to 8 batches of `RX_BATCH` datagrams).
        const ROUNDS: usize = 32;
        let mut done = 0;
        for _ in 0..ROUNDS {
            match self.receive(rx, false) {
                0 => break,
                n => done += n,
            }
        }
        done
    }

    /// True when no application thread has polled for `POLLER_ACTIVE`.
    pub(super) fn pollers_quiet(&self) -> bool {
        self.quiet_for(self.now(), POLLER_ACTIVE)
    }

    /// True when no application thread has polled for `span` ns at `now` (or ever: a device
    /// whose application never polls is quiet from its start, not only `span` after it).
    pub(super) fn quiet_for(&self, now: u64, span: u64) -> bool {
        let last = self.last_poll.load(Ordering::Relaxed);
        last == 0 || now.saturating_sub(last) > span
    }

    /// The receive path for the engine thread, when it is the thread's turn: always in
    /// blocking mode (an application thread that calls `progress` meanwhile is waited for,
    /// not spun against), in busy-poll mode only once pollers have gone quiet and if free.
    pub(super) fn thread_rx(&self, pollers_quiet: bool) -> Option<MutexGuard<'_, RxState>> {
        match self.mode {
            PollMode::Blocking => Some(self.rx.lock().unwrap_or_else(|e| e.into_inner())),
            PollMode::BusyPoll if pollers_quiet => self.rx.try_lock().ok(),
            PollMode::BusyPoll => None,
        }
    }

    /// Ask the engine thread to stop.
    pub fn stop(&self) {
        self.stop.store(true, Ordering::Release);
        self.wake_in(1);
    }

    /// Busy-poll mode, when the engine thread has the receive path because no application
    /// thread polls (a server that waits elsewhere, as perftest's does) and found datagrams:
    /// keep taking them until ENGINE_SPIN passes without one, instead of going back to sleep
    /// (on this kind of machine a wake-up costs more than the packets it serves, and a
    /// requester waiting for the acknowledgements waits for it). Answers left over are served
    /// in between. Returns to the loop when a timer is due, a region was invalidated, a
    /// poller is active again, the engine stops, or after ENGINE_SPIN_MAX in all. Returns the
    /// packets handled.
    fn spin_receive(&self, rx: &mut RxState) -> usize {
        let start = self.now();
        let mut until = start + ENGINE_SPIN;
        let mut found = 0;
        loop {
            if self.has_pending_transmit() {
                self.serve_pending_transmit();
            }
            let now = self.now();
            if now > until
                || now - start > ENGINE_SPIN_MAX
                || now >= self.ep.next_timer()
                || self.ep.invalidations_pending()
                || !self.pollers_quiet()
                || self.stop.load(Ordering::Relaxed)
            {
                return found;
            }
            match self.receive(rx, false) {
                0 => std::hint::spin_loop(),
                n => {
                    found += n;
                    until = self.now() + ENGINE_SPIN;
                }
            }
        }
    }

    /// The engine thread's loop: until stopped, wait for packets (blocking mode) or for the
    /// next timer, then make progress.
    pub fn run(&self) {
        const IDLE: u64 = 50_000_000; // wake at least every 50 ms (a safety net: `stop` wakes it)
        // Busy-poll mode: the socket woke this thread but a poller had the packets (it was
        // active again, or still inside a long receive); the next wait does not watch the
        // socket, so that a steady stream of packets cannot keep waking the thread to spin
        // against the pollers for the cores.
        let mut woken_for_nothing = false;
        // Pollers had gone quiet but the receive path was taken: nobody may push the waker
        // again, so the next wait is short.
        let mut retry = false;
        // Busy-poll mode: this thread found datagrams nobody had polled for (the application
        // waits without calling verbs, spinning on memory for a WRITE): it watches the socket
        // and takes what pollers leave for SPINNER_GRACE, until SPINNER_SKIPS wake-ups in a
        // row find pollers taking the datagrams again.
        let mut spinner = false;
        let mut skips = 0u32;
        // Take-overs in a row that found datagrams waiting (see SPINNER_TAKEOVERS).
        let mut takeovers = 0u32;
        // The last wake-up for the socket found a poller polling: the next wait leaves the
        // socket alone for SPINNER_GRACE (it stays readable until the poller takes it).
        let mut nap = false;
        // Posts left for a poll (`post_done`): their count at the last look, and the looks in a
        // row that left them to an active poller.
        let mut doorbells_seen = 0u64;
        let mut doorbell_naps = 0u32;
        // Busy-poll mode: when an acknowledgement this thread held (receiving for a memory
        // spinner) falls due (u64::MAX: none).
        let mut ack_due = u64::MAX;
        while !self.stop.load(Ordering::Acquire) {
            self.ep.tear_down_users(self);
            if self.now() >= ack_due {
                // Not carried by a post in time: sent now (a poller holding the receive path
                // sends it itself).
                ack_due = match self.rx.try_lock() {
                    Ok(mut rx) => {
                        let now = self.now();
                        self.ep.flush_pending_at(&mut rx.work, false, now, self);
                        held_ack_due(&rx)
                    }
                    Err(_) => u64::MAX,
                };
            }
            // The scan of every QP's timers runs only once the earliest deadline is due (drives
            // lower `next_timer` whenever they arm one): a wake-up for a packet costs nothing
            // per QP of the device.
            let due = self.ep.next_timer();
            let next = if self.now() >= due {
                if let Some(mut rx) = self.thread_rx(self.pollers_quiet()) {
                    self.drain_before_timers(&mut rx);
                }
                self.run_timers()
            } else {
                Some(due)
            };
            let now = self.now();
            let wait = next.map_or(IDLE, |t| t.saturating_sub(now)).min(IDLE);
            // Posts left for a poll while a poller polls are its to send: this thread looks
            // again after a nap (DOORBELL_GRACE, doubled at each look that found the poller
            // still sending them, up to DOORBELL_NAP_MAX), and sends them once pollers have
            // been quiet for DOORBELL_GRACE.
            let watching = self.doorbell_watch_on(&mut doorbells_seen);
            let leave_to_poller = watching && !self.quiet_for(now, DOORBELL_GRACE);
            let doorbell_nap = (DOORBELL_GRACE << doorbell_naps).min(DOORBELL_NAP_MAX);
            doorbell_naps = if leave_to_poller {
                (doorbell_naps + 1).min(8)
            } else {
                0
            };
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
                    (spinner && !nap) || (!woken_for_nothing && self.quiet_for(now, POLLER_ACTIVE))
                }
            };
            // While pollers are active they fire timers themselves, and keep pushing the
            // waker back: the thread sleeps until they have gone quiet (or `stop`).
            let wait = match (watch_socket, retry) {
                (true, _) => wait,
                // Each wake-up in a row that found a poller taking the datagrams doubles the
                // next nap (up to POLLER_ACTIVE), so that an active poller costs few of them.
                (false, _) if nap => (SPINNER_GRACE << skips.min(5)).min(POLLER_ACTIVE),
                (false, true) => ENGINE_RETRY,
                (false, false) => IDLE,
            };
            let wait = match (watching, leave_to_poller) {
                (true, true) => wait.min(doorbell_nap),
                (true, false) => 0,
                (false, _) => wait,
            };
            nap = false;
            // While this thread keeps the timers (it watches the socket), a timer armed
            // before it would wake kicks it; one armed between reading the deadline above and
            // this is seen here.
            let wait = if watch_socket {
                let now = self.now();
                self.timer_watch.store(now + wait, Ordering::SeqCst);
                let due = self.ep.next_timer();
                wait.min(due.saturating_sub(now))
            } else {
                wait
            };
            let wait = wait.min(ack_due.saturating_sub(self.now()));
            let ts = libc::timespec {
                tv_sec: (wait / 1_000_000_000) as i64,
                tv_nsec: (wait % 1_000_000_000) as i64,
            };
            let mut fds = [
                libc::pollfd {
                    fd: self.waker.as_raw_fd(),
                    events: libc::POLLIN,
                    revents: 0,
                },
                libc::pollfd {
                    fd: self.kick.as_raw_fd(),
                    events: libc::POLLIN,
                    revents: 0,
                },
                libc::pollfd {
                    fd: self.port.raw_fd(),
                    events: libc::POLLIN,
                    revents: 0,
                },
            ];
            let nfds = if watch_socket { 3 } else { 2 };
            // SAFETY: `fds` holds `nfds` valid pollfds and `ts` is a valid timeout.
            let n = unsafe { libc::ppoll(fds.as_mut_ptr(), nfds, &ts, std::ptr::null()) };
            self.timer_watch.store(0, Ordering::SeqCst);
            let ready = n > 0 && fds[2].revents != 0;
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
            // Receive only when it is this thread's turn: always in blocking mode, and in
            // busy-poll mode once pollers have gone quiet (competing with an active poller
            // only adds lock hand-offs and reorders nothing for the better).
            let pollers_quiet = self.pollers_quiet();
            // A memory-spinning application: the datagram is this thread's once no poller has
            // polled a CQ for SPINNER_GRACE (one polling now takes it itself).
            let spinner_turn = spinner
                && ready
                && self
                    .now()
                    .saturating_sub(self.last_progress.load(Ordering::Relaxed))
                    > SPINNER_GRACE;
            if spinner && ready && !spinner_turn && !pollers_quiet {
                skips += 1;
                spinner = skips < SPINNER_SKIPS;
                nap = true;
                if !spinner {
                    takeovers = 0;
                }
            }
            // While pollers are active they hold the receive path (and send held ACKs when
            // due); this thread keeps off the receive lock, so that being preempted while
            // holding it can never stall them.
            woken_for_nothing = false;
            retry = false;
            match self.thread_rx(pollers_quiet || spinner_turn) {
                Some(mut rx) => {
                    // Progress without marking a poller active.
                    self.ep
                        .counters
                        .thread_receives
                        .fetch_add(1, Ordering::Relaxed);
                    // Standing in for a memory spinner, the thread holds acknowledgements
                    // as a poller does: the application's next post (its answer, once it sees
                    // the data) carries them in its datagram. Sent at once, they made the
                    // peer's completion arrive apart from the data it waits for next, which
                    // then nobody polled for: a ping-pong fell into a mode where this thread
                    // received every message (about 6,000 wake-ups per 5,000 iterations of
                    // ib_write_lat, 16-150 us each instead of 4) and stayed there.
                    let hold = self.mode == PollMode::BusyPoll && spinner;
                    let mut found = self.receive(&mut rx, hold);
                    if self.mode == PollMode::BusyPoll && found > 0 && pollers_quiet {
                        found += self.spin_receive(&mut rx);
                    }
                    ack_due = held_ack_due(&rx);
                    drop(rx);
                    // Busy-poll mode: datagrams waited for a take-over, round after round (the
                    // application waits without polling): watch the socket for it from now
                    // on. While watching, a datagram taken when no thread had even posted for
                    // SPINNER_GRACE confirms it; one a busy poster left behind does not.
                    if self.mode == PollMode::BusyPoll {
                        let idle = self.quiet_for(self.now(), SPINNER_GRACE);
                        if spinner {
                            if found > 0 && idle {
                                skips = 0;
                            }
                        } else if pollers_quiet && found > 0 {
                            takeovers += 1;
                            if takeovers >= SPINNER_TAKEOVERS {
                                self.ep
                                    .counters
                                    .spinner_watches
                                    .fetch_add(1, Ordering::Relaxed);
                                spinner = true;
                                skips = 0;
                            }
                        } else if pollers_quiet {
                            takeovers = 0;
                        }
                    }
                    // One round of left-over answers between two receives.
                    self.serve_pending_transmit();
                }
                // A poller holds the receive path (a poller inside a long receive has not
                // marked itself active for a while), or was active again by the time this
                // thread ran.
                None => {
                    // Posts left for a poll (`post_done`) or answers left over: sent now if
                    // no poller got to them first (posts left for a poll: once pollers have
                    // been quiet for DOORBELL_GRACE). A QP still locked (its poster is about
                    // to let go, or posts again) is tried again a few times.
                    let serve = !self.doorbell_watch.load(Ordering::SeqCst)
                        || self.quiet_for(self.now(), DOORBELL_GRACE);
                    for _ in 0..if serve { DOORBELL_RETRIES } else { 0 } {
                        self.serve_pending_transmit();
                        if !self.has_pending_transmit() {
                            break;
                        }
                        std::thread::yield_now();
                    }
                    woken_for_nothing = ready || pollers_quiet;
                    retry = pollers_quiet;
                    // Watching for a memory spinner, but a poller had the receive path: that
                    // poller takes the datagrams; nap as after a skip.
                    if spinner_turn {
                        skips += 1;
                        spinner = skips < SPINNER_SKIPS;
                        nap = true;
                    }
                }
            }
        }
    }
}

/// When the earliest acknowledgement held on the receive path falls due (u64::MAX: none).
fn held_ack_due(rx: &RxState) -> u64 {
    rx.work.held_ack_due().unwrap_or(u64::MAX)
}

/// Start the engine thread.
pub fn spawn(engine: Arc<Engine>) -> io::Result<std::thread::JoinHandle<()>> {
    crate::thread::spawn("softrdma-engine", move || engine.run())
}
