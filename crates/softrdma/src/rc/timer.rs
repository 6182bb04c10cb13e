//! Transport timers: the local ACK timeout and the RNR back-off (IBTA 9.7.6.1.3, table 45).

/// Local ACK timeout in nanoseconds for the 5-bit `timeout` attribute: 4.096 us x 2^timeout.
/// `None` for 0, which means "wait forever".
pub const fn ack_timeout_ns(timeout: u8) -> Option<u64> {
    if timeout == 0 {
        None
    } else {
        Some(4096u64 << (timeout & 0x1f))
    }
}

/// RNR back-off in nanoseconds for a timer code carried in an RNR NAK.
pub const fn rnr_backoff_ns(code: u8) -> u64 {
    crate::wire::aeth::rnr_timer_ns(code)
}

/// The earlier of two optional deadlines.
pub fn earliest(a: Option<u64>, b: Option<u64>) -> Option<u64> {
    match (a, b) {
        (Some(x), Some(y)) => Some(x.min(y)),
        (x, None) => x,
        (None, y) => y,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn timeouts() {
        assert_eq!(ack_timeout_ns(0), None);
        assert_eq!(ack_timeout_ns(14), Some(67_108_864));
        assert_eq!(rnr_backoff_ns(1), 10_000);
        assert_eq!(earliest(Some(3), Some(2)), Some(2));
        assert_eq!(earliest(None, Some(2)), Some(2));
    }
}
