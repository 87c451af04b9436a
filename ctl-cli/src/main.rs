//! memshim-ctl: finds shimmed processes and shows or releases their memory.
//!
//! Interim entry point of the deploy branch (run, doctor); the control
//! branch's CLI skeleton replaces it on merge.

#![forbid(unsafe_code)]

mod cmd;

use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(name = "memshim-ctl", version)]
struct Cli {
    #[command(subcommand)]
    cmd: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run a command with libmemshim.so preloaded
    Run(cmd::run::RunArgs),
    /// Explain why a process has no shim or a degraded one
    Doctor(cmd::doctor::DoctorArgs),
}

fn main() -> std::process::ExitCode {
    match Cli::parse().cmd {
        Command::Run(a) => cmd::run::run(a),
        Command::Doctor(a) => cmd::doctor::run(a, |_| cmd::doctor::Endpoint::Absent),
    }
}
