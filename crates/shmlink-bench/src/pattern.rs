//! The [`Pattern`] trait every pattern of `shmlink-bench` implements (one file each in
//! [`crate::patterns`], which lists them), and the check of the options a pattern takes.

use std::path::Path;
use std::process::ExitCode;

use serde::Serialize;

use crate::cli::{Cli, UsageError};
use crate::report::Machine;

/// One way of measuring, chosen with `--pattern`.
pub trait Pattern: Sync {
    /// The `--pattern` value.
    fn name(&self) -> &'static str;

    /// Other `--pattern` values meaning this one.
    fn aliases(&self) -> &'static [&'static str] {
        &[]
    }

    /// Its paragraph in `--help`: what it measures and how, its defaults.
    fn help(&self) -> &'static str;

    /// The options it takes (long names without the dashes); the others are refused
    /// before anything runs (`--pattern` is always taken).
    fn flags(&self) -> &'static [&'static str];

    /// The usage error for `flag` (`--name`), given but not in [`Pattern::flags`].
    fn refuse(&self, flag: &str) -> String {
        let flags: Vec<String> = self.flags().iter().map(|f| format!("--{f}")).collect();
        format!(
            "{flag:?} does not apply to --pattern {} (its options: {})",
            self.name(),
            flags.join(", ")
        )
    }

    /// Runs this program as one of the pattern's child processes if `argv` (the
    /// arguments after the program's name) is one of its hidden subcommands.
    fn child(&self, _argv: &[String]) -> Option<ExitCode> {
        None
    }

    /// Reads the options (`Err`: bad arguments, exit status 2, before anything ran), then
    /// runs, prints the table, writes the reports: exit 0 if every run succeeded, 1 if
    /// one failed or a report could not be written.
    fn run(&self, cli: &Cli) -> Result<ExitCode, UsageError>;
}

/// The options the suite patterns (p2p, pubsub) take besides their own: the CPUs, the
/// list of methods, the reports.
pub const SUITE_FLAGS: &[&str] = &["cpus", "same-core", "quick", "list", "json", "csv", "plot"];

/// The flags of a suite pattern: `own`, then [`SUITE_FLAGS`].
pub fn suite_flags(own: &[&'static str]) -> Vec<&'static str> {
    [own, SUITE_FLAGS].concat()
}

/// A child process's role: its name and its main function, which takes the spec.
pub type ChildRole<'a> = (&'a str, fn(&str) -> ExitCode);

/// Runs the child process `argv` asks for (`ROLE SPEC ...`), if its role is one of
/// `roles`: with that role's main function and the spec.
pub fn run_child(argv: &[String], roles: &[ChildRole<'_>]) -> Option<ExitCode> {
    let [role, spec, ..] = argv else {
        return None;
    };
    let (_, main) = roles.iter().find(|(r, _)| *r == role.as_str())?;
    Some(main(spec))
}

/// The head of the JSON report of a pattern with a table of its own (apps, async): its
/// schema, the pattern, the version, the command line and the machine.
#[derive(Serialize)]
pub struct ReportHead {
    schema: &'static str,
    pattern: &'static str,
    shmlink_version: &'static str,
    command: String,
    machine: Machine,
}

impl ReportHead {
    /// The head of `pattern`'s report of layout `schema`, run by this command here.
    pub fn new(schema: &'static str, pattern: &'static str) -> ReportHead {
        ReportHead {
            schema,
            pattern,
            shmlink_version: env!("CARGO_PKG_VERSION"),
            command: std::env::args().collect::<Vec<_>>().join(" "),
            machine: Machine::this(),
        }
    }
}

/// Writes `report` as pretty JSON to `path` (if given) and says so; false, with the
/// reason on stderr, if it could not be written.
pub fn write_json(path: Option<&Path>, report: &impl Serialize) -> bool {
    let Some(path) = path else {
        return true;
    };
    match serde_json::to_string_pretty(report)
        .map_err(std::io::Error::other)
        .and_then(|j| std::fs::write(path, j + "\n"))
    {
        Ok(()) => {
            println!("# wrote {}", path.display());
            true
        }
        Err(e) => {
            eprintln!("shmlink-bench: write {}: {e}", path.display());
            false
        }
    }
}

/// Refuses an option `cli` gives that `p` does not take.
pub fn check_flags(p: &dyn Pattern, cli: &Cli) -> Result<(), UsageError> {
    match cli.not_in(p.flags()) {
        Some(flag) => Err(UsageError(p.refuse(&flag))),
        None => Ok(()),
    }
}
