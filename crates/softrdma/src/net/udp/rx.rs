//! The receive batch: buffers for one `recvmmsg`, and each datagram's GRO segments.

use super::*;

/// A reusable batch of receive buffers for [`UdpPort::recv`].
pub struct RxBatch {
    bufs: Vec<u8>,
    buf_len: usize,
    addrs: Vec<libc::sockaddr_storage>,
    iovs: Vec<libc::iovec>,
    cmsgs: Vec<[u8; CMSG_SPACE]>,
    pub(super) hdrs: Vec<libc::mmsghdr>,
    segs: Vec<u16>,
    pub(super) count: usize,
    prepared: bool,
}

impl std::fmt::Debug for RxBatch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RxBatch")
            .field("count", &self.count)
            .field("capacity", &self.hdrs.len())
            .finish()
    }
}

// SAFETY: as for TxBatch: internal pointers are rebuilt before each use and point only into
// the batch's own vectors.
unsafe impl Send for RxBatch {}

/// One received datagram: the sender and a run of one or more packets of `segment` bytes
/// (the last may be shorter); `segment` is the whole length without GRO.
#[derive(Debug, Clone, Copy)]
pub struct Received<'a> {
    /// Sender.
    pub src: SocketAddr,
    /// The bytes.
    pub data: &'a [u8],
    /// Segment size.
    pub segment: usize,
}

impl<'a> Received<'a> {
    /// The packets in this datagram.
    pub fn segments(&self) -> impl Iterator<Item = &'a [u8]> + 'a {
        let seg = self.segment.max(1);
        self.data.chunks(seg)
    }
}

impl RxBatch {
    /// `datagrams` buffers of `buf_len` bytes each (use [`MAX_DATAGRAM`] when GRO is on).
    pub fn new(datagrams: usize, buf_len: usize) -> RxBatch {
        RxBatch {
            bufs: vec![0; datagrams * buf_len],
            buf_len,
            // SAFETY: sockaddr_storage, iovec and mmsghdr are plain C structs for which all-zero
            // is a valid value.
            addrs: vec![unsafe { zeroed() }; datagrams],
            // SAFETY: as above.
            iovs: vec![unsafe { zeroed() }; datagrams],
            cmsgs: vec![[0; CMSG_SPACE]; datagrams],
            // SAFETY: as above.
            hdrs: vec![unsafe { zeroed() }; datagrams],
            segs: vec![0; datagrams],
            count: 0,
            prepared: false,
        }
    }

    pub(super) fn prepare(&mut self) {
        if self.prepared {
            // The pointers still hold (they point into this batch's heap vectors, which do not
            // move); the kernel changed only the lengths and flags of the entries it filled.
            for h in &mut self.hdrs[..self.count] {
                h.msg_hdr.msg_namelen = size_of::<libc::sockaddr_storage>() as libc::socklen_t;
                h.msg_hdr.msg_controllen = CMSG_SPACE;
                h.msg_hdr.msg_flags = 0;
                h.msg_len = 0;
            }
            return;
        }
        for i in 0..self.hdrs.len() {
            let buf = &mut self.bufs[i * self.buf_len..(i + 1) * self.buf_len];
            self.iovs[i] = libc::iovec {
                iov_base: buf.as_mut_ptr().cast(),
                iov_len: buf.len(),
            };
            let h = &mut self.hdrs[i].msg_hdr;
            h.msg_name = (&mut self.addrs[i] as *mut libc::sockaddr_storage).cast();
            h.msg_namelen = size_of::<libc::sockaddr_storage>() as libc::socklen_t;
            h.msg_iov = &mut self.iovs[i];
            h.msg_iovlen = 1;
            h.msg_control = self.cmsgs[i].as_mut_ptr().cast();
            h.msg_controllen = CMSG_SPACE;
            h.msg_flags = 0;
            self.hdrs[i].msg_len = 0;
        }
        self.prepared = true;
    }

    pub(super) fn finish(&mut self) {
        for i in 0..self.count {
            let len = self.hdrs[i].msg_len as usize;
            let mut seg = len;
            let h = &self.hdrs[i].msg_hdr;
            // SAFETY: the kernel filled msg_control/msg_controllen of this header within the
            // control buffer we gave it; the CMSG_* walkers stay within msg_controllen.
            unsafe {
                let mut cm = libc::CMSG_FIRSTHDR(h);
                while !cm.is_null() {
                    if (*cm).cmsg_level == libc::SOL_UDP && (*cm).cmsg_type == UDP_GRO {
                        let v = std::ptr::read_unaligned(libc::CMSG_DATA(cm).cast::<libc::c_int>());
                        if v > 0 {
                            seg = v as usize;
                        }
                    }
                    cm = libc::CMSG_NXTHDR(h, cm);
                }
            }
            self.segs[i] = seg.min(u16::MAX as usize) as u16;
            if seg > u16::MAX as usize {
                self.segs[i] = 0;
            }
        }
    }

    /// Receive from a memory port's inbox (see [`crate::net::port`]): up to the batch's
    /// capacity of datagrams, each cut to a buffer's length as a socket would truncate it.
    pub(crate) fn fill(
        &mut self,
        inbox: &mut std::collections::VecDeque<crate::net::Datagram>,
    ) -> usize {
        let n = inbox.len().min(self.hdrs.len());
        for i in 0..n {
            let Some(d) = inbox.pop_front() else { break };
            let len = d.data.len().min(self.buf_len);
            self.bufs[i * self.buf_len..i * self.buf_len + len].copy_from_slice(&d.data[..len]);
            let a = SockAddr::from(d.src);
            // SAFETY: `a` holds a valid socket address of `a.len()` bytes, no more than a
            // sockaddr_storage; the copy fills the front of this entry's storage.
            unsafe {
                std::ptr::copy_nonoverlapping(
                    a.as_ptr().cast::<u8>(),
                    (&mut self.addrs[i] as *mut libc::sockaddr_storage).cast::<u8>(),
                    a.len() as usize,
                );
            }
            self.hdrs[i].msg_hdr.msg_namelen = a.len();
            self.hdrs[i].msg_len = len as u32;
            self.segs[i] = if d.segment >= len || d.segment > usize::from(u16::MAX) {
                0
            } else {
                d.segment as u16
            };
        }
        self.count = n;
        n
    }

    /// Datagrams in the last receive.
    pub fn len(&self) -> usize {
        self.count
    }

    /// True when the last receive got nothing.
    pub fn is_empty(&self) -> bool {
        self.count == 0
    }

    /// The `i`-th datagram of the last receive.
    pub fn get(&self, i: usize) -> Option<Received<'_>> {
        if i >= self.count {
            return None;
        }
        let len = (self.hdrs[i].msg_len as usize).min(self.buf_len);
        let data = &self.bufs[i * self.buf_len..i * self.buf_len + len];
        let src = sockaddr_to_std(&self.addrs[i], self.hdrs[i].msg_hdr.msg_namelen)?;
        let segment = match self.segs[i] {
            0 => len,
            s => usize::from(s),
        };
        Some(Received { src, data, segment })
    }
}

/// The address the kernel stored in `a` (`len` bytes), if it is IPv4 or IPv6.
fn sockaddr_to_std(a: &libc::sockaddr_storage, len: libc::socklen_t) -> Option<SocketAddr> {
    let len = len as usize;
    match libc::c_int::from(a.ss_family) {
        libc::AF_INET if len >= size_of::<libc::sockaddr_in>() => {
            // SAFETY: the family says the storage holds a sockaddr_in, which it is large enough
            // for and aligned for (sockaddr_storage has the strictest alignment of them all).
            let v4 = unsafe { &*(a as *const libc::sockaddr_storage).cast::<libc::sockaddr_in>() };
            let ip = std::net::Ipv4Addr::from(u32::from_be(v4.sin_addr.s_addr));
            Some(SocketAddr::from((ip, u16::from_be(v4.sin_port))))
        }
        libc::AF_INET6 if len >= size_of::<libc::sockaddr_in6>() => {
            // SAFETY: as above, for sockaddr_in6.
            let v6 = unsafe { &*(a as *const libc::sockaddr_storage).cast::<libc::sockaddr_in6>() };
            let ip = std::net::Ipv6Addr::from(v6.sin6_addr.s6_addr);
            Some(SocketAddr::V6(std::net::SocketAddrV6::new(
                ip,
                u16::from_be(v6.sin6_port),
                v6.sin6_flowinfo,
                v6.sin6_scope_id,
            )))
        }
        _ => None,
    }
}
