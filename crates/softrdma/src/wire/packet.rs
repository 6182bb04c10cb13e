//! A whole RoCEv2 UDP payload: BTH, extension headers, payload, pad, ICRC.
//!
//! [`HeaderRepr`] holds the headers; [`Packet`] adds the payload and takes a UDP payload apart
//! ([`Packet::parse`], [`Packet::parse_verified`]) or builds one ([`Packet::emit`]). The
//! transport may also emit headers alone, copy the payload straight from registered memory
//! behind them, and then [`seal`] the packet (pad and ICRC).

use super::aeth::{Aeth, AethRepr};
use super::atomic_ack_eth::{AtomicAckEth, AtomicAckEthRepr};
use super::atomic_eth::{AtomicEth, AtomicEthRepr};
use super::bth::{Bth, BthRepr};
use super::deth::{Deth, DethRepr};
use super::feth::{Feth, FethRepr};
use super::icrc::{self, Icrc};
use super::immdt::ImmDt;
use super::opcode::{Headers, OpKind, OpcodeInfo, Position};
use super::reth::{Reth, RethRepr};
use super::{Error, ICRC_LEN, Result};

/// The transport headers of one packet.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HeaderRepr {
    /// Base transport header.
    pub bth: BthRepr,
    /// Datagram ETH (UD).
    pub deth: Option<DethRepr>,
    /// Flush ETH.
    pub feth: Option<FethRepr>,
    /// RDMA ETH.
    pub reth: Option<RethRepr>,
    /// Atomic ETH.
    pub atomic_eth: Option<AtomicEthRepr>,
    /// ACK ETH.
    pub aeth: Option<AethRepr>,
    /// Atomic ACK ETH.
    pub atomic_ack_eth: Option<AtomicAckEthRepr>,
    /// Immediate data.
    pub immdt: Option<u32>,
    /// R_Key to invalidate.
    pub ieth: Option<u32>,
}

impl HeaderRepr {
    /// Headers with only a BTH; set the extension headers the opcode needs.
    pub fn new(bth: BthRepr) -> HeaderRepr {
        HeaderRepr {
            bth,
            deth: None,
            feth: None,
            reth: None,
            atomic_eth: None,
            aeth: None,
            atomic_ack_eth: None,
            immdt: None,
            ieth: None,
        }
    }

    /// The set of extension headers present.
    pub fn headers(&self) -> Headers {
        let mut h = Headers::NONE;
        for (present, bit) in [
            (self.deth.is_some(), Headers::DETH),
            (self.feth.is_some(), Headers::FETH),
            (self.reth.is_some(), Headers::RETH),
            (self.atomic_eth.is_some(), Headers::ATOMIC_ETH),
            (self.aeth.is_some(), Headers::AETH),
            (self.atomic_ack_eth.is_some(), Headers::ATOMIC_ACK_ETH),
            (self.immdt.is_some(), Headers::IMMDT),
            (self.ieth.is_some(), Headers::IETH),
        ] {
            if present {
                h = h.with(bit);
            }
        }
        h
    }

    /// The table entry of the BTH opcode.
    pub fn info(&self) -> Result<&'static OpcodeInfo> {
        self.bth
            .opcode
            .info()
            .ok_or(Error::UnknownOpcode(self.bth.opcode.0))
    }

    /// Length of BTH and extension headers.
    pub fn len(&self) -> usize {
        Bth::<&[u8]>::LEN + self.headers().len()
    }

    /// Always false: a packet has at least a BTH.
    pub fn is_empty(&self) -> bool {
        false
    }

    /// Parse the headers at the start of `buf`; returns them and the opcode's table entry.
    #[inline]
    pub fn parse(buf: &[u8]) -> Result<(HeaderRepr, &'static OpcodeInfo)> {
        let bth = BthRepr::parse(&Bth::new_checked(buf)?)?;
        let info = bth
            .opcode
            .info()
            .ok_or(Error::UnknownOpcode(bth.opcode.0))?;
        let need = info.header_len();
        if buf.len() < need {
            return Err(Error::Truncated {
                what: info.name,
                need,
                have: buf.len(),
            });
        }
        let mut h = HeaderRepr::new(bth);
        let mut off = Bth::<&[u8]>::LEN;
        let hs = info.headers;
        let mut take = |bit: Headers| -> Option<&[u8]> {
            hs.has(bit).then(|| {
                let s = &buf[off..];
                off += bit.len();
                s
            })
        };
        // The order here is the order on the wire.
        h.deth = take(Headers::DETH)
            .map(|b| DethRepr::parse(&Deth::new_unchecked(b)))
            .transpose()?;
        h.feth = take(Headers::FETH)
            .map(|b| FethRepr::parse(&Feth::new_unchecked(b)))
            .transpose()?;
        h.reth = take(Headers::RETH)
            .map(|b| RethRepr::parse(&Reth::new_unchecked(b)))
            .transpose()?;
        h.atomic_eth = take(Headers::ATOMIC_ETH)
            .map(|b| AtomicEthRepr::parse(&AtomicEth::new_unchecked(b)))
            .transpose()?;
        h.aeth = take(Headers::AETH)
            .map(|b| AethRepr::parse(&Aeth::new_unchecked(b)))
            .transpose()?;
        h.atomic_ack_eth = take(Headers::ATOMIC_ACK_ETH)
            .map(|b| AtomicAckEthRepr::parse(&AtomicAckEth::new_unchecked(b)))
            .transpose()?;
        h.immdt = take(Headers::IMMDT).map(|b| ImmDt::new_unchecked(b).value());
        h.ieth = take(Headers::IETH).map(|b| ImmDt::new_unchecked(b).value());
        Ok((h, info))
    }

    /// Emit the headers at the start of `buf`; returns their length. The present extension
    /// headers must be exactly those the opcode calls for.
    pub fn emit(&self, buf: &mut [u8]) -> Result<usize> {
        self.emit_padded(self.bth.pad_cnt, buf)
    }

    /// [`HeaderRepr::emit`] with the BTH's pad count `pad` instead of its own (a packet
    /// builder's headers are shared by its packets; the pad depends on each one's payload).
    pub fn emit_padded(&self, pad: u8, buf: &mut [u8]) -> Result<usize> {
        let info = self.info()?;
        if self.headers() != info.headers {
            return Err(Error::FieldRange(
                "extension headers do not match the opcode",
            ));
        }
        let len = info.header_len();
        if buf.len() < len {
            return Err(Error::BufferTooSmall {
                need: len,
                have: buf.len(),
            });
        }
        let mut bth = self.bth;
        bth.pad_cnt = pad;
        bth.emit(&mut Bth::new_unchecked(&mut buf[..]))?;
        let mut off = Bth::<&[u8]>::LEN;
        let mut next = |n: usize| {
            let r = off..off + n;
            off += n;
            r
        };
        if let Some(d) = &self.deth {
            d.emit(&mut Deth::new_unchecked(&mut buf[next(8)]))?;
        }
        if let Some(f) = &self.feth {
            f.emit(&mut Feth::new_unchecked(&mut buf[next(4)]));
        }
        if let Some(r) = &self.reth {
            r.emit(&mut Reth::new_unchecked(&mut buf[next(16)]));
        }
        if let Some(a) = &self.atomic_eth {
            a.emit(&mut AtomicEth::new_unchecked(&mut buf[next(28)]));
        }
        if let Some(a) = &self.aeth {
            a.emit(&mut Aeth::new_unchecked(&mut buf[next(4)]));
        }
        if let Some(a) = &self.atomic_ack_eth {
            a.emit(&mut AtomicAckEth::new_unchecked(&mut buf[next(8)]));
        }
        if let Some(v) = self.immdt {
            ImmDt::new_unchecked(&mut buf[next(4)]).set_value(v);
        }
        if let Some(v) = self.ieth {
            ImmDt::new_unchecked(&mut buf[next(4)]).set_value(v);
        }
        Ok(len)
    }
}

/// Pad bytes needed after `payload_len` bytes to reach a multiple of four.
pub const fn pad_for(payload_len: usize) -> u8 {
    ((4 - (payload_len & 3)) & 3) as u8
}

/// Bytes of the UDP payload of a packet with these headers and `payload_len` payload bytes.
pub fn udp_payload_len(hdr: &HeaderRepr, payload_len: usize) -> usize {
    hdr.len() + payload_len + usize::from(pad_for(payload_len)) + ICRC_LEN
}

/// Finish a packet whose headers and `payload_len` payload bytes are already in `buf`: write
/// zero pad and the ICRC, and return the UDP payload length. The BTH pad count must already
/// be `pad_for(payload_len)` (as [`Packet::emit`] and the transport set it).
pub fn seal(ctx: &impl Icrc, buf: &mut [u8], hdr_len: usize, payload_len: usize) -> Result<usize> {
    let pad = usize::from(pad_for(payload_len));
    let body = hdr_len + payload_len + pad;
    let total = body + ICRC_LEN;
    if buf.len() < total {
        return Err(Error::BufferTooSmall {
            need: total,
            have: buf.len(),
        });
    }
    buf[hdr_len + payload_len..body].fill(0);
    let crc = ctx.compute(&buf[..body])?;
    buf[body..total].copy_from_slice(&crc.to_le_bytes());
    Ok(total)
}

/// One parsed packet: headers, payload (without pad) and the ICRC it carried.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Packet<'a> {
    /// Transport headers.
    pub hdr: HeaderRepr,
    /// Payload bytes, pad excluded.
    pub payload: &'a [u8],
    /// The ICRC as carried (not verified by [`Packet::parse`]).
    pub icrc: u32,
}

impl<'a> Packet<'a> {
    /// Take a UDP payload apart without verifying the ICRC. Checks the opcode, header lengths,
    /// that payload plus pad is a multiple of four, and the payload rules of the opcode
    /// (none for requests without data and acknowledgements; a whole MTU-sized, unpadded
    /// payload for First and Middle packets; 8 bytes for ATOMIC WRITE).
    #[inline]
    pub fn parse(buf: &'a [u8]) -> Result<Packet<'a>> {
        let (hdr, info) = HeaderRepr::parse(buf)?;
        let hl = info.header_len();
        let need = hl + ICRC_LEN;
        if buf.len() < need {
            return Err(Error::Truncated {
                what: "ICRC",
                need,
                have: buf.len(),
            });
        }
        let icrc = icrc::carried(buf)?;
        let with_pad = buf.len() - need;
        let pad = hdr.bth.pad_cnt;
        let bad = || Error::BadPayload {
            opcode: info.name,
            payload: with_pad,
            pad,
        };
        if usize::from(pad) > with_pad || !with_pad.is_multiple_of(4) {
            return Err(bad());
        }
        let payload = &buf[hl..hl + with_pad - usize::from(pad)];
        let ok = match (info.payload, info.kind, info.position) {
            (false, _, _) => with_pad == 0,
            (true, OpKind::AtomicWrite, _) => payload.len() == 8,
            (true, _, Position::First | Position::Middle) => {
                pad == 0 && (256..=4096).contains(&payload.len()) && payload.len().is_power_of_two()
            }
            (true, _, _) => true,
        };
        if !ok {
            return Err(bad());
        }
        Ok(Packet { hdr, payload, icrc })
    }

    /// Parse and verify the ICRC against the IP/UDP context the payload arrived in.
    pub fn parse_verified(ctx: &impl Icrc, buf: &'a [u8]) -> Result<Packet<'a>> {
        let p = Packet::parse(buf)?;
        let computed = ctx.compute(&buf[..buf.len() - ICRC_LEN])?;
        if computed != p.icrc {
            return Err(Error::BadIcrc {
                carried: p.icrc,
                computed,
            });
        }
        Ok(p)
    }

    /// Parse a received segment and verify its ICRC when the IPv4 identification its sender
    /// used is not known in advance (a UDP socket does not see it): first with `id`, the one
    /// expected (softrdma senders use 0 for a lone packet and k for the k-th segment of a GSO
    /// datagram), a full 32-bit check; then, for IPv4, by solving for the identification
    /// that makes the carried ICRC right (third-party senders such as Linux rxe number their
    /// datagrams), which leaves 16 check bits. `base` holds the covered headers with
    /// identification 0. Returns the packet, the identification, and whether it was solved.
    pub fn parse_verified_solving(
        base: &super::IcrcPrefix,
        id: u16,
        buf: &'a [u8],
        deltas: &mut super::IdDeltas,
    ) -> Result<(Packet<'a>, u16, bool)> {
        let ctx = base.with_id(id);
        let v4 = matches!(ctx.context().ip, super::IpHeader::V4 { .. });
        match Packet::parse_verified(&ctx, buf) {
            Ok(p) => Ok((p, if v4 { id } else { 0 }, false)),
            Err(Error::BadIcrc { carried, computed }) if v4 => {
                let d = deltas.for_len(buf.len() - ICRC_LEN);
                match d.solve(computed ^ d.delta(id), carried) {
                    Some(solved) => Ok((Packet::parse(buf)?, solved, true)),
                    None => Err(Error::BadIcrc { carried, computed }),
                }
            }
            Err(e) => Err(e),
        }
    }

    /// Length of the UDP payload this packet emits to.
    pub fn buffer_len(&self) -> usize {
        udp_payload_len(&self.hdr, self.payload.len())
    }

    /// Build the complete UDP payload into `buf`: headers (with the pad count set from the
    /// payload length), payload, zero pad and ICRC. Returns the length written.
    pub fn emit(&self, ctx: &impl Icrc, buf: &mut [u8]) -> Result<usize> {
        let info = self.hdr.info()?;
        if !info.payload && !self.payload.is_empty() {
            return Err(Error::BadPayload {
                opcode: info.name,
                payload: self.payload.len(),
                pad: 0,
            });
        }
        let need = self.buffer_len();
        if buf.len() < need {
            return Err(Error::BufferTooSmall {
                need,
                have: buf.len(),
            });
        }
        let mut hdr = self.hdr;
        hdr.bth.pad_cnt = pad_for(self.payload.len());
        let hl = hdr.emit(buf)?;
        buf[hl..hl + self.payload.len()].copy_from_slice(self.payload);
        seal(ctx, buf, hl, self.payload.len())
    }
}

#[cfg(test)]
mod tests {
    use super::super::{IcrcContext, NakCode, Opcode, Psn, Syndrome};
    use super::*;
    use core::net::Ipv4Addr;

    fn ctx() -> IcrcContext {
        IcrcContext::v4(
            Ipv4Addr::new(127, 0, 0, 1),
            Ipv4Addr::new(127, 0, 0, 2),
            0xc001,
        )
    }

    #[test]
    fn write_only_with_imm_round_trip() {
        let mut h = HeaderRepr::new(BthRepr::new(Opcode::RC_WRITE_ONLY_IMM, 0x12, Psn::new(77)));
        h.reth = Some(RethRepr {
            va: 0x1000,
            rkey: 0xabcd_0001,
            dma_len: 5,
        });
        h.immdt = Some(0xfeed_f00d);
        let p = Packet {
            hdr: h,
            payload: b"hello",
            icrc: 0,
        };
        let mut buf = [0u8; 64];
        let n = p.emit(&ctx(), &mut buf).unwrap();
        assert_eq!(n, 32 + 5 + 3 + 4);
        let q = Packet::parse_verified(&ctx(), &buf[..n]).unwrap();
        assert_eq!(q.payload, b"hello");
        assert_eq!(q.hdr.bth.pad_cnt, 3);
        assert_eq!(q.hdr.reth, h.reth);
        assert_eq!(q.hdr.immdt, Some(0xfeed_f00d));
        let mut again = [0u8; 64];
        assert_eq!(q.emit(&ctx(), &mut again).unwrap(), n);
        assert_eq!(buf[..n], again[..n]);
    }

    #[test]
    fn mismatched_headers_are_refused() {
        let h = HeaderRepr::new(BthRepr::new(Opcode::RC_WRITE_ONLY, 1, Psn::new(0)));
        let mut buf = [0u8; 64];
        assert!(h.emit(&mut buf).is_err());
        let mut ack = HeaderRepr::new(BthRepr::new(Opcode::RC_ACK, 1, Psn::new(0)));
        ack.aeth = Some(AethRepr {
            syndrome: Syndrome::Nak(NakCode::InvalidRequest),
            msn: 3,
        });
        let p = Packet {
            hdr: ack,
            payload: b"x",
            icrc: 0,
        };
        assert!(matches!(
            p.emit(&ctx(), &mut buf),
            Err(Error::BadPayload { .. })
        ));
        assert!(matches!(
            Packet {
                hdr: ack,
                payload: b"",
                icrc: 0
            }
            .emit(&ctx(), &mut buf[..10]),
            Err(Error::BufferTooSmall { .. })
        ));
    }

    #[test]
    fn payload_rules() {
        let mut buf = [0u8; 600];
        let h = HeaderRepr::new(BthRepr::new(Opcode::RC_SEND_FIRST, 1, Psn::new(0)));
        let body = [7u8; 256];
        let n = Packet {
            hdr: h,
            payload: &body,
            icrc: 0,
        }
        .emit(&ctx(), &mut buf)
        .unwrap();
        assert!(Packet::parse(&buf[..n]).is_ok());
        // A First packet of 100 bytes is not a whole MTU.
        let n = Packet {
            hdr: h,
            payload: &body[..100],
            icrc: 0,
        }
        .emit(&ctx(), &mut buf)
        .unwrap();
        assert!(matches!(
            Packet::parse(&buf[..n]),
            Err(Error::BadPayload { .. })
        ));
        // Truncations at every length are errors, never panics.
        let n = Packet {
            hdr: h,
            payload: &body,
            icrc: 0,
        }
        .emit(&ctx(), &mut buf)
        .unwrap();
        for cut in 0..n {
            assert!(Packet::parse(&buf[..cut]).is_err());
        }
    }
}
