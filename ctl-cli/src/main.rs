//! memshim-ctl: finds shimmed processes and shows or releases their memory.
//!
//! `main` only parses the command line, runs the subcommand and turns its
//! outcome into an exit code (`memshim_proto::exit` has them; exit.rs
//! maps onto them). Subcommands live in `cmd/`, one file each; `cmd/mod.rs`
//! says how to add one. docs/design.md's layout table and "The CLI's
//! layers" say which file holds what.

#![forbid(unsafe_code)]

mod args;
mod cgroupfs;
mod charge;
mod cli;
mod client;
mod cmd;
mod exit;
mod flame;
mod gpu;
mod heapprof;
mod no_endpoint;
mod out;
mod pprof;
mod procfs;
mod pytrace;
mod reach;
mod render;
mod report;
mod retainers;
mod shm;
mod socket;
mod speedscope;
mod symbols;
mod timeline;

fn main() -> std::process::ExitCode {
    let cli = cli::Cli::parse_checked();
    let json = cli.command.json();
    match cli.command.run() {
        Ok(exit) => std::process::ExitCode::from(exit.code),
        Err(failure) => out::report(&failure, json),
    }
}
