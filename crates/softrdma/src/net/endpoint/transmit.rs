//! The send side of the endpoint: driving a QP's transport into its transmit batch
//! (requests, answers a budget at a time, held acknowledgements), the pending-transmit queue,
//! moving completions to the CQs, and the ICRC fix-ups of GSO segments.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::Ordering;

use super::{ACK_DELAY, Endpoint, EndpointIo, QpBody, QpCell, RESPONSE_BUDGET, RxWork};
use crate::mem::MemoryTable;
use crate::net::udp::TxBatch;
use crate::params::{ACK_GRACE, INBOX_ROUNDS};
use crate::rc::QpType;
use crate::wire::{ICRC_LEN, IdDeltas};

impl Endpoint {
    /// Transmit whatever `cell`'s transport has ready (answers up to [`RESPONSE_BUDGET`], the
    /// rest later from the pending-transmit queue) and move its completions to the CQs.
    /// Called with the QP locked, after every post, packet and timeout.
    pub fn drive(&self, cell: &Arc<QpCell>, body: &mut QpBody, now: u64, io: &impl EndpointIo) {
        self.drive_inner(cell, body, now, false, io);
    }

    /// [`Engine::drive`]; with `defer_acks`, plain acknowledgements are held back (the
    /// newest replacing older ones) to go out after ACK_DELAY, which keeps an
    /// acknowledgement's system call off a busy poller's critical path. Returns when the
    /// held acknowledgement, if any, is due.
    pub(super) fn drive_inner(
        &self,
        cell: &Arc<QpCell>,
        body: &mut QpBody,
        now: u64,
        defer_acks: bool,
        io: &impl EndpointIo,
    ) -> Option<u64> {
        body.deferred = 0;
        // A UD QP has no peer: each datagram goes where its work request says.
        let dst = body.peer;
        // Requests posted through the inbox while this drive sent go out with it, not at the
        // QP's next event (a few rounds at most; later ones wait for the poster's hand-over,
        // `Engine::inbox_posted`).
        for _ in 0..INBOX_ROUNDS {
            self.absorb_inbox(cell, body);
            if dst.is_none() && cell.qp_type != QpType::Ud {
                break;
            }
            // A held acknowledgement stays held through this drive's requests, and so does a
            // new one in busy-poll mode.
            let hold = defer_acks || body.held_ack.since.is_some();
            if body.held_ack.early() && body.qp.has_request_work() {
                body.held_ack.posted();
            }
            let sent = self.build(body, dst, now, hold, io);
            // Requests and answers go first. Outside packet handling (a post, a timer), a
            // held ACK goes out behind them in the same system call, as the last (shorter)
            // GSO segment of their datagram where GSO is on: the peer may be waiting for it (a
            // signaled send completes only with it), and the request it follows is already on
            // its way; one datagram through both kernels' stacks costs less than two (a
            // ping-pong whose every WRITE is signaled, as perftest's: 7.5 -> 6.5-6.8 us
            // typical). Never from packet handling: the next progress call sends a due one,
            // after the application has seen what arrived.
            if !defer_acks && body.held_ack.since.is_some() && (sent > 0 || body.held_ack.due(now))
            {
                self.build(body, dst, now, false, io);
            }
            self.flush(&mut body.tx, io);
            body.held_ack.note(body.qp.holds_ack(), now);
            self.queue_if_left(cell, body, io);
            if cell.inbox_len() == 0 {
                break;
            }
        }
        self.drain_completions(cell, body);
        self.publish_deadline(cell, body, io);
        body.held_ack.due_at()
    }

    /// Build everything the QP has ready for `dst` into its batch (sending full batches),
    /// leaving a lone positive acknowledgement queued with `hold_ack`; the caller flushes.
    /// Without `dst` (UD), each datagram goes where its work request says. Returns the
    /// packets built.
    fn build(
        &self,
        body: &mut QpBody,
        dst: Option<SocketAddr>,
        now: u64,
        hold_ack: bool,
        io: &impl EndpointIo,
    ) -> usize {
        let QpBody {
            qp,
            tx,
            gather,
            deltas,
            ..
        } = body;
        let mut built_n = 0;
        let mut answers = 0;
        let mut zero_copy = 0;
        let max = qp.max_packet_len();
        let mem: &MemoryTable = &self.mem;
        // Payloads lent in an earlier run are lent again (the region may have changed since).
        gather.forget_anchor();
        loop {
            // A transmit poll that cannot produce anything costs as much as one that does
            // (it runs cold, after the kernel's receive path, on a latency's critical path).
            // Answers first, up to the budget; requests are bounded by the send window.
            // A lone acknowledgement held back is no answer to build (a transmit poll that
            // holds it produces nothing: 80 ns on each side of a ping-pong whose every SEND
            // asks for an ACK, twice a round).
            let answer = answers < RESPONSE_BUDGET
                && qp.has_response_work()
                && !(hold_ack && qp.holds_ack());
            if !answer && !qp.has_request_work() {
                break;
            }
            let Some(to) = dst.or_else(|| qp.next_datagram_dest().map(|av| av.dest())) else {
                break;
            };
            let v4 = to.is_ipv4();
            if !tx.has_room(max) {
                self.flush(tx, io);
            }
            // Request and READ response payloads from memory the device keeps alive are
            // lent, not copied: the kernel copies them from the region during the send.
            let built = tx.push_packet_gather(to, max, gather, |buf, g| {
                if answers < RESPONSE_BUDGET {
                    qp.poll_transmit_gather(now, mem, buf, g, hold_ack)
                } else {
                    qp.poll_request_gather(now, mem, buf, g)
                }
                .unwrap_or(0)
            });
            match built {
                Some((0, _, _)) => break,
                Some((wire, n, k)) => {
                    built_n += 1;
                    answers += usize::from(answer);
                    zero_copy += usize::from(wire > n);
                    if k > 0 && v4 {
                        fix_icrc_for_id(deltas, tx.last_packet_mut(n), wire, k);
                    }
                }
                None => {
                    if tx.is_empty() {
                        break; // cannot happen: an empty batch has room for a packet
                    }
                    self.flush(tx, io);
                }
            }
        }
        if zero_copy > 0 {
            self.counters
                .tx_zero_copy
                .fetch_add(zero_copy as u64, Ordering::Relaxed);
        }
        built_n
    }

    /// Answers left over (a drive spent its budget): the engine serves them later.
    fn queue_if_left(&self, cell: &Arc<QpCell>, body: &mut QpBody, io: &impl EndpointIo) {
        if body.qp.has_response_work() && !body.qp.holds_ack() && !body.tx_queued {
            body.tx_queued = true;
            self.queue_transmit(cell, io);
        }
    }

    /// Put a QP with answers left over into the pending-transmit queue, and wake the driver
    /// if it may be asleep (the queue was empty).
    fn queue_transmit(&self, cell: &Arc<QpCell>, io: &impl EndpointIo) {
        let mut q = self.tx_pending.lock().unwrap_or_else(|e| e.into_inner());
        q.push_back(Arc::clone(cell));
        let was_empty = self.tx_pending_len.fetch_add(1, Ordering::Release) == 0;
        drop(q);
        if was_empty {
            io.wake();
        }
    }

    /// Put a QP whose posts wait for their doorbell into the pending-transmit queue (once),
    /// counting the post in `posts_deferred`; the driver sends them on its next pass
    /// ([`Engine::post_done`](crate::net::Engine::post_done) decides when a post waits).
    pub fn defer_post(&self, cell: &Arc<QpCell>, body: &mut QpBody) {
        body.deferred += 1;
        self.counters.posts_deferred.fetch_add(1, Ordering::Relaxed);
        if !body.tx_queued {
            body.tx_queued = true;
            let mut q = self.tx_pending.lock().unwrap_or_else(|e| e.into_inner());
            q.push_back(Arc::clone(cell));
            self.tx_pending_len.fetch_add(1, Ordering::SeqCst);
        }
    }

    /// Put a QP whose inbox holds requests that nobody drove into the pending-transmit queue
    /// (once), and wake the driver if it may be asleep: the poster could not take the QP, and
    /// its holder may have unlocked it without seeing them.
    pub fn queue_inbox(&self, cell: &Arc<QpCell>, io: &impl EndpointIo) {
        if !cell.inbox_queued.swap(true, Ordering::SeqCst) {
            self.queue_transmit(cell, io);
        }
    }

    /// QPs waiting in the pending-transmit queue.
    pub fn pending_transmit_len(&self) -> usize {
        self.tx_pending_len.load(Ordering::SeqCst)
    }

    /// True when QPs wait in the pending-transmit queue.
    pub fn has_pending_transmit(&self) -> bool {
        self.tx_pending_len.load(Ordering::Acquire) > 0
    }

    /// Serve the pending-transmit queue once round: each QP queued now sends up to
    /// [`RESPONSE_BUDGET`] answers and goes to the back of the queue if it has more. A QP
    /// whose lock is taken (being driven elsewhere) waits for the next round. Returns the QPs
    /// served.
    pub fn serve_pending_transmit(&self, io: &impl EndpointIo) -> usize {
        let n = self.tx_pending_len.load(Ordering::Acquire);
        let mut served = 0;
        for _ in 0..n {
            let cell = {
                let mut q = self.tx_pending.lock().unwrap_or_else(|e| e.into_inner());
                let Some(c) = q.pop_front() else { break };
                self.tx_pending_len.fetch_sub(1, Ordering::Release);
                c
            };
            let mut body = match cell.try_lock() {
                Some(b) => b,
                None => {
                    let mut q = self.tx_pending.lock().unwrap_or_else(|e| e.into_inner());
                    q.push_back(Arc::clone(&cell));
                    self.tx_pending_len.fetch_add(1, Ordering::Release);
                    continue;
                }
            };
            body.tx_queued = false;
            cell.inbox_queued.store(false, Ordering::SeqCst);
            self.drive(&cell, &mut body, io.now(), io);
            served += 1;
        }
        served
    }

    /// Send the QP's held acknowledgement (and whatever else it has ready) now.
    fn release_ack(&self, body: &mut QpBody, now: u64, io: &impl EndpointIo) {
        if body.peer.is_some() {
            self.build(body, body.peer, now, false, io);
            self.flush(&mut body.tx, io);
        }
        body.held_ack.note(body.qp.holds_ack(), now);
        // Requests built with it arm the retransmission timer (the QP's own deadline is
        // published when it is unlocked).
        self.timers_changed(body.qp.poll_timeout(), io);
    }

    /// Move a QP's completions to its CQs without transmitting (after a post that cannot
    /// produce packets, such as a receive: acknowledgements waiting in the batch then still
    /// leave with the QP's next request).
    pub fn drain_completions(&self, cell: &QpCell, body: &mut QpBody) {
        // Work that invalidated a key completes only once every byte lent from its region has
        // been handed to the socket (this QP's batch is flushed before completions are
        // drained; another QP's, by the drive that built it, which needs no lock held here).
        while let Some(key) = body.qp.pop_invalidated() {
            self.mem.wait_unlent(key);
        }
        // The slots of completed requests are free before the application sees them complete
        // (its next post may go through the inbox).
        cell.sync_sq_slots(body);
        while let Some(wc) = body.qp.poll_send_completion() {
            cell.send_cq.push(wc);
        }
        while let Some(wc) = body.qp.poll_recv_completion() {
            cell.recv_cq.push(wc);
        }
    }

    /// Send the QP's held acknowledgement, and the one of requests executed without AckReq,
    /// now (before the QP goes away: its peer is waiting for them).
    pub fn flush_held(&self, body: &mut QpBody, io: &impl EndpointIo) {
        body.qp.ack_now();
        self.release_ack(body, io.now(), io);
    }

    /// Send held acknowledgements that are due (all of them with `all`); QPs still holding
    /// one stay on the list.
    pub fn flush_pending(&self, w: &mut RxWork, all: bool, io: &impl EndpointIo) {
        if !w.pending.is_empty() {
            self.flush_pending_at(w, all, io.now(), io);
        }
    }

    /// [`Endpoint::flush_pending`] at `now`.
    pub fn flush_pending_at(&self, w: &mut RxWork, all: bool, now: u64, io: &impl EndpointIo) {
        self.flush_held_for(w, if all { 0 } else { ACK_DELAY }, now, io);
    }

    /// An application's poll found nothing (busy-poll mode): send the acknowledgements held
    /// for at least their QP's grace ([`HeldAck::grace`](super::qp::HeldAck::grace), at
    /// least `ACK_GRACE`) at `now`, alone.
    pub fn flush_held_early(&self, w: &mut RxWork, now: u64, io: &impl EndpointIo) {
        self.flush_held_where(w, ACK_GRACE, true, now, io);
    }

    /// Send the acknowledgements held for at least `held` at `now` (ACK_DELAY: those due; 0:
    /// all); QPs still holding one stay on the list.
    pub fn flush_held_for(&self, w: &mut RxWork, held: u64, now: u64, io: &impl EndpointIo) {
        self.flush_held_where(w, held, false, now, io);
    }

    /// Send the acknowledgements held for at least `least` at `now` (`early`: for at least
    /// their QP's grace, which is never below `least`, and noted as sent early).
    fn flush_held_where(
        &self,
        w: &mut RxWork,
        least: u64,
        early: bool,
        now: u64,
        io: &impl EndpointIo,
    ) {
        // `pending_due` is the earliest hold's start plus ACK_DELAY.
        let earliest = w.pending_due.saturating_sub(ACK_DELAY);
        if w.pending.is_empty() || now.saturating_sub(earliest) < least {
            return;
        }
        let mut next = u64::MAX;
        w.pending.retain(|cell| {
            let mut body = cell.lock();
            let held = if early { body.held_ack.grace() } else { least };
            if body.held_ack.held_for(now, held) {
                let waiting = body.qp.requests_outstanding();
                self.release_ack(&mut body, now, io);
                if early {
                    body.held_ack.sent_early(waiting);
                }
                self.publish_deadline(cell, &body, io);
                self.queue_if_left(cell, &mut body, io);
            }
            next = next.min(body.held_ack.due_at().unwrap_or(u64::MAX));
            body.held_ack.since.is_some()
        });
        w.pending_due = next;
    }

    fn flush(&self, tx: &mut TxBatch, io: &impl EndpointIo) {
        if tx.is_empty() {
            return;
        }
        let (d, p) = (tx.len() as u64, tx.packets() as u64);
        match io.send(tx) {
            Ok(_) => {
                self.counters.tx_datagrams.fetch_add(d, Ordering::Relaxed);
                self.counters.tx_packets.fetch_add(p, Ordering::Relaxed);
            }
            Err(e) => {
                // Lost packets are recovered by the transport's retransmission.
                self.counters.tx_errors.fetch_add(1, Ordering::Relaxed);
                tracing::debug!("send failed: {e}");
            }
        }
    }
}

/// Give a packet of `wire` bytes (a whole UDP payload) the ICRC for IPv4 identification
/// `id`; `pkt` holds its last bytes, the ICRC among them (the packet's bytes in the transmit
/// arena: all of them, or the tail behind a lent payload).
pub fn fix_icrc_for_id(deltas: &mut IdDeltas, pkt: &mut [u8], wire: usize, id: u16) {
    let n = pkt.len();
    if n < ICRC_LEN || wire < n {
        return;
    }
    let d = deltas.for_len(wire - ICRC_LEN).delta(id);
    let mut c = [0u8; 4];
    c.copy_from_slice(&pkt[n - ICRC_LEN..]);
    let icrc = u32::from_le_bytes(c) ^ d;
    pkt[n - ICRC_LEN..].copy_from_slice(&icrc.to_le_bytes());
}
