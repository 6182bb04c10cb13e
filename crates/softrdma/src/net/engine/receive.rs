//! The receive side of the engine: progress calls, batches of datagrams from the socket, ICRC
//! verification (with IPv4-identification solving), demultiplexing to QPs and the peer check.

use super::*;

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
        let now = self.polled_at(active);
        let Ok(mut rx) = self.rx.try_lock() else {
            return 0;
        };
        // A thread about to sleep holds back no acknowledgement: nobody might send it for a
        // while.
        let defer_acks = self.mode == PollMode::BusyPoll && active;
        let mut done = self.receive_at(&mut rx, defer_acks, active, now);
        // Active pollers also fire due timers, so that the engine thread can stay asleep
        // instead of preempting them; what is queued goes first (`drain_before_timers`).
        let scan = timers || now >= self.next_timer.load(Ordering::Relaxed);
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
            (!rx.work.pending.is_empty()).then_some(rx.work.pending_due)
        };
        let next = match (timers, acks) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
        (done, next)
    }

    /// A poll that found completions waiting (busy-poll mode): it takes them without a
    /// receive (a system call that would only delay them; the next poll that finds the CQ
    /// empty receives), but counts as a poll all the same: an `active` poller keeps the engine
    /// thread off the receive path, and posts left for a poll are sent.
    pub fn polled(&self, active: bool) {
        self.polled_at(active);
    }

    /// What every poll does before it receives ([`Engine::polled`]); returns the clock read.
    fn polled_at(&self, active: bool) -> u64 {
        // The poller counts as active even when it finds the receive path taken: otherwise an
        // engine thread that stepped in while pollers were quiet would keep it (and compete
        // with spinning pollers for the cores) for as long as they keep finding it taken.
        let now = self.now();
        if active {
            self.poller_active(now);
            self.last_progress.store(now, Ordering::Relaxed);
        }
        if self.has_pending_transmit() {
            self.serve_pending_transmit();
        }
        now
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
            self.flush_pending_at(rx, true, now);
        }
        let mut done = 0;
        let mut now = now;
        for round in 0..8 {
            let n = match self.port.recv(&mut rx.batch) {
                Ok(n) => n,
                Err(_) => break,
            };
            if n == 0 {
                break;
            }
            self.counters
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
                    done += self.handle_datagram(now, &d, &mut rx.work);
                }
            }
            if !defer_acks {
                self.flush_pending(rx, true);
            }
            if n < RX_BATCH {
                break;
            }
        }
        if defer_acks {
            // Busy-poll mode: a due acknowledgement goes out from a poll that found nothing,
            // in time the poller would spin away anyway. A poll that found packets hands them
            // to the application first (a system call ahead of them delays what it waits
            // for); in a stream that never leaves the socket empty, acknowledgements go out
            // once overdue by another ACK_DELAY.
            let slack = if done > 0 { ACK_DELAY } else { 0 };
            self.flush_pending_at(rx, false, now.saturating_sub(slack));
        }
        if done > 0 {
            self.counters
                .rx_packets
                .fetch_add(done as u64, Ordering::Relaxed);
        }
        done
    }

    /// Handle one datagram as if the socket had just delivered it from `d.src` at `now`:
    /// verification, demultiplexing, the peer check and the transport, as for a datagram
    /// received; acknowledgements go out at the end, as in blocking mode. The receive path
    /// without the socket, for tests and fuzzing. Returns the packets the datagram held.
    pub fn handle_received(&self, now: u64, d: &Received<'_>) -> usize {
        let mut rx = self.rx.lock().unwrap_or_else(|e| e.into_inner());
        self.counters.rx_datagrams.fetch_add(1, Ordering::Relaxed);
        let done = self.handle_datagram(now, d, &mut rx.work);
        self.flush_pending_at(&mut rx, true, now);
        self.counters
            .rx_packets
            .fetch_add(done as u64, Ordering::Relaxed);
        done
    }

    /// Verify a received packet's ICRC ([`Packet::parse_verified_solving`]): softrdma senders
    /// use identification 0 for a lone packet and k for the k-th segment of a GSO datagram,
    /// tried first (a full 32-bit check); a third-party sender's (Linux rxe numbers its
    /// datagrams) is solved for, leaving 16 check bits, and counted in `rx_icrc_solved`.
    ///
    /// Returns the packet with the IPv4 identification its ICRC was computed with (0 for
    /// IPv6).
    pub fn verify<'a>(
        &self,
        src: SocketAddr,
        k: usize,
        seg: &'a [u8],
        deltas: &mut IdDeltas,
        prefix: &mut Option<(SocketAddr, IcrcPrefix)>,
    ) -> Option<(Packet<'a>, u16)> {
        // The covered headers of the last sender's packets, computed once per sender.
        let base = match prefix {
            Some((s, p)) if *s == src => *p,
            _ => {
                let ip = match (src.ip(), self.local_ip) {
                    (IpAddr::V4(s), IpAddr::V4(d)) => IpHeader::V4 {
                        src: s,
                        dst: d,
                        id: 0,
                        dont_fragment: true,
                    },
                    (IpAddr::V6(s), IpAddr::V6(d)) => IpHeader::V6 { src: s, dst: d },
                    _ => {
                        self.counters.rx_bad.fetch_add(1, Ordering::Relaxed);
                        return None;
                    }
                };
                let p = IcrcPrefix::new(IcrcContext {
                    ip,
                    src_port: src.port(),
                    dst_port: self.port.local_addr().port(),
                });
                *prefix = Some((src, p));
                p
            }
        };
        match Packet::parse_verified_solving(&base, (k & 0xffff) as u16, seg, deltas) {
            Ok((p, id, solved)) => {
                if solved {
                    self.counters.rx_icrc_solved.fetch_add(1, Ordering::Relaxed);
                }
                Some((p, id))
            }
            Err(_) => {
                self.counters.rx_bad.fetch_add(1, Ordering::Relaxed);
                None
            }
        }
    }

    /// Handle the packets of one received datagram; returns how many it held. Its segments
    /// usually belong to one QP, which stays locked across them and is driven once, after
    /// the last of them; a plain acknowledgement it produces is held (the QP joins
    /// `w.pending`).
    pub(super) fn handle_datagram(&self, now: u64, d: &Received<'_>, w: &mut RxWork) -> usize {
        let mut done = 0;
        let mut segs = d.segments().enumerate();
        // A verified packet for another QP than the one just handled, with its segment's
        // length and IPv4 identification.
        let mut carry: Option<(Packet<'_>, usize, u16)> = None;
        loop {
            let (pkt, len, id) = match carry.take() {
                Some(c) => c,
                None => {
                    let Some((k, seg)) = segs.next() else { break };
                    done += 1;
                    match self.verify(d.src, k, seg, &mut w.deltas, &mut w.icrc) {
                        Some((p, id)) => (p, seg.len(), id),
                        None => continue,
                    }
                }
            };
            let qpn = pkt.hdr.bth.dest_qp;
            let Some(cell) = self.find_qp(qpn, &mut w.last_qp) else {
                continue;
            };
            let mut body = cell.lock();
            // A UD QP takes datagrams from anyone (the Q_Key is its filter); a connected one
            // only from its peer.
            let ud = cell.qp_type == QpType::Ud;
            if !ud
                && (body.peer.map(|p| p.ip()) != Some(d.src.ip())
                    || body.peer_src_port.is_some_and(|p| p != d.src.port()))
            {
                self.counters.rx_wrong_peer.fetch_add(1, Ordering::Relaxed);
                continue;
            }
            // Not latched yet: the first datagram whose packets the transport accepts as
            // progress names the peer's source port.
            let mark = (!ud && body.peer_src_port.is_none()).then(|| body.qp.progress_mark());
            let from = |len, id| ud.then(|| self.source_of(d.src, len, id));
            self.handle_packet(now, &cell, &mut body, &pkt, from(len, id).as_ref());
            for (k, seg) in segs.by_ref() {
                done += 1;
                let Some((p, id)) = self.verify(d.src, k, seg, &mut w.deltas, &mut w.icrc) else {
                    continue;
                };
                if p.hdr.bth.dest_qp != qpn {
                    carry = Some((p, seg.len(), id));
                    break;
                }
                self.handle_packet(now, &cell, &mut body, &p, from(seg.len(), id).as_ref());
            }
            if mark.is_some_and(|m| m != body.qp.progress_mark()) {
                body.peer_src_port = Some(d.src.port());
            }
            let due = self.drive_inner(&cell, &mut body, now, true);
            drop(body);
            if let Some(t) = due {
                w.pending_due = w.pending_due.min(t);
                if !w.pending.iter().any(|c| c.qpn == cell.qpn) {
                    w.pending.push(cell);
                }
            }
        }
        done
    }

    /// The QP with this number (counted when there is none): `last` when it is that QP and
    /// the table has not changed since it was looked up.
    pub(super) fn find_qp(
        &self,
        qpn: u32,
        last: &mut Option<(u64, Arc<QpCell>)>,
    ) -> Option<Arc<QpCell>> {
        if let Some((generation, cell)) = last.as_ref()
            && cell.qpn == qpn
            && *generation == self.qp_gen.load(Ordering::Acquire)
        {
            return Some(Arc::clone(cell));
        }
        let qps = self.qps.read().unwrap_or_else(|e| e.into_inner());
        let generation = self.qp_gen.load(Ordering::Acquire);
        let Some(cell) = qps.get(&qpn).cloned() else {
            drop(qps);
            self.counters.rx_unknown_qp.fetch_add(1, Ordering::Relaxed);
            return None;
        };
        drop(qps);
        *last = Some((generation, Arc::clone(&cell)));
        Some(cell)
    }

    /// Where a datagram from `src` came from, as its IP header said: a UD receive's GRH area.
    /// `len` is the packet's UDP payload length, `id` its IPv4 identification.
    fn source_of(&self, src: SocketAddr, len: usize, id: u16) -> crate::rc::DatagramSource {
        let ip = match (src.ip(), self.local_ip) {
            (IpAddr::V4(s), IpAddr::V4(d)) => IpHeader::V4 {
                src: s,
                dst: d,
                id,
                dont_fragment: true,
            },
            (s, d) => IpHeader::V6 {
                src: ipv6_of(s),
                dst: ipv6_of(d),
            },
        };
        crate::rc::DatagramSource {
            ip,
            udp_payload_len: len,
        }
    }

    /// Hand one verified packet to its (locked) QP; `from` says where it came from (UD).
    pub(super) fn handle_packet(
        &self,
        now: u64,
        cell: &QpCell,
        body: &mut QpBody,
        pkt: &Packet<'_>,
        from: Option<&crate::rc::DatagramSource>,
    ) {
        match &cell.srq {
            Some(s) => {
                let mut srq = s.srq.lock().unwrap_or_else(|e| e.into_inner());
                body.qp
                    .handle_packet_from(now, pkt, from, &*self.mem, Some(&mut srq));
                let fired = srq.take_limit_event().then(|| srq.id());
                drop(srq);
                if let Some(id) = fired {
                    s.limit_reached(id);
                }
            }
            None => body.qp.handle_packet_from(now, pkt, from, &*self.mem, None),
        }
    }
}

fn ipv6_of(ip: IpAddr) -> std::net::Ipv6Addr {
    match ip {
        IpAddr::V4(v4) => v4.to_ipv6_mapped(),
        IpAddr::V6(v6) => v6,
    }
}
