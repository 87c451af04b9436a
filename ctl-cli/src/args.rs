//! Arguments several subcommands share: the targets of `purge` and
//! `release`, a pid, a decay time. Each subcommand's own options are in its
//! `cmd/<name>.rs`; `cli.rs` lists the subcommands.

use clap::Args;
use memshim_proto::endpoint::MAX_DECAY_MS;
use memshim_proto::settings;

/// Seconds between samples (`watch`, `record`): 0.1 to 3600.
pub fn parse_interval(s: &str) -> Result<f64, String> {
    let v: f64 = s
        .parse()
        .map_err(|_| format!("{s:?} is not a number of seconds"))?;
    if (0.1..=3600.0).contains(&v) {
        Ok(v)
    } else {
        Err("must be between 0.1 and 3600 seconds".into())
    }
}

/// A size in bytes, with an optional unit (K, M, G, T; memshim-proto's
/// parser, the one the settings use).
pub fn size_parser() -> impl clap::builder::TypedValueParser<Value = u64> {
    use clap::builder::TypedValueParser;
    clap::builder::StringValueParser::new().try_map(|s: String| {
        memshim_proto::settings::parse_size(s.as_bytes()).ok_or_else(|| {
            format!("{s:?} is not a size: bytes, or a whole number with K, M, G or T (512M, 2G)")
        })
    })
}

/// `<PID>... | --all [--json]`, shared by purge and release.
#[derive(Args, Debug, Clone)]
pub struct Targets {
    /// Process ids (as this shell sees them).
    #[arg(required_unless_present = "all", conflicts_with = "all", value_parser = pid_parser())]
    pub pids: Vec<i32>,
    /// Every shimmed process whose endpoint is running.
    #[arg(long)]
    pub all: bool,
    /// One JSON document on stdout.
    #[arg(long)]
    pub json: bool,
}

/// A single `<PID>`.
pub fn pid_parser() -> clap::builder::RangedI64ValueParser<i32> {
    clap::value_parser!(i32).range(1..)
}

/// A decay time in milliseconds: -1 (never) or 0 to 10^12, what the library
/// accepts in its settings and in a `decay` request
/// (`memshim_proto::settings::parse_decay`).
pub fn decay_ms(s: &str) -> Result<i64, String> {
    settings::parse_decay(s.as_bytes()).ok_or_else(|| {
        format!("{s:?} is not -1 (never) or a number of milliseconds from 0 to {MAX_DECAY_MS}")
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decay_times_are_the_librarys() {
        assert_eq!(decay_ms("-1"), Ok(-1));
        assert_eq!(decay_ms("0"), Ok(0));
        assert_eq!(decay_ms("+5"), Ok(5));
        assert_eq!(decay_ms("1000000000000"), Ok(MAX_DECAY_MS));
        for bad in ["-2", "1s", "", " 5", "1000000000001"] {
            assert!(decay_ms(bad).is_err(), "{bad:?}");
        }
        assert_eq!(
            decay_ms("-2").unwrap_err(),
            "\"-2\" is not -1 (never) or a number of milliseconds from 0 to 1000000000000"
        );
    }
}
