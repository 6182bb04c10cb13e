//! The polling heuristics: the hand-over of the receive path between busy pollers and the
//! engine thread, its waker and kick, and its spin while nobody polls (its loop is in
//! `run.rs`).

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

    /// The device has a completion channel (each watches the socket in busy-poll mode).
    fn has_channel(&self) -> bool {
        let v = self.channels.lock().unwrap_or_else(|e| e.into_inner());
        v.iter().any(|w| w.strong_count() > 0)
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
    /// fires (milliseconds), so pollers count as quiet from now. A thread that sleeps on a
    /// completion channel watches the socket itself (`ibv_get_cq_event`, and the channel's
    /// descriptor, which then includes the socket), and handles the datagram that fires its
    /// event: the engine thread is woken to take the receive path at once only on a device
    /// without channels. A poll after this (of a CQ that is not armed) makes the poller
    /// active again.
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
        if !self.has_channel() {
            self.kick_thread();
        }
    }

    /// Busy-poll mode: the count of application threads waiting for a CQ event that watch
    /// the socket themselves meanwhile (`ChannelCore::get_event_driving` holds it). While one
    /// does, the engine thread does not watch the socket or take the receive path for
    /// datagrams (timers apart): two threads woken for each datagram, one of them for
    /// nothing, and an event signalled to a thread that was awake for the datagram anyway
    /// cost a wake-up each.
    pub fn socket_waiters(&self) -> &AtomicU32 {
        &self.socket_waiters
    }

    /// An application thread waits for a CQ event watching the socket itself.
    pub(super) fn socket_waited_on(&self) -> bool {
        self.socket_waiters.load(Ordering::SeqCst) > 0
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
    /// thread polls (a server that waits elsewhere, as perftest's does), or one polls only
    /// now and then (a rare poller: see `note_find`), and found datagrams:
    /// keep taking them until ENGINE_SPIN passes without one, instead of going back to sleep
    /// (on this kind of machine a wake-up costs more than the packets it serves, and a
    /// requester waiting for the acknowledgements waits for it). Answers left over are served
    /// in between. Returns to the loop when a timer is due, a region was invalidated, an
    /// application thread polls, the engine stops, or after ENGINE_SPIN_MAX in all. Returns
    /// the packets handled.
    pub(super) fn spin_receive(&self, rx: &mut RxState) -> usize {
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
                || self.last_poll.load(Ordering::Relaxed) > start
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
}

/// Start the engine thread.
pub fn spawn(engine: Arc<Engine>) -> io::Result<std::thread::JoinHandle<()>> {
    crate::thread::spawn("softrdma-engine", move || engine.run())
}
