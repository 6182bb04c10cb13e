//! The opcode table: every opcode described once (IBTA 9.2.1, table 36; FLUSH and ATOMIC WRITE
//! from IBTA 1.5). Code asks the table which headers follow the BTH, whether a payload is
//! carried and where the packet sits in its message, instead of repeating `match` arms.

use core::fmt;

/// An 8-bit BTH opcode.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Opcode(pub u8);

/// The set of extension headers that follow the BTH. The order on the wire is fixed:
/// DETH, FETH, RETH, AtomicETH, AETH, AtomicAckETH, ImmDt, IETH.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct Headers(pub u16);

impl Headers {
    /// No extension header.
    pub const NONE: Headers = Headers(0);
    /// Datagram ETH (UD).
    pub const DETH: Headers = Headers(1 << 0);
    /// Flush ETH.
    pub const FETH: Headers = Headers(1 << 1);
    /// RDMA ETH.
    pub const RETH: Headers = Headers(1 << 2);
    /// Atomic ETH.
    pub const ATOMIC_ETH: Headers = Headers(1 << 3);
    /// ACK ETH.
    pub const AETH: Headers = Headers(1 << 4);
    /// Atomic ACK ETH.
    pub const ATOMIC_ACK_ETH: Headers = Headers(1 << 5);
    /// Immediate data.
    pub const IMMDT: Headers = Headers(1 << 6);
    /// Invalidate ETH.
    pub const IETH: Headers = Headers(1 << 7);

    /// True when every header in `other` is present.
    pub const fn has(self, other: Headers) -> bool {
        self.0 & other.0 == other.0
    }
    /// Union.
    pub const fn with(self, other: Headers) -> Headers {
        Headers(self.0 | other.0)
    }
    /// Total length in bytes of these extension headers.
    pub const fn len(self) -> usize {
        let sizes = [8, 4, 16, 28, 4, 8, 4, 4];
        let mut i = 0;
        let mut n = 0;
        while i < sizes.len() {
            if self.0 & (1 << i) != 0 {
                n += sizes[i];
            }
            i += 1;
        }
        n
    }
    /// True when no extension header is present.
    pub const fn is_empty(self) -> bool {
        self.0 == 0
    }
}

/// Transport service of an opcode (bits 7-5).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Transport {
    /// Reliable Connected.
    Rc,
    /// Unreliable Connected.
    Uc,
    /// Unreliable Datagram.
    Ud,
}

/// What an opcode does.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum OpKind {
    /// SEND (consumes a receive WQE).
    Send,
    /// RDMA WRITE.
    Write,
    /// RDMA READ request.
    ReadRequest,
    /// RDMA READ response.
    ReadResponse,
    /// Acknowledge.
    Ack,
    /// Atomic acknowledge.
    AtomicAck,
    /// Compare & Swap.
    CompareSwap,
    /// Fetch & Add.
    FetchAdd,
    /// RDMA FLUSH.
    Flush,
    /// ATOMIC WRITE (8 bytes, placed atomically).
    AtomicWrite,
}

/// Where a packet sits in its message.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Position {
    /// First of several.
    First,
    /// Neither first nor last.
    Middle,
    /// Last of several.
    Last,
    /// The whole message.
    Only,
}

impl Position {
    /// Starts a message (First or Only).
    pub const fn starts(self) -> bool {
        matches!(self, Position::First | Position::Only)
    }
    /// Ends a message (Last or Only).
    pub const fn ends(self) -> bool {
        matches!(self, Position::Last | Position::Only)
    }
}

/// Everything the stack needs to know about one opcode.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct OpcodeInfo {
    /// The opcode.
    pub opcode: Opcode,
    /// Name in the style of the spec and rxe, e.g. `RC_SEND_ONLY`.
    pub name: &'static str,
    /// Transport service.
    pub transport: Transport,
    /// Operation.
    pub kind: OpKind,
    /// Position in the message.
    pub position: Position,
    /// Extension headers after the BTH.
    pub headers: Headers,
    /// Whether a payload may follow the headers.
    pub payload: bool,
}

impl OpcodeInfo {
    /// Length of BTH plus extension headers.
    pub const fn header_len(&self) -> usize {
        super::Bth::<&[u8]>::LEN + self.headers.len()
    }
    /// True for packets a requester sends (as opposed to responses and acknowledgements).
    pub const fn is_request(&self) -> bool {
        !matches!(
            self.kind,
            OpKind::ReadResponse | OpKind::Ack | OpKind::AtomicAck
        )
    }
    /// True for packets that consume a receive WQE at the responder (SEND, WRITE with immediate).
    pub const fn consumes_recv(&self) -> bool {
        match self.kind {
            OpKind::Send => true,
            OpKind::Write => self.headers.has(Headers::IMMDT),
            _ => false,
        }
    }
}

const fn op(
    code: u8,
    name: &'static str,
    kind: OpKind,
    position: Position,
    headers: Headers,
    payload: bool,
) -> OpcodeInfo {
    let transport = match code >> 5 {
        0 => Transport::Rc,
        1 => Transport::Uc,
        _ => Transport::Ud,
    };
    OpcodeInfo {
        opcode: Opcode(code),
        name,
        transport,
        kind,
        position,
        headers,
        payload,
    }
}

use Headers as H;
use OpKind::*;
use Position::*;

/// Every opcode softrdma knows, in opcode order.
pub const OPCODES: &[OpcodeInfo] = &[
    op(0x00, "RC_SEND_FIRST", Send, First, H::NONE, true),
    op(0x01, "RC_SEND_MIDDLE", Send, Middle, H::NONE, true),
    op(0x02, "RC_SEND_LAST", Send, Last, H::NONE, true),
    op(
        0x03,
        "RC_SEND_LAST_WITH_IMMEDIATE",
        Send,
        Last,
        H::IMMDT,
        true,
    ),
    op(0x04, "RC_SEND_ONLY", Send, Only, H::NONE, true),
    op(
        0x05,
        "RC_SEND_ONLY_WITH_IMMEDIATE",
        Send,
        Only,
        H::IMMDT,
        true,
    ),
    op(0x06, "RC_RDMA_WRITE_FIRST", Write, First, H::RETH, true),
    op(0x07, "RC_RDMA_WRITE_MIDDLE", Write, Middle, H::NONE, true),
    op(0x08, "RC_RDMA_WRITE_LAST", Write, Last, H::NONE, true),
    op(
        0x09,
        "RC_RDMA_WRITE_LAST_WITH_IMMEDIATE",
        Write,
        Last,
        H::IMMDT,
        true,
    ),
    op(0x0a, "RC_RDMA_WRITE_ONLY", Write, Only, H::RETH, true),
    op(
        0x0b,
        "RC_RDMA_WRITE_ONLY_WITH_IMMEDIATE",
        Write,
        Only,
        H::RETH.with(H::IMMDT),
        true,
    ),
    op(
        0x0c,
        "RC_RDMA_READ_REQUEST",
        ReadRequest,
        Only,
        H::RETH,
        false,
    ),
    op(
        0x0d,
        "RC_RDMA_READ_RESPONSE_FIRST",
        ReadResponse,
        First,
        H::AETH,
        true,
    ),
    op(
        0x0e,
        "RC_RDMA_READ_RESPONSE_MIDDLE",
        ReadResponse,
        Middle,
        H::NONE,
        true,
    ),
    op(
        0x0f,
        "RC_RDMA_READ_RESPONSE_LAST",
        ReadResponse,
        Last,
        H::AETH,
        true,
    ),
    op(
        0x10,
        "RC_RDMA_READ_RESPONSE_ONLY",
        ReadResponse,
        Only,
        H::AETH,
        true,
    ),
    op(0x11, "RC_ACKNOWLEDGE", Ack, Only, H::AETH, false),
    op(
        0x12,
        "RC_ATOMIC_ACKNOWLEDGE",
        AtomicAck,
        Only,
        H::AETH.with(H::ATOMIC_ACK_ETH),
        false,
    ),
    op(
        0x13,
        "RC_COMPARE_SWAP",
        CompareSwap,
        Only,
        H::ATOMIC_ETH,
        false,
    ),
    op(0x14, "RC_FETCH_ADD", FetchAdd, Only, H::ATOMIC_ETH, false),
    op(
        0x16,
        "RC_SEND_LAST_WITH_INVALIDATE",
        Send,
        Last,
        H::IETH,
        true,
    ),
    op(
        0x17,
        "RC_SEND_ONLY_WITH_INVALIDATE",
        Send,
        Only,
        H::IETH,
        true,
    ),
    op(0x1c, "RC_FLUSH", Flush, Only, H::FETH.with(H::RETH), false),
    op(0x1d, "RC_ATOMIC_WRITE", AtomicWrite, Only, H::RETH, true),
    op(0x20, "UC_SEND_FIRST", Send, First, H::NONE, true),
    op(0x21, "UC_SEND_MIDDLE", Send, Middle, H::NONE, true),
    op(0x22, "UC_SEND_LAST", Send, Last, H::NONE, true),
    op(
        0x23,
        "UC_SEND_LAST_WITH_IMMEDIATE",
        Send,
        Last,
        H::IMMDT,
        true,
    ),
    op(0x24, "UC_SEND_ONLY", Send, Only, H::NONE, true),
    op(
        0x25,
        "UC_SEND_ONLY_WITH_IMMEDIATE",
        Send,
        Only,
        H::IMMDT,
        true,
    ),
    op(0x26, "UC_RDMA_WRITE_FIRST", Write, First, H::RETH, true),
    op(0x27, "UC_RDMA_WRITE_MIDDLE", Write, Middle, H::NONE, true),
    op(0x28, "UC_RDMA_WRITE_LAST", Write, Last, H::NONE, true),
    op(
        0x29,
        "UC_RDMA_WRITE_LAST_WITH_IMMEDIATE",
        Write,
        Last,
        H::IMMDT,
        true,
    ),
    op(0x2a, "UC_RDMA_WRITE_ONLY", Write, Only, H::RETH, true),
    op(
        0x2b,
        "UC_RDMA_WRITE_ONLY_WITH_IMMEDIATE",
        Write,
        Only,
        H::RETH.with(H::IMMDT),
        true,
    ),
    op(0x64, "UD_SEND_ONLY", Send, Only, H::DETH, true),
    op(
        0x65,
        "UD_SEND_ONLY_WITH_IMMEDIATE",
        Send,
        Only,
        H::DETH.with(H::IMMDT),
        true,
    ),
];

/// Index into [`OPCODES`] by opcode byte; 0xff marks an unknown opcode.
const INDEX: [u8; 256] = {
    let mut idx = [0xffu8; 256];
    let mut i = 0;
    while i < OPCODES.len() {
        idx[OPCODES[i].opcode.0 as usize] = i as u8;
        i += 1;
    }
    idx
};

impl Opcode {
    /// The table entry, or `None` for an opcode softrdma does not implement.
    #[inline]
    pub fn info(self) -> Option<&'static OpcodeInfo> {
        match INDEX[self.0 as usize] {
            0xff => None,
            i => Some(&OPCODES[i as usize]),
        }
    }

    /// The name, or `UNKNOWN`.
    pub fn name(self) -> &'static str {
        self.info().map_or("UNKNOWN", |i| i.name)
    }

    /// Find the opcode for a transport, operation, position and optional immediate or
    /// invalidate header.
    pub fn find(
        transport: Transport,
        kind: OpKind,
        position: Position,
        extra: Headers,
    ) -> Option<Opcode> {
        OPCODES
            .iter()
            .find(|i| {
                i.transport == transport
                    && i.kind == kind
                    && i.position == position
                    && i.headers.0 & (H::IMMDT.0 | H::IETH.0) == extra.0
            })
            .map(|i| i.opcode)
    }

    /// RC opcodes, named.
    pub const RC_SEND_FIRST: Opcode = Opcode(0x00);
    /// `RC_SEND_MIDDLE`
    pub const RC_SEND_MIDDLE: Opcode = Opcode(0x01);
    /// `RC_SEND_LAST`
    pub const RC_SEND_LAST: Opcode = Opcode(0x02);
    /// `RC_SEND_LAST_WITH_IMMEDIATE`
    pub const RC_SEND_LAST_IMM: Opcode = Opcode(0x03);
    /// `RC_SEND_ONLY`
    pub const RC_SEND_ONLY: Opcode = Opcode(0x04);
    /// `RC_SEND_ONLY_WITH_IMMEDIATE`
    pub const RC_SEND_ONLY_IMM: Opcode = Opcode(0x05);
    /// `RC_RDMA_WRITE_FIRST`
    pub const RC_WRITE_FIRST: Opcode = Opcode(0x06);
    /// `RC_RDMA_WRITE_MIDDLE`
    pub const RC_WRITE_MIDDLE: Opcode = Opcode(0x07);
    /// `RC_RDMA_WRITE_LAST`
    pub const RC_WRITE_LAST: Opcode = Opcode(0x08);
    /// `RC_RDMA_WRITE_LAST_WITH_IMMEDIATE`
    pub const RC_WRITE_LAST_IMM: Opcode = Opcode(0x09);
    /// `RC_RDMA_WRITE_ONLY`
    pub const RC_WRITE_ONLY: Opcode = Opcode(0x0a);
    /// `RC_RDMA_WRITE_ONLY_WITH_IMMEDIATE`
    pub const RC_WRITE_ONLY_IMM: Opcode = Opcode(0x0b);
    /// `RC_RDMA_READ_REQUEST`
    pub const RC_READ_REQUEST: Opcode = Opcode(0x0c);
    /// `RC_RDMA_READ_RESPONSE_FIRST`
    pub const RC_READ_RESPONSE_FIRST: Opcode = Opcode(0x0d);
    /// `RC_RDMA_READ_RESPONSE_MIDDLE`
    pub const RC_READ_RESPONSE_MIDDLE: Opcode = Opcode(0x0e);
    /// `RC_RDMA_READ_RESPONSE_LAST`
    pub const RC_READ_RESPONSE_LAST: Opcode = Opcode(0x0f);
    /// `RC_RDMA_READ_RESPONSE_ONLY`
    pub const RC_READ_RESPONSE_ONLY: Opcode = Opcode(0x10);
    /// `RC_ACKNOWLEDGE`
    pub const RC_ACK: Opcode = Opcode(0x11);
    /// `RC_ATOMIC_ACKNOWLEDGE`
    pub const RC_ATOMIC_ACK: Opcode = Opcode(0x12);
    /// `RC_COMPARE_SWAP`
    pub const RC_COMPARE_SWAP: Opcode = Opcode(0x13);
    /// `RC_FETCH_ADD`
    pub const RC_FETCH_ADD: Opcode = Opcode(0x14);
    /// `RC_SEND_LAST_WITH_INVALIDATE`
    pub const RC_SEND_LAST_INV: Opcode = Opcode(0x16);
    /// `RC_SEND_ONLY_WITH_INVALIDATE`
    pub const RC_SEND_ONLY_INV: Opcode = Opcode(0x17);
    /// `RC_FLUSH`
    pub const RC_FLUSH: Opcode = Opcode(0x1c);
    /// `RC_ATOMIC_WRITE`
    pub const RC_ATOMIC_WRITE: Opcode = Opcode(0x1d);
    /// `UD_SEND_ONLY`
    pub const UD_SEND_ONLY: Opcode = Opcode(0x64);
    /// `UD_SEND_ONLY_WITH_IMMEDIATE`
    pub const UD_SEND_ONLY_IMM: Opcode = Opcode(0x65);
}

impl fmt::Debug for Opcode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}({:#04x})", self.name(), self.0)
    }
}

impl fmt::Display for Opcode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn table_is_sorted_unique_and_indexed() {
        for w in OPCODES.windows(2) {
            assert!(w[0].opcode.0 < w[1].opcode.0);
        }
        for i in OPCODES {
            assert_eq!(i.opcode.info(), Some(i));
        }
        let known = (0..=255u8).filter(|b| Opcode(*b).info().is_some()).count();
        assert_eq!(known, OPCODES.len());
        assert!(Opcode(0x15).info().is_none() && Opcode(0x40).info().is_none());
    }

    #[test]
    fn header_lengths_match_the_spec() {
        let len = |o: u8| Opcode(o).info().unwrap().header_len();
        assert_eq!(len(0x04), 12);
        assert_eq!(len(0x0a), 28);
        assert_eq!(len(0x0b), 32);
        assert_eq!(len(0x11), 16);
        assert_eq!(len(0x12), 24);
        assert_eq!(len(0x13), 40);
        assert_eq!(len(0x1c), 32);
        assert_eq!(len(0x65), 24);
    }

    #[test]
    fn find_inverts_the_table() {
        for i in OPCODES {
            let extra = Headers(i.headers.0 & (Headers::IMMDT.0 | Headers::IETH.0));
            assert_eq!(
                Opcode::find(i.transport, i.kind, i.position, extra),
                Some(i.opcode)
            );
        }
    }

    #[test]
    fn uc_is_rc_plus_0x20() {
        for i in OPCODES.iter().filter(|i| i.transport == Transport::Uc) {
            let rc = Opcode(i.opcode.0 - 0x20).info().unwrap();
            assert_eq!(
                (rc.kind, rc.position, rc.headers),
                (i.kind, i.position, i.headers)
            );
        }
    }
}
