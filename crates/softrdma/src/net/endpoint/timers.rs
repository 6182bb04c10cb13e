//! The timer scan: every QP publishes its transport's next deadline when it is unlocked, and
//! the device keeps the earliest, so that a wake-up for a packet costs nothing per QP and a
//! scan runs only once a deadline is due.

use std::sync::atomic::Ordering;

use super::{Endpoint, EndpointIo, QpBody, QpCell, TIMER_SCAN, TIMER_SLACK_PER_QP};

impl Endpoint {
    /// Fire due timers of every QP; returns the earliest deadline still pending.
    pub fn run_timers(&self, io: &impl EndpointIo) -> Option<u64> {
        let mut next: Option<u64> = None;
        // QP bodies are locked under the table's read lock; no path takes the table's write
        // lock while holding a body, so this cannot deadlock.
        let qps = self.qps.read().unwrap_or_else(|e| e.into_inner());
        let now = io.now();
        self.counters.timer_scans.fetch_add(1, Ordering::Relaxed);
        // Deadlines armed from now on lower this again (after publishing their QP's, which
        // this scan then sees, or lowering it after this store): none is lost.
        self.next_timer.store(u64::MAX, Ordering::SeqCst);
        for cell in qps.values() {
            // Most QPs are not due: their published deadline says so without their lock.
            let d = cell.deadline();
            if d > now {
                if d != u64::MAX {
                    next = Some(next.map_or(d, |n: u64| n.min(d)));
                }
                continue;
            }
            // A due QP whose lock is held is being worked on (a post or a packet): its timers
            // are looked at again shortly rather than making this thread wait for it.
            let Some(mut body) = cell.try_lock() else {
                next = Some(next.map_or(now + 1_000_000, |n: u64| n.min(now + 1_000_000)));
                continue;
            };
            if let Some(t) = body.qp.poll_timeout()
                && t <= now
            {
                body.qp.handle_timeout(now);
                self.drive(cell, &mut body, now, io);
            }
            if let Some(t) = body.qp.poll_timeout() {
                next = Some(next.map_or(t, |n: u64| n.min(t)));
            }
        }
        // A scan costs every QP of the device: the next one waits at least as long as this
        // one took per QP (TIMER_SLACK_PER_QP each), so that thousands of QPs whose timers
        // fall due one after another (a burst posted at once) do not make every wake-up a
        // scan. A timer fires at most that much late (0.8 ms with 16,000 QPs).
        let slack = now + qps.len() as u64 * TIMER_SLACK_PER_QP;
        let next = next.map(|t| t.max(slack));
        // A scan by a poller may find a deadline earlier than the one the driver sleeps for:
        // that wakes it (the driver's own scans find its watch cleared).
        self.timers_changed(Some(next.unwrap_or(now + TIMER_SCAN)), io);
        next
    }

    /// When the QPs' timers are next looked at (engine clock). A sequentially consistent
    /// load (a plain load on x86-64): a driver that publishes when it sleeps until, then
    /// reads this, sees every deadline lowered before the publish, or is told of it.
    pub fn next_timer(&self) -> u64 {
        self.next_timer.load(Ordering::SeqCst)
    }

    /// Note that a QP's timers changed (a post or a packet may arm one): the next progress
    /// call looks at them, and a driver asleep past the new deadline is told.
    pub fn timers_changed(&self, deadline: Option<u64>, io: &impl EndpointIo) {
        let Some(t) = deadline else { return };
        if t >= self.next_timer.load(Ordering::Relaxed) {
            return;
        }
        if t < self.next_timer.fetch_min(t, Ordering::SeqCst) {
            io.deadline_lowered(t);
        }
    }

    /// Publish a QP's next deadline (for the timer scan) and lower the device's.
    pub(super) fn publish_deadline(&self, cell: &QpCell, body: &QpBody, io: &impl EndpointIo) {
        let t = body.qp.poll_timeout();
        cell.deadline.store(t.unwrap_or(u64::MAX), Ordering::SeqCst);
        self.timers_changed(t, io);
    }
}
