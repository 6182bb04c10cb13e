//! The receive side of the endpoint: ICRC verification (with IPv4-identification solving),
//! demultiplexing to QPs and the peer check.

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::sync::atomic::Ordering;

use super::{Endpoint, EndpointIo, QpBody, QpCell, RxWork};
use crate::net::udp::Received;
use crate::rc::QpType;
use crate::wire::{IcrcContext, IcrcPrefix, IdDeltas, IpHeader, Packet};

impl Endpoint {
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
                let ip = match (src.ip(), self.local.ip()) {
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
                    dst_port: self.local.port(),
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
    pub fn handle_datagram(
        &self,
        now: u64,
        d: &Received<'_>,
        w: &mut RxWork,
        io: &impl EndpointIo,
    ) -> usize {
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
            let mut takes_recv = consumes_recv(&pkt);
            // Only an ACK sent early waits to learn whether the peer posts next.
            let early = body.held_ack.early();
            let mut request = early && is_request(&pkt);
            for (k, seg) in segs.by_ref() {
                done += 1;
                let Some((p, id)) = self.verify(d.src, k, seg, &mut w.deltas, &mut w.icrc) else {
                    continue;
                };
                if p.hdr.bth.dest_qp != qpn {
                    carry = Some((p, seg.len(), id));
                    break;
                }
                request |= early && is_request(&p);
                takes_recv |= consumes_recv(&p);
                self.handle_packet(now, &cell, &mut body, &p, from(seg.len(), id).as_ref());
            }
            w.warm_recv = takes_recv.then_some(qpn).or(w.warm_recv);
            if request {
                body.held_ack.peer_posted();
            }
            if mark.is_some_and(|m| m != body.qp.progress_mark()) {
                body.peer_src_port = Some(d.src.port());
            }
            let due = self.drive_inner(&cell, &mut body, now, true, io);
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

    /// Warm the cache for the receive buffer the next message of the QP that last took a
    /// receive will land in (see `RxWork::warm_recv`), once: a poll that found nothing calls
    /// it, in time the poller would spin away anyway. Applications rotate through pools of
    /// receive buffers (UCX and libfabric's RxM post thousands), each one cold in the cache
    /// by its turn: the first store of a message's payload into it stalled the next locked
    /// instruction about 190 ns on the receive path, every message, where a NIC's DMA costs
    /// the CPU nothing. Locks that are taken are not waited for (the hint is dropped).
    pub fn warm_next_recv(&self, w: &mut RxWork) {
        let Some(qpn) = w.warm_recv.take() else {
            return;
        };
        let Some(cell) = self.find_qp(qpn, &mut w.last_qp) else {
            return;
        };
        let Some(body) = cell.try_lock() else {
            return;
        };
        let next = match &cell.srq {
            Some(s) => match s.srq.try_lock() {
                Ok(srq) => body.qp.next_recv_buffer(Some(&srq)),
                Err(_) => None,
            },
            None => body.qp.next_recv_buffer(None),
        };
        drop(body);
        if let Some((actx, sge)) = next {
            crate::mem::MemoryAccess::warm(
                &*self.mem,
                actx,
                sge.lkey,
                sge.addr,
                u64::from(sge.length),
            );
        }
    }

    /// The QP with this number (counted when there is none): `last` when it is that QP and
    /// the table has not changed since it was looked up.
    fn find_qp(&self, qpn: u32, last: &mut Option<(u64, Arc<QpCell>)>) -> Option<Arc<QpCell>> {
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
        let ip = match (src.ip(), self.local.ip()) {
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
    pub fn handle_packet(
        &self,
        now: u64,
        cell: &QpCell,
        body: &mut QpBody,
        pkt: &Packet<'_>,
        from: Option<&crate::rc::DatagramSource>,
    ) {
        // Completions of the datagram's earlier packets go to the CQ before they could make
        // this one look refused: an SRQ's QP holds only one between drives, and a datagram
        // may carry several messages (a GSO train of small SENDs).
        if body.qp.recv_completions_full() {
            self.drain_completions(cell, body);
        }
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

/// A packet a requester sends (the peer posted something), not an answer.
fn is_request(p: &Packet<'_>) -> bool {
    p.hdr.bth.opcode.info().is_some_and(|i| i.is_request())
}

/// A packet that takes a receive (a SEND, a WRITE with immediate).
fn consumes_recv(p: &Packet<'_>) -> bool {
    p.hdr.bth.opcode.info().is_some_and(|i| i.consumes_recv())
}
