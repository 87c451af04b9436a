//! How memshim-ctl exits, and the one error type every subcommand returns.
//!
//! The statuses themselves (number, `--json` name, `--help` words) are
//! `memshim_proto::exit`'s, re-exported here: a command ends with one of
//! its constants (`exit::NOT_FOUND`), and [`Exit`] is its type.
//! docs/troubleshooting.md has the table of codes (a test below checks it
//! against proto's), the messages and what to do about each. Printing a
//! failure is output's business (`print::report`).

use serde::Serialize;

pub use memshim_proto::exit::*;

/// How memshim-ctl exits: one of proto's statuses. Usage errors
/// ([`USAGE`]) are clap's own, never a [`Failure`]'s.
pub type Exit = ExitStatus;

/// A failure for one target: what went wrong, for which pid, and what to do.
#[derive(Debug, Clone, Serialize)]
pub struct Failure {
    /// Exit category.
    #[serde(rename = "code")]
    pub exit: Exit,
    /// The pid concerned, if any.
    pub pid: Option<i32>,
    /// What is wrong (names the path where one is involved).
    pub message: String,
    /// What to do about it.
    pub hint: Option<String>,
}

impl Failure {
    /// A failure of kind `exit`.
    pub fn new(exit: Exit, pid: Option<i32>, message: impl Into<String>) -> Failure {
        Failure {
            exit,
            pid,
            message: message.into(),
            hint: None,
        }
    }

    /// Adds what to do.
    pub fn hint(mut self, hint: impl Into<String>) -> Failure {
        self.hint = Some(hint.into());
        self
    }

    /// One line for a person: `pid 123: message`.
    pub fn line(&self) -> String {
        match self.pid {
            Some(p) => format!("pid {p}: {}", self.message),
            None => self.message.clone(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn failures_carry_the_shared_names() {
        let f = Failure::new(NOT_FOUND, Some(7), "no such process");
        assert_eq!(f.line(), "pid 7: no such process");
        assert_eq!(
            serde_json::to_string(&f).unwrap(),
            r#"{"code":"not_found","pid":7,"message":"no such process","hint":null}"#
        );
    }

    /// docs/troubleshooting.md opens with a `| code | meaning |` table: its
    /// codes are exactly proto's statuses, and the `--json` names it lists
    /// are exactly those a failure can carry.
    #[test]
    fn troubleshooting_table_lists_exactly_the_shared_codes() {
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../docs/troubleshooting.md");
        let doc = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{path}: {e}"));
        let codes: Vec<u8> = doc
            .lines()
            .skip_while(|l| l.trim() != "| code | meaning |")
            .skip(2) // the header and its |---| line
            .take_while(|l| l.starts_with('|'))
            .map(|l| {
                let cell = l.split('|').nth(1).unwrap_or_default().trim();
                cell.parse()
                    .unwrap_or_else(|_| panic!("{path}: {cell:?} is not a code in {l:?}"))
            })
            .collect();
        let shared: Vec<u8> = ALL.iter().map(|s| s.code).collect();
        assert_eq!(codes, shared, "{path}'s exit-code table");
        let listed = doc
            .split("(`code` is one of ")
            .nth(1)
            .and_then(|rest| rest.split(')').next())
            .unwrap_or_else(|| panic!("{path}: no \"(`code` is one of ...)\" list"));
        let names: Vec<&str> = listed
            .split(',')
            .map(|n| n.trim().trim_matches('`'))
            .collect();
        // Every status but success and usage (clap's, never JSON).
        let failures: Vec<&str> = ALL
            .iter()
            .filter(|s| *s != &OK && *s != &USAGE)
            .map(|s| s.name)
            .collect();
        assert_eq!(names, failures, "{path}'s list of --json codes");
    }
}
