//! memshim-ctl: finds shimmed processes and shows or releases their memory.
//!
//! `main` only parses the command line, runs the subcommand and turns its
//! outcome into an exit code (`memshim_proto::exit` has them; exit.rs
//! maps onto them). docs/design.md, "The CLI's layers", says which file
//! holds what. Subcommands live in
//! `cmd/`, one file each; `cmd/mod.rs` says how to add one.

#![forbid(unsafe_code)]

mod cgroupfs;
mod charge;
mod cli;
mod client;
mod cmd;
mod exit;
mod gpu;
mod no_endpoint;
mod out;
mod procfs;
mod render;
mod shm;
mod socket;

use clap::Parser;

fn main() -> std::process::ExitCode {
    let cli = cli::Cli::parse();
    let json = cli.command.json();
    match cmd::run(cli.command) {
        Ok(code) => code.into(),
        Err(failure) => out::report(&failure, json),
    }
}
