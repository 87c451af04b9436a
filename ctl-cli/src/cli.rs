//! The command line (clap derive): the subcommands, which `--json` each
//! has, and which file runs each. Each subcommand's arguments are a struct in
//! its own `cmd/<name>.rs`; arguments several share are in `args.rs`.

use crate::cmd;
use crate::exit::{Exit, Failure};
use clap::{CommandFactory, Parser, Subcommand};

/// Find processes running with libmemshim.so, show where their memory is,
/// and make them return free memory to the OS.
#[derive(Parser, Debug)]
#[command(name = "memshim-ctl", version, about, after_help = after_help())]
pub struct Cli {
    /// What to do.
    #[command(subcommand)]
    pub command: Command,
}

/// The `--help` footer: the exit statuses (`memshim_proto::exit`) and where
/// the figures and errors are explained.
fn after_help() -> String {
    format!(
        "{}\nFigures are defined in docs/stats.md; errors in docs/troubleshooting.md.",
        memshim_proto::exit::help_line()
    )
}

impl Cli {
    /// Parses the command line; bad arguments end the process with clap's
    /// usage error ([`crate::exit::USAGE`]), combinations clap cannot check itself too.
    pub fn parse_checked() -> Cli {
        let cli = Cli::try_parse().unwrap_or_else(|e| exit_with(&e));
        let (name, why) = match &cli.command {
            Command::Serve(a) => ("serve", cmd::serve::conflict(a)),
            Command::Profile(a) => ("profile", cmd::profile::conflict(a)),
            _ => ("", None),
        };
        if let Some(why) = why {
            let mut all = Cli::command();
            // The subcommand's own usage line, as clap prints for its other errors.
            let sub = all.find_subcommand_mut(name).cloned().unwrap_or_default();
            sub.bin_name(format!("memshim-ctl {name}"))
                .error(clap::error::ErrorKind::ArgumentConflict, why)
                .exit();
        }
        cli
    }
}

/// Ends the process as clap's `exit` does, for a usage error or for
/// `--help`/`--version`, except that help or a version that cannot be
/// written (`> /dev/full`, a closed pipe) is a failure (exit 1), as for
/// any other output, not a success.
fn exit_with(e: &clap::Error) -> ! {
    use std::io::Write;
    if e.use_stderr() {
        e.exit();
    }
    // Styled on a terminal only, as clap does.
    let text = if std::io::IsTerminal::is_terminal(&std::io::stdout()) {
        e.render().ansi().to_string()
    } else {
        e.render().to_string()
    };
    let written = crate::output::closed::stdout()
        .and_then(|mut out| out.write_all(text.as_bytes()).and_then(|()| out.flush()));
    match written {
        Ok(()) => std::process::exit(0),
        Err(err) => {
            let failed = crate::exit::FAILED;
            let f = crate::exit::Failure::new(failed, None, format!("writing to stdout: {err}"));
            let _ = crate::output::print::report(&f, false);
            std::process::exit(i32::from(failed.code))
        }
    }
}

/// Subcommands. To add one, see the comment at the top of `cmd/mod.rs`.
#[derive(Subcommand, Debug)]
pub enum Command {
    /// Every process you can see that has the shim loaded.
    List(cmd::list::ListArgs),
    /// The memory report of one process.
    Stats(cmd::stats::StatsArgs),
    /// Return every free page of the allocator to the OS now.
    Purge(cmd::purge::PurgeArgs),
    /// Change how fast freed memory is returned (at runtime).
    Decay(cmd::decay::DecayArgs),
    /// A live view of RSS, resident and purgeable memory.
    Watch(cmd::watch::WatchArgs),
    /// Run a full gc.collect() in a Python process.
    Gc(cmd::gc::GcArgs),
    /// Run torch.cuda.empty_cache() on the devices a process already uses.
    EmptyCache(cmd::empty_cache::EmptyCacheArgs),
    /// gc, empty-cache and purge, in that order, with one figure per step.
    Release(cmd::release::ReleaseArgs),
    /// Run a command with libmemshim.so preloaded (exec; its exit status is the command's).
    Run(cmd::run::RunArgs),
    /// Explain why a process has no shim or a degraded one; host memory facts.
    Doctor(cmd::doctor::DoctorArgs),
    /// Prometheus text exposition of every shimmed process you can reach.
    Metrics(cmd::metrics::MetricsArgs),
    /// Serve /metrics over HTTP for Prometheus (node_exporter style).
    Serve(cmd::serve::ServeArgs),
    /// What a memory cgroup is charged, part by part, and what gives each part back.
    Cgroup(cmd::cgroup::CgroupArgs),
    /// Purge every shimmed process of a cgroup, then reclaim its page cache.
    Reclaim(cmd::reclaim::ReclaimArgs),
    /// A memory timeline of one process, as an SVG chart or an HTML page.
    Record(cmd::record::RecordArgs),
    /// Where a process's live memory was allocated: a heap profile, taken from outside.
    Profile(cmd::profile::ProfileArgs),
    /// Bring memshim's bridge (thread, socket, Python) into a CPython started without the preload.
    Attach(cmd::attach::AttachArgs),
    /// Stop an attached bridge's thread and close its socket.
    Detach(cmd::attach::DetachArgs),
}

impl Command {
    /// Whether the user asked for JSON (errors are then JSON too).
    pub fn json(&self) -> bool {
        match self {
            Command::List(a) => a.json,
            Command::Stats(a) => a.json,
            Command::Purge(a) => a.targets.json,
            Command::Decay(a) => a.json,
            Command::Watch(_) | Command::Record(_) => false,
            Command::Gc(a) => a.json,
            Command::EmptyCache(a) => a.json,
            Command::Release(a) => a.targets.json,
            Command::Run(_) | Command::Metrics(_) | Command::Serve(_) => false,
            Command::Doctor(a) => a.json,
            Command::Cgroup(a) => a.json,
            Command::Reclaim(a) => a.json,
            Command::Profile(a) => a.json,
            Command::Attach(a) => a.json,
            Command::Detach(a) => a.json,
        }
    }

    /// Runs the subcommand.
    pub fn run(self) -> Result<Exit, Failure> {
        match self {
            Command::List(a) => cmd::list::run(a),
            Command::Stats(a) => cmd::stats::run(a),
            Command::Purge(a) => cmd::purge::run(a),
            Command::Decay(a) => cmd::decay::run(a),
            Command::Watch(a) => cmd::watch::run(a),
            Command::Gc(a) => cmd::gc::run(a),
            Command::EmptyCache(a) => cmd::empty_cache::run(a),
            Command::Release(a) => cmd::release::run(a),
            Command::Run(a) => cmd::run::run(a),
            Command::Doctor(a) => cmd::doctor::run(a),
            Command::Metrics(a) => cmd::metrics::run(a),
            Command::Serve(a) => cmd::serve::run(a),
            Command::Cgroup(a) => cmd::cgroup::run(a),
            Command::Reclaim(a) => cmd::reclaim::run(a),
            Command::Record(a) => cmd::record::run(a),
            Command::Profile(a) => cmd::profile::run(a),
            Command::Attach(a) => cmd::attach::run_attach(a),
            Command::Detach(a) => cmd::attach::run_detach(a),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(args: &[&str]) -> Result<Command, clap::Error> {
        Cli::try_parse_from(std::iter::once("memshim-ctl").chain(args.iter().copied()))
            .map(|c| c.command)
    }

    #[test]
    fn parses_every_subcommand() {
        assert!(matches!(parse(&["list", "--json"]).unwrap(), Command::List(a) if a.json));
        assert!(
            matches!(parse(&["stats", "42", "--arenas"]).unwrap(), Command::Stats(a) if a.pid == 42 && a.arenas)
        );
        assert!(
            matches!(parse(&["purge", "1", "2"]).unwrap(), Command::Purge(a) if a.targets.pids == [1, 2] && !a.targets.all)
        );
        assert!(
            matches!(parse(&["purge", "--all", "--json"]).unwrap(), Command::Purge(a) if a.targets.all && a.targets.json)
        );
        assert!(matches!(
            parse(&["decay", "7", "--dirty-ms", "-1", "--muzzy-ms", "0"]).unwrap(),
            Command::Decay(a) if a.dirty_ms == Some(-1) && a.muzzy_ms == Some(0)
        ));
        assert!(matches!(
            parse(&["watch", "7", "--interval", "0.5", "--count", "3"]).unwrap(),
            Command::Watch(a) if a.interval == 0.5 && a.count == Some(3)
        ));
        assert!(matches!(parse(&["gc", "7"]).unwrap(), Command::Gc(a) if a.pid == 7));
        assert!(
            matches!(parse(&["empty-cache", "7", "--json"]).unwrap(), Command::EmptyCache(a) if a.json)
        );
        assert!(
            matches!(parse(&["release", "--all"]).unwrap(), Command::Release(a) if a.targets.all)
        );
        assert!(matches!(
            parse(&["run", "--dirty-ms", "-1", "--", "python", "-X", "dev", "--dirty-ms", "5"]).unwrap(),
            Command::Run(a) if a.dirty_ms == Some(-1) && a.command == ["python", "-X", "dev", "--dirty-ms", "5"]
        ));
        assert!(matches!(parse(&["doctor"]).unwrap(), Command::Doctor(a) if a.pid.is_none()));
        assert!(
            matches!(parse(&["doctor", "7", "--json"]).unwrap(), Command::Doctor(a) if a.pid == Some(7) && a.json)
        );
        assert!(
            matches!(parse(&["metrics", "--max-processes", "3"]).unwrap(), Command::Metrics(a) if a.limits.max_processes == 3)
        );
        assert!(matches!(
            parse(&["serve", "--listen", "127.0.0.1:0", "--enable-purge"]).unwrap(),
            Command::Serve(a) if a.enable_purge && a.listen.port() == 0
        ));
        assert!(
            matches!(parse(&["cgroup"]).unwrap(), Command::Cgroup(a) if a.pid.is_none() && !a.json)
        );
        assert!(
            matches!(parse(&["cgroup", "7", "--json"]).unwrap(), Command::Cgroup(a) if a.pid == Some(7) && a.json)
        );
        assert!(
            matches!(parse(&["reclaim", "7"]).unwrap(), Command::Reclaim(a) if a.pid == Some(7) && !a.json)
        );
        assert!(
            matches!(parse(&["reclaim", "--json"]).unwrap(), Command::Reclaim(a) if a.pid.is_none() && a.json)
        );
    }

    #[test]
    fn accepts_the_setting_words_the_shim_accepts() {
        assert!(matches!(
            parse(&["run", "--control", "ON", "--narenas", "AUTO", "--", "true"]).unwrap(),
            Command::Run(a) if a.control.as_deref() == Some("ON") && a.narenas.as_deref() == Some("AUTO")
        ));
    }

    #[test]
    fn serve_refuses_purge_on_an_address_other_than_loopback() {
        let serve = |listen: &str| match parse(&["serve", "--listen", listen, "--enable-purge"]) {
            Ok(Command::Serve(a)) => cmd::serve::conflict(&a),
            other => panic!("{other:?}"),
        };
        assert_eq!(serve("127.0.0.1:0"), None);
        assert_eq!(serve("[::1]:0"), None);
        assert!(serve("0.0.0.0:9464").is_some_and(|why| why.contains("loopback")));
    }

    #[test]
    fn rejects_bad_usage() {
        for bad in [
            &["purge"][..],           // no target
            &["purge", "1", "--all"], // both
            &["stats"],               // no pid
            &["stats", "0"],          // not a pid
            &["stats", "abc"],        // not a number
            &["decay", "1"],          // nothing to change
            &["decay", "1", "--dirty-ms", "-2"],
            &["watch", "1", "--interval", "0"],
            &["frobnicate"],
            &["run"], // no command
            &["run", "--control", "sometimes", "--", "true"],
            &["serve", "--listen", "not-an-address"],
            &["cgroup", "0"],
            &["cgroup", "1", "2"],
            &["reclaim", "-5"],
            &["reclaim", "x"],
        ] {
            let e = parse(bad).expect_err(&format!("{bad:?} must be refused"));
            assert_eq!(e.exit_code(), 2, "{bad:?}");
        }
    }
}
