//! `shmlink-bench --pattern sessions`: what N parallel sessions cost (the question of
//! the Shimmy paper, seeds/004: CPU and memory under parallel sessions), and what idle
//! connections on one listener cost.
//!
//! **Sessions.** A row is N sessions of one method at once, each a process pair: a
//! driver (this program re-executed, hidden subcommand [`RUN_CMD`]) and its peer, set up
//! and driven exactly as a point-to-point run ([`crate::run`]: the method's
//! `prepare`/`connect`, the measurement core's drivers, its verification and
//! `SHMLINK_BENCH_FAULT`). Every driver says `READY` once connected and waits; when all
//! N are ready they are told `GO` with one wall-clock instant at which every warm-up
//! ends, so the measured parts start together (at each session's first message after
//! it) and, being equally long, end together. No process is pinned (2N processes share
//! the machine's CPUs as the scheduler places them). Per row:
//! - throughput: all sessions' messages (round trips in the round-trip rows) over the
//!   span from the first session's start to the last one's end (each session reports
//!   both, wall clock), never a sum of rates over different spans; the row also
//!   reports how far the sessions' spans differ (`span_skew_ms`: the union minus the
//!   part common to all);
//! - p50/p99 of the round trip over every session's samples (merged in a histogram of
//!   1/64 relative precision, [`Hist`]);
//! - CPU seconds per million messages (round trips): both ends' user + system time
//!   (`getrusage(RUSAGE_SELF)` in each process, over its measured part), summed over the
//!   sessions, over all their messages;
//! - memory per session: both processes' `/proc/PID/smaps_rollup` (Rss, Pss, Pss_Anon,
//!   Pss_File, Pss_Shmem, Shared_*, Private_*) read by the driver in the middle of the
//!   measured part (or a tenth of the way in, when the middle sample found the run
//!   over), summed over the two, averaged over the sessions. Pss_Shmem is the
//!   shared memory actually touched (memfd or /dev/shm pages that are resident); the
//!   kernel's socket buffers (UDS, TCP) are in no process's figures.
//!
//! **Idle connections.** One server process (hidden subcommand [`IDLE_SERVER_CMD`])
//! binds one listener, accepts N connections from client processes
//! ([`IDLE_CLIENT_CMD`], at most [`PER_CLIENT`] connections each) and waits for any of
//! them to become readable in one `ppoll` (as an event loop would); nothing is sent.
//! Reported: open fds and memory (the Pss of each side, minus what it had before the
//! first connection, per connection), CPU time (`/proc/PID/task/*/schedstat`) and
//! context switches (`/proc/PID/task/*/status`) of every process over an idle window,
//! and the system's `Slab` growth (`/proc/meminfo`: the kernel's part, noisy on a busy
//! machine). Each process raises its soft fd limit to the hard one
//! ([`shmlink_sys::process::raise_fd_limit`]); the limit is reported.

use std::collections::BTreeMap;
use std::io::{self, BufRead, BufReader, Read, Write};
use std::os::fd::{AsFd, BorrowedFd};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, ExitCode, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{mpsc, Arc};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use crate::cli::{self, usage, Cli, UsageError};
use crate::method::Mode;
use crate::methods;
use crate::output::{self, ProgressOut};
use crate::pattern::Pattern;
use crate::report::{Machine, SuiteReport};
use crate::run::{drive_with, inherit_and_die_with_parent, run_spec_main, RunOutput, RunSpec};
use crate::suite::{self, Status};
use shmlink_measure::protocol::Stop;
use shmlink_measure::size;
use shmlink_measure::stats::median_f64;
use shmlink_measure::verify::Sampling;

/// The hidden subcommand of a session's driver: `RUN_CMD SPEC` (a `SessionSpec`).
pub const RUN_CMD: &str = "__sessions-run";
/// The hidden subcommand of the idle listener: `IDLE_SERVER_CMD METHOD N`.
pub const IDLE_SERVER_CMD: &str = "__sessions-idle-server";
/// The hidden subcommand of an idle client: `IDLE_CLIENT_CMD METHOD ADDR N`.
pub const IDLE_CLIENT_CMD: &str = "__sessions-idle-client";
/// Most idle connections one client process holds.
pub const PER_CLIENT: usize = 2500;

/// The methods of the sessions rows (point-to-point methods, [`crate::methods`]).
pub const METHODS: &[&str] = &[
    "shmlink-shm",
    "shmlink-shm-blocking",
    "uds-stream",
    "tcp",
    "iceoryx2",
];
/// The methods of the idle rows: `shm:NAME`, a Unix stream listener, TCP on 127.0.0.1.
pub const IDLE_METHODS: &[&str] = &["shmlink-shm", "uds", "tcp"];

/// What to run (the report's `config`).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct SessionsConfig {
    pub methods: Vec<String>,
    pub sizes: Vec<usize>,
    pub modes: Vec<Mode>,
    /// Sessions per row.
    pub sessions: Vec<usize>,
    /// Idle connections per idle row (none: no idle rows).
    pub idle: Vec<usize>,
    pub idle_methods: Vec<String>,
    pub warmup_ms: u64,
    /// The measured part of each session.
    pub measure_ms: u64,
    /// How long the idle processes are watched.
    pub idle_window_ms: u64,
    pub rounds: u32,
}

/// `--pattern sessions`.
pub struct Sessions;

/// The options `--pattern sessions` takes.
const FLAGS: &[&str] = &[
    "methods", "sizes", "mode", "duration", "warmup", "rounds", "sessions", "idle", "quick", "json",
];

impl Pattern for Sessions {
    fn name(&self) -> &'static str {
        "sessions"
    }

    fn help(&self) -> &'static str {
        "N parallel sessions (process pairs, each a point-to-point run: round trips and a
stream, verified) of shmlink-shm, shmlink-shm-blocking, uds-stream, tcp and iceoryx2 at
64 B and 10 KiB: total throughput, p50/p99, CPU s per million messages (both ends),
memory per session (smaps_rollup of both processes); then 1,000 and 10,000 idle
connections on one listener (shm:, UDS, TCP): fds, memory, idle CPU. Options:
--methods, --sizes, --mode, --sessions LIST [1,4,16,64], --idle LIST [1000,10000; 0:
none], --duration [1s], --warmup [200ms], --rounds [1], --quick (sessions 1,4, idle
1000, 200 ms runs), --json FILE."
    }

    fn flags(&self) -> &'static [&'static str] {
        FLAGS
    }

    fn child(&self, argv: &[String]) -> Option<ExitCode> {
        match argv {
            [cmd, spec, ..] if cmd == RUN_CMD => Some(run_spec_main(spec, "", session)),
            [cmd, method, n] if cmd == IDLE_SERVER_CMD => Some(idle_server_main(method, n)),
            // Four arguments: more than `argv` holds.
            [cmd, ..] if cmd == IDLE_CLIENT_CMD => Some(idle_client_main(
                &std::env::args().skip(2).collect::<Vec<_>>(),
            )),
            _ => None,
        }
    }

    fn run(&self, cli: &Cli) -> Result<ExitCode, UsageError> {
        let c = config(cli)?;
        Ok(run(&c, cli.json.as_deref()))
    }
}

/// A list of counts for `flag`, each in `range`.
fn counts(
    flag: &str,
    text: &str,
    range: std::ops::RangeInclusive<usize>,
) -> Result<Vec<usize>, UsageError> {
    let mut v = Vec::new();
    for s in text.split(',') {
        match s.trim().parse::<usize>() {
            Ok(n) if range.contains(&n) => {
                if !v.contains(&n) {
                    v.push(n)
                }
            }
            _ => {
                return usage(format!(
                    "invalid {flag} value {s:?} (counts from {} to {})",
                    range.start(),
                    range.end()
                ))
            }
        }
    }
    Ok(v)
}

/// The configuration from the options.
pub fn config(cli: &Cli) -> Result<SessionsConfig, UsageError> {
    let quick = cli.quick;
    let methods = match &cli.methods {
        Some(text) => {
            let mut all: Vec<&str> = METHODS.to_vec();
            all.extend(IDLE_METHODS.iter().filter(|m| !METHODS.contains(m)));
            cli::unique_method_list(text, &all, |name| {
                format!(
                    "unknown method {name:?} for --pattern sessions (valid: all, {}; idle rows: {})",
                    METHODS.join(", "),
                    IDLE_METHODS.join(", ")
                )
            })?
        }
        None => METHODS
            .iter()
            .chain(IDLE_METHODS.iter().filter(|m| !METHODS.contains(m)))
            .map(|s| s.to_string())
            .collect(),
    };
    let session_methods: Vec<String> = methods
        .iter()
        .filter(|m| METHODS.contains(&m.as_str()))
        .cloned()
        .collect();
    let idle_methods: Vec<String> = methods
        .iter()
        .filter(|m| IDLE_METHODS.contains(&m.as_str()))
        .cloned()
        .collect();
    let sizes = match &cli.sizes {
        Some(t) => cli::suite_sizes(t)?,
        None => vec![64, 10 << 10],
    };
    let modes = match cli.mode.as_deref() {
        None | Some("both") => vec![Mode::Latency, Mode::Throughput],
        Some("latency") => vec![Mode::Latency],
        Some("throughput") => vec![Mode::Throughput],
        Some(other) => {
            return usage(format!(
                "invalid --mode {other:?} (valid: latency, throughput, both)"
            ))
        }
    };
    let sessions = match &cli.sessions {
        Some(t) => counts("--sessions", t, 1..=256)?,
        None if quick => vec![1, 4],
        None => vec![1, 4, 16, 64],
    };
    let idle = match &cli.idle {
        Some(t) => counts("--idle", t, 0..=100_000)?
            .into_iter()
            .filter(|&n| n > 0)
            .collect(),
        None if quick => vec![1000],
        None => vec![1000, 10_000],
    };
    let measure_ms = match &cli.duration {
        Some(t) => match cli::millis("--duration", t)? {
            0 => return usage("--duration must be more than 0"),
            ms => ms,
        },
        None if quick => 200,
        None => 1000,
    };
    let warmup_ms = match &cli.warmup {
        Some(t) => cli::millis("--warmup", t)?,
        None if quick => 50,
        None => 200,
    };
    Ok(SessionsConfig {
        methods: session_methods,
        sizes,
        modes,
        sessions,
        idle,
        idle_methods,
        warmup_ms,
        measure_ms,
        idle_window_ms: if quick { 1000 } else { 3000 },
        rounds: cli::suite_rounds(cli)?.unwrap_or(1),
    })
}

// ---------------------------------------------------------------------------------------
// Figures read from /proc.

/// Memory of a set of processes from `/proc/PID/smaps_rollup`, in KiB (summed).
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Mem {
    pub rss_kib: f64,
    pub pss_kib: f64,
    pub pss_anon_kib: f64,
    pub pss_file_kib: f64,
    pub pss_shmem_kib: f64,
    pub shared_clean_kib: f64,
    pub shared_dirty_kib: f64,
    pub private_clean_kib: f64,
    pub private_dirty_kib: f64,
}

impl Mem {
    /// The figures of process `pid` (`"self"` for this one).
    pub fn of(pid: &str) -> io::Result<Mem> {
        let path = format!("/proc/{pid}/smaps_rollup");
        let text = std::fs::read_to_string(&path)
            .map_err(|e| io::Error::new(e.kind(), format!("read {path}: {e}")))?;
        Mem::parse(&text).ok_or_else(|| io::Error::other(format!("no Rss/Pss in {path}")))
    }

    /// Parses an `smaps_rollup` text (`None` without Rss and Pss).
    pub fn parse(text: &str) -> Option<Mem> {
        let mut m = Mem::default();
        let (mut rss, mut pss) = (false, false);
        for line in text.lines() {
            let Some((key, rest)) = line.split_once(':') else {
                continue;
            };
            let Some(kib) = rest
                .trim()
                .strip_suffix("kB")
                .and_then(|v| v.trim().parse::<f64>().ok())
            else {
                continue;
            };
            let slot = match key {
                "Rss" => {
                    rss = true;
                    &mut m.rss_kib
                }
                "Pss" => {
                    pss = true;
                    &mut m.pss_kib
                }
                "Pss_Anon" => &mut m.pss_anon_kib,
                "Pss_File" => &mut m.pss_file_kib,
                "Pss_Shmem" => &mut m.pss_shmem_kib,
                "Shared_Clean" => &mut m.shared_clean_kib,
                "Shared_Dirty" => &mut m.shared_dirty_kib,
                "Private_Clean" => &mut m.private_clean_kib,
                "Private_Dirty" => &mut m.private_dirty_kib,
                _ => continue,
            };
            *slot = kib;
        }
        (rss && pss).then_some(m)
    }

    fn zip(self, o: Mem, f: impl Fn(f64, f64) -> f64) -> Mem {
        Mem {
            rss_kib: f(self.rss_kib, o.rss_kib),
            pss_kib: f(self.pss_kib, o.pss_kib),
            pss_anon_kib: f(self.pss_anon_kib, o.pss_anon_kib),
            pss_file_kib: f(self.pss_file_kib, o.pss_file_kib),
            pss_shmem_kib: f(self.pss_shmem_kib, o.pss_shmem_kib),
            shared_clean_kib: f(self.shared_clean_kib, o.shared_clean_kib),
            shared_dirty_kib: f(self.shared_dirty_kib, o.shared_dirty_kib),
            private_clean_kib: f(self.private_clean_kib, o.private_clean_kib),
            private_dirty_kib: f(self.private_dirty_kib, o.private_dirty_kib),
        }
    }

    /// Each figure summed.
    pub fn plus(self, o: Mem) -> Mem {
        self.zip(o, |a, b| a + b)
    }

    /// Each figure minus `o`'s.
    pub fn minus(self, o: Mem) -> Mem {
        self.zip(o, |a, b| a - b)
    }

    /// Each figure divided by `n`.
    pub fn per(self, n: f64) -> Mem {
        self.zip(self, |a, _| a / n)
    }
}

/// CPU time (ns, every thread: `/proc/PID/task/*/schedstat`) and context switches
/// (voluntary + involuntary, `/proc/PID/task/*/status`) of process `pid` so far.
fn cpu_and_switches(pid: u32) -> io::Result<(u64, u64)> {
    let (mut ns, mut switches) = (0u64, 0u64);
    for task in std::fs::read_dir(format!("/proc/{pid}/task"))? {
        let dir = task?.path();
        // A thread that ended between the listing and the read is skipped.
        if let Ok(s) = std::fs::read_to_string(dir.join("schedstat")) {
            ns += s
                .split_whitespace()
                .next()
                .and_then(|v| v.parse::<u64>().ok())
                .unwrap_or(0);
        }
        if let Ok(s) = std::fs::read_to_string(dir.join("status")) {
            for line in s.lines() {
                if let Some(v) = line
                    .strip_prefix("voluntary_ctxt_switches:")
                    .or_else(|| line.strip_prefix("nonvoluntary_ctxt_switches:"))
                {
                    switches += v.trim().parse::<u64>().unwrap_or(0);
                }
            }
        }
    }
    Ok((ns, switches))
}

/// Open fds of process `pid`, and how many of them, past stdin, stdout and stderr, are
/// pipe ends (a `shm:` connection's doorbell pipes: three per side, design §4.4).
fn fd_count(pid: u32) -> io::Result<(usize, usize)> {
    fds_in(&format!("/proc/{pid}/fd"))
}

/// [`fd_count`] of the `/proc/…/fd` directory `dir`.
fn fds_in(dir: &str) -> io::Result<(usize, usize)> {
    let mut all = 0;
    let mut pipes = 0;
    for e in std::fs::read_dir(dir)?.flatten() {
        all += 1;
        let stdio = matches!(e.file_name().to_str(), Some("0" | "1" | "2"));
        if !stdio
            && std::fs::read_link(e.path()).is_ok_and(|t| t.to_string_lossy().starts_with("pipe:"))
        {
            pipes += 1;
        }
    }
    Ok((all, pipes))
}

/// The system's `Slab:` in KiB (`/proc/meminfo`).
fn slab_kib() -> Option<f64> {
    let text = std::fs::read_to_string("/proc/meminfo").ok()?;
    text.lines()
        .find_map(|l| l.strip_prefix("Slab:"))
        .and_then(|v| v.trim().strip_suffix("kB"))
        .and_then(|v| v.trim().parse().ok())
}

// ---------------------------------------------------------------------------------------
// Round-trip samples of many sessions.

/// A histogram of nanoseconds with 1/64 relative precision: exact below 128 ns, then 64
/// buckets per power of two. Sessions send theirs; the row merges them.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Hist(pub BTreeMap<u32, u64>);

impl Hist {
    fn key(v: u64) -> u32 {
        if v < 128 {
            return v as u32;
        }
        let e = 63 - v.leading_zeros(); // >= 7
        let shift = e - 6;
        shift * 64 + (v >> shift) as u32
    }

    /// The middle of bucket `key`.
    fn value(key: u32) -> u64 {
        let shift = (key / 64).max(1) - 1;
        let m = (key - shift * 64) as u64;
        (m << shift) + ((1u64 << shift) >> 1)
    }

    /// A histogram of `samples`.
    pub fn of(samples: &[u64]) -> Hist {
        let mut h = Hist::default();
        for &s in samples {
            *h.0.entry(Hist::key(s)).or_default() += 1;
        }
        h
    }

    /// Adds `o`'s counts.
    pub fn merge(&mut self, o: &Hist) {
        for (k, n) in &o.0 {
            *self.0.entry(*k).or_default() += n;
        }
    }

    /// The `q` quantile (0 < q <= 1), `None` if empty.
    pub fn quantile(&self, q: f64) -> Option<u64> {
        let total: u64 = self.0.values().sum();
        if total == 0 {
            return None;
        }
        let rank = ((q * total as f64).ceil() as u64).clamp(1, total);
        let mut seen = 0;
        for (k, n) in &self.0 {
            seen += n;
            if seen >= rank {
                return Some(Hist::value(*k));
            }
        }
        None
    }
}

// ---------------------------------------------------------------------------------------
// One session (the driver process).

/// A session's run and when its driver samples memory.
#[derive(Clone, Debug, Serialize, Deserialize)]
struct SessionSpec {
    run: RunSpec,
    /// After the measured part starts: half of it.
    sample_after_ms: u64,
}

/// What one session measured.
#[derive(Clone, Debug, Serialize, Deserialize)]
struct SessionOutput {
    run: RunOutput,
    hist: Hist,
    /// Driver + peer, in the middle of the measured part.
    mem: Mem,
    /// When the measured part started and ended (wall clock, ns since the Unix epoch).
    start_ns: u64,
    end_ns: u64,
}

/// Nanoseconds since the Unix epoch.
fn unix_ns(t: std::time::SystemTime) -> u64 {
    t.duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64)
}

/// A session's driver: the point-to-point run of `spec`, with a barrier before the
/// warm-up (`READY` on stdout, `GO` on stdin) and the memory of both ends read in the
/// middle of the measured part.
fn session(spec: &SessionSpec, exe: &Path) -> io::Result<SessionOutput> {
    let peer = Arc::new(AtomicU32::new(0));
    let mut sampler = None;
    let after = Duration::from_millis(spec.sample_after_ms);
    let p = peer.clone();
    let (run, rtts, ended) = drive_with(
        &spec.run,
        exe,
        &mut |pid| p.store(pid, Ordering::Relaxed),
        &mut || {
            let mut out = io::stdout().lock();
            out.write_all(b"READY\n")?;
            out.flush()?;
            let mut line = String::new();
            io::stdin().lock().read_line(&mut line)?;
            // `GO NS`: the warm-up ends at NS (ns since the Unix epoch) in every session.
            let at = match line.trim().strip_prefix("GO ").map(str::parse::<u64>) {
                Some(Ok(ns)) => std::time::UNIX_EPOCH + Duration::from_nanos(ns),
                _ => return Err(io::Error::other("the bench ended the row before it began")),
            };
            let warmup = at
                .duration_since(std::time::SystemTime::now())
                .unwrap_or(Duration::ZERO);
            let pid = peer.load(Ordering::Relaxed);
            // Two samples: one a fifth of the way to the middle of the measured part, and
            // the one in the middle, which the row reports unless it found the run over
            // (a sampler thread starved on a loaded machine: the peer has exited).
            sampler = Some(std::thread::spawn(move || -> io::Result<Mem> {
                let both =
                    || -> io::Result<Mem> { Ok(Mem::of("self")?.plus(Mem::of(&pid.to_string())?)) };
                std::thread::sleep(warmup + after / 5);
                let early = both()?;
                std::thread::sleep(after - after / 5);
                Ok(both().unwrap_or(early))
            }));
            Ok(Some(warmup))
        },
    )?;
    let mem = sampler
        .expect("ready ran")
        .join()
        .map_err(|_| io::Error::other("memory sampler panicked"))?
        .map_err(|e| io::Error::other(format!("memory in the measured part: {e}")))?;
    let end_ns = unix_ns(ended);
    Ok(SessionOutput {
        hist: Hist::of(rtts.as_deref().unwrap_or(&[])),
        start_ns: end_ns.saturating_sub(run.elapsed_ns),
        end_ns,
        run,
        mem,
    })
}

// ---------------------------------------------------------------------------------------
// The orchestrator's side of a row.

/// A row's figures in one round.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Figures {
    /// Messages (round trips in latency mode) of all sessions per second of the span from
    /// the first session's start to the last one's end.
    pub msgs_per_s: f64,
    /// The union of the sessions' measured spans minus the part common to all, in ms
    /// (0: all measured exactly together).
    #[serde(default)]
    pub span_skew_ms: f64,
    pub p50_ns: Option<u64>,
    pub p99_ns: Option<u64>,
    /// CPU seconds of both ends per million messages (round trips).
    pub cpu_s_per_m: f64,
    /// Of which the drivers' (senders' in the stream rows).
    pub cpu_s_per_m_driver: f64,
    /// Measured messages, all sessions.
    pub messages: u64,
    /// Memory per session (driver + peer).
    pub mem_per_session: Mem,
}

/// One sessions row.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct SessionsRow {
    pub method: String,
    pub mode: Mode,
    pub size: usize,
    pub sessions: usize,
    pub status: Status,
    pub note: Option<String>,
    pub runs: Vec<Figures>,
    /// Each figure's median over the rounds.
    pub summary: Option<Figures>,
}

/// One idle row.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct IdleRow {
    pub method: String,
    pub connections: usize,
    pub status: Status,
    pub note: Option<String>,
    pub figures: Option<IdleFigures>,
}

/// What idle connections cost.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct IdleFigures {
    pub client_processes: usize,
    pub server_fds: usize,
    /// Of the server's fds, pipe ends it did not have before the first connection: three
    /// per `shm:` connection with doorbell pipes (the rest keep their socket alone,
    /// docs/design.md §4.4's descriptor budget).
    #[serde(default)]
    pub server_pipe_ends: usize,
    pub client_fds: usize,
    /// Growth from before the first connection to after the last, per connection.
    pub server_per_conn: Mem,
    pub client_per_conn: Mem,
    pub server_mem: Mem,
    pub client_mem: Mem,
    /// Growth of the system's Slab over the same time, per connection (every process of
    /// the machine counts: noisy on a busy one).
    pub slab_kib_per_conn: Option<f64>,
    pub window_s: f64,
    /// CPU time of the server and of all clients over the window, in ms.
    pub server_cpu_ms: f64,
    pub client_cpu_ms: f64,
    /// Context switches (voluntary + involuntary) over the window.
    pub server_switches: u64,
    pub client_switches: u64,
    /// The fd limit the processes ran with (soft = hard).
    pub fd_limit: u64,
}

/// A row of the report.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "lowercase")]
pub enum Row {
    Sessions(Box<SessionsRow>),
    Idle(Box<IdleRow>),
}

/// The `--json` report.
pub type Report = SuiteReport<SessionsConfig, Row>;

suite::impl_suite_cell!(SessionsRow, summarize);

/// A row's summary: the median of its rounds' figures.
fn summarize(row: &SessionsRow) -> Option<Figures> {
    median_figures(&row.runs)
}

/// Child processes killed on drop (unless they were waited for).
struct Children(Vec<Child>);

impl Drop for Children {
    fn drop(&mut self) {
        for c in &mut self.0 {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// What a child said: a line on stdout, or the end of it.
enum Said {
    Line(usize, String),
    End(usize),
}

/// Starts `exe ARGS` dying with this process, stdin/stdout piped, stderr collected; its
/// stdout lines go to `tx` tagged `i`. Returns the child and its stderr's reader.
fn start(
    exe: &Path,
    args: &[&str],
    i: usize,
    tx: &mpsc::Sender<Said>,
) -> io::Result<(Child, std::thread::JoinHandle<String>)> {
    let mut cmd = Command::new(exe);
    cmd.args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    inherit_and_die_with_parent(&mut cmd, Vec::new());
    let mut child = cmd.spawn()?;
    let out = child.stdout.take().expect("piped");
    let mut err = child.stderr.take().expect("piped");
    let tx = tx.clone();
    std::thread::spawn(move || {
        for line in BufReader::new(out).lines() {
            match line {
                Ok(l) => {
                    if tx.send(Said::Line(i, l)).is_err() {
                        return;
                    }
                }
                Err(_) => break,
            }
        }
        let _ = tx.send(Said::End(i));
    });
    let errs = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = err.read_to_string(&mut s);
        s
    });
    Ok((child, errs))
}

/// Waits until every one of `n` children said a line starting with `word` (returns
/// them, in child order), or one ended, or `deadline` passed.
fn await_all(
    rx: &mpsc::Receiver<Said>,
    n: usize,
    word: &str,
    deadline: Instant,
) -> Result<Vec<String>, String> {
    let mut got: Vec<Option<String>> = vec![None; n];
    let mut left = n;
    while left > 0 {
        let wait = deadline.saturating_duration_since(Instant::now());
        match rx.recv_timeout(wait) {
            Ok(Said::Line(i, l)) if l.starts_with(word) && got[i].is_none() => {
                got[i] = Some(l);
                left -= 1;
            }
            Ok(Said::Line(i, l)) => return Err(format!("process {i} said {l:?}")),
            // A process that said its line may end (after its result).
            Ok(Said::End(i)) if got[i].is_some() => {}
            Ok(Said::End(i)) => return Err(format!("process {i} ended before {word}")),
            Err(_) => return Err(format!("{left} of {n} processes not at {word} in time")),
        }
    }
    Ok(got.into_iter().map(|l| l.expect("all said")).collect())
}

/// The stderr of the children, joined (after they ended).
fn stderr_of(readers: Vec<std::thread::JoinHandle<String>>) -> String {
    let lines: Vec<String> = readers
        .into_iter()
        .filter_map(|r| r.join().ok())
        .flat_map(|s| {
            s.lines()
                .map(str::trim)
                .filter(|l| !l.is_empty())
                .map(String::from)
                .collect::<Vec<_>>()
        })
        .collect();
    let mut uniq: Vec<String> = Vec::new();
    for l in lines {
        if !uniq.contains(&l) {
            uniq.push(l);
        }
    }
    uniq.join("; ")
}

/// Sends `line` to every child's stdin.
fn tell(stdins: &mut [ChildStdin], line: &str) {
    for s in stdins {
        let _ = s.write_all(line.as_bytes());
        let _ = s.flush();
    }
}

/// One round of a row: `n` sessions of `row`'s method at once.
fn run_row(
    exe: &Path,
    c: &SessionsConfig,
    row: &SessionsRow,
    serial: u64,
) -> Result<Figures, String> {
    let n = row.sessions;
    let pid = std::process::id();
    let tags: Vec<String> = (0..n)
        .map(|i| format!("shmlink-bench-s{pid}-{serial}-{i}"))
        .collect();
    let window = match row.mode {
        Mode::Latency => 1,
        Mode::Throughput => {
            let max = methods::find(&row.method).and_then(|m| m.max_window(row.size));
            suite::default_window(row.size).min(max.unwrap_or(u64::MAX))
        }
    };
    let (tx, rx) = mpsc::channel();
    let mut children = Children(Vec::new());
    let mut stdins = Vec::new();
    let mut readers = Vec::new();
    let clean_up = || {
        if let Some(m) = methods::find(&row.method) {
            for t in &tags {
                m.clean_up_after_failure(t);
            }
        }
    };
    for (i, tag) in tags.iter().enumerate() {
        let spec = SessionSpec {
            run: RunSpec {
                method: row.method.clone(),
                size: row.size,
                mode: row.mode,
                window,
                warmup_ms: c.warmup_ms,
                stop: Stop::Millis(c.measure_ms),
                sampling: Sampling::DEFAULT,
                cpus: None,
                tag: tag.clone(),
            },
            sample_after_ms: c.measure_ms / 2,
        };
        let json = serde_json::to_string(&spec).expect("a spec serialises");
        let (mut child, errs) =
            start(exe, &[RUN_CMD, &json], i, &tx).map_err(|e| format!("start a session: {e}"))?;
        stdins.push(child.stdin.take().expect("piped"));
        children.0.push(child);
        readers.push(errs);
    }
    drop(tx);
    let fail = |children: Children, readers, what: String| {
        drop(children);
        clean_up();
        let said = stderr_of(readers);
        Err(if said.is_empty() {
            what
        } else {
            format!("{what}: {said}")
        })
    };
    let setup = Instant::now() + Duration::from_secs(30 + n as u64);
    if let Err(e) = await_all(&rx, n, "READY", setup) {
        return fail(children, readers, e);
    }
    // Every warm-up ends at one instant, far enough ahead for the last session to read
    // its `GO` on a loaded machine.
    let lead = Duration::from_millis(c.warmup_ms) + Duration::from_millis(20 + 2 * n as u64);
    let at = unix_ns(std::time::SystemTime::now() + lead);
    tell(&mut stdins, &format!("GO {at}\n"));
    let end = Instant::now()
        + Duration::from_millis(c.warmup_ms + c.measure_ms)
        + Duration::from_secs(30 + n as u64);
    let lines = match await_all(&rx, n, "{", end) {
        Ok(l) => l,
        Err(e) => return fail(children, readers, e),
    };
    drop(stdins);
    for ch in &mut children.0 {
        let _ = ch.wait();
    }
    children.0.clear();
    let _ = stderr_of(readers);
    let outs: Vec<SessionOutput> = lines
        .iter()
        .map(|l| serde_json::from_str(l).map_err(|e| format!("unreadable session result: {e}")))
        .collect::<Result<_, _>>()?;
    Ok(figures(&outs))
}

/// A row's figures from its sessions' outputs.
fn figures(outs: &[SessionOutput]) -> Figures {
    let messages: u64 = outs.iter().map(|o| o.run.count).sum();
    let first_start = outs.iter().map(|o| o.start_ns).min().unwrap_or(0);
    let last_end = outs.iter().map(|o| o.end_ns).max().unwrap_or(0);
    let last_start = outs.iter().map(|o| o.start_ns).max().unwrap_or(0);
    let first_end = outs.iter().map(|o| o.end_ns).min().unwrap_or(0);
    let union = last_end.saturating_sub(first_start);
    let common = first_end.saturating_sub(last_start);
    let rate = messages as f64 / (union.max(1) as f64 / 1e9);
    let cpu_us = |f: fn(&RunOutput) -> f64| -> f64 {
        outs.iter()
            .map(|o| f(&o.run) * o.run.count as f64)
            .sum::<f64>()
            / messages.max(1) as f64
    };
    let mut hist = Hist::default();
    for o in outs {
        hist.merge(&o.hist);
    }
    let mem = outs
        .iter()
        .fold(Mem::default(), |m, o| m.plus(o.mem))
        .per(outs.len().max(1) as f64);
    Figures {
        msgs_per_s: rate,
        span_skew_ms: union.saturating_sub(common) as f64 / 1e6,
        p50_ns: hist.quantile(0.5),
        p99_ns: hist.quantile(0.99),
        // µs per message = s per million messages.
        cpu_s_per_m: cpu_us(|r| r.cpu_us_per_msg.driver + r.cpu_us_per_msg.peer),
        cpu_s_per_m_driver: cpu_us(|r| r.cpu_us_per_msg.driver),
        messages,
        mem_per_session: mem,
    }
}

/// Each figure's median over the rounds.
fn median_figures(runs: &[Figures]) -> Option<Figures> {
    if runs.is_empty() {
        return None;
    }
    let med = |f: &dyn Fn(&Figures) -> f64| median_f64(&runs.iter().map(f).collect::<Vec<_>>());
    let medu = |f: &dyn Fn(&Figures) -> Option<u64>| {
        let v: Vec<f64> = runs.iter().filter_map(f).map(|x| x as f64).collect();
        median_f64(&v).map(|x| x as u64)
    };
    let mems: Vec<Mem> = runs.iter().map(|r| r.mem_per_session).collect();
    let mem_med =
        |f: fn(&Mem) -> f64| median_f64(&mems.iter().map(f).collect::<Vec<_>>()).unwrap_or(0.0);
    Some(Figures {
        msgs_per_s: med(&|r| r.msgs_per_s).unwrap_or(0.0),
        span_skew_ms: med(&|r| r.span_skew_ms).unwrap_or(0.0),
        p50_ns: medu(&|r| r.p50_ns),
        p99_ns: medu(&|r| r.p99_ns),
        cpu_s_per_m: med(&|r| r.cpu_s_per_m).unwrap_or(0.0),
        cpu_s_per_m_driver: med(&|r| r.cpu_s_per_m_driver).unwrap_or(0.0),
        messages: runs.iter().map(|r| r.messages).sum(),
        mem_per_session: Mem {
            rss_kib: mem_med(|m| m.rss_kib),
            pss_kib: mem_med(|m| m.pss_kib),
            pss_anon_kib: mem_med(|m| m.pss_anon_kib),
            pss_file_kib: mem_med(|m| m.pss_file_kib),
            pss_shmem_kib: mem_med(|m| m.pss_shmem_kib),
            shared_clean_kib: mem_med(|m| m.shared_clean_kib),
            shared_dirty_kib: mem_med(|m| m.shared_dirty_kib),
            private_clean_kib: mem_med(|m| m.private_clean_kib),
            private_dirty_kib: mem_med(|m| m.private_dirty_kib),
        },
    })
}

// ---------------------------------------------------------------------------------------
// Idle connections.

/// An idle endpoint: whatever keeps a connection open, and its fd to wait on.
trait Held: Send {
    fn fd(&self) -> BorrowedFd<'_>;
}

impl<T: AsFd + Send> Held for T {
    fn fd(&self) -> BorrowedFd<'_> {
        self.as_fd()
    }
}

enum IdleListener {
    Shm(shmlink::Listener),
    Uds(std::os::unix::net::UnixListener, PathBuf),
    Tcp(std::net::TcpListener),
}

impl Drop for IdleListener {
    fn drop(&mut self) {
        if let IdleListener::Uds(_, p) = self {
            let _ = std::fs::remove_file(p);
        }
    }
}

fn shm_err(e: shmlink::Error) -> io::Error {
    io::Error::other(e.to_string())
}

impl IdleListener {
    fn bind(method: &str) -> io::Result<(IdleListener, String)> {
        let tag = format!("shmlink-bench-idle-{}", std::process::id());
        Ok(match method {
            "shmlink-shm" => {
                let l =
                    shmlink::Listener::bind(&format!("shm:{tag}"), &shmlink::Options::default())
                        .map_err(shm_err)?;
                let a = l.local_addr();
                (IdleListener::Shm(l), a)
            }
            "uds" => {
                let p = std::env::temp_dir().join(format!("{tag}.sock"));
                let _ = std::fs::remove_file(&p);
                let l = std::os::unix::net::UnixListener::bind(&p)?;
                let a = p.display().to_string();
                (IdleListener::Uds(l, p), a)
            }
            "tcp" => {
                let l = std::net::TcpListener::bind("127.0.0.1:0")?;
                let a = l.local_addr()?.to_string();
                (IdleListener::Tcp(l), a)
            }
            other => return Err(io::Error::other(format!("unknown idle method {other}"))),
        })
    }

    fn accept(&mut self) -> io::Result<Box<dyn Held>> {
        Ok(match self {
            IdleListener::Shm(l) => Box::new(l.accept().map_err(shm_err)?),
            IdleListener::Uds(l, _) => Box::new(l.accept()?.0),
            IdleListener::Tcp(l) => Box::new(l.accept()?.0),
        })
    }
}

fn idle_connect(method: &str, addr: &str) -> io::Result<Box<dyn Held>> {
    Ok(match method {
        "shmlink-shm" => Box::new(
            shmlink::Connection::connect(addr, &shmlink::Options::default()).map_err(shm_err)?,
        ),
        "uds" => Box::new(std::os::unix::net::UnixStream::connect(addr)?),
        "tcp" => Box::new(std::net::TcpStream::connect(addr)?),
        other => return Err(io::Error::other(format!("unknown idle method {other}"))),
    })
}

/// How a process of the idle rows starts: its fd limit raised, its memory so far.
/// Its pipe ends (past stdio) are counted too: a process may inherit some from whoever
/// started the bench, and only the connections' count.
fn idle_start() -> io::Result<(u64, Mem, usize)> {
    let (soft, _) = shmlink_sys::process::raise_fd_limit()?;
    Ok((soft, Mem::of("self")?, fds_in("/proc/self/fd")?.1))
}

/// `IDLE_SERVER_CMD METHOD N`: binds, says `ADDR address`, accepts N connections, says
/// `ACCEPTED [limit, before, pipe ends]`, then waits for any connection or stdin to
/// become readable: stdin's end ends it (status 0), a connection's event fails it (an idle connection that
/// is not idle).
fn idle_server_main(method: &str, n: &str) -> ExitCode {
    let res = (|| -> io::Result<()> {
        let n: usize = n
            .parse()
            .map_err(|_| io::Error::other(format!("bad count {n:?}")))?;
        let (limit, before, pipes) = idle_start()?;
        let (mut l, addr) = IdleListener::bind(method)?;
        println!("ADDR {addr}");
        let mut held = Vec::with_capacity(n);
        for i in 0..n {
            held.push(l.accept().map_err(|e| {
                io::Error::new(e.kind(), format!("accept #{i} (fd limit {limit}): {e}"))
            })?);
        }
        println!(
            "ACCEPTED {}",
            serde_json::to_string(&(limit, before, pipes)).expect("serialises")
        );
        let stdin = io::stdin();
        let mut fds = vec![stdin.as_fd()];
        fds.extend(held.iter().map(|h| h.fd()));
        loop {
            let events = match shmlink_sys::poll_many(&fds, shmlink_sys::Interest::READABLE, None) {
                Ok(e) => e,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(e),
            };
            if events[0].is_ready() {
                return Ok(());
            }
            if let Some(i) = events.iter().position(|e| e.is_ready()) {
                return Err(io::Error::other(format!(
                    "idle connection #{} became ready while nothing was sent",
                    i - 1
                )));
            }
        }
    })();
    match res {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("idle server: {e}");
            ExitCode::FAILURE
        }
    }
}

/// `IDLE_CLIENT_CMD METHOD ADDR N`: makes N connections, says `CONNECTED [limit,
/// before, pipe ends]`, holds them until stdin ends.
fn idle_client_main(args: &[String]) -> ExitCode {
    let res = (|| -> io::Result<()> {
        let [method, addr, n] = args else {
            return Err(io::Error::other("usage: METHOD ADDR N"));
        };
        let n: usize = n
            .parse()
            .map_err(|_| io::Error::other(format!("bad count {n:?}")))?;
        let (limit, before, pipes) = idle_start()?;
        let mut held = Vec::with_capacity(n);
        for i in 0..n {
            held.push(idle_connect(method, addr).map_err(|e| {
                io::Error::new(e.kind(), format!("connect #{i} (fd limit {limit}): {e}"))
            })?);
        }
        println!(
            "CONNECTED {}",
            serde_json::to_string(&(limit, before, pipes)).expect("serialises")
        );
        let mut rest = Vec::new();
        io::stdin().read_to_end(&mut rest)?;
        drop(held);
        Ok(())
    })();
    match res {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("idle client: {e}");
            ExitCode::FAILURE
        }
    }
}

/// The `(limit, memory before, pipe ends before)` after `word` in a line.
fn limit_and_before(line: &str, word: &str) -> Result<(u64, Mem, usize), String> {
    let json = line.strip_prefix(word).unwrap_or("").trim();
    serde_json::from_str(json).map_err(|e| format!("unreadable {word} line {line:?}: {e}"))
}

/// Sums of CPU ns and switches over `pids`.
fn cpu_of(pids: &[u32]) -> Result<(u64, u64), String> {
    let mut t = (0, 0);
    for &p in pids {
        let (ns, sw) = cpu_and_switches(p).map_err(|e| format!("/proc/{p}: {e}"))?;
        t.0 += ns;
        t.1 += sw;
    }
    Ok(t)
}

fn mem_of(pids: &[u32]) -> Result<Mem, String> {
    pids.iter().try_fold(Mem::default(), |m, p| {
        Ok(m.plus(Mem::of(&p.to_string()).map_err(|e| e.to_string())?))
    })
}

/// One idle row: `n` connections of `method` on one listener.
fn idle_row(exe: &Path, method: &str, n: usize, window: Duration) -> Result<IdleFigures, String> {
    let slab_before = slab_kib();
    let (tx, rx) = mpsc::channel();
    let count = n.to_string();
    let (server, server_err) = start(exe, &[IDLE_SERVER_CMD, method, &count], 0, &tx)
        .map_err(|e| format!("start the server: {e}"))?;
    let mut children = Children(vec![server]);
    let mut readers = vec![server_err];
    let fail = |children: Children, readers, what: String| {
        drop(children);
        let said = stderr_of(readers);
        Err(if said.is_empty() {
            what
        } else {
            format!("{what}: {said}")
        })
    };
    let connect_time = Duration::from_secs(60) + Duration::from_millis(20 * n as u64);
    let addr = match rx.recv_timeout(Duration::from_secs(30)) {
        Ok(Said::Line(0, l)) if l.starts_with("ADDR ") => l[5..].to_string(),
        _ => return fail(children, readers, "the server gave no address".into()),
    };
    let clients = n.div_ceil(PER_CLIENT);
    for k in 0..clients {
        let share = (n - k * PER_CLIENT).min(PER_CLIENT).to_string();
        match start(exe, &[IDLE_CLIENT_CMD, method, &addr, &share], k + 1, &tx) {
            Ok((c, e)) => {
                children.0.push(c);
                readers.push(e);
            }
            Err(e) => return fail(children, readers, format!("start a client: {e}")),
        }
    }
    drop(tx);
    let deadline = Instant::now() + connect_time;
    // The server's ACCEPTED and every client's CONNECTED, in any order.
    let mut server_line = None;
    let mut client_lines = vec![None; clients];
    let mut left = clients + 1;
    while left > 0 {
        match rx.recv_timeout(deadline.saturating_duration_since(Instant::now())) {
            Ok(Said::Line(0, l)) if l.starts_with("ACCEPTED") && server_line.is_none() => {
                server_line = Some(l);
                left -= 1;
            }
            Ok(Said::Line(i, l))
                if i > 0 && l.starts_with("CONNECTED") && client_lines[i - 1].is_none() =>
            {
                client_lines[i - 1] = Some(l);
                left -= 1;
            }
            Ok(Said::Line(i, l)) => {
                return fail(children, readers, format!("process {i} said {l:?}"))
            }
            Ok(Said::End(i)) => {
                let who = if i == 0 {
                    "the server".to_string()
                } else {
                    format!("client {i}")
                };
                return fail(
                    children,
                    readers,
                    format!("{who} ended before all {n} connections were made"),
                );
            }
            Err(_) => {
                return fail(
                    children,
                    readers,
                    format!("{n} connections not made within {connect_time:?}"),
                )
            }
        }
    }
    let (limit, server_before, server_pipes_before) =
        limit_and_before(server_line.as_deref().unwrap_or(""), "ACCEPTED")?;
    let mut client_before = Mem::default();
    for l in client_lines.iter().flatten() {
        client_before = client_before.plus(limit_and_before(l, "CONNECTED")?.1);
    }
    let server_pid = [children.0[0].id()];
    let client_pids: Vec<u32> = children.0[1..].iter().map(|c| c.id()).collect();
    // Let the last connection's work settle, then watch.
    std::thread::sleep(Duration::from_millis(300));
    let measure = || -> Result<IdleFigures, String> {
        let s0 = cpu_of(&server_pid)?;
        let c0 = cpu_of(&client_pids)?;
        let t0 = Instant::now();
        std::thread::sleep(window);
        let s1 = cpu_of(&server_pid)?;
        let c1 = cpu_of(&client_pids)?;
        let secs = t0.elapsed().as_secs_f64();
        let server_mem = mem_of(&server_pid)?;
        let client_mem = mem_of(&client_pids)?;
        let slab_after = slab_kib();
        let (server_fds, server_pipe_ends) = fd_count(server_pid[0]).map_err(|e| e.to_string())?;
        let mut client_fds = 0;
        for &p in &client_pids {
            client_fds += fd_count(p).map_err(|e| e.to_string())?.0;
        }
        Ok(IdleFigures {
            client_processes: client_pids.len(),
            server_fds,
            server_pipe_ends: server_pipe_ends.saturating_sub(server_pipes_before),
            client_fds,
            server_per_conn: server_mem.minus(server_before).per(n as f64),
            client_per_conn: client_mem.minus(client_before).per(n as f64),
            server_mem,
            client_mem,
            slab_kib_per_conn: slab_before.zip(slab_after).map(|(a, b)| (b - a) / n as f64),
            window_s: secs,
            server_cpu_ms: (s1.0 - s0.0) as f64 / 1e6,
            client_cpu_ms: (c1.0 - c0.0) as f64 / 1e6,
            server_switches: s1.1 - s0.1,
            client_switches: c1.1 - c0.1,
            fd_limit: limit,
        })
    };
    let figures = match measure() {
        Ok(f) => f,
        Err(e) => return fail(children, readers, e),
    };
    // Ends the server (its stdin closes), then the clients.
    for c in &mut children.0 {
        drop(c.stdin.take());
        let _ = c.wait();
    }
    // A server that saw an event on an idle connection exits 1 before its stdin closed.
    let server_ok = children.0[0]
        .try_wait()
        .ok()
        .flatten()
        .is_some_and(|s| s.success());
    children.0.clear();
    let said = stderr_of(std::mem::take(&mut readers));
    if !server_ok {
        return Err(format!("the server failed: {said}"));
    }
    Ok(figures)
}

// ---------------------------------------------------------------------------------------
// The table and the run.

fn kib(v: f64) -> String {
    if v.abs() >= 10_240.0 {
        format!("{:.1}M", v / 1024.0)
    } else {
        format!("{v:.0}")
    }
}

fn rate(v: f64) -> String {
    if v >= 1e6 {
        format!("{:.2}M", v / 1e6)
    } else if v >= 1e3 {
        format!("{:.1}k", v / 1e3)
    } else {
        format!("{v:.0}")
    }
}

/// The sessions table: one block per (mode, size).
pub fn table(rows: &[SessionsRow]) -> String {
    let mut out = String::new();
    let mut keys: Vec<(Mode, usize)> = Vec::new();
    for r in rows {
        if !keys.contains(&(r.mode, r.size)) {
            keys.push((r.mode, r.size));
        }
    }
    for (mode, size) in keys {
        let (what, unit) = match mode {
            Mode::Latency => ("round trips", "rt/s"),
            Mode::Throughput => ("stream", "msg/s"),
        };
        out += &format!(
            "\n## {what}, {} (CPU: both ends' s per million {}; memory: KiB per session, driver + peer)\n",
            size::human(size),
            if mode == Mode::Latency { "round trips" } else { "messages" }
        );
        out += &format!(
            "{:<22} {:>4} {:>9} {:>7} {:>9} {:>9} {:>8} {:>8} {:>8} {:>8}\n",
            "method", "N", unit, "skew ms", "p50 us", "p99 us", "CPU s/M", "RSS", "PSS", "shm"
        );
        for r in rows.iter().filter(|r| r.mode == mode && r.size == size) {
            match (&r.summary, r.status) {
                (Some(f), Status::Ok) => {
                    let us = |v: Option<u64>| {
                        v.map_or("-".into(), |ns| format!("{:.2}", ns as f64 / 1e3))
                    };
                    let m = f.mem_per_session;
                    out += &format!(
                        "{:<22} {:>4} {:>9} {:>7.1} {:>9} {:>9} {:>8.2} {:>8} {:>8} {:>8}\n",
                        r.method,
                        r.sessions,
                        rate(f.msgs_per_s),
                        f.span_skew_ms,
                        us(f.p50_ns),
                        us(f.p99_ns),
                        f.cpu_s_per_m,
                        kib(m.rss_kib),
                        kib(m.pss_kib),
                        kib(m.pss_shmem_kib),
                    )
                }
                _ => {
                    out += &format!(
                        "{:<22} {:>4} failed: {}\n",
                        r.method,
                        r.sessions,
                        r.note.as_deref().unwrap_or("")
                    )
                }
            }
        }
    }
    out
}

/// The idle table.
pub fn idle_table(rows: &[IdleRow]) -> String {
    let mut out = String::from(
        "\n## idle connections on one listener (memory: KiB per connection, growth of Rss, Pss and Pss_Shmem (shared memory touched); CPU: ms over the window, all processes; piped: server-side connections with doorbell pipes)\n",
    );
    out += &format!(
        "{:<14} {:>6} {:>8} {:>6} {:>8} {:>8} {:>8} {:>8} {:>8} {:>8} {:>8} {:>8} {:>8} {:>8} {:>9}\n",
        "method",
        "conns",
        "srv fds",
        "piped",
        "cli fds",
        "srv RSS",
        "srv PSS",
        "srv shm",
        "cli RSS",
        "cli PSS",
        "cli shm",
        "slab KiB",
        "CPU ms",
        "switches",
        "window s"
    );
    for r in rows {
        match &r.figures {
            Some(f) => {
                out += &format!(
                    "{:<14} {:>6} {:>8} {:>6} {:>8} {:>8.2} {:>8.2} {:>8.2} {:>8.2} {:>8.2} {:>8.2} {:>8} {:>8.2} {:>8} {:>9.1}\n",
                    r.method,
                    r.connections,
                    f.server_fds,
                    // Three ends per connection; the listener may hold four more, a
                    // pair made ahead for its next client.
                    (f.server_pipe_ends / 3).min(r.connections),
                    f.client_fds,
                    f.server_per_conn.rss_kib,
                    f.server_per_conn.pss_kib,
                    f.server_per_conn.pss_shmem_kib,
                    f.client_per_conn.rss_kib,
                    f.client_per_conn.pss_kib,
                    f.client_per_conn.pss_shmem_kib,
                    f.slab_kib_per_conn
                        .map_or("-".into(), |v| format!("{v:.2}")),
                    f.server_cpu_ms + f.client_cpu_ms,
                    f.server_switches + f.client_switches,
                    f.window_s
                )
            }
            None => {
                out += &format!(
                    "{:<14} {:>6} failed: {}\n",
                    r.method,
                    r.connections,
                    r.note.as_deref().unwrap_or("")
                )
            }
        }
    }
    out
}

/// Runs the rows, prints the tables, writes the report: exit 1 if a row failed.
fn run(c: &SessionsConfig, json: Option<&Path>) -> ExitCode {
    let exe = match std::env::current_exe() {
        Ok(e) => e,
        Err(e) => {
            eprintln!("shmlink-bench: find this program: {e}");
            return ExitCode::from(1);
        }
    };
    let limit = shmlink_sys::process::raise_fd_limit();
    let started = output::unix_now();
    let t0 = Instant::now();
    let mut rows = Vec::new();
    for &size in &c.sizes {
        for &mode in &c.modes {
            for &n in &c.sessions {
                for m in &c.methods {
                    let found = methods::find(m).map(|x| (x.unavailable(), x.size_limit()));
                    let (status, note) = suite::planned_status(m, size, found);
                    rows.push(SessionsRow {
                        method: m.clone(),
                        mode,
                        size,
                        sessions: n,
                        status,
                        note,
                        runs: Vec::new(),
                        summary: None,
                    });
                }
            }
        }
    }
    println!(
        "# shmlink-bench --pattern sessions: {} rows x {} round(s), {} ms warm-up + {} ms measured each, unpinned; idle rows: {:?} connections of {}; fd limit {}",
        rows.len(),
        c.rounds,
        c.warmup_ms,
        c.measure_ms,
        c.idle,
        c.idle_methods.join(", "),
        match limit {
            Ok((soft, hard)) => format!("{soft} (hard {hard})"),
            Err(e) => format!("unknown ({e})"),
        }
    );
    let mut progress = ProgressOut::new();
    let rows = suite::run_cells(
        rows,
        c.rounds,
        |row, serial| {
            let f = run_row(&exe, c, row, serial)?;
            row.runs.push(f);
            Ok(())
        },
        |suite::Progress {
             done,
             total,
             round,
             cell: row,
         }| {
            let what = format!(
                "{} x{} {} {}",
                row.method,
                row.sessions,
                row.mode.name(),
                size::human(row.size)
            );
            let line = output::bar_line(done, total, round, &what, t0.elapsed());
            let failure = (row.status == Status::Failed)
                .then(|| format!("{what} failed: {}", row.note.as_deref().unwrap_or("")));
            progress.show(done, total, &line, failure);
        },
    );
    progress.finish();
    print!("{}", table(&rows));
    let window = Duration::from_millis(c.idle_window_ms);
    let mut idle = Vec::new();
    for &n in &c.idle {
        for m in &c.idle_methods {
            eprintln!("idle: {m} x {n}");
            let (status, note, figures) = match idle_row(&exe, m, n, window) {
                Ok(f) => (Status::Ok, None, Some(f)),
                Err(e) => (Status::Failed, Some(e), None),
            };
            idle.push(IdleRow {
                method: m.clone(),
                connections: n,
                status,
                note,
                figures,
            });
        }
    }
    if !idle.is_empty() {
        print!("{}", idle_table(&idle));
    }
    let failed = rows.iter().filter(|r| r.status == Status::Failed).count()
        + idle.iter().filter(|r| r.status == Status::Failed).count();
    let total = rows.len() + idle.len();
    let report = Report {
        schema: crate::report::SCHEMA,
        pattern: "sessions".into(),
        shmlink_version: env!("CARGO_PKG_VERSION").to_string(),
        command: crate::report::command_line(),
        started_unix: started,
        wall_s: t0.elapsed().as_secs_f64(),
        machine: Machine::this(),
        config: c.clone(),
        results: rows
            .into_iter()
            .map(|r| Row::Sessions(Box::new(r)))
            .chain(idle.into_iter().map(|r| Row::Idle(Box::new(r))))
            .collect(),
    };
    println!("\n# {:.1} s", report.wall_s);
    let mut written = true;
    if let Some(path) = json {
        match std::fs::write(path, report.to_json()) {
            Ok(()) => println!("# wrote {}", path.display()),
            Err(e) => {
                eprintln!("shmlink-bench: write {}: {e}", path.display());
                written = false;
            }
        }
    }
    output::exit_status(failed, total, written)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_histogram_keeps_quantiles_within_its_precision() {
        let samples: Vec<u64> = (1..=100_000u64).map(|i| i * 37 % 1_000_003).collect();
        let h = Hist::of(&samples);
        let mut sorted = samples.clone();
        sorted.sort_unstable();
        for q in [0.5, 0.9, 0.99] {
            let exact = sorted[(q * sorted.len() as f64).ceil() as usize - 1] as f64;
            let got = h.quantile(q).unwrap() as f64;
            assert!(
                (got - exact).abs() <= exact / 64.0 + 1.0,
                "q {q}: {got} vs {exact}"
            );
        }
        // Below 128 ns every value is its own bucket.
        assert_eq!(Hist::of(&[5, 5, 100]).quantile(0.5), Some(5));
        assert_eq!(Hist::of(&[127]).quantile(1.0), Some(127));
        // Merging is adding the counts.
        let mut a = Hist::of(&[1000; 3]);
        a.merge(&Hist::of(&[9_000_000]));
        assert_eq!(a.quantile(0.75).map(|v| v / 1000), Some(1));
        assert!(a.quantile(1.0).unwrap() > 8_800_000);
        assert_eq!(Hist::default().quantile(0.5), None);
    }

    #[test]
    fn smaps_rollup_is_read_field_by_field() {
        let text = "00400000-7fff [rollup]\nRss:                1000 kB\nPss:                 400 kB\nPss_Anon:            100 kB\nPss_File:            250 kB\nPss_Shmem:            50 kB\nShared_Clean:        600 kB\nShared_Dirty:          8 kB\nPrivate_Clean:         2 kB\nPrivate_Dirty:       390 kB\nSwap:                  0 kB\n";
        let m = Mem::parse(text).unwrap();
        assert_eq!(
            (m.rss_kib, m.pss_kib, m.pss_shmem_kib),
            (1000.0, 400.0, 50.0)
        );
        assert_eq!(m.plus(m).minus(m), m);
        assert_eq!(m.per(4.0).rss_kib, 250.0);
        assert!(Mem::parse("Swap: 0 kB\n").is_none());
        let own = Mem::of("self").unwrap();
        assert!(own.rss_kib > 0.0 && own.pss_kib > 0.0, "{own:?}");
    }

    #[test]
    fn options_and_their_defaults() {
        let c = |args: &str| config(&cli::parse_test(args).unwrap());
        let d = c("--pattern sessions").unwrap();
        assert_eq!(d.sessions, vec![1, 4, 16, 64]);
        assert_eq!(d.idle, vec![1000, 10_000]);
        assert_eq!(d.sizes, vec![64, 10240]);
        assert_eq!(d.methods.len(), METHODS.len());
        assert_eq!(d.idle_methods.len(), IDLE_METHODS.len());
        let q = c("--pattern sessions --quick").unwrap();
        assert_eq!(
            (q.sessions.clone(), q.idle.clone(), q.measure_ms),
            (vec![1, 4], vec![1000], 200)
        );
        let s = c("--pattern sessions --sessions 2,8 --idle 0 --methods uds-stream,uds").unwrap();
        assert_eq!(s.sessions, vec![2, 8]);
        assert!(s.idle.is_empty());
        assert_eq!(
            (s.methods, s.idle_methods),
            (vec!["uds-stream".to_string()], vec!["uds".to_string()])
        );
        assert!(c("--pattern sessions --sessions 0").is_err());
        assert!(c("--pattern sessions --sessions 300").is_err());
        assert!(c("--pattern sessions --methods pipe").is_err());
    }
}
