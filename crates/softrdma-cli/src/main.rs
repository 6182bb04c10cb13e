//! `softrdma`: decode RoCEv2 captures (and, as the project grows, device info and perf tests).

use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};
use softrdma::wire::ROCE_PORT;
use softrdma_cli::{decode, sample};

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
        Cmd::Sample { out } => {
            std::fs::write(&out, sample::sample_pcap()?)?;
            Ok(ExitCode::SUCCESS)
        }
    }
}
