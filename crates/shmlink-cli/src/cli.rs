//! The command tree (clap derive): every command and its arguments' type, and parsing a
//! command line into it. Each command's own arguments live with the command (`pong::cli`,
//! `ls`, `netcat`, `topic`, `run`, `vm_host`); the value parsers and flags they share are
//! in `args`.
//!
//! Exit codes: a usage error exits 2 with `shmlink: ` and clap's message on stderr;
//! `--help` and `--version` print on stdout and exit 0.

use std::ffi::OsString;
use std::process::ExitCode;

use clap::error::ErrorKind;
use clap::{Args, CommandFactory, Parser, Subcommand};

use crate::ls::LsCli;
use crate::netcat::{RecvCli, SendCli};
use crate::pong::cli::PongCli;
use crate::topic::{PubCli, SubCli};

const TOP_ABOUT: &str = "Fast, reliable messaging between processes that share a Linux kernel";

const TOP_AFTER: &str = "\
Addresses: shm:NAME, shm:/path.sock, shm:@name, ux:NAME, ux:/path, tcp:HOST:PORT,
tls:HOST:PORT, auto:HOST:PORT; a bare NAME (no colon) means shm:NAME in every command.
shm:NAME lives in the rendezvous directory: $SHMLINK_DIR, else $XDG_RUNTIME_DIR/shmlink,
else /tmp/shmlink-UID. vm:NAME[@REGION]: a region shared between QEMU guests and their
host (docs/vms.md).

Exit status: 0 on success, 1 if the command failed, 2 on bad arguments.";

/// `shmlink`'s command line.
#[derive(Parser, Debug)]
#[command(
    name = "shmlink",
    version,
    about = TOP_ABOUT,
    after_help = TOP_AFTER,
    subcommand_required = true,
    max_term_width = 100
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

impl Cli {
    /// What the library's events are filtered by when `SHMLINK_LOG` is unset: nothing,
    /// or with `-v` (`send`, `recv`) accepts, refusals with their
    /// reasons and peer deaths.
    pub fn log_default(&self) -> Option<&'static str> {
        let verbose = match &self.command {
            Command::Send(c) => c.verbose(),
            Command::Recv(c) => c.verbose(),
            _ => false,
        };
        verbose.then_some("shmlink=info")
    }
}

/// The commands.
#[derive(Subcommand, Debug)]
pub enum Command {
    Pong(PongCli),
    Ls(LsCli),
    Metrics(crate::metrics::MetricsCli),
    Send(SendCli),
    Recv(RecvCli),
    Pub(PubCli),
    Sub(SubCli),
    Bench(BenchCli),
    Run(crate::run::RunCli),
    Probe(crate::probe::ProbeCli),
    VmHost(crate::vm_host::VmHostCli),
    Completions(CompletionsCli),
    Man(ManCli),
    /// Conformance scenarios between two processes (scripts/vm-test.sh runs them in
    /// guests); hidden from help, completions and the manual.
    #[command(hide = true)]
    Conform(crate::conform::ConformCli),
}

/// `shmlink bench ARGS…`: everything after `bench` goes to `shmlink-bench` unparsed.
#[derive(Args, Debug)]
#[command(
    about = "Compare IPC methods side by side (runs the shmlink-bench program)",
    long_about = "Compare every IPC method side by side: latency, throughput and CPU per \
                  message. Runs the shmlink-bench program (next to this one, else on PATH) \
                  with the same arguments; see `shmlink bench --help`.",
    disable_help_flag = true
)]
pub struct BenchCli {
    /// Arguments of shmlink-bench (`--quick`, `--pattern pubsub`, `--json FILE`, ...).
    #[arg(
        value_name = "ARGS",
        trailing_var_arg = true,
        allow_hyphen_values = true,
        num_args = 0..
    )]
    pub args: Vec<OsString>,
}

/// `shmlink completions SHELL`.
#[derive(Args, Debug)]
#[command(
    about = "Print a shell completion script",
    long_about = "Print a completion script for SHELL on stdout, e.g.\n  \
                  shmlink completions bash > /etc/bash_completion.d/shmlink\n  \
                  shmlink completions zsh > ~/.zfunc/_shmlink\n  \
                  shmlink completions fish > ~/.config/fish/completions/shmlink.fish"
)]
pub struct CompletionsCli {
    /// The shell.
    #[arg(value_enum)]
    pub shell: clap_complete::Shell,
}

/// `shmlink man [COMMAND]`.
#[derive(Args, Debug)]
#[command(
    about = "Print the manual page (roff) on stdout",
    long_about = "Print the manual page, in roff, on stdout: `shmlink man > shmlink.1`, \
                  then `man -l shmlink.1`. With COMMAND, the page of that command \
                  (shmlink-COMMAND(1))."
)]
pub struct ManCli {
    /// A command, for its own page.
    pub command: Option<String>,
}

/// Parses the command line (without the program name's handling: `argv[0]` included).
pub fn parse<I, T>(argv: I) -> Result<Cli, clap::Error>
where
    I: IntoIterator<Item = T>,
    T: Into<OsString> + Clone,
{
    Cli::try_parse_from(argv)
}

/// A usage error in `command`'s context (its usage line in the message), exit code 2.
pub fn usage_error(command: &str, msg: impl std::fmt::Display) -> clap::Error {
    let mut cmd = Cli::command();
    cmd.build();
    let sub = cmd
        .find_subcommand_mut(command)
        .expect("a command of the tree");
    sub.error(ErrorKind::ValueValidation, msg)
}

/// Prints a clap outcome that is not a parsed command line: help or version on stdout
/// (exit 0), a usage error on stderr as `shmlink: …` (exit 2).
pub fn report(e: &clap::Error) -> ExitCode {
    match e.kind() {
        ErrorKind::DisplayHelp | ErrorKind::DisplayVersion => {
            // A closed stdout (`| head`) is not worth an error.
            let _ = e.print();
            ExitCode::SUCCESS
        }
        ErrorKind::DisplayHelpOnMissingArgumentOrSubcommand => {
            eprint!("shmlink: missing command\n\n{}", e.render());
            ExitCode::from(2)
        }
        _ => {
            let text = e.render().to_string();
            let text = text.strip_prefix("error: ").unwrap_or(&text);
            eprint!("shmlink: {text}");
            ExitCode::from(2)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::args::*;

    #[test]
    fn the_command_tree_is_consistent() {
        Cli::command().debug_assert();
    }

    #[test]
    fn top_level() {
        let kind = |args: &[&str]| {
            let argv = std::iter::once("shmlink").chain(args.iter().copied());
            parse(argv).unwrap_err().kind()
        };
        assert_eq!(kind(&["--help"]), ErrorKind::DisplayHelp);
        assert_eq!(kind(&["help", "pong"]), ErrorKind::DisplayHelp);
        assert_eq!(kind(&["help", "ls"]), ErrorKind::DisplayHelp);
        assert_eq!(kind(&["ls", "--help"]), ErrorKind::DisplayHelp);
        assert_eq!(kind(&["pong", "-h"]), ErrorKind::DisplayHelp);
        assert_eq!(kind(&["-V"]), ErrorKind::DisplayVersion);
        assert_eq!(
            kind(&[]),
            ErrorKind::DisplayHelpOnMissingArgumentOrSubcommand
        );
        assert_eq!(kind(&["bong"]), ErrorKind::InvalidSubcommand);
        // bench takes everything, --help included, for shmlink-bench.
        let cli = parse(["shmlink", "bench", "--quick", "--help", "-x"]).unwrap();
        let Command::Bench(b) = cli.command else {
            panic!("{cli:?}")
        };
        assert_eq!(b.args, ["--quick", "--help", "-x"]);
        for shell in ["bash", "zsh", "fish"] {
            assert!(matches!(
                parse(["shmlink", "completions", shell]).unwrap().command,
                Command::Completions(_)
            ));
        }
        assert_eq!(
            parse(["shmlink", "completions", "tcsh"])
                .unwrap_err()
                .kind(),
            ErrorKind::InvalidValue
        );
    }

    #[test]
    fn usage_errors_render_with_the_command_usage() {
        let e = usage_error("pong", "--server needs exactly one ADDR, got 0");
        assert_eq!(e.kind(), ErrorKind::ValueValidation);
        let text = e.render().to_string();
        assert!(text.contains("--server needs exactly one ADDR"), "{text}");
        assert!(text.contains("Usage: shmlink pong"), "{text}");
    }

    #[test]
    fn a_bare_name_is_shm_name_for_every_command() {
        for cmd in ["send", "recv", "pub", "sub"] {
            assert!(parse(["shmlink", cmd, "cli2"]).is_ok(), "{cmd}");
        }
        let Command::Pong(p) = parse(["shmlink", "pong", "--client", "cli2"])
            .unwrap()
            .command
        else {
            panic!()
        };
        assert_eq!(p.into_args(&[0, 1]).unwrap().addrs, ["shm:cli2"]);
        assert_eq!(parse_addr("cli2").unwrap(), "shm:cli2");
        assert_eq!(parse_addr("tcp:127.0.0.1:1").unwrap(), "tcp:127.0.0.1:1");
        assert!(parse_addr("foo:bar").is_err());
    }

    #[test]
    fn tls_files_go_together() {
        let e = parse(["shmlink", "send", "--cert", "c.pem", "tls:h:1"]).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::MissingRequiredArgument);
        assert!(e.to_string().contains("--key"), "{e}");
    }

    #[test]
    fn users_are_repeatable_and_comma_lists() {
        #[derive(Parser, Debug)]
        struct T {
            #[command(flatten)]
            conn: ConnFlags,
        }
        let t = T::try_parse_from([
            "t",
            "--allow-uid",
            "65534,1000",
            "--allow-uid=7",
            "--allow-gid",
            "100",
            "--expect-uid",
            "0",
        ])
        .unwrap();
        let u = &t.conn.users;
        assert_eq!(u.allow_uids, [65534, 1000, 7]);
        assert_eq!(u.allow_gids, [100]);
        assert_eq!(u.expect_uids, [0]);
        let e = T::try_parse_from(["t", "--allow-uid", "nobody"]).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::ValueValidation);
        assert!(e.to_string().contains("--allow-uid"), "{e}");
        // recv, pub and pong take them.
        for cmd in ["recv", "pub", "pong"] {
            let mut argv = vec!["shmlink", cmd, "--allow-uid", "65534"];
            if cmd == "pong" {
                argv.push("--server");
            }
            argv.push("shm:x");
            let r = parse(argv.clone());
            assert!(r.is_ok(), "{argv:?}: {r:?}");
        }
    }

    #[test]
    fn sizes_take_binary_suffixes() {
        for (text, want) in [
            ("0", 0),
            ("64", 64),
            ("1k", 1024),
            ("1K", 1024),
            ("1KiB", 1024),
            ("4K", 4096),
            ("1M", 1 << 20),
            ("1MiB", 1 << 20),
            ("64M", 64 << 20),
            ("1G", 1 << 30),
            ("100B", 100),
        ] {
            assert_eq!(parse_size(text), Ok(want), "{text}");
        }
        for text in [
            "",
            "12Q",
            "k",
            "-1",
            "1.5M",
            "1 M",
            "1MiBs",
            "99999999999999999999",
        ] {
            assert!(parse_size(text).is_err(), "{text:?} accepted");
        }
        assert!(parse_size("99999999999G")
            .unwrap_err()
            .contains("too large"));
        assert!(parse_msg_size("2G").unwrap_err().contains("at most 1GiB"));
    }

    #[test]
    fn format_size_round_trips() {
        for s in [0, 1, 64, 1000, 1024, 4096, 1 << 20, 3 << 20, 1 << 30] {
            assert_eq!(parse_size(&format_size(s)), Ok(s));
        }
        assert_eq!(format_size(1 << 20), "1MiB");
        assert_eq!(format_size(1536), "1536");
    }
}
