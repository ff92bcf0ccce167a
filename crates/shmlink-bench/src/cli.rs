//! `shmlink-bench`'s command line: one clap parser ([`Cli`]) for every pattern, the
//! usage error (exit status 2), and the parsers of the option values the patterns share
//! (method lists, size lists, counts, times, CPU placement).
//!
//! The options are parsed as text here; each pattern reads the ones it takes (its
//! `flags`) with the value parsers below, and the options it does not take are refused
//! before anything runs.

use std::fmt;
use std::path::PathBuf;

use clap::parser::ValueSource;
use clap::{CommandFactory, FromArgMatches, Parser};
use shmlink_measure::cpus::{different_cores, format_cpu_list};
use shmlink_measure::protocol::{Stop, MIN_SIZE};

/// `shmlink-bench`'s options, as given (each pattern validates the ones it takes).
#[derive(Parser, Debug, Default, Clone, PartialEq, Eq)]
#[command(
    name = "shmlink-bench",
    version,
    about = "Compare IPC methods side by side: latency and throughput between two \
             processes, with the CPU each end spends per message.",
    args_override_self = true,
    max_term_width = 100
)]
pub struct Cli {
    /// The pattern: p2p (or point-to-point), pubsub, async, inproc, connect, apps, containers,
    /// sessions, remote (see Patterns below) [default: p2p]
    #[arg(long, value_name = "P", allow_hyphen_values = true)]
    pub pattern: Option<String>,
    /// Comma-separated method names, or all [default: all]; --list shows them
    #[arg(
        long,
        value_name = "LIST",
        allow_hyphen_values = true,
        help_heading = "Selection"
    )]
    pub methods: Option<String>,
    /// Message sizes with binary suffixes (64,1k,64k,1M), or all
    /// (64,128,1k,4k,16k,64k,1M); p2p: 8 B to 16 MiB [default: 64,1k,64k,1M; --quick:
    /// 64,64k]. A size a method cannot carry is shown as n/a with the method's maximum
    #[arg(
        long,
        value_name = "LIST",
        allow_hyphen_values = true,
        help_heading = "Selection"
    )]
    pub sizes: Option<String>,
    /// p2p: latency (ping-pong, one message in flight: round-trip p50, p90, p99, p99.9,
    /// max), throughput (a window of messages in flight: messages/s, bytes/s), or both
    /// [default: both]
    #[arg(
        long,
        value_name = "M",
        allow_hyphen_values = true,
        help_heading = "Selection"
    )]
    pub mode: Option<String>,
    /// p2p: measured time per run: 300ms, 1s, 0.5 (seconds) [default: 300ms; --quick:
    /// 100ms]. apps: seconds per timed client run (1 to 60) [default: 2]
    #[arg(
        long,
        value_name = "TIME",
        allow_hyphen_values = true,
        help_heading = "Selection"
    )]
    pub duration: Option<String>,
    /// Measured messages (round trips, calls) per run instead of a duration
    #[arg(
        long,
        value_name = "N",
        allow_hyphen_values = true,
        help_heading = "Selection"
    )]
    pub iterations: Option<String>,
    /// p2p: warm-up per run [default: 100ms; --quick: 30ms]
    #[arg(
        long,
        value_name = "TIME",
        allow_hyphen_values = true,
        help_heading = "Selection"
    )]
    pub warmup: Option<String>,
    /// Runs per method, size and mode, interleaved [default: 3; --quick: 2, or 1 for
    /// the other patterns]
    #[arg(
        long,
        value_name = "N",
        allow_hyphen_values = true,
        help_heading = "Selection"
    )]
    pub rounds: Option<String>,
    /// p2p: messages in flight in throughput mode [default: 64 KiB worth, at least 64];
    /// UDP uses fewer (what its receive buffer holds)
    #[arg(
        long,
        value_name = "N",
        allow_hyphen_values = true,
        help_heading = "Selection"
    )]
    pub window: Option<String>,
    /// A run of under a minute: the defaults marked --quick
    #[arg(long, help_heading = "Selection")]
    pub quick: bool,
    /// List the methods, what each measures, and which cannot run here (p2p, pubsub)
    #[arg(long, help_heading = "Selection")]
    pub list: bool,
    /// pubsub: subscriber counts, 1 to 64 [default: 1,2,4,8,16]
    #[arg(
        long,
        value_name = "LIST",
        allow_hyphen_values = true,
        help_heading = "Pattern options"
    )]
    pub subscribers: Option<String>,
    /// async: concurrent tonic callers, 1 to 256 [default: 1,16]
    #[arg(
        long,
        value_name = "LIST",
        allow_hyphen_values = true,
        help_heading = "Pattern options"
    )]
    pub callers: Option<String>,
    /// sessions: parallel sessions (process pairs) per row, 1 to 256 [default: 1,4,16,64;
    /// --quick: 1,4]
    #[arg(
        long,
        value_name = "LIST",
        allow_hyphen_values = true,
        help_heading = "Pattern options"
    )]
    pub sessions: Option<String>,
    /// sessions: idle connections on one listener, 0 for none, 1 to 100000 [default:
    /// 1000,10000; --quick: 1000]
    #[arg(
        long,
        value_name = "LIST",
        allow_hyphen_values = true,
        help_heading = "Pattern options"
    )]
    pub idle: Option<String>,
    /// connect: seconds per method and round (0 to 600) [default: 2; --quick: 0.5]
    #[arg(
        long,
        value_name = "S",
        allow_hyphen_values = true,
        help_heading = "Pattern options"
    )]
    pub seconds: Option<String>,
    /// apps: the programs (redis, nginx, iperf3, sockperf), or all [default: all]
    #[arg(
        long,
        value_name = "LIST",
        allow_hyphen_values = true,
        help_heading = "Pattern options"
    )]
    pub apps: Option<String>,
    /// apps: requests per redis-benchmark -c 1 run (100 to 10000000) [default: 100000;
    /// --quick: 20000]
    #[arg(
        long,
        value_name = "N",
        allow_hyphen_values = true,
        help_heading = "Pattern options"
    )]
    pub requests: Option<String>,
    /// apps: the preload library [default: libshmlink_preload.so next to this program]
    #[arg(
        long,
        value_name = "PATH",
        allow_hyphen_values = true,
        help_heading = "Pattern options"
    )]
    pub preload_lib: Option<PathBuf>,
    /// Pin the driver to CPU A and the peer to CPU B; A = B is the same-core mode, none
    /// does not pin [default: two CPUs on different physical cores]. pubsub: the
    /// publisher on A, every subscriber on B
    #[arg(
        long,
        value_name = "A,B",
        allow_hyphen_values = true,
        help_heading = "Placement"
    )]
    pub cpus: Option<String>,
    /// Both ends on the first CPU (busy-polling methods then yield); pubsub: every process
    #[arg(long, help_heading = "Placement")]
    pub same_core: bool,
    /// The full report: configuration, machine, every run, summaries
    #[arg(
        long,
        value_name = "FILE",
        allow_hyphen_values = true,
        help_heading = "Output"
    )]
    pub json: Option<PathBuf>,
    /// p2p, pubsub: one line per method, mode and size
    #[arg(
        long,
        value_name = "FILE",
        allow_hyphen_values = true,
        help_heading = "Output"
    )]
    pub csv: Option<PathBuf>,
    /// p2p, pubsub: charts as SVG or PNG (by FILE's extension, .svg or .png)
    #[arg(
        long,
        value_name = "FILE",
        allow_hyphen_values = true,
        help_heading = "Output"
    )]
    pub plot: Option<PathBuf>,
    /// The options given on the command line (long names without the dashes), in the
    /// order clap defines them.
    #[arg(skip)]
    pub given: Vec<String>,
}

impl Cli {
    /// Parses `args` (the program's name first) with `after_help` below the options;
    /// `Err` is clap's (help and version included: `exit()` prints it, with status 0
    /// for those, 2 for bad arguments).
    pub fn parse_from<I, T>(args: I, after_help: String) -> Result<Cli, clap::Error>
    where
        I: IntoIterator<Item = T>,
        T: Into<std::ffi::OsString> + Clone,
    {
        let mut cmd = Cli::command().after_help(after_help);
        let matches = cmd.try_get_matches_from_mut(args)?;
        let mut cli = Cli::from_arg_matches(&matches).map_err(|e| e.format(&mut cmd))?;
        cli.given = cmd
            .get_arguments()
            .map(|a| a.get_id().as_str())
            .filter(|id| matches.value_source(id) == Some(ValueSource::CommandLine))
            .map(|id| id.replace('_', "-"))
            .collect();
        Ok(cli)
    }

    /// The `--pattern` value (`p2p` if none).
    pub fn pattern(&self) -> &str {
        self.pattern.as_deref().unwrap_or("p2p")
    }

    /// The first option given that is not in `flags` (and not `--pattern`), if any.
    pub fn not_in(&self, flags: &[&str]) -> Option<String> {
        self.given
            .iter()
            .find(|g| *g != "pattern" && !flags.contains(&g.as_str()))
            .map(|g| format!("--{g}"))
    }
}

/// Bad arguments: the message for stderr.
#[derive(Debug, PartialEq, Eq)]
pub struct UsageError(pub String);

impl fmt::Display for UsageError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// `Err(UsageError(msg))`.
pub fn usage<T>(msg: impl Into<String>) -> Result<T, UsageError> {
    Err(UsageError(msg.into()))
}

/// A `--methods` list of a pattern: `None` for `all`, else each name found by `find`
/// (`names` lists the valid ones for the error).
pub fn method_list<T>(
    text: &str,
    pattern: &str,
    names: &[&str],
    find: impl Fn(&str) -> Option<T>,
) -> Result<Option<Vec<T>>, UsageError> {
    if text == "all" {
        return Ok(None);
    }
    let mut ms = Vec::new();
    for m in text.split(',').map(str::trim) {
        match find(m) {
            Some(m) => ms.push(m),
            None => {
                return usage(format!(
                    "unknown method {m:?} (valid with --pattern {pattern}: all, {})",
                    names.join(", ")
                ))
            }
        }
    }
    Ok(Some(ms))
}

/// `--methods LIST`: `all` (every name of `all`, in order), or names of `all`,
/// comma-separated, each once; `unknown` words the error for a name not in `all`.
pub fn unique_method_list(
    text: &str,
    all: &[&str],
    unknown: impl Fn(&str) -> String,
) -> Result<Vec<String>, UsageError> {
    if text == "all" {
        return Ok(all.iter().map(|n| n.to_string()).collect());
    }
    let mut out: Vec<String> = Vec::new();
    for name in text.split(',').map(str::trim) {
        if !all.contains(&name) {
            return usage(unknown(name));
        }
        if !out.iter().any(|n| n == name) {
            out.push(name.to_string());
        }
    }
    Ok(out)
}

/// A `--sizes` list of a pattern, each within `range` (`bounds` says it in words).
pub fn size_list(
    text: &str,
    pattern: &str,
    range: std::ops::RangeInclusive<usize>,
    bounds: &str,
) -> Result<Vec<usize>, UsageError> {
    let mut v = Vec::new();
    for s in text.split(',') {
        match shmlink_measure::size::parse(s.trim()) {
            Ok(n) if range.contains(&n) => v.push(n),
            _ => {
                return usage(format!(
                    "invalid size {s:?} for --sizes ({bounds} with --pattern {pattern})"
                ))
            }
        }
    }
    Ok(v)
}

/// A positive count for `flag`.
pub fn positive<T: std::str::FromStr + PartialOrd + Default>(
    text: &str,
    flag: &str,
) -> Result<T, UsageError> {
    match text.parse::<T>() {
        Ok(n) if n > T::default() => Ok(n),
        _ => usage(format!("{flag} needs a positive count")),
    }
}

/// A positive integer for `flag` (the point-to-point and pub/sub wording).
pub fn count(flag: &str, text: &str) -> Result<u64, UsageError> {
    match text.parse::<u64>() {
        Ok(n) if n > 0 => Ok(n),
        _ => usage(format!(
            "invalid value {text:?} for {flag} (expected a positive integer)"
        )),
    }
}

/// Parses `300ms`, `1s`, `0.5` (seconds), `2m` into milliseconds.
pub fn millis(flag: &str, text: &str) -> Result<u64, UsageError> {
    let (num, scale) = if let Some(n) = text.strip_suffix("ms") {
        (n, 1.0)
    } else if let Some(n) = text.strip_suffix('s') {
        (n, 1000.0)
    } else if let Some(n) = text.strip_suffix('m') {
        (n, 60_000.0)
    } else {
        (text, 1000.0)
    };
    match num.parse::<f64>() {
        Ok(v) if v.is_finite() && v >= 0.0 && v * scale <= 3.6e6 => Ok((v * scale).round() as u64),
        _ => usage(format!(
            "invalid value {text:?} for {flag} (expected a time such as 300ms, 1s, 0.5)"
        )),
    }
}

/// A whole number for `flag` within `range`.
pub fn within<T>(
    flag: &str,
    text: &str,
    range: std::ops::RangeInclusive<T>,
) -> Result<T, UsageError>
where
    T: std::str::FromStr + PartialOrd + fmt::Display,
{
    text.parse::<T>()
        .ok()
        .filter(|n| range.contains(n))
        .ok_or_else(|| {
            UsageError(format!(
                "invalid {flag} {text:?} ({} to {})",
                range.start(),
                range.end()
            ))
        })
}

/// Where the two ends run: `--cpus A,B`, `--cpus none`, `--same-core`, or the default
/// (two CPUs on different physical cores); `allowed` are the CPUs this process may use.
pub fn placement(
    cpus_arg: Option<&str>,
    same_core: bool,
    allowed: &[usize],
) -> Result<Option<(usize, usize)>, UsageError> {
    let valid = || {
        format!(
            "valid CPUs: {} (A,B with A = B for the same core, --same-core, or none)",
            format_cpu_list(allowed)
        )
    };
    match (cpus_arg, same_core) {
        (Some(_), true) => usage("--cpus and --same-core exclude each other"),
        (None, true) => match allowed.first() {
            Some(&a) => Ok(Some((a, a))),
            None => Ok(None),
        },
        (Some("none"), false) => Ok(None),
        (Some(text), false) => {
            let parsed = text
                .split_once(',')
                .and_then(|(a, b)| Some((a.trim().parse().ok()?, b.trim().parse().ok()?)));
            let Some((a, b)) = parsed else {
                return usage(format!("invalid value {text:?} for --cpus; {}", valid()));
            };
            if let Some(cpu) = [a, b].into_iter().find(|c| !allowed.contains(c)) {
                return usage(format!(
                    "--cpus {text}: CPU {cpu} is not available; {}",
                    valid()
                ));
            }
            Ok(Some((a, b)))
        }
        (None, false) => Ok(different_cores(allowed).or(allowed.first().map(|&a| (a, a)))),
    }
}

/// Largest message size the point-to-point and pub/sub suites run.
pub const MAX_SIZE: usize = 16 << 20;

/// `--sizes all`: the seeds' size series, 64 B to 1 MiB (about 7 minutes with every
/// method; the default run takes four of them).
pub const ALL_SIZES: [usize; 7] = [64, 128, 1 << 10, 4 << 10, 16 << 10, 64 << 10, 1 << 20];

/// `--sizes` of the point-to-point and pub/sub suites: 8 B to 16 MiB, each once, or all.
pub fn suite_sizes(text: &str) -> Result<Vec<usize>, UsageError> {
    if text.trim() == "all" {
        return Ok(ALL_SIZES.to_vec());
    }
    let mut out = Vec::new();
    for s in text.split(',').map(str::trim) {
        let valid =
            "valid sizes: 8 B to 16 MiB with binary suffixes, e.g. 64,128,1k,4k,16k,64k,1M,16M, or all";
        let n = match shmlink_measure::size::parse(s) {
            Ok(n) => n,
            Err(e) => return usage(format!("--sizes: {e}; {valid}")),
        };
        if !(MIN_SIZE..=MAX_SIZE).contains(&n) {
            return usage(format!("--sizes: {s} is out of range; {valid}"));
        }
        if !out.contains(&n) {
            out.push(n);
        }
    }
    Ok(out)
}

/// When a run of the point-to-point or pub/sub suite stops: `--duration` or
/// `--iterations` (not both), if given.
pub fn suite_stop(cli: &Cli) -> Result<Option<Stop>, UsageError> {
    match (&cli.duration, &cli.iterations) {
        (Some(_), Some(_)) => usage("--duration and --iterations exclude each other"),
        (Some(t), None) => match millis("--duration", t)? {
            0 => usage("--duration must be more than 0"),
            ms => Ok(Some(Stop::Millis(ms))),
        },
        (None, Some(t)) => Ok(Some(Stop::Count(count("--iterations", t)?))),
        (None, None) => Ok(None),
    }
}

/// `--rounds` of the point-to-point and pub/sub suites, if given.
pub fn suite_rounds(cli: &Cli) -> Result<Option<u32>, UsageError> {
    match &cli.rounds {
        Some(t) => Ok(Some(count("--rounds", t)? as u32)),
        None => Ok(None),
    }
}

/// `--plot FILE`, if given, with an extension the plot can be written in.
pub fn plot_file(cli: &Cli) -> Result<(), UsageError> {
    match &cli.plot {
        Some(path) => crate::plot::Format::of(path)
            .map(|_| ())
            .map_err(|e| UsageError(format!("--plot: {e}"))),
        None => Ok(()),
    }
}

/// `shmlink-bench ARGS` (split at white space) parsed, for the patterns' tests; clap's
/// errors as usage errors.
#[cfg(test)]
pub(crate) fn parse_test(args: &str) -> Result<Cli, UsageError> {
    let argv = std::iter::once("shmlink-bench").chain(args.split_whitespace());
    Cli::parse_from(argv, String::new()).map_err(|e| UsageError(e.to_string()))
}
