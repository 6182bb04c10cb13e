//! Waiting for a server's TCP port (shared with the libibverbs crate's tests).

/// Wait until something listens on TCP `port` (any address; /proc/net/tcp and tcp6), for at
/// most `limit`: a client started before its server listens fails its connect, and a fixed
/// sleep is either too short on a loaded machine or wasted on an idle one. Panics naming
/// the port when nothing listens in time.
pub fn wait_listening(port: u16, limit: std::time::Duration) {
    let t0 = std::time::Instant::now();
    let listening = || {
        ["/proc/net/tcp", "/proc/net/tcp6"].iter().any(|f| {
            std::fs::read_to_string(f).is_ok_and(|text| {
                text.lines().skip(1).any(|l| {
                    let cols: Vec<&str> = l.split_whitespace().collect();
                    // local_address is ADDR:PORT in hex; state 0A is LISTEN.
                    cols.len() > 3
                        && cols[3] == "0A"
                        && cols[1]
                            .rsplit(':')
                            .next()
                            .and_then(|p| u16::from_str_radix(p, 16).ok())
                            == Some(port)
                })
            })
        })
    };
    while !listening() {
        assert!(
            t0.elapsed() < limit,
            "nothing listens on TCP port {port} after {limit:?}"
        );
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
}
