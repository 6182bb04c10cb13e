//! Two processes, one RDMA connection set: the test binary re-runs itself as a child (selected
//! by an environment variable naming the test), each side opens a device on its own loopback
//! address, and the two exchange QPNs, PSNs, keys and results over TCP in lines of text. Every
//! wait is bounded.

use std::io::{BufRead, BufReader, Write};
use std::net::{IpAddr, TcpListener, TcpStream};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use softrdma::verbs::{Qp, QpAttr, random_psn};

/// A text link to the other process (every read waits at most 60 s).
pub struct Link {
    r: BufReader<TcpStream>,
    w: TcpStream,
}

impl Link {
    fn new(s: TcpStream) -> Link {
        s.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
        Link {
            r: BufReader::new(s.try_clone().unwrap()),
            w: s,
        }
    }

    /// Send one line.
    pub fn send(&mut self, s: &str) {
        writeln!(self.w, "{s}").unwrap();
    }

    /// The next line, trimmed.
    pub fn recv(&mut self) -> String {
        let mut s = String::new();
        self.r.read_line(&mut s).expect("peer line within 60 s");
        s.trim().to_owned()
    }

    /// The next line as numbers.
    pub fn nums(&mut self) -> Vec<u64> {
        self.recv()
            .split_whitespace()
            .map(|x| x.parse().unwrap())
            .collect()
    }
}

/// How a test file's processes meet: the child's environment variable, the first three bytes
/// of their loopback addresses (pair `p` uses `.2p` for the parent and `.2p+1` for the child),
/// the child's first TCP port (pair `p` listens on `port + p`), and the QP attributes both
/// sides connect with (`attr(peer_qpn, my_psn, peer_psn)`).
pub struct TwoProcesses {
    pub env: &'static str,
    pub net: [u8; 3],
    pub port: u16,
    pub attr: fn(u32, u32, u32) -> QpAttr,
}

impl TwoProcesses {
    /// The address of pair `pair`'s child or parent.
    pub fn addr(&self, pair: u8, child: bool) -> IpAddr {
        let [a, b, c] = self.net;
        IpAddr::from([a, b, c, pair * 2 + u8::from(child)])
    }

    /// True in the child process of `test`.
    pub fn is_child(&self, test: &str) -> bool {
        std::env::var(self.env).is_ok_and(|v| v == test)
    }

    /// Parent side: start the child for `test` on pair `pair`, connect one QP per entry of
    /// `qps` to the child's, announcing `extra` after the QPN/PSN pairs, and return the child,
    /// the link and the child's numbers after its QPN/PSN pairs. Returns once the child's QPs
    /// are at RTS: a request that reached one still in RTR would be answered there, and a NAK
    /// would put it in the error state before it could move to RTS.
    pub fn parent(
        &self,
        test: &str,
        pair: u8,
        qps: &[&Qp],
        extra: &[u64],
    ) -> (Child, Link, Vec<u64>) {
        let child = Command::new(std::env::current_exe().unwrap())
            .args([test, "--exact", "--nocapture", "--test-threads=1"])
            .env(self.env, test)
            .stdin(Stdio::null())
            .spawn()
            .unwrap();
        let deadline = Instant::now() + Duration::from_secs(30);
        let port = self.port + u16::from(pair);
        let s = loop {
            match TcpStream::connect((self.addr(pair, true), port)) {
                Ok(s) => break s,
                Err(e) if Instant::now() > deadline => panic!("child never listened: {e}"),
                Err(_) => std::thread::sleep(Duration::from_millis(20)),
            }
        };
        let mut l = Link::new(s);
        let theirs = l.nums();
        let mut mine = String::new();
        for (i, qp) in qps.iter().enumerate() {
            let psn = random_psn();
            mine.push_str(&format!("{} {} ", qp.qp_num(), psn));
            let attr = (self.attr)(theirs[2 * i] as u32, psn, theirs[2 * i + 1] as u32);
            qp.connect(self.addr(pair, true), &attr).unwrap();
        }
        for e in extra {
            mine.push_str(&format!("{e} "));
        }
        l.send(mine.trim());
        assert_eq!(l.recv(), "up", "the child did not connect");
        let rest = theirs[2 * qps.len()..].to_vec();
        (child, l, rest)
    }

    /// Child side: listen, announce QPN/PSN per QP plus `extra`, connect to the parent's QPs;
    /// returns the link and the parent's numbers after its QPN/PSN pairs.
    pub fn child(&self, pair: u8, qps: &[&Qp], extra: &[u64]) -> (Link, Vec<u64>) {
        let port = self.port + u16::from(pair);
        let lis = TcpListener::bind((self.addr(pair, true), port)).unwrap();
        let (s, _) = lis.accept().unwrap();
        let mut l = Link::new(s);
        let psns: Vec<u32> = qps.iter().map(|_| random_psn()).collect();
        let mut line = String::new();
        for (qp, psn) in qps.iter().zip(&psns) {
            line.push_str(&format!("{} {} ", qp.qp_num(), psn));
        }
        for e in extra {
            line.push_str(&format!("{e} "));
        }
        l.send(line.trim());
        let theirs = l.nums();
        for (i, qp) in qps.iter().enumerate() {
            let attr = (self.attr)(theirs[2 * i] as u32, psns[i], theirs[2 * i + 1] as u32);
            qp.connect(self.addr(pair, false), &attr).unwrap();
        }
        l.send("up");
        (l, theirs[2 * qps.len()..].to_vec())
    }
}

/// Wait up to 30 s for the child to exit successfully (killed, by its own handle, if not).
pub fn finish(mut child: Child) {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        if let Some(st) = child.try_wait().unwrap() {
            assert!(st.success(), "child failed: {st}");
            return;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("child did not exit");
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}
