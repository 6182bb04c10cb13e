//! Where a device's datagrams go: a UDP socket ([`UdpPort`]), or an in-memory network
//! ([`MemoryNet`]) that a test or the simulator owns. The engine sends and receives through a
//! [`Port`] and is the same code over either; the memory network leaves each datagram's fate
//! (delivered, delayed, lost, duplicated, reordered, corrupted, a GSO datagram split into its
//! segments) to whoever moves datagrams from its sent queue to a port's inbox.

use std::collections::{HashMap, VecDeque};
use std::io;
use std::net::SocketAddr;
use std::os::fd::RawFd;
use std::sync::{Arc, Mutex};

use super::udp::{RxBatch, TxBatch, UdpPort};

/// One datagram on the memory network: from, to, its bytes, and its segment size (a GSO
/// datagram carries several packets of `segment` bytes, the last possibly shorter; `segment`
/// equals the length for a lone packet).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Datagram {
    /// Sender.
    pub src: SocketAddr,
    /// Destination.
    pub dst: SocketAddr,
    /// The UDP payload.
    pub data: Vec<u8>,
    /// Segment size.
    pub segment: usize,
}

impl Datagram {
    /// Its packets, one datagram each, as a receiver without GRO would see them.
    pub fn split(&self) -> Vec<Datagram> {
        self.data
            .chunks(self.segment.max(1))
            .map(|c| Datagram {
                src: self.src,
                dst: self.dst,
                data: c.to_vec(),
                segment: c.len(),
            })
            .collect()
    }
}

/// An in-memory network: datagrams sent by its ports wait in one sent queue until their
/// owner delivers them to a port's inbox ([`MemoryNet::deliver`]).
#[derive(Debug, Default)]
pub struct MemoryNet {
    inner: Mutex<NetState>,
}

#[derive(Debug, Default)]
struct NetState {
    sent: VecDeque<Datagram>,
    inboxes: HashMap<SocketAddr, VecDeque<Datagram>>,
}

/// Datagrams an inbox holds at most: more are dropped, as a full socket buffer drops them.
pub const INBOX_DATAGRAMS: usize = 4096;

impl MemoryNet {
    /// An empty network.
    pub fn new() -> Arc<MemoryNet> {
        Arc::new(MemoryNet::default())
    }

    fn state(&self) -> std::sync::MutexGuard<'_, NetState> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A port at `addr` on this network.
    pub fn port(self: &Arc<Self>, addr: SocketAddr) -> MemoryPort {
        self.state().inboxes.entry(addr).or_default();
        MemoryPort {
            addr,
            net: Arc::clone(self),
        }
    }

    /// Take every datagram sent since the last call, in the order sent.
    pub fn take_sent(&self) -> Vec<Datagram> {
        self.state().sent.drain(..).collect()
    }

    /// Put `d` in its destination's inbox. Returns false (and drops it) when no port has that
    /// address or the inbox is full.
    pub fn deliver(&self, d: Datagram) -> bool {
        let mut s = self.state();
        match s.inboxes.get_mut(&d.dst) {
            Some(q) if q.len() < INBOX_DATAGRAMS => {
                q.push_back(d);
                true
            }
            _ => false,
        }
    }
}

/// A port of a [`MemoryNet`].
#[derive(Debug)]
pub struct MemoryPort {
    addr: SocketAddr,
    net: Arc<MemoryNet>,
}

impl MemoryPort {
    fn send(&self, batch: &mut TxBatch) -> usize {
        let out = batch.take_datagrams();
        let n = out.len();
        let mut s = self.net.state();
        for (dst, data, segment) in out {
            s.sent.push_back(Datagram {
                src: self.addr,
                dst,
                data,
                segment,
            });
        }
        n
    }

    fn recv(&self, batch: &mut RxBatch) -> usize {
        let mut s = self.net.state();
        match s.inboxes.get_mut(&self.addr) {
            Some(q) => batch.fill(q),
            None => batch.fill(&mut VecDeque::new()),
        }
    }
}

/// A device's port: a UDP socket or a memory network's port.
#[derive(Debug)]
pub enum Port {
    /// A UDP socket.
    Udp(UdpPort),
    /// A port of a [`MemoryNet`].
    Memory(MemoryPort),
}

impl Port {
    /// The bound address.
    pub fn local_addr(&self) -> SocketAddr {
        match self {
            Port::Udp(p) => p.local_addr(),
            Port::Memory(p) => p.addr,
        }
    }

    /// The socket; -1 for a memory port (nothing to wait on: `poll` skips a negative
    /// descriptor).
    pub fn raw_fd(&self) -> RawFd {
        match self {
            Port::Udp(p) => p.raw_fd(),
            Port::Memory(_) => -1,
        }
    }

    /// Send and empty `batch`; returns the datagrams sent.
    pub fn send(&self, batch: &mut TxBatch) -> io::Result<usize> {
        match self {
            Port::Udp(p) => p.send(batch),
            Port::Memory(p) => Ok(p.send(batch)),
        }
    }

    /// Receive into `batch` what is queued; returns how many datagrams (a memory port with
    /// nothing queued says `WouldBlock`, as a non-blocking socket does).
    pub fn recv(&self, batch: &mut RxBatch) -> io::Result<usize> {
        match self {
            Port::Udp(p) => p.recv(batch),
            Port::Memory(p) => match p.recv(batch) {
                0 => Err(io::ErrorKind::WouldBlock.into()),
                n => Ok(n),
            },
        }
    }
}
