//! The CM messages themselves: one struct each, and [`CmMessage`] with its parse and emit.

use super::*;

/// ConnectRequest (IBTA 12.6.5).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Req {
    /// The sender's communication ID.
    pub local_comm_id: u32,
    /// The service the REQ is for (rdma_cm: port space and port).
    pub service_id: u64,
    /// The sender's CA GUID.
    pub local_ca_guid: u64,
    /// Local Q_Key (RD only).
    pub local_qkey: u32,
    /// The sender's QP number.
    pub local_qpn: u32,
    /// READs and atomics the sender accepts at once.
    pub responder_resources: u8,
    /// Local EE context (RD only).
    pub local_eecn: u32,
    /// READs and atomics the sender issues at once.
    pub initiator_depth: u8,
    /// Remote EE context (RD only).
    pub remote_eecn: u32,
    /// How long the receiver may take to answer (4.096 µs × 2^n).
    pub remote_cm_response_timeout: u8,
    /// Transport service type: 0 RC, 1 UC, 3 RD.
    pub transport: u8,
    /// End-to-end flow control.
    pub e2e_flow_control: bool,
    /// Starting PSN: the PSN the sender expects to receive first (the receiver sends from
    /// it; Linux's CM reads REQ and REP this way).
    pub starting_psn: u32,
    /// How long the sender takes to answer.
    pub local_cm_response_timeout: u8,
    /// Transport retry count.
    pub retry_count: u8,
    /// Partition key.
    pub pkey: u16,
    /// Path MTU (the IBTA encoding: 1 = 256 … 5 = 4096).
    pub path_mtu: u8,
    /// RD channel exists.
    pub rdc_exists: bool,
    /// RNR retry count.
    pub rnr_retry_count: u8,
    /// How often the CM retries (0–15).
    pub max_cm_retries: u8,
    /// The sender's QP uses an SRQ.
    pub srq: bool,
    /// Extended transport type.
    pub ext_transport: u8,
    /// The primary path.
    pub primary: CmPath,
    /// The alternate path (all zero when none).
    pub alternate: CmPath,
    /// Private data (92 bytes).
    pub private_data: Vec<u8>,
}

/// MessageReceiptAcknowledgement (IBTA 12.6.6): "your message arrived, answer is coming".
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Mra {
    /// The sender's communication ID.
    pub local_comm_id: u32,
    /// The receiver's communication ID.
    pub remote_comm_id: u32,
    /// The message acknowledged.
    pub message: MsgRef,
    /// How long the sender needs (4.096 µs × 2^n).
    pub service_timeout: u8,
    /// Private data (222 bytes).
    pub private_data: Vec<u8>,
}

/// ConnectReject (IBTA 12.6.7).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Rej {
    /// The sender's communication ID.
    pub local_comm_id: u32,
    /// The receiver's communication ID (0 when rejecting a REQ whose sender is unknown).
    pub remote_comm_id: u32,
    /// The message rejected.
    pub message: MsgRef,
    /// Length of the additional reject information.
    pub ari_len: u8,
    /// Reason ([`rej_reason`]).
    pub reason: u16,
    /// Additional reject information (72 bytes).
    pub ari: [u8; 72],
    /// Private data (148 bytes).
    pub private_data: Vec<u8>,
}

/// ConnectReply (IBTA 12.6.8).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Rep {
    /// The sender's communication ID.
    pub local_comm_id: u32,
    /// The receiver's communication ID.
    pub remote_comm_id: u32,
    /// Local Q_Key.
    pub local_qkey: u32,
    /// The sender's QP number.
    pub local_qpn: u32,
    /// Local EE context.
    pub local_eecn: u32,
    /// Starting PSN: the PSN the sender expects to receive first (the receiver sends from
    /// it; Linux's CM reads REQ and REP this way).
    pub starting_psn: u32,
    /// READs and atomics the sender accepts at once.
    pub responder_resources: u8,
    /// READs and atomics the sender issues at once.
    pub initiator_depth: u8,
    /// Target ACK delay (5 bits).
    pub target_ack_delay: u8,
    /// Failover accepted (2 bits).
    pub failover_accepted: u8,
    /// End-to-end flow control.
    pub e2e_flow_control: bool,
    /// RNR retry count (3 bits).
    pub rnr_retry_count: u8,
    /// The sender's QP uses an SRQ.
    pub srq: bool,
    /// The sender's CA GUID.
    pub local_ca_guid: u64,
    /// Private data (196 bytes).
    pub private_data: Vec<u8>,
}

/// ReadyToUse (12.6.9), DisconnectReply (12.6.11): two communication IDs and private data.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Ids {
    /// The sender's communication ID.
    pub local_comm_id: u32,
    /// The receiver's communication ID.
    pub remote_comm_id: u32,
    /// Private data (224 bytes).
    pub private_data: Vec<u8>,
}

/// DisconnectRequest (IBTA 12.6.10).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Dreq {
    /// The sender's communication ID.
    pub local_comm_id: u32,
    /// The receiver's communication ID.
    pub remote_comm_id: u32,
    /// The receiver's QP number.
    pub remote_qpn: u32,
    /// Private data (220 bytes).
    pub private_data: Vec<u8>,
}

/// ServiceIDResolutionRequest: which UD QP and Q_Key serve a service ID.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SidrReq {
    /// The requester's ID for this resolution (the reply carries it back).
    pub request_id: u32,
    /// Partition key.
    pub pkey: u16,
    /// The service asked for.
    pub service_id: u64,
    /// Private data (216 bytes).
    pub private_data: Vec<u8>,
}

/// ServiceIDResolutionResponse.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SidrRep {
    /// The request's ID.
    pub request_id: u32,
    /// [`sidr_status`].
    pub status: u8,
    /// Bytes of `info` that are valid.
    pub info_len: u8,
    /// The QP serving the service (status SUCCESS).
    pub qpn: u32,
    /// The service.
    pub service_id: u64,
    /// The Q_Key to send to it with.
    pub qkey: u32,
    /// Additional information (a ClassPortInfo for REDIRECT).
    pub info: [u8; 72],
    /// Private data (136 bytes).
    pub private_data: Vec<u8>,
}

/// A CM message.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum CmMessage {
    /// ConnectRequest.
    Req(Box<Req>),
    /// MessageReceiptAcknowledgement.
    Mra(Mra),
    /// ConnectReject.
    Rej(Box<Rej>),
    /// ConnectReply.
    Rep(Rep),
    /// ReadyToUse.
    Rtu(Ids),
    /// DisconnectRequest.
    Dreq(Dreq),
    /// DisconnectReply.
    Drep(Ids),
    /// ServiceIDResolutionRequest.
    SidrReq(Box<SidrReq>),
    /// ServiceIDResolutionResponse.
    SidrRep(Box<SidrRep>),
}

fn private(b: &[u8], id: u16) -> Vec<u8> {
    let info = attr_info(id).map_or(MAD_DATA_LEN, |i| i.private_at);
    b[info..].to_vec()
}

fn put_private(b: &mut [u8], at: usize, data: &[u8]) -> Result<()> {
    let room = b.len() - at;
    if data.len() > room {
        return Err(Error::FieldRange("private_data"));
    }
    b[at..at + data.len()].copy_from_slice(data);
    b[at + data.len()..].fill(0);
    Ok(())
}

impl CmMessage {
    /// The attribute ID this message travels under.
    pub fn attr_id(&self) -> u16 {
        match self {
            CmMessage::Req(_) => attr::REQ,
            CmMessage::Mra(_) => attr::MRA,
            CmMessage::Rej(_) => attr::REJ,
            CmMessage::Rep(_) => attr::REP,
            CmMessage::Rtu(_) => attr::RTU,
            CmMessage::Dreq(_) => attr::DREQ,
            CmMessage::Drep(_) => attr::DREP,
            CmMessage::SidrReq(_) => attr::SIDR_REQ,
            CmMessage::SidrRep(_) => attr::SIDR_REP,
        }
    }

    /// The sender's communication ID (a SIDR_REQ's request ID; 0 for a SIDR_REP).
    pub fn local_comm_id(&self) -> u32 {
        match self {
            CmMessage::SidrReq(m) => m.request_id,
            CmMessage::SidrRep(_) => 0,
            CmMessage::Req(m) => m.local_comm_id,
            CmMessage::Mra(m) => m.local_comm_id,
            CmMessage::Rej(m) => m.local_comm_id,
            CmMessage::Rep(m) => m.local_comm_id,
            CmMessage::Rtu(m) | CmMessage::Drep(m) => m.local_comm_id,
            CmMessage::Dreq(m) => m.local_comm_id,
        }
    }

    /// The receiver's communication ID (0 for a REQ or SIDR_REQ; a SIDR_REP's request ID).
    pub fn remote_comm_id(&self) -> u32 {
        match self {
            CmMessage::Req(_) | CmMessage::SidrReq(_) => 0,
            CmMessage::SidrRep(m) => m.request_id,
            CmMessage::Mra(m) => m.remote_comm_id,
            CmMessage::Rej(m) => m.remote_comm_id,
            CmMessage::Rep(m) => m.remote_comm_id,
            CmMessage::Rtu(m) | CmMessage::Drep(m) => m.remote_comm_id,
            CmMessage::Dreq(m) => m.remote_comm_id,
        }
    }

    /// Parse the class data `b` (at least 232 bytes) of attribute `id`.
    pub fn parse(id: u16, b: &[u8]) -> Result<CmMessage> {
        if b.len() < MAD_DATA_LEN {
            return Err(Error::Truncated {
                what: "CM message",
                need: MAD_DATA_LEN,
                have: b.len(),
            });
        }
        let b = &b[..MAD_DATA_LEN];
        let ids = (get_u32(b, 0..4), get_u32(b, 4..8));
        Ok(match id {
            attr::REQ => CmMessage::Req(Box::new(Req {
                local_comm_id: ids.0,
                service_id: get_u64(b, 8..16),
                local_ca_guid: get_u64(b, 16..24),
                local_qkey: get_u32(b, 28..32),
                local_qpn: get_u24(b, 32..35),
                responder_resources: b[35],
                local_eecn: get_u24(b, 36..39),
                initiator_depth: b[39],
                remote_eecn: get_u24(b, 40..43),
                remote_cm_response_timeout: b[43] >> 3,
                transport: (b[43] >> 1) & 3,
                e2e_flow_control: b[43] & 1 != 0,
                starting_psn: get_u24(b, 44..47),
                local_cm_response_timeout: b[47] >> 3,
                retry_count: b[47] & 7,
                pkey: get_u16(b, 48..50),
                path_mtu: b[50] >> 4,
                rdc_exists: b[50] & 8 != 0,
                rnr_retry_count: b[50] & 7,
                max_cm_retries: b[51] >> 4,
                srq: b[51] & 8 != 0,
                ext_transport: b[51] & 7,
                primary: CmPath::parse(&b[52..52 + CmPath::LEN]),
                alternate: CmPath::parse(&b[96..96 + CmPath::LEN]),
                private_data: private(b, id),
            })),
            attr::MRA => CmMessage::Mra(Mra {
                local_comm_id: ids.0,
                remote_comm_id: ids.1,
                message: MsgRef::from_bits(b[8] >> 6)?,
                service_timeout: b[9] >> 3,
                private_data: private(b, id),
            }),
            attr::REJ => {
                let mut ari = [0u8; 72];
                ari.copy_from_slice(&b[12..84]);
                let ari_len = b[9] >> 1;
                if usize::from(ari_len) > ari.len() {
                    return Err(Error::BadMad("REJ ARI length"));
                }
                CmMessage::Rej(Box::new(Rej {
                    local_comm_id: ids.0,
                    remote_comm_id: ids.1,
                    message: MsgRef::from_bits(b[8] >> 6)?,
                    ari_len,
                    reason: get_u16(b, 10..12),
                    ari,
                    private_data: private(b, id),
                }))
            }
            attr::REP => CmMessage::Rep(Rep {
                local_comm_id: ids.0,
                remote_comm_id: ids.1,
                local_qkey: get_u32(b, 8..12),
                local_qpn: get_u24(b, 12..15),
                local_eecn: get_u24(b, 16..19),
                starting_psn: get_u24(b, 20..23),
                responder_resources: b[24],
                initiator_depth: b[25],
                target_ack_delay: b[26] >> 3,
                failover_accepted: (b[26] >> 1) & 3,
                e2e_flow_control: b[26] & 1 != 0,
                rnr_retry_count: b[27] >> 5,
                srq: b[27] & 0x10 != 0,
                local_ca_guid: get_u64(b, 28..36),
                private_data: private(b, id),
            }),
            attr::RTU | attr::DREP => {
                let m = Ids {
                    local_comm_id: ids.0,
                    remote_comm_id: ids.1,
                    private_data: private(b, id),
                };
                if id == attr::RTU {
                    CmMessage::Rtu(m)
                } else {
                    CmMessage::Drep(m)
                }
            }
            attr::DREQ => CmMessage::Dreq(Dreq {
                local_comm_id: ids.0,
                remote_comm_id: ids.1,
                remote_qpn: get_u24(b, 8..11),
                private_data: private(b, id),
            }),
            attr::SIDR_REQ => CmMessage::SidrReq(Box::new(SidrReq {
                request_id: ids.0,
                pkey: get_u16(b, 4..6),
                service_id: get_u64(b, 8..16),
                private_data: private(b, id),
            })),
            attr::SIDR_REP => {
                let info_len = b[5];
                if usize::from(info_len) > 72 {
                    return Err(Error::BadMad("SIDR_REP info length"));
                }
                let mut info = [0u8; 72];
                info.copy_from_slice(&b[24..96]);
                CmMessage::SidrRep(Box::new(SidrRep {
                    request_id: ids.0,
                    status: b[4],
                    info_len,
                    qpn: get_u24(b, 8..11),
                    service_id: get_u64(b, 12..20),
                    qkey: get_u32(b, 20..24),
                    info,
                    private_data: private(b, id),
                }))
            }
            _ => return Err(Error::BadMad("unsupported CM attribute")),
        })
    }

    /// Emit into the class data `b` (at least 232 bytes): every byte of the 232 is written.
    pub fn emit(&self, b: &mut [u8]) -> Result<()> {
        if b.len() < MAD_DATA_LEN {
            return Err(Error::BufferTooSmall {
                need: MAD_DATA_LEN,
                have: b.len(),
            });
        }
        let b = &mut b[..MAD_DATA_LEN];
        b.fill(0);
        let at = attr_info(self.attr_id()).map_or(MAD_DATA_LEN, |i| i.private_at);
        match self {
            CmMessage::SidrReq(m) => {
                set_u32(b, 0..4, m.request_id);
                set_u16(b, 4..6, m.pkey);
                set_u64(b, 8..16, m.service_id);
                return put_private(b, at, &m.private_data);
            }
            CmMessage::SidrRep(m) => {
                if usize::from(m.info_len) > m.info.len() {
                    return Err(Error::FieldRange("info_len"));
                }
                set_u32(b, 0..4, m.request_id);
                b[4] = m.status;
                b[5] = m.info_len;
                set_u24(b, 8..11, u24(m.qpn, "qpn")?);
                set_u64(b, 12..20, m.service_id);
                set_u32(b, 20..24, m.qkey);
                b[24..96].copy_from_slice(&m.info);
                return put_private(b, at, &m.private_data);
            }
            _ => {}
        }
        set_u32(b, 0..4, self.local_comm_id());
        set_u32(b, 4..8, self.remote_comm_id());
        match self {
            CmMessage::Req(m) => {
                set_u64(b, 8..16, m.service_id);
                set_u64(b, 16..24, m.local_ca_guid);
                set_u32(b, 28..32, m.local_qkey);
                set_u24(b, 32..35, u24(m.local_qpn, "local_qpn")?);
                b[35] = m.responder_resources;
                set_u24(b, 36..39, u24(m.local_eecn, "local_eecn")?);
                b[39] = m.initiator_depth;
                set_u24(b, 40..43, u24(m.remote_eecn, "remote_eecn")?);
                b[43] = (bits(
                    m.remote_cm_response_timeout,
                    5,
                    "remote_cm_response_timeout",
                )? << 3)
                    | (bits(m.transport, 2, "transport")? << 1)
                    | u8::from(m.e2e_flow_control);
                set_u24(b, 44..47, u24(m.starting_psn, "starting_psn")?);
                b[47] = (bits(m.local_cm_response_timeout, 5, "local_cm_response_timeout")? << 3)
                    | bits(m.retry_count, 3, "retry_count")?;
                set_u16(b, 48..50, m.pkey);
                b[50] = (bits(m.path_mtu, 4, "path_mtu")? << 4)
                    | (u8::from(m.rdc_exists) << 3)
                    | bits(m.rnr_retry_count, 3, "rnr_retry_count")?;
                b[51] = (bits(m.max_cm_retries, 4, "max_cm_retries")? << 4)
                    | (u8::from(m.srq) << 3)
                    | bits(m.ext_transport, 3, "ext_transport")?;
                m.primary.emit(&mut b[52..52 + CmPath::LEN])?;
                m.alternate.emit(&mut b[96..96 + CmPath::LEN])?;
                put_private(b, at, &m.private_data)
            }
            CmMessage::Mra(m) => {
                b[8] = m.message.bits() << 6;
                b[9] = bits(m.service_timeout, 5, "service_timeout")? << 3;
                put_private(b, at, &m.private_data)
            }
            CmMessage::Rej(m) => {
                b[8] = m.message.bits() << 6;
                b[9] = bits(m.ari_len, 7, "ari_len")? << 1;
                if usize::from(m.ari_len) > m.ari.len() {
                    return Err(Error::FieldRange("ari_len"));
                }
                set_u16(b, 10..12, m.reason);
                b[12..84].copy_from_slice(&m.ari);
                put_private(b, at, &m.private_data)
            }
            CmMessage::Rep(m) => {
                set_u32(b, 8..12, m.local_qkey);
                set_u24(b, 12..15, u24(m.local_qpn, "local_qpn")?);
                set_u24(b, 16..19, u24(m.local_eecn, "local_eecn")?);
                set_u24(b, 20..23, u24(m.starting_psn, "starting_psn")?);
                b[24] = m.responder_resources;
                b[25] = m.initiator_depth;
                b[26] = (bits(m.target_ack_delay, 5, "target_ack_delay")? << 3)
                    | (bits(m.failover_accepted, 2, "failover_accepted")? << 1)
                    | u8::from(m.e2e_flow_control);
                b[27] =
                    (bits(m.rnr_retry_count, 3, "rnr_retry_count")? << 5) | (u8::from(m.srq) << 4);
                set_u64(b, 28..36, m.local_ca_guid);
                put_private(b, at, &m.private_data)
            }
            CmMessage::Rtu(m) | CmMessage::Drep(m) => put_private(b, at, &m.private_data),
            CmMessage::Dreq(m) => {
                set_u24(b, 8..11, u24(m.remote_qpn, "remote_qpn")?);
                put_private(b, at, &m.private_data)
            }
            CmMessage::SidrReq(_) | CmMessage::SidrRep(_) => Ok(()),
        }
    }
}
