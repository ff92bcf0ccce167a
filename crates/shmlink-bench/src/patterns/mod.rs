//! The patterns `shmlink-bench` measures, one file each implementing
//! [`Pattern`], listed once ([`PATTERNS`]), and the program's
//! entry ([`main`]): the hidden child processes' subcommands, the command line
//! ([`Cli`]), the fault check, the chosen pattern's run.
//!
//! A new pattern is one file here implementing the trait plus its `mod` line and its
//! entry in [`PATTERNS`]: its name becomes a `--pattern` value, its help paragraph part of
//! `--help`, its options the ones it accepts.

use std::process::ExitCode;

use crate::cli::{Cli, UsageError};
use crate::pattern::{check_flags, Pattern};

pub mod apps;
pub mod r#async;
pub mod connect;
pub mod containers;
pub mod inproc;
pub mod pingpong;
pub mod pubsub;
pub mod remote;
pub mod sessions;

/// Every pattern, in `--help` order; the first is the default.
pub const PATTERNS: &[&dyn Pattern] = &[
    &pingpong::PingPong,
    &pubsub::PubSub,
    &r#async::Async,
    &inproc::Inproc,
    &connect::Connect,
    &apps::Apps,
    &containers::Containers,
    &sessions::Sessions,
    &remote::Remote,
];

/// The pattern named `name` (or one of its aliases).
pub fn find(name: &str) -> Option<&'static dyn Pattern> {
    PATTERNS
        .iter()
        .copied()
        .find(|p| p.name() == name || p.aliases().contains(&name))
}

/// The pattern `cli` asks for, if there is one of that name and it takes every option
/// given.
pub fn chosen(cli: &Cli) -> Result<&'static dyn Pattern, UsageError> {
    let Some(pattern) = find(cli.pattern()) else {
        let names: Vec<&str> = PATTERNS.iter().map(|p| p.name()).collect();
        return Err(UsageError(format!(
            "invalid --pattern {:?} (valid: {})",
            cli.pattern(),
            names.join(", ")
        )));
    };
    check_flags(pattern, cli)?;
    Ok(pattern)
}

/// The text below the options in `--help`: each pattern's paragraph (wrapped to 80
/// columns under its name), then what is common to all.
pub fn after_help() -> String {
    let mut s = String::from("Patterns (--pattern P):\n");
    for p in PATTERNS {
        let mut line = format!("  {:<8}", p.name());
        for word in p.help().split_whitespace() {
            if line.len() + 1 + word.len() > 80 {
                s += &line;
                s.push('\n');
                line = " ".repeat(11);
            } else {
                line.push(' ');
            }
            line += word;
        }
        s += &line;
        s.push('\n');
    }
    s + COMMON_HELP
}

/// The end of `--help`.
const COMMON_HELP: &str = "
Fairness: the sender writes every byte of every message (sequence number, generated
payload, checksum) and the receiver copies it out and checks its length and sequence
number; the first 32 messages of every run are checksummed in full. CPU per message is
user + system time (getrusage) of each process over the measured part.

Exit status: 0 if every run succeeded, 1 if a run failed (the others still run and are
reported), 2 on bad arguments.";

/// `shmlink-bench`: a child process if the arguments say so, else the pattern the
/// command line asks for.
pub fn main() -> ExitCode {
    let argv: Vec<String> = std::env::args().skip(1).take(3).collect();
    if let Some(exit) = PATTERNS.iter().find_map(|p| p.child(&argv)) {
        return exit;
    }
    let cli = match Cli::parse_from(std::env::args_os(), after_help()) {
        Ok(cli) => cli,
        Err(e) => e.exit(),
    };
    // A fault for tests of failure handling is injected or refused, never ignored (the
    // pattern's, before its options are checked; an unknown pattern injects none).
    let name = find(cli.pattern()).map_or("", |p| p.name());
    if let Err(e) = crate::fault::check(name) {
        eprintln!("shmlink-bench: {e}");
        return ExitCode::from(2);
    }
    match chosen(&cli).and_then(|pattern| pattern.run(&cli)) {
        Ok(exit) => exit,
        Err(e) => usage_error(&e),
    }
}

/// Bad arguments: the reason on stderr, exit status 2.
fn usage_error(e: &UsageError) -> ExitCode {
    eprintln!("shmlink-bench: {e}");
    ExitCode::from(2)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cli::parse_test;

    /// The pattern `shmlink-bench ARGS` chooses, its options checked.
    fn chosen_by(args: &str) -> Result<&'static str, UsageError> {
        chosen(&parse_test(args)?).map(|p| p.name())
    }

    #[test]
    fn the_pattern_chosen_and_its_options_checked() {
        // p2p is the default; pubsub is chosen by name.
        assert_eq!(chosen_by("").unwrap(), "p2p");
        assert_eq!(chosen_by("--pattern p2p").unwrap(), "p2p");
        assert_eq!(chosen_by("--pattern point-to-point").unwrap(), "p2p");
        assert_eq!(chosen_by("--pattern=pubsub").unwrap(), "pubsub");
        let e = chosen_by("--pattern fanout").unwrap_err().0;
        assert!(e.contains("valid: p2p, pubsub"), "{e}");
        let e = chosen_by("--subscribers 2").unwrap_err().0;
        assert!(e.contains("needs --pattern pubsub"), "{e}");
        // The point-to-point method names are not pub/sub ones, and vice versa.
        let cli = parse_test("--methods shmlink").unwrap();
        assert!(pingpong::config(&cli, &[0, 1]).is_err());
        let e = chosen_by("--pattern apps --window 4").unwrap_err().0;
        assert!(
            e.contains("\"--window\" does not apply to --pattern apps"),
            "{e}"
        );
        // Every pattern's name and aliases are its own.
        for p in PATTERNS {
            assert!(
                std::ptr::addr_eq(find(p.name()).unwrap(), *p),
                "{}",
                p.name()
            );
        }
    }
}
