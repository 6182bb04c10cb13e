//! Helpers shared by the adversarial tests that run part of themselves in a child process:
//! a guard that owns the child (killed by its pid and reaped on every path out of the test)
//! and reads its output with a bound on every wait, a small seeded generator, and running part
//! of a test in a network namespace ([`netns`]); and the two-process harness of the verbs
//! tests that connect a parent and a child ([`pair`]).

#![allow(dead_code)]

pub mod netns;
pub mod pair;

use std::io::{BufRead, BufReader, Read, Write};
use std::process::{Child, ChildStdin, Command, ExitStatus, Stdio};
use std::sync::mpsc::{Receiver, RecvTimeoutError, Sender, channel};
use std::time::{Duration, Instant};

/// A child process this test started. Its stdout and stderr are read by two threads into one
/// channel (stderr lines tagged `stderr| `), so that no read blocks the test: every wait has
/// a deadline. Dropping the guard kills the child (SIGKILL to its pid, only this child) if it
/// is still running, and reaps it.
pub struct ChildGuard {
    child: Child,
    stdin: Option<ChildStdin>,
    lines: Receiver<String>,
    log: Vec<String>,
}

fn pump(r: impl Read + Send + 'static, tag: &'static str, tx: Sender<String>) {
    std::thread::spawn(move || {
        for line in BufReader::new(r).lines() {
            let Ok(line) = line else { break };
            if tx.send(format!("{tag}{line}")).is_err() {
                break;
            }
        }
    });
}

impl ChildGuard {
    /// Start `cmd` with its stdin, stdout and stderr piped.
    pub fn spawn(mut cmd: Command) -> std::io::Result<ChildGuard> {
        cmd.stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        let mut child = cmd.spawn()?;
        let (tx, lines) = channel();
        pump(child.stdout.take().expect("piped"), "", tx.clone());
        pump(child.stderr.take().expect("piped"), "stderr| ", tx);
        let stdin = child.stdin.take();
        Ok(ChildGuard {
            child,
            stdin,
            lines,
            log: Vec::new(),
        })
    }

    /// The child's process id.
    pub fn id(&self) -> u32 {
        self.child.id()
    }

    /// The next line of output within `timeout` (None when none came or the child's output
    /// ended).
    pub fn line(&mut self, timeout: Duration) -> Option<String> {
        match self.lines.recv_timeout(timeout) {
            Ok(l) => {
                self.log.push(l.clone());
                Some(l)
            }
            Err(RecvTimeoutError::Timeout | RecvTimeoutError::Disconnected) => None,
        }
    }

    /// The first line holding one of `markers` within `timeout`, or None (the lines passed
    /// over are kept in the log). A marker may follow the test harness's "test name ... ".
    pub fn find(&mut self, markers: &[&str], timeout: Duration) -> Option<String> {
        let end = Instant::now() + timeout;
        loop {
            let left = end.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return None;
            }
            let l = self.line(left)?;
            if markers.iter().any(|m| l.contains(m)) {
                return Some(l);
            }
        }
    }

    /// The rest of the first line holding `marker` (from the marker on) within `timeout`;
    /// panics with the child's output otherwise.
    pub fn expect(&mut self, marker: &str, timeout: Duration) -> String {
        match self.find(&[marker], timeout) {
            Some(l) => l[l.find(marker).unwrap()..].to_owned(),
            None => panic!(
                "no `{marker}` line from the child within {timeout:?}; alive: {}; its output:\n{}",
                self.alive(),
                self.log()
            ),
        }
    }

    /// Write one line to the child's stdin.
    pub fn send(&mut self, line: &str) {
        let w = self.stdin.as_mut().expect("stdin still open");
        writeln!(w, "{line}").and_then(|_| w.flush()).unwrap();
    }

    /// Close the child's stdin (it sees end of input).
    pub fn close_stdin(&mut self) {
        self.stdin = None;
    }

    /// Still running: not exited, not killed by a signal.
    pub fn alive(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(None))
    }

    /// Wait up to `timeout` for the child to end; None if it is still running (the guard
    /// then kills it when dropped). Collects what is left of its output.
    pub fn wait(&mut self, timeout: Duration) -> Option<ExitStatus> {
        let end = Instant::now() + timeout;
        let status = loop {
            if let Ok(Some(s)) = self.child.try_wait() {
                break Some(s);
            }
            if Instant::now() >= end {
                break None;
            }
            std::thread::sleep(Duration::from_millis(10));
        };
        // The readers end with the pipes; take what they still hold, briefly.
        while self.line(Duration::from_millis(50)).is_some() {}
        status
    }

    /// Everything the child printed so far.
    pub fn log(&self) -> String {
        self.log.join("\n")
    }
}

impl Drop for ChildGuard {
    fn drop(&mut self) {
        self.stdin = None;
        if matches!(self.child.try_wait(), Ok(None)) {
            // Child::kill signals this child's pid, nothing else.
            let _ = self.child.kill();
        }
        let _ = self.child.wait();
    }
}

/// xorshift64: reproducible "random" choices from a fixed seed.
pub struct Rng(pub u64);

impl Rng {
    pub fn next(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        self.0 = x;
        x
    }

    /// Uniform-ish in `0..n` (n > 0).
    pub fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

/// Counter lines `name=value ...` as pairs (for values passed between processes).
pub fn parse_kv(line: &str) -> Vec<(String, u64)> {
    line.split_whitespace()
        .filter_map(|kv| {
            let (k, v) = kv.split_once('=')?;
            Some((k.to_owned(), v.parse().ok()?))
        })
        .collect()
}

/// The value of `key` in `kv`; panics if absent.
pub fn kv(kv: &[(String, u64)], key: &str) -> u64 {
    kv.iter()
        .find(|(k, _)| k == key)
        .map(|(_, v)| *v)
        .unwrap_or_else(|| panic!("no {key} in {kv:?}"))
}

mod listen;
// Not every test binary that includes this module waits for a port.
#[allow(unused_imports)]
pub use listen::wait_listening;
