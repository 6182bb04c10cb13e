//! `softrdma`: decode RoCEv2 captures (and, as the project grows, device info and perf tests).

use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};
use softrdma::wire::ROCE_PORT;
use softrdma_cli::{decode, perf, sample};
use std::net::IpAddr;

#[derive(Parser)]
#[command(name = "softrdma", version, about = "A software RDMA NIC: tools")]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Print every RoCEv2 packet of a pcap or pcapng capture with its headers and ICRC verdict.
    Decode {
        /// The capture; without it, the sample capture bundled with softrdma.
        file: Option<PathBuf>,
        /// Exit non-zero, naming the packets, if any RoCEv2 packet is malformed or has a bad ICRC.
        #[arg(long)]
        check: bool,
        /// Print JSON (one object per packet, then the summary) instead of text.
        #[arg(long)]
        json: bool,
        /// UDP destination port that carries RoCEv2.
        #[arg(long, default_value_t = ROCE_PORT)]
        port: u16,
        /// Print only the summary.
        #[arg(long, short)]
        quiet: bool,
    },
    /// Run a perftest-style test over softrdma: server and client in two processes.
    Perf {
        /// Which test.
        #[arg(value_enum)]
        test: perf::Test,
        /// Be the server.
        #[arg(long, conflicts_with_all = ["client", "loopback"])]
        server: bool,
        /// Be the client of the server at this address.
        #[arg(long, conflicts_with = "loopback")]
        client: Option<IpAddr>,
        /// Run a server in a child process on 127.0.0.2 and the client on 127.0.0.1 (the
        /// default when neither --server nor --client is given).
        #[arg(long)]
        loopback: bool,
        /// This side's device address (default 127.0.0.1; 127.0.0.2 for a loopback server).
        #[arg(long)]
        local: Option<IpAddr>,
        #[command(flatten)]
        opts: perf::PerfOpts,
    },
    /// Measure the raw UDP loopback baseline (same batching, GSO and GRO, no transport).
    Baseline {
        /// `bw` (receiver goodput) or `lat` (one-way latency, busy-polling).
        #[arg(value_parser = ["bw", "lat"])]
        what: String,
        /// Message size in bytes.
        #[arg(long, short = 's', default_value_t = 65536)]
        size: usize,
        /// Packet (GSO segment) size for `bw`.
        #[arg(long, default_value_t = 4096)]
        segment: usize,
        /// Seconds for `bw`; round trips for `lat`.
        #[arg(long, default_value_t = 2.0)]
        amount: f64,
        /// `lat`: every datagram also carries an acknowledgement-sized second GSO segment (20
        /// bytes), the shape of a datagram with a held ACK behind the request.
        #[arg(long)]
        held_ack: bool,
    },
    /// Plot bandwidth over message size from JSON lines (perf --json, baseline) into an SVG.
    Plot {
        /// Input: JSON lines.
        input: PathBuf,
        /// Output SVG.
        out: PathBuf,
        /// Title.
        #[arg(long, default_value = "RDMA WRITE bandwidth over loopback")]
        title: String,
    },
    /// Report memory footprint: a device's baseline and each further QP's, from the resident
    /// set size before and after creating them.
    Footprint {
        /// QPs to create for the per-QP figure.
        #[arg(long, default_value_t = 256)]
        qps: usize,
    },
    /// Write the sample capture (every opcode, built by softrdma) to a file.
    Sample {
        /// Output file.
        out: PathBuf,
    },
}

fn main() -> ExitCode {
    match run(Cli::parse()) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("softrdma: {e}");
            ExitCode::from(2)
        }
    }
}

fn run(cli: Cli) -> Result<ExitCode, Box<dyn std::error::Error>> {
    match cli.cmd {
        Cmd::Decode {
            file,
            check,
            json,
            port,
            quiet,
        } => {
            let bytes = match &file {
                Some(f) => std::fs::read(f).map_err(|e| format!("{}: {e}", f.display()))?,
                None => sample::BUNDLED_SAMPLE.to_vec(),
            };
            let out = std::io::stdout();
            let mut out = std::io::BufWriter::new(out.lock());
            let mut io_err = None;
            let summary = decode::decode_capture(&bytes, port, |r| {
                if quiet || io_err.is_some() {
                    return;
                }
                let res = if json {
                    writeln!(out, "{}", decode::record_json(r))
                } else {
                    writeln!(out, "{}", decode::record_text(r))
                };
                if let Err(e) = res {
                    io_err = Some(e);
                }
            });
            if let Some(e) = io_err {
                if e.kind() == std::io::ErrorKind::BrokenPipe {
                    return Ok(ExitCode::SUCCESS);
                }
                return Err(e.into());
            }
            let summary = summary?;
            if json {
                writeln!(
                    out,
                    "{}",
                    serde_json::json!({ "summary": decode::summary_json(&summary) })
                )?;
            } else {
                write!(out, "{}", decode::summary_text(&summary))?;
            }
            out.flush()?;
            if check && !summary.failed_frames.is_empty() {
                let list: Vec<String> = summary
                    .failed_frames
                    .iter()
                    .take(20)
                    .map(|n| format!("#{n}"))
                    .collect();
                eprintln!(
                    "check failed: {} RoCEv2 packet(s) malformed or with a bad ICRC: frames {}{}",
                    summary.failed_frames.len(),
                    list.join(", "),
                    if summary.failed_frames.len() > 20 {
                        ", ..."
                    } else {
                        ""
                    }
                );
                return Ok(ExitCode::from(1));
            }
            Ok(ExitCode::SUCCESS)
        }
        Cmd::Perf {
            test,
            server,
            client,
            loopback: _,
            local,
            opts,
        } => {
            if server {
                perf::server(local.unwrap_or(IpAddr::from([127, 0, 0, 1])), &opts)?;
                return Ok(ExitCode::SUCCESS);
            }
            // Refuse a test the transport does not run (or a UD size above the MTU) before
            // a server is started.
            perf::validate(test, &opts)?;
            let stdout = std::io::stdout();
            let mut out = stdout.lock();
            if let Some(addr) = client {
                perf::client(
                    local.unwrap_or(IpAddr::from([127, 0, 0, 1])),
                    addr,
                    test,
                    &opts,
                    &mut out,
                )?;
                return Ok(ExitCode::SUCCESS);
            }
            // Loopback: a server process on 127.0.0.2, this process the client on 127.0.0.1.
            let me = std::env::current_exe()?;
            let args: Vec<String> = std::env::args()
                .skip(1)
                .filter(|a| a != "--loopback")
                .collect();
            let mut child = std::process::Command::new(me)
                .args(&args)
                .args(["--server", "--local", "127.0.0.2"])
                .stdin(std::process::Stdio::null())
                .spawn()?;
            let res = perf::client(
                IpAddr::from([127, 0, 0, 1]),
                IpAddr::from([127, 0, 0, 2]),
                test,
                &opts,
                &mut out,
            );
            let status = match res {
                Ok(_) => child.wait()?,
                Err(e) => {
                    let _ = child.kill();
                    let _ = child.wait();
                    return Err(e);
                }
            };
            if !status.success() {
                return Err(format!("server process: {status}").into());
            }
            Ok(ExitCode::SUCCESS)
        }
        Cmd::Baseline {
            what,
            size,
            segment,
            amount,
            held_ack,
        } => {
            if what == "bw" {
                let mb = softrdma_cli::baseline::bw(
                    size,
                    segment.clamp(64, 65000),
                    amount.clamp(0.1, 60.0),
                )?;
                println!(
                    "{{\"baseline\": \"udp_bw\", \"size\": {size}, \"segment\": {segment}, \"mb_per_s\": {mb:.1}}}"
                );
            } else {
                let trailer = if held_ack {
                    softrdma_cli::baseline::ACK_PACKET_LEN
                } else {
                    0
                };
                let l = softrdma_cli::baseline::lat_with(
                    size,
                    trailer,
                    (amount as usize).clamp(10, 1_000_000),
                )?;
                println!(
                    "{{\"baseline\": \"udp_lat\", \"size\": {size}, \"trailer\": {trailer}, \"lat_us\": {:.3}, \"lat_min_us\": {:.3}, \"lat_avg_us\": {:.3}, \"lat_p99_us\": {:.3}}}",
                    l.median, l.min, l.avg, l.p99
                );
            }
            Ok(ExitCode::SUCCESS)
        }
        Cmd::Plot { input, out, title } => {
            let text = std::fs::read_to_string(&input)?;
            let series = softrdma_cli::plot::series_from_jsonl(&text);
            softrdma_cli::plot::bandwidth_svg(&series, &title, &out)?;
            Ok(ExitCode::SUCCESS)
        }
        Cmd::Footprint { qps } => {
            let f = softrdma_cli::footprint::measure(qps)?;
            println!(
                "{}",
                serde_json::json!({
                    "device_baseline_bytes": f.device_bytes, "per_qp_bytes": f.per_qp_bytes,
                    "per_qp_bound_bytes": f.per_qp_bound_bytes, "qps": qps,
                })
            );
            Ok(ExitCode::SUCCESS)
        }
        Cmd::Sample { out } => {
            std::fs::write(&out, sample::sample_pcap()?)?;
            Ok(ExitCode::SUCCESS)
        }
    }
}
