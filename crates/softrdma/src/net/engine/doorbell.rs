//! Posts left for a poll: in busy-poll mode, one-sided posts to a QP with packets in flight
//! wait for the poster's next poll (the doorbell of a NIC that batches them), and the engine
//! thread watches for posters that stop polling.

use std::sync::Arc;
use std::sync::atomic::Ordering;

use super::{DOORBELL_MAX, Engine, POLLER_ACTIVE, PollMode};
use crate::net::endpoint::{QpBody, QpCell};

impl Engine {
    /// Work requests were just posted to the (locked) QP: transmit them, or, in busy-poll
    /// mode while the QP has packets in flight and the application polls, leave them for its
    /// next poll (the doorbell of a NIC that batches them), up to `DOORBELL_MAX` posts. An
    /// application that posts one request per call in a poll loop (perftest, UCX) so sends
    /// them several to a system call instead of one. A post that `consumes_receive` (a SEND,
    /// a WRITE with immediate) waits only when it is not the first on the QP since the last
    /// poll: a burst of them leaves together (UCX's rendezvous requests, one SEND per call,
    /// went out at one system call each, about 4 us apart across two hosts, while the READs
    /// they asked for waited), while a ping-pong's answer, posted right after the poll that
    /// brought the question, goes out at once (fi_pingpong over RxM: 64 KiB 37 -> 41 us per
    /// transfer when it waited for the next poll). The peer takes such a burst as it takes
    /// datagrams queued on its socket (a QP of an SRQ all of them: `recv_completions_full`).
    /// The QP joins the endpoint's pending-transmit queue, which every poll serves first.
    ///
    /// Returns true when the caller must kick the engine thread
    /// ([`Engine::kick_for_doorbell`]) once it has unlocked the QP: the thread then looks at
    /// the queue every DOORBELL_GRACE (doubling up to DOORBELL_NAP_MAX while posts keep being
    /// left and polled) until it is empty and no post was left since (posts meanwhile do not
    /// wake it again), and sends what is left once no application thread has polled for
    /// DOORBELL_GRACE, so that an application that stops polling (waiting on memory for the
    /// peer's answer) is not left waiting for its requests.
    #[must_use]
    pub fn post_done(
        &self,
        cell: &Arc<QpCell>,
        body: &mut QpBody,
        now: u64,
        consumes_receive: bool,
    ) -> bool {
        self.note_post();
        // Another post to this QP since the last poll: a burst.
        let burst = body.last_post > self.last_poll.load(Ordering::Relaxed);
        body.last_post = now;
        if self.mode == PollMode::BusyPoll
            && (burst || !consumes_receive)
            && body.deferred < DOORBELL_MAX
            && body.peer.is_some()
            && body.qp.requests_outstanding()
            && !self.quiet_for(now, POLLER_ACTIVE)
        {
            self.ep.defer_post(cell, body);
            // The engine thread already watches the queue, or is to be woken to watch it.
            return !self.doorbell_watch.swap(true, Ordering::SeqCst);
        }
        self.drive(cell, body, now);
        false
    }

    /// `n` send work requests were posted through `cell`'s inbox (another thread held the QP;
    /// see `net::endpoint::inbox`): drive the QP now if it is free; else its holder sends them
    /// before it lets go (every drive takes the inbox in), and the pending-transmit queue gets
    /// the QP in case the holder had looked already.
    pub fn inbox_posted(&self, cell: &Arc<QpCell>, n: usize) {
        self.ep
            .counters
            .posts_inboxed
            .fetch_add(n as u64, Ordering::Relaxed);
        self.note_post();
        if let Some(mut body) = cell.try_lock() {
            self.drive(cell, &mut body, self.now());
            return;
        }
        self.ep.queue_inbox(cell, self);
    }

    /// Wake the engine thread for posts left for a poll ([`Engine::post_done`] said so).
    pub fn kick_for_doorbell(&self) {
        self.kick_thread();
    }

    /// The engine thread's look at posts left for a poll: true while they are waiting or were
    /// left since its last look (`seen`: the count of posts left then; it keeps watching),
    /// false once the queue is empty and no post was left since (the next post left wakes it
    /// again). A queue the poller keeps emptying is watched without a kick per burst.
    pub(super) fn doorbell_watch_on(&self, seen: &mut u64) -> bool {
        if !self.doorbell_watch.load(Ordering::SeqCst) {
            return false;
        }
        let left = self.ep.counters.posts_deferred.load(Ordering::Relaxed);
        if self.ep.pending_transmit_len() > 0 || left != *seen {
            *seen = left;
            return true;
        }
        self.doorbell_watch.store(false, Ordering::SeqCst);
        // A post left between the look and the store saw the watch on and did not kick: take
        // the watch back (if another post kicked meanwhile, the kick brings the thread back).
        self.ep.pending_transmit_len() > 0 && !self.doorbell_watch.swap(true, Ordering::SeqCst)
    }
}
