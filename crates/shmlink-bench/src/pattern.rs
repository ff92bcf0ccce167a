//! The [`Pattern`] trait every pattern of `shmlink-bench` implements (one file each in
//! [`crate::patterns`], which lists them), and the check of the options a pattern takes.

use std::process::ExitCode;

use crate::cli::{Cli, UsageError};

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

/// Refuses an option `cli` gives that `p` does not take.
pub fn check_flags(p: &dyn Pattern, cli: &Cli) -> Result<(), UsageError> {
    match cli.not_in(p.flags()) {
        Some(flag) => Err(UsageError(p.refuse(&flag))),
        None => Ok(()),
    }
}
