//! memshim-ctl: finds shimmed processes and shows or releases their memory.
//!
//! `main` only parses the command line, runs the subcommand and turns its
//! outcome into an exit code (`memshim_proto::exit` has them; exit.rs
//! maps onto them). Subcommands live in `cmd/`, one file each; `cmd/mod.rs`
//! says how to add one. docs/design.md's layout table and "The CLI's
//! layers" say which file holds what.

// No `unsafe` but output/closed.rs's constructor, which says so.
#![deny(unsafe_code)]

mod args;
mod cgroup;
mod cli;
mod cmd;
mod elf;
mod exit;
mod gpu;
mod output;
mod profile;
mod reach;

fn main() -> std::process::ExitCode {
    let cli = cli::Cli::parse_checked();
    let json = cli.command.json();
    match cli.command.run() {
        Ok(exit) => std::process::ExitCode::from(exit.code),
        Err(failure) => output::print::report(&failure, json),
    }
}
