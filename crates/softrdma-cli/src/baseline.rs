//! The raw UDP baseline that softrdma's benchmarks compare against, measured in the same run:
//! the same socket set-up, batching (`sendmmsg`/`recvmmsg`), UDP GSO and GRO as softrdma's
//! datapath, with no transport on top.
//!
//! * `bw`: a sender blasts messages of `size` bytes (as GSO datagrams of `segment`-byte
//!   packets) at a receiver for `secs` seconds; the receiver's goodput is the figure.
//! * `lat`: ping-pong of `size`-byte datagrams, both sides busy-polling non-blocking sockets;
//!   reports half the round trip, as perftest does. With a trailer (`lat_with`), each datagram
//!   also carries a second, shorter GSO segment: the shape of a datagram that carries a held
//!   acknowledgement behind a request, so the kernel's price of that second packet can be
//!   measured apart from any transport.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use softrdma::net::udp::MAX_DATAGRAM;
use softrdma::net::{PortOptions, RxBatch, TxBatch, UdpPort};

type Res<T> = Result<T, Box<dyn std::error::Error>>;

fn port(addr: SocketAddr) -> Res<UdpPort> {
    Ok(UdpPort::bind(
        addr,
        PortOptions {
            buffer_bytes: 8 << 20,
            gro: true,
            nonblocking: true,
        },
    )?)
}

/// Receiver goodput in MB/s of `size`-byte messages sent as GSO datagrams of `segment`-byte
/// packets for `secs` seconds, sender and receiver in two threads.
pub fn bw(size: usize, segment: usize, secs: f64) -> Res<f64> {
    let rx = port("127.0.0.2:0".parse()?)?;
    let tx = port("127.0.0.1:0".parse()?)?;
    let dst = rx.local_addr();
    let dur = Duration::from_secs_f64(secs);
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let stop2 = stop.clone();
    let sender = std::thread::spawn(move || -> usize {
        let per_dgram = (MAX_DATAGRAM / segment).min(64) * segment;
        let mut batch = TxBatch::new(16, 16 * MAX_DATAGRAM);
        let msg = vec![0xa5u8; size];
        let mut sent = 0;
        while !stop2.load(std::sync::atomic::Ordering::Relaxed) {
            for chunk in msg.chunks(per_dgram) {
                if !batch.push(dst, chunk, segment as u16) {
                    let _ = tx.send(&mut batch);
                    batch.push(dst, chunk, segment as u16);
                }
            }
            if batch.len() >= 8 {
                let _ = tx.send(&mut batch);
            }
            sent += size;
        }
        sent
    });
    let mut batch = RxBatch::new(32, MAX_DATAGRAM);
    let mut got = 0usize;
    let t0 = Instant::now();
    let mut first: Option<Instant> = None;
    while t0.elapsed() < dur {
        if let Ok(n) = rx.recv(&mut batch) {
            first.get_or_insert_with(Instant::now);
            for i in 0..n {
                if let Some(d) = batch.get(i) {
                    got += d.data.len();
                }
            }
        } else {
            std::hint::spin_loop();
        }
    }
    let secs = first.map_or(secs, |f| f.elapsed().as_secs_f64());
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let _ = sender.join();
    Ok(got as f64 / secs / 1e6)
}

/// One-way latencies of a ping-pong, in microseconds (half the round trip, as perftest
/// reports).
#[derive(Clone, Copy, Debug)]
pub struct Lat {
    /// Fastest.
    pub min: f64,
    /// Median: the figure compared against.
    pub median: f64,
    /// Mean.
    pub avg: f64,
    /// 99th percentile.
    pub p99: f64,
}

/// One-way latencies (half the round trip) of `size`-byte datagrams, ping-pong between two
/// busy-polling threads, `iters` round trips.
pub fn lat(size: usize, iters: usize) -> Res<Lat> {
    lat_with(size, 0, iters)
}

/// Length of an RC acknowledgement packet (BTH, AETH, ICRC): the trailer that gives
/// `lat_with` the shape of a datagram carrying a held acknowledgement.
pub const ACK_PACKET_LEN: usize = softrdma::wire::Bth::<&[u8]>::LEN
    + softrdma::wire::Aeth::<&[u8]>::LEN
    + softrdma::wire::ICRC_LEN;

/// Like `lat`, but when `trailer` is not 0 every datagram is a GSO datagram of two segments:
/// the `size`-byte message and a `trailer`-byte packet behind it (at most `size` bytes: a GSO
/// datagram's last segment may be shorter than the others, not longer).
pub fn lat_with(size: usize, trailer: usize, iters: usize) -> Res<Lat> {
    if trailer > size {
        return Err(
            format!("a trailer of {trailer} bytes is longer than the {size}-byte message").into(),
        );
    }
    let total = size + trailer;
    if total > MAX_DATAGRAM {
        return Err(format!("{total} bytes do not fit a datagram").into());
    }
    // A segment size of 0 sends a plain datagram; `size` cuts the trailer off as a segment.
    let segment = if trailer == 0 { 0 } else { size as u16 };
    let a = port("127.0.0.1:0".parse()?)?;
    let b = port("127.0.0.2:0".parse()?)?;
    let (aa, ba) = (a.local_addr(), b.local_addr());
    let echo = std::thread::spawn(move || {
        let mut rx = RxBatch::new(4, MAX_DATAGRAM);
        let mut tx = TxBatch::new(1, MAX_DATAGRAM);
        let deadline = Instant::now() + Duration::from_secs(60);
        let mut n = 0;
        while n < iters && Instant::now() < deadline {
            if let Ok(k) = b.recv(&mut rx) {
                for i in 0..k {
                    if let Some(d) = rx.get(i) {
                        tx.push(aa, d.data, segment);
                        n += 1;
                    }
                }
                let _ = b.send(&mut tx);
            }
        }
    });
    let msg = vec![1u8; total];
    let mut rx = RxBatch::new(4, MAX_DATAGRAM);
    let mut tx = TxBatch::new(1, MAX_DATAGRAM);
    let mut rtts = Vec::with_capacity(iters);
    let deadline = Instant::now() + Duration::from_secs(60);
    for _ in 0..iters {
        let t0 = Instant::now();
        tx.push(ba, &msg, segment);
        a.send(&mut tx)?;
        loop {
            if let Ok(k) = a.recv(&mut rx)
                && k > 0
            {
                break;
            }
            if Instant::now() > deadline {
                return Err("baseline ping-pong timed out".into());
            }
        }
        rtts.push(t0.elapsed());
    }
    let _ = echo.join();
    rtts.sort();
    let one_way = |d: Duration| d.as_secs_f64() * 1e6 / 2.0;
    let n = rtts.len();
    Ok(Lat {
        min: one_way(rtts[0]),
        median: one_way(rtts[n / 2]),
        avg: rtts.iter().map(|d| one_way(*d)).sum::<f64>() / n as f64,
        p99: one_way(rtts[(n * 99 / 100).min(n - 1)]),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_ack_packet_is_bth_aeth_and_icrc() {
        assert_eq!(ACK_PACKET_LEN, 12 + 4 + 4);
    }

    #[test]
    fn a_ping_pong_with_a_held_ack_shape_completes() {
        let l = lat_with(40, ACK_PACKET_LEN, 200).expect("ping-pong with a second segment");
        assert!(l.min > 0.0 && l.min <= l.median && l.median <= l.p99);
    }

    #[test]
    fn a_trailer_longer_than_the_message_is_refused() {
        let e = lat_with(16, 20, 10).expect_err("GSO's last segment may not be the longest");
        assert!(e.to_string().contains("longer"), "{e}");
    }
}
