//! Subcommands.

pub mod doctor;
pub mod run;
