//! One run as processes: the orchestrator starts a driver process (`shmlink-bench __bench-run
//! SPEC`), which sets the method up, starts the peer process (`shmlink-bench __bench-peer
//! SPEC`), drives the run and prints its result as JSON. A run that hangs or crashes
//! takes only its own processes down: the orchestrator kills the driver after a
//! timeout, and the peer dies with the driver (`PR_SET_PDEATHSIG`); the method then
//! removes what the dead processes left behind
//! ([`Method::clean_up_after_failure`](crate::method::Method::clean_up_after_failure)).

use std::io::{self, BufRead, BufReader, Read, Write};
use std::os::fd::{AsRawFd, RawFd};
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Child, Command, ExitCode, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc};
use std::time::{Duration, Instant};

use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

use crate::method::{Ctx, Mode};
use crate::methods::{self, block_signal};
use crate::placement::Placement;
use crate::sys::{err, pin};
use shmlink_measure::protocol::{self, Fault, PeerReport, Plan, Stop, Warmup};
use shmlink_measure::stats::Percentiles;
use shmlink_measure::verify::{fresh_seed, Sampling};
use shmlink_sys::process;

/// The hidden subcommand that runs a driver.
pub const DRIVER_CMD: &str = "__bench-run";
/// The hidden subcommand that runs a peer.
pub const PEER_CMD: &str = "__bench-peer";
/// Environment variable that makes a run inject a fault, for tests of failure handling:
/// `exit:N` (the peer exits at message #N), `corrupt:N` (the last byte of data message
/// #N is flipped), `scribble:N` (a byte in the middle of every data message from #N on
/// is flipped). The data is damaged by its sender: the peer in latency mode, the driver
/// in throughput mode; see [`Fault`].
pub use crate::fault::FAULT_ENV;

/// One run, as the orchestrator asks for it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct RunSpec {
    pub method: String,
    pub size: usize,
    pub mode: Mode,
    /// Messages in flight (1 in latency mode).
    pub window: u64,
    pub warmup_ms: u64,
    pub stop: Stop,
    /// Which messages are checksummed in full (see [`shmlink_measure::verify`]); the seed of the
    /// sample is drawn by the driver, not given here.
    pub sampling: Sampling,
    /// CPUs of the driver and the peer; `None`: not pinned.
    pub cpus: Option<(usize, usize)>,
    /// Unique name for methods that rendezvous by name.
    pub tag: String,
}

/// CPU time per message of each end, in microseconds (per round trip in latency mode).
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct CpuPerMsg {
    pub driver: f64,
    pub peer: f64,
}

/// What one run measured.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct RunOutput {
    /// Measured messages (round trips in latency mode).
    pub count: u64,
    pub elapsed_ns: u64,
    /// Latency mode: round-trip percentiles.
    pub rtt_ns: Option<Percentiles>,
    /// Throughput mode.
    pub msgs_per_s: Option<f64>,
    /// Throughput mode.
    pub bytes_per_s: Option<f64>,
    pub cpu_us_per_msg: CpuPerMsg,
    /// Time each end spent checksumming, per measured message, in microseconds: part of
    /// the CPU figures; in throughput mode (the peer) and in zero-copy rows also part of
    /// the measured time, in latency mode of copy rows not (see [`shmlink_measure::verify`]).
    #[serde(default)]
    pub verify_us_per_msg: CpuPerMsg,
    /// A bare cache-line round trip between the run's two CPUs, in ns, measured just
    /// before and just after the run ([`crate::placement`]); `None` where not pinned.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub line_ns: Option<[u64; 2]>,
    /// The placement those probes say the run had, against the split of all the suite's
    /// probes ([`crate::placement::split`]); `None` where they found one placement.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub placement: Option<Placement>,
}

/// The peer's instructions (one JSON argument).
#[derive(Clone, Debug, Serialize, Deserialize)]
struct PeerSpec {
    method: String,
    size: usize,
    mode: Mode,
    window: u64,
    sampling: Sampling,
    seed: u64,
    cpu: Option<usize>,
    same_core: bool,
    tag: String,
    args: Vec<String>,
}

fn ctx_of(size: usize, mode: Mode, window: u64, same_core: bool, tag: &str) -> Ctx {
    Ctx {
        size,
        mode,
        window,
        same_core,
        tag: tag.to_string(),
    }
}

/// Makes the process `cmd` starts inherit `fds` (their close-on-exec flag cleared in the
/// child) and get SIGKILL when this process dies (`PR_SET_PDEATHSIG`).
pub(crate) fn inherit_and_die_with_parent(cmd: &mut Command, fds: Vec<RawFd>) {
    // SAFETY: the closure runs between fork and exec and only makes async-signal-safe
    // system calls (fcntl, prctl) on integers; it allocates nothing.
    unsafe {
        cmd.pre_exec(move || {
            for &fd in &fds {
                process::clear_cloexec(fd)?;
            }
            process::kill_with_parent()?;
            Ok(())
        });
    }
}

/// Runs `spec` in this process (the driver) with a peer started from `exe`.
pub fn drive(spec: &RunSpec, exe: &Path) -> io::Result<RunOutput> {
    drive_with(spec, exe, &mut |_| {}, &mut || Ok(None)).map(|(out, _, _)| out)
}

/// [`drive`], calling `on_peer` with the peer's process id once it is started and
/// `ready` once both ends are connected, before the warm-up (`--pattern sessions`
/// samples the peer's memory, and ends every session's warm-up at one instant: `ready`
/// may return the warm-up's length from now, instead of `spec.warmup_ms`); also returns
/// the round-trip samples (latency mode) and when the measured part ended (wall clock).
pub(crate) fn drive_with(
    spec: &RunSpec,
    exe: &Path,
    on_peer: &mut dyn FnMut(u32),
    ready: &mut dyn FnMut() -> io::Result<Option<Duration>>,
) -> io::Result<(RunOutput, Option<Vec<u64>>, std::time::SystemTime)> {
    block_signal()?;
    let method = methods::find(&spec.method)
        .ok_or_else(|| err(format!("unknown method {:?}", spec.method)))?;
    if spec.size < protocol::MIN_SIZE {
        return Err(err(format!(
            "{}-byte messages are too small (at least {})",
            spec.size,
            protocol::MIN_SIZE
        )));
    }
    pin(spec.cpus.map(|c| c.0))?;
    let same_core = spec.cpus.is_some_and(|(a, b)| a == b);
    let ctx = ctx_of(spec.size, spec.mode, spec.window, same_core, &spec.tag);
    // Drawn here, after nothing of the method has run, and given only to the checkers.
    let seed = fresh_seed()?;
    let prepared = method
        .prepare(&ctx)
        .map_err(|e| err(format!("set up: {e}")))?;
    let peer = PeerSpec {
        method: spec.method.clone(),
        size: spec.size,
        mode: spec.mode,
        window: spec.window,
        sampling: spec.sampling,
        seed,
        cpu: spec.cpus.map(|c| c.1),
        same_core,
        tag: spec.tag.clone(),
        args: prepared.args,
    };
    let fds: Vec<RawFd> = prepared.inherit.iter().map(|f| f.as_raw_fd()).collect();
    let peer = serde_json::to_string(&peer).expect("a PeerSpec serialises");
    let mut child =
        spawn_hidden(exe, PEER_CMD, &peer, fds).map_err(|e| err(format!("start the peer: {e}")))?;
    drop(prepared.inherit);
    on_peer(child.id());
    let stdout = child.stdout.take().expect("stdout is piped");
    let finished = Arc::new(AtomicBool::new(false));
    let status = watch(child, finished.clone());

    let mut ep = (prepared.finish)().map_err(|e| err(format!("connect: {e}")))?;
    let warmup = ready()?.unwrap_or(Duration::from_millis(spec.warmup_ms));
    let plan = Plan {
        size: spec.size,
        mode: spec.mode,
        window: spec.window,
        warmup: Warmup::Time(warmup),
        stop: spec.stop,
        sampling: spec.sampling,
        seed,
        fault: fault_from_env(),
    };
    let m = protocol::drive(ep.as_mut(), &plan).map_err(|e| err(format!("driver: {e}")));
    let ended = std::time::SystemTime::now();
    finished.store(true, Ordering::SeqCst);
    let m = m?;
    let mut line = String::new();
    BufReader::new(stdout)
        .read_line(&mut line)
        .map_err(|e| err(format!("read the peer's report: {e}")))?;
    drop(ep);
    match status.recv_timeout(Duration::from_secs(10)) {
        Ok(Some(s)) if s.success() => {}
        Ok(s) => return Err(err(format!("the peer failed: {s:?}"))),
        Err(_) => return Err(err("the peer did not exit after the run")),
    }
    let report: PeerReport = serde_json::from_str(line.trim())
        .map_err(|e| err(format!("the peer's report {line:?}: {e}")))?;
    if report.msgs != m.count && spec.mode == Mode::Latency {
        return Err(err(format!(
            "the peer counted {} measured messages, the driver {}",
            report.msgs, m.count
        )));
    }
    let per_msg = |ns: f64| ns / 1000.0 / m.count.max(1) as f64;
    let secs = m.elapsed.as_secs_f64();
    let tput = |n: f64| (spec.mode == Mode::Throughput).then(|| n / secs);
    let out = RunOutput {
        count: m.count,
        elapsed_ns: m.elapsed.as_nanos() as u64,
        rtt_ns: m.rtts.clone().and_then(|mut v| Percentiles::of(&mut v)),
        msgs_per_s: tput(m.count as f64),
        bytes_per_s: tput((m.count * spec.size as u64) as f64),
        cpu_us_per_msg: CpuPerMsg {
            driver: per_msg(m.cpu.as_nanos() as f64),
            peer: per_msg(report.cpu_ns as f64),
        },
        verify_us_per_msg: CpuPerMsg {
            driver: per_msg(m.verify.as_nanos() as f64),
            peer: per_msg(report.verify_ns as f64),
        },
        line_ns: None,
        placement: None,
    };
    Ok((out, m.rtts, ended))
}

/// The fault in [`FAULT_ENV`], if any.
fn fault_from_env() -> Option<Fault> {
    std::env::var(FAULT_ENV).ok().and_then(|f| Fault::parse(&f))
}

/// Waits for the peer in a thread; if it exits before the run is finished, this process
/// exits with its status (a driver blocked on a dead peer would otherwise wait forever).
fn watch(
    mut child: Child,
    finished: Arc<AtomicBool>,
) -> mpsc::Receiver<Option<std::process::ExitStatus>> {
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let status = child.wait().ok();
        if !finished.load(Ordering::SeqCst) && !status.is_some_and(|s| s.success()) {
            eprintln!(
                "the peer exited during the run ({})",
                status.map_or("unknown status".to_string(), |s| s.to_string())
            );
            methods::cleanup();
            std::process::exit(1);
        }
        let _ = tx.send(status);
    });
    rx
}

/// Starts `exe SUBCOMMAND SPEC` (a hidden subcommand of this program) with `fds` inherited
/// and dying with this process; its stdin is empty, its stdout piped, its stderr ours.
pub(crate) fn spawn_hidden(
    exe: &Path,
    subcommand: &str,
    spec_json: &str,
    fds: Vec<RawFd>,
) -> io::Result<Child> {
    let mut cmd = Command::new(exe);
    cmd.arg(subcommand)
        .arg(spec_json)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit());
    inherit_and_die_with_parent(&mut cmd, fds);
    cmd.spawn()
}

/// The end of a hidden subcommand: prints `res` as one JSON line on stdout, or the error
/// on stderr after `prefix` and exits 1.
pub(crate) fn print_result<T: Serialize>(res: io::Result<T>, prefix: &str) -> ExitCode {
    match res {
        Ok(out) => {
            println!(
                "{}",
                serde_json::to_string(&out).expect("a result serialises")
            );
            ExitCode::SUCCESS
        }
        Err(e) => {
            say_error(&e, prefix);
            ExitCode::from(1)
        }
    }
}

/// `shmlink-bench __bench-run SPEC`: prints the run's [`RunOutput`] as JSON; exit 1 with the
/// error on stderr on failure.
pub fn driver_main(spec_json: &str) -> ExitCode {
    run_spec_main(spec_json, "", drive)
}

/// A hidden subcommand that runs a run spec from this program: parses `spec_json`, runs
/// `run` with the spec and this program's path, and ends as [`print_result`] does.
pub(crate) fn run_spec_main<S: DeserializeOwned, T: Serialize>(
    spec_json: &str,
    prefix: &str,
    run: impl FnOnce(&S, &Path) -> io::Result<T>,
) -> ExitCode {
    let res = serde_json::from_str::<S>(spec_json)
        .map_err(|e| err(format!("bad run spec: {e}")))
        .and_then(|spec| {
            let exe =
                std::env::current_exe().map_err(|e| err(format!("find this program: {e}")))?;
            run(&spec, &exe)
        });
    print_result(res, prefix)
}

/// `shmlink-bench __bench-peer SPEC`: the peer's side of a run.
pub fn peer_main(spec_json: &str) -> ExitCode {
    // `Err(None)`: failed, and already said why.
    let res = (|| -> Result<PeerReport, Option<io::Error>> {
        let spec: PeerSpec =
            serde_json::from_str(spec_json).map_err(|e| err(format!("bad peer spec: {e}")))?;
        block_signal()?;
        pin(spec.cpu)?;
        let method = methods::find(&spec.method)
            .ok_or_else(|| err(format!("unknown method {:?}", spec.method)))?;
        let ctx = ctx_of(spec.size, spec.mode, spec.window, spec.same_core, &spec.tag);
        let mut ep = method
            .connect(&ctx, &spec.args)
            .map_err(|e| err(format!("connect: {e}")))?;
        protocol::serve(
            ep.as_mut(),
            spec.size,
            spec.mode,
            spec.window,
            (spec.sampling, spec.seed),
            fault_from_env(),
        )
        .map_err(|e| {
            // Said while the connection is still open: closing it ends the driver, and
            // this process dies with the driver, possibly before it could say why.
            say_error(&e, "peer: ");
            None
        })
    })();
    match res {
        Ok(report) => print_result(Ok(report), ""),
        Err(Some(e)) => print_result::<PeerReport>(Err(e), "peer: "),
        Err(None) => ExitCode::from(1),
    }
}

/// Writes `prefix` and `e` as one line to stderr in one write (whole, not interleaved
/// with the other process's lines, as long as it fits a pipe's atomic write).
fn say_error(e: &io::Error, prefix: &str) {
    let line = format!("{prefix}{e}\n");
    let _ = io::stderr().lock().write_all(line.as_bytes());
}

/// Runs `spec` in a driver process started from `exe` (the `shmlink-bench` binary), killing it
/// after `timeout`. The error is what the driver and the peer said on stderr.
pub fn run_isolated(exe: &Path, spec: &RunSpec, timeout: Duration) -> Result<RunOutput, String> {
    let stdout = run_child(
        exe,
        DRIVER_CMD,
        &serde_json::to_string(spec).expect("a RunSpec serialises"),
        timeout,
        &|| clean_up_after_failure(spec),
    )?;
    serde_json::from_str(stdout.trim()).map_err(|e| format!("unreadable result {stdout:?}: {e}"))
}

/// Runs `exe SUBCMD SPEC_JSON`, killing it after `timeout`; its stdout if it succeeded,
/// else what it said on stderr. `clean_up` runs after a failure or a kill.
pub(crate) fn run_child(
    exe: &Path,
    subcmd: &str,
    spec_json: &str,
    timeout: Duration,
    clean_up: &dyn Fn(),
) -> Result<String, String> {
    let mut child = Command::new(exe)
        .arg(subcmd)
        .arg(spec_json)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| format!("start {}: {e}", exe.display()))?;
    let pid = child.id();
    let reader = |mut r: Box<dyn Read + Send>| {
        std::thread::spawn(move || {
            let mut s = String::new();
            let _ = r.read_to_string(&mut s);
            s
        })
    };
    let out = reader(Box::new(child.stdout.take().expect("piped")));
    let errs = reader(Box::new(child.stderr.take().expect("piped")));
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(child.wait());
    });
    let deadline = Instant::now() + timeout;
    let status = match rx.recv_timeout(deadline.saturating_duration_since(Instant::now())) {
        Ok(s) => s.ok(),
        Err(_) => {
            // `pid` is our child, not yet reaped (the waiting thread has not returned).
            let _ = process::kill(pid, process::SIGKILL);
            let _ = rx.recv();
            clean_up();
            let stderr = errs.join().unwrap_or_default();
            return Err(format!(
                "timed out after {:.0?}{}",
                timeout,
                summarize(&stderr).map_or(String::new(), |s| format!(" ({s})"))
            ));
        }
    };
    let stdout = out.join().unwrap_or_default();
    let stderr = errs.join().unwrap_or_default();
    match status {
        Some(s) if s.success() => Ok(stdout),
        s => {
            clean_up();
            Err(summarize(&stderr).unwrap_or_else(|| format!("driver failed: {s:?}")))
        }
    }
}

/// Lets the method remove what a failed run's processes left behind.
fn clean_up_after_failure(spec: &RunSpec) {
    if let Some(m) = methods::find(&spec.method) {
        m.clean_up_after_failure(&spec.tag);
    }
}

/// The lines of a failed run's stderr, joined.
fn summarize(stderr: &str) -> Option<String> {
    let lines: Vec<&str> = stderr
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .collect();
    (!lines.is_empty()).then(|| lines.join("; "))
}
