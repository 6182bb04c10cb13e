//! `softrdma decode`: every RoCEv2 packet of a capture with its headers and ICRC verdict.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::time::Duration;

use serde_json::{Value, json};
use softrdma::wire::cm::{CmMad, attr_info};
use softrdma::wire::mad::GSI_QPN;
use softrdma::wire::{self, Packet, Syndrome, icrc};

use crate::capture::{self, CaptureError, Classified, UdpFrame};

/// The verdict on one RoCEv2 datagram.
#[derive(Debug, Clone)]
pub enum Verdict<'a> {
    /// Parsed, and the ICRC is good.
    Good(Packet<'a>),
    /// Parsed, but the carried ICRC differs from the computed one.
    BadIcrc(Packet<'a>, u32),
    /// Not a valid RoCEv2 packet.
    Malformed(String),
}

/// One RoCEv2 datagram of a capture.
#[derive(Debug, Clone)]
pub struct Record<'a> {
    /// Frame number (1-based).
    pub frame: usize,
    /// Time since the first frame.
    pub time: Duration,
    /// Addresses and ports, if the frame got as far as UDP.
    pub udp: Option<UdpFrame<'a>>,
    /// What the datagram is.
    pub verdict: Verdict<'a>,
}

impl Record<'_> {
    /// True when the packet parsed and its ICRC verified.
    pub fn is_good(&self) -> bool {
        matches!(self.verdict, Verdict::Good(_))
    }
}

/// Counts over a whole capture.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Summary {
    /// Frames read.
    pub frames: usize,
    /// RoCEv2 datagrams seen.
    pub roce: usize,
    /// Frames that are not RoCEv2.
    pub other: usize,
    /// RoCEv2 datagrams that did not parse.
    pub malformed: usize,
    /// RoCEv2 datagrams with a bad ICRC.
    pub bad_icrc: usize,
    /// Good and bad-ICRC packets by opcode name.
    pub by_opcode: BTreeMap<&'static str, usize>,
    /// Numbers of the frames that failed (malformed or bad ICRC), in order.
    pub failed_frames: Vec<usize>,
}

/// Decode one UDP datagram addressed to the RoCEv2 port.
pub fn decode_datagram<'a>(udp: &UdpFrame<'a>) -> Verdict<'a> {
    let p = match Packet::parse(udp.payload) {
        Ok(p) => p,
        Err(e) => return Verdict::Malformed(e.to_string()),
    };
    let body = &udp.payload[..udp.payload.len() - wire::ICRC_LEN];
    match icrc::compute_from_headers(udp.ip_header, udp.udp_header, body) {
        Ok(c) if c == p.icrc => Verdict::Good(p),
        Ok(c) => Verdict::BadIcrc(p, c),
        Err(e) => Verdict::Malformed(e.to_string()),
    }
}

/// Decode a whole capture, calling `each` for every RoCEv2 datagram, and summarise.
pub fn decode_capture(
    bytes: &[u8],
    port: u16,
    mut each: impl FnMut(&Record<'_>),
) -> Result<Summary, CaptureError> {
    let mut s = Summary::default();
    let mut t0 = None;
    s.frames = capture::for_each_frame(bytes, |f| {
        let start = *t0.get_or_insert(f.time);
        let time = f.time.saturating_sub(start);
        let (udp, verdict) = match capture::classify(f.link, &f.data, port) {
            Classified::Other => {
                s.other += 1;
                return;
            }
            Classified::Malformed(e) => (None, Verdict::Malformed(e)),
            Classified::Udp(u) => (Some(u), decode_datagram(&u)),
        };
        s.roce += 1;
        match &verdict {
            Verdict::Good(p) => *s.by_opcode.entry(p.hdr.bth.opcode.name()).or_default() += 1,
            Verdict::BadIcrc(p, _) => {
                *s.by_opcode.entry(p.hdr.bth.opcode.name()).or_default() += 1;
                s.bad_icrc += 1;
                s.failed_frames.push(f.number);
            }
            Verdict::Malformed(_) => {
                s.malformed += 1;
                s.failed_frames.push(f.number);
            }
        }
        each(&Record {
            frame: f.number,
            time,
            udp,
            verdict,
        });
    })?;
    Ok(s)
}

/// A UD datagram from QP1 to QP1 is a MAD: the CM message it carries (its attribute's name
/// and the message), or why it is not one; `None` for other packets.
fn cm_mad(p: &Packet<'_>) -> Option<Result<(&'static str, CmMad), softrdma::wire::Error>> {
    let d = p.hdr.deth?;
    if p.hdr.bth.dest_qp != GSI_QPN || d.src_qp != GSI_QPN {
        return None;
    }
    Some(CmMad::parse(p.payload).map(|m| {
        let name = attr_info(m.msg.attr_id()).map_or("?", |a| a.name);
        (name, m)
    }))
}

fn headers_text(p: &Packet<'_>, out: &mut String) {
    let h = &p.hdr;
    let b = &h.bth;
    let _ = write!(
        out,
        " {} qpn={:#08x} psn={} a={} se={} m={} pad={} pkey={:#06x}",
        b.opcode.name(),
        b.dest_qp,
        b.psn,
        u8::from(b.ack_req),
        u8::from(b.se),
        u8::from(b.mig_req),
        b.pad_cnt,
        b.pkey
    );
    if b.fecn || b.becn {
        let _ = write!(out, " fecn={} becn={}", u8::from(b.fecn), u8::from(b.becn));
    }
    if let Some(d) = h.deth {
        let _ = write!(out, " [DETH qkey={:#010x} srcqp={:#08x}]", d.qkey, d.src_qp);
    }
    if let Some(m) = cm_mad(p) {
        match m {
            Ok((name, mad)) => {
                let _ = write!(
                    out,
                    " [CM {name} tid={:#x} local_comm_id={:#010x} remote_comm_id={:#010x}]",
                    mad.tid,
                    mad.msg.local_comm_id(),
                    mad.msg.remote_comm_id()
                );
            }
            Err(e) => {
                let _ = write!(out, " [MAD not a CM message: {e}]");
            }
        }
    }
    if let Some(f) = h.feth {
        let _ = write!(out, " [FETH sel={} plt={}]", f.sel, f.plt);
    }
    if let Some(r) = h.reth {
        let _ = write!(
            out,
            " [RETH va={:#x} rkey={:#010x} len={}]",
            r.va, r.rkey, r.dma_len
        );
    }
    if let Some(a) = h.atomic_eth {
        let _ = write!(
            out,
            " [AtomicETH va={:#x} rkey={:#010x} swap_add={:#x} compare={:#x}]",
            a.va, a.rkey, a.swap_add, a.compare
        );
    }
    if let Some(a) = h.aeth {
        let syn = match a.syndrome {
            Syndrome::Ack { credits } => format!("ACK credits={credits}"),
            Syndrome::RnrNak { timer } => format!("RNR_NAK timer={timer}"),
            Syndrome::Nak(c) => format!("NAK {c:?}"),
            Syndrome::Reserved(v) => format!("reserved {v:#04x}"),
        };
        let _ = write!(out, " [AETH {syn} msn={}]", a.msn);
    }
    if let Some(a) = h.atomic_ack_eth {
        let _ = write!(out, " [AtomicAckETH orig={:#x}]", a.orig);
    }
    if let Some(v) = h.immdt {
        let _ = write!(out, " [ImmDt {v:#010x}]");
    }
    if let Some(v) = h.ieth {
        let _ = write!(out, " [IETH rkey={v:#010x}]");
    }
    let _ = write!(out, " payload={} icrc={:#010x}", p.payload.len(), p.icrc);
}

/// One line of text for a record.
pub fn record_text(r: &Record<'_>) -> String {
    let mut s = format!("#{:<6} {:>12.6}", r.frame, r.time.as_secs_f64());
    if let Some(u) = &r.udp {
        let _ = write!(s, " {}:{} > {}:{}", u.src, u.src_port, u.dst, u.dst_port);
    }
    match &r.verdict {
        Verdict::Good(p) => {
            headers_text(p, &mut s);
            s.push_str(" good");
        }
        Verdict::BadIcrc(p, computed) => {
            headers_text(p, &mut s);
            let _ = write!(s, " BAD (computed {computed:#010x})");
        }
        Verdict::Malformed(e) => {
            let _ = write!(s, " MALFORMED: {e}");
        }
    }
    s
}

/// A record as JSON.
pub fn record_json(r: &Record<'_>) -> Value {
    let mut v = json!({ "frame": r.frame, "time": r.time.as_secs_f64() });
    if let Some(u) = &r.udp {
        v["src"] = json!(format!("{}:{}", u.src, u.src_port));
        v["dst"] = json!(format!("{}:{}", u.dst, u.dst_port));
    }
    let packet = |p: &Packet<'_>| {
        let h = &p.hdr;
        let b = &h.bth;
        let mut o = json!({
            "opcode": b.opcode.0, "name": b.opcode.name(), "qpn": b.dest_qp, "psn": b.psn.value(),
            "ack_req": b.ack_req, "se": b.se, "mig_req": b.mig_req, "pad_cnt": b.pad_cnt,
            "pkey": b.pkey, "fecn": b.fecn, "becn": b.becn,
            "payload_len": p.payload.len(), "icrc": p.icrc,
        });
        if let Some(d) = h.deth {
            o["deth"] = json!({ "qkey": d.qkey, "src_qp": d.src_qp });
        }
        match cm_mad(p) {
            Some(Ok((name, mad))) => {
                o["cm"] = json!({
                    "name": name, "attr_id": mad.msg.attr_id(), "tid": mad.tid,
                    "local_comm_id": mad.msg.local_comm_id(),
                    "remote_comm_id": mad.msg.remote_comm_id(),
                });
            }
            Some(Err(e)) => o["mad_error"] = json!(e.to_string()),
            None => {}
        }
        if let Some(f) = h.feth {
            o["feth"] = json!({ "sel": f.sel, "plt": f.plt });
        }
        if let Some(r) = h.reth {
            o["reth"] = json!({ "va": r.va, "rkey": r.rkey, "dma_len": r.dma_len });
        }
        if let Some(a) = h.atomic_eth {
            o["atomic_eth"] =
                json!({ "va": a.va, "rkey": a.rkey, "swap_add": a.swap_add, "compare": a.compare });
        }
        if let Some(a) = h.aeth {
            o["aeth"] = json!({ "syndrome": a.syndrome.to_byte(), "kind": format!("{:?}", a.syndrome), "msn": a.msn });
        }
        if let Some(a) = h.atomic_ack_eth {
            o["atomic_ack_eth"] = json!({ "orig": a.orig });
        }
        if let Some(i) = h.immdt {
            o["immdt"] = json!(i);
        }
        if let Some(i) = h.ieth {
            o["ieth"] = json!(i);
        }
        o
    };
    match &r.verdict {
        Verdict::Good(p) => {
            v["packet"] = packet(p);
            v["icrc_ok"] = json!(true);
        }
        Verdict::BadIcrc(p, c) => {
            v["packet"] = packet(p);
            v["icrc_ok"] = json!(false);
            v["icrc_computed"] = json!(c);
        }
        Verdict::Malformed(e) => v["error"] = json!(e),
    }
    v
}

/// The summary as text.
pub fn summary_text(s: &Summary) -> String {
    let mut out = format!(
        "{} frames: {} RoCEv2 ({} good, {} bad ICRC, {} malformed), {} other\n",
        s.frames,
        s.roce,
        s.roce - s.bad_icrc - s.malformed,
        s.bad_icrc,
        s.malformed,
        s.other
    );
    for (name, n) in &s.by_opcode {
        let _ = writeln!(out, "  {name:<36} {n:>8}");
    }
    out
}

/// The summary as JSON.
pub fn summary_json(s: &Summary) -> Value {
    json!({
        "frames": s.frames, "roce": s.roce, "other": s.other, "malformed": s.malformed,
        "bad_icrc": s.bad_icrc, "by_opcode": s.by_opcode, "failed_frames": s.failed_frames,
    })
}
