//! Out-of-band connection set-up over TCP, in the text format of rdma-core's
//! `ibv_rc_pingpong`: each side sends `LID:QPN:PSN:GID` (`%04x:%06x:%06x:` and the 16 GID bytes
//! as 32 hex digits, NUL-terminated, 52 bytes); the client then sends `done`.

use std::io::{self, Read, Write};
use std::net::{TcpListener, TcpStream, ToSocketAddrs};
use std::time::Duration;

/// The size of one message, terminating NUL included.
pub const MSG_LEN: usize = 52;

/// What one side tells the other.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Dest {
    /// Local identifier (0 on RoCE).
    pub lid: u16,
    /// QP number.
    pub qpn: u32,
    /// Initial PSN.
    pub psn: u32,
    /// GID (IPv4-mapped address on RoCEv2).
    pub gid: [u8; 16],
}

fn bad(msg: &str) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, msg.to_owned())
}

impl Dest {
    /// The 52-byte message.
    pub fn to_wire(&self) -> [u8; MSG_LEN] {
        let mut gid = String::with_capacity(32);
        for b in self.gid {
            gid.push_str(&format!("{b:02x}"));
        }
        let s = format!(
            "{:04x}:{:06x}:{:06x}:{}",
            self.lid,
            self.qpn & 0xff_ffff,
            self.psn & 0xff_ffff,
            gid
        );
        let mut out = [0u8; MSG_LEN];
        out[..s.len()].copy_from_slice(s.as_bytes());
        out
    }

    /// Parse a message.
    pub fn from_wire(b: &[u8]) -> io::Result<Dest> {
        let end = b.iter().position(|&c| c == 0).unwrap_or(b.len());
        let s =
            std::str::from_utf8(&b[..end]).map_err(|_| bad("connection message is not text"))?;
        let mut parts = s.split(':');
        let mut field = |name: &str| {
            parts
                .next()
                .ok_or_else(|| bad(&format!("connection message lacks {name}")))
        };
        let lid = u16::from_str_radix(field("LID")?, 16).map_err(|_| bad("bad LID"))?;
        let qpn = u32::from_str_radix(field("QPN")?, 16).map_err(|_| bad("bad QPN"))?;
        let psn = u32::from_str_radix(field("PSN")?, 16).map_err(|_| bad("bad PSN"))?;
        let g = field("GID")?;
        if g.len() != 32 || qpn > 0xff_ffff || psn > 0xff_ffff {
            return Err(bad("bad GID, QPN or PSN"));
        }
        let mut gid = [0u8; 16];
        for (i, byte) in gid.iter_mut().enumerate() {
            *byte = u8::from_str_radix(&g[2 * i..2 * i + 2], 16).map_err(|_| bad("bad GID"))?;
        }
        Ok(Dest { lid, qpn, psn, gid })
    }

    /// The peer's IP address from its GID.
    pub fn ip(&self) -> std::net::IpAddr {
        let v6 = std::net::Ipv6Addr::from(self.gid);
        match v6.to_ipv4_mapped() {
            Some(v4) => v4.into(),
            None => v6.into(),
        }
    }
}

/// Client side: connect, send ours, read theirs, send `done`.
pub fn client(server: impl ToSocketAddrs, local: &Dest, timeout: Duration) -> io::Result<Dest> {
    let addr = server
        .to_socket_addrs()?
        .next()
        .ok_or_else(|| bad("no server address"))?;
    let mut s = TcpStream::connect_timeout(&addr, timeout)?;
    s.set_read_timeout(Some(timeout))?;
    s.write_all(&local.to_wire())?;
    let mut msg = [0u8; MSG_LEN];
    s.read_exact(&mut msg)?;
    let remote = Dest::from_wire(&msg)?;
    s.write_all(b"done\0")?;
    Ok(remote)
}

/// Server side, first half: accept one client and read its message. Connect the QP, then
/// call [`server_finish`] with the stream.
pub fn server_accept(listener: &TcpListener, timeout: Duration) -> io::Result<(TcpStream, Dest)> {
    let (mut s, _) = listener.accept()?;
    s.set_read_timeout(Some(timeout))?;
    let mut msg = [0u8; MSG_LEN];
    s.read_exact(&mut msg)?;
    Ok((s, Dest::from_wire(&msg)?))
}

/// Server side, second half: send ours and wait for the client's `done`.
pub fn server_finish(mut s: TcpStream, local: &Dest) -> io::Result<()> {
    s.write_all(&local.to_wire())?;
    let mut done = [0u8; 5];
    s.read_exact(&mut done)?;
    if &done[..4] != b"done" {
        return Err(bad("client did not confirm"));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn message_round_trip() {
        let d = Dest {
            lid: 0,
            qpn: 0x11,
            psn: 0x0e8a3c,
            gid: std::net::Ipv4Addr::new(10, 77, 0, 2)
                .to_ipv6_mapped()
                .octets(),
        };
        let w = d.to_wire();
        assert_eq!(
            &w[..51],
            b"0000:000011:0e8a3c:00000000000000000000ffff0a4d0002"
        );
        assert_eq!(w[51], 0);
        assert_eq!(Dest::from_wire(&w).unwrap(), d);
        assert_eq!(d.ip(), std::net::IpAddr::from([10, 77, 0, 2]));
        assert!(Dest::from_wire(b"0000:zz").is_err());
        assert!(Dest::from_wire(b"").is_err());
    }
}
