//! `driverlab agent ...`: reading what the guest agent sent.

use std::path::PathBuf;

use anyhow::Context;
use clap::Subcommand;

/// Guest agent commands.
#[derive(Subcommand)]
pub enum AgentCommand {
    /// The frames of a result port's log (COM2), one JSON object per line, and how many were broken.
    Frames {
        /// The log.
        log: PathBuf,
    },
    /// The Linux check's verdict over a folder of logs (agent.log, console.log, and where they
    /// are, model.log, qemu.log, qemu-trace.log): the steps, iperf3, IOMMU activity, then
    /// `result: PASS` or `result: FAIL` with the problems. Exit code 0 on PASS, 1 on FAIL.
    Verdict {
        /// The folder.
        logs: PathBuf,
        /// The report as JSON instead.
        #[arg(long)]
        json: bool,
    },
}

impl AgentCommand {
    /// Runs the command.
    pub fn run(self) -> anyhow::Result<u8> {
        match self {
            AgentCommand::Frames { log } => {
                let data = std::fs::read(&log).with_context(|| log.display().to_string())?;
                let frames = engines::agent::parse(&data);
                for frame in &frames.frames {
                    println!("{}", serde_json::to_string(frame)?);
                }
                eprintln!("{} frames, {} broken", frames.frames.len(), frames.broken);
                Ok(0)
            }
            AgentCommand::Verdict { logs, json } => {
                let check = engines::agent::linux_check(&logs)
                    .with_context(|| format!("reading the logs in {}", logs.display()))?;
                if json {
                    println!("{}", serde_json::to_string_pretty(&check)?);
                } else {
                    print!("{}", check.summary());
                }
                Ok(if check.verdict.ok { 0 } else { 1 })
            }
        }
    }
}
