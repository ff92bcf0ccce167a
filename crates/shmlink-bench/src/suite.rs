//! Many runs: every (size, mode, method) cell, run in rounds with the methods interleaved
//! (A B C A B C …) so that drift of the machine hits every method alike, each run with
//! its own warm-up; then each cell's median across rounds and its spread.

use std::path::Path;
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use crate::method::{Mode, SizeLimit};
use crate::methods;
use crate::placement::{self, Placement};
use crate::run::{run_isolated, CpuPerMsg, RunOutput, RunSpec};
use shmlink_measure::protocol::Stop;
use shmlink_measure::stats::{median_f64, spread_pct, Percentiles};
use shmlink_measure::verify::Sampling;

/// What to run.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SuiteConfig {
    pub methods: Vec<String>,
    pub sizes: Vec<usize>,
    pub modes: Vec<Mode>,
    /// Runs per cell; the methods are interleaved within each round.
    pub rounds: u32,
    /// Warm-up per run.
    pub warmup_ms: u64,
    /// The measured part of each run.
    pub stop: Stop,
    /// Messages in flight in throughput mode (less where a method cannot carry that many);
    /// `None`: by size ([`default_window`]).
    pub window: Option<u64>,
    /// CPUs of the driver and the peer; `None`: not pinned.
    pub cpus: Option<(usize, usize)>,
    /// Which messages are checksummed in full (see [`shmlink_measure::verify`]).
    pub sampling: Sampling,
}

/// How a cell ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Status {
    /// Measured.
    Ok,
    /// The method cannot carry this message size (the note says its maximum).
    Unsupported,
    /// A run failed (the note says how); later rounds skip the cell.
    Failed,
    /// The method is not available on this machine (the note has the kernel's reason).
    Skipped,
}

/// A cell's summary across rounds: each figure's median.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Summary {
    pub rtt_ns: Option<Percentiles>,
    pub msgs_per_s: Option<f64>,
    pub bytes_per_s: Option<f64>,
    pub cpu_us_per_msg: CpuPerMsg,
    /// `(max - min) / median` of the headline figure (p50 or msgs/s) across rounds, in %.
    pub spread_pct: f64,
}

/// One (method, mode, size) cell.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Cell {
    pub method: String,
    pub mode: Mode,
    pub size: usize,
    pub status: Status,
    pub note: Option<String>,
    /// One entry per successful round.
    pub runs: Vec<RunOutput>,
    pub summary: Option<Summary>,
}

impl Cell {
    /// The headline figure: p50 in ns (latency) or messages/s (throughput).
    pub fn headline(&self) -> Option<f64> {
        let s = self.summary.as_ref()?;
        match self.mode {
            Mode::Latency => s.rtt_ns.map(|p| p.p50 as f64),
            Mode::Throughput => s.msgs_per_s,
        }
    }
}

/// Progress of a suite (of cells `C`), for a progress bar.
pub struct Progress<'a, C = Cell> {
    pub done: usize,
    pub total: usize,
    pub round: u32,
    pub cell: &'a C,
}

/// The headline figure of one run.
pub(crate) fn run_headline(mode: Mode, r: &RunOutput) -> f64 {
    match mode {
        Mode::Latency => r.rtt_ns.map_or(f64::NAN, |p| p.p50 as f64),
        Mode::Throughput => r.msgs_per_s.unwrap_or(f64::NAN),
    }
}

fn summarize(cell: &Cell) -> Option<Summary> {
    if cell.runs.is_empty() {
        return None;
    }
    let med = |f: fn(&RunOutput) -> Option<f64>| {
        median_f64(&cell.runs.iter().filter_map(f).collect::<Vec<_>>())
    };
    let rtts: Vec<Percentiles> = cell.runs.iter().filter_map(|r| r.rtt_ns).collect();
    let heads: Vec<f64> = cell
        .runs
        .iter()
        .map(|r| run_headline(cell.mode, r))
        .collect();
    Some(Summary {
        rtt_ns: Percentiles::median_of(&rtts),
        msgs_per_s: med(|r| r.msgs_per_s),
        bytes_per_s: med(|r| r.bytes_per_s),
        cpu_us_per_msg: CpuPerMsg {
            driver: med(|r| Some(r.cpu_us_per_msg.driver)).unwrap_or(0.0),
            peer: med(|r| Some(r.cpu_us_per_msg.peer)).unwrap_or(0.0),
        },
        spread_pct: spread_pct(&heads),
    })
}

/// How a planned cell of method `name` starts: failed if the method is unknown (`found`
/// is `None`), skipped if it cannot run here, unsupported if `size` is over its limit,
/// else ok. `found`: the method's `unavailable()` and `size_limit()`.
pub(crate) fn planned_status(
    name: &str,
    size: usize,
    found: Option<(Option<String>, Option<SizeLimit>)>,
) -> (Status, Option<String>) {
    match found {
        None => (Status::Failed, Some(format!("unknown method {name:?}"))),
        Some(availability) => match availability {
            (Some(reason), _) => (Status::Skipped, Some(reason)),
            (None, Some(l)) if size > l.max => (
                Status::Unsupported,
                Some(format!("max {} bytes: {}", l.max, l.why)),
            ),
            _ => (Status::Ok, None),
        },
    }
}

/// The note of a cell whose run failed in round `round` (from 0) of `rounds`.
pub(crate) fn failed_run_note(round: u32, rounds: u32, elapsed: Duration, e: &str) -> String {
    format!("round {} of {rounds} after {elapsed:.1?}: {e}", round + 1)
}

/// The cells of `config` in table order, with the methods that cannot run marked.
pub fn plan(config: &SuiteConfig) -> Vec<Cell> {
    let mut cells = Vec::new();
    for &size in &config.sizes {
        for &mode in &config.modes {
            for name in &config.methods {
                let found = methods::find(name).map(|m| (m.unavailable(), m.size_limit()));
                let (status, note) = planned_status(name, size, found);
                cells.push(Cell {
                    method: name.clone(),
                    mode,
                    size,
                    status,
                    note,
                    runs: Vec::new(),
                    summary: None,
                });
            }
        }
    }
    cells
}

/// How long one run may take before it is killed.
fn timeout(config: &SuiteConfig) -> Duration {
    match config.stop {
        Stop::Millis(ms) => Duration::from_millis(15_000 + 3 * (ms + config.warmup_ms)),
        Stop::Count(_) => Duration::from_secs(300),
    }
}

/// Bytes in flight the default window allows (a socket buffer's worth).
const DEFAULT_WINDOW_BYTES: u64 = 64 << 10;
/// The fewest messages in flight the default window allows.
const MIN_DEFAULT_WINDOW: u64 = 64;

/// The throughput mode's window when `--window` is not given: 64 KiB in flight, at least
/// 64 messages. A fixed 64 left small messages (4 KiB in flight at 64 B) waiting on
/// acknowledgements, a cost of the harness, not of the method (docs/benchmarks.md, round 3).
pub fn default_window(size: usize) -> u64 {
    (DEFAULT_WINDOW_BYTES / (size as u64).max(1)).max(MIN_DEFAULT_WINDOW)
}

/// The window a method runs with.
fn window(config: &SuiteConfig, cell: &Cell) -> u64 {
    match cell.mode {
        Mode::Latency => 1,
        Mode::Throughput => {
            let max = methods::find(&cell.method).and_then(|m| m.max_window(cell.size));
            let want = config.window.unwrap_or_else(|| default_window(cell.size));
            want.min(max.unwrap_or(u64::MAX)).max(1)
        }
    }
}

/// What [`interleave`] and [`run_cells`] need of a cell of a suite: its status and
/// note, to fail it, and to summarise its runs.
pub trait SuiteCell {
    /// How the cell stands.
    fn status(&self) -> Status;
    /// Why it is not ok, if it is not.
    fn note(&self) -> Option<&str>;
    /// Marks it failed, saying why.
    fn fail(&mut self, note: String);
    /// Sets its summary from its runs.
    fn summarize(&mut self);
}

/// Implements [`SuiteCell`] for a cell type of a suite, with fields `status`, `note`
/// and `summary`, the summary made by `$summarize(&cell)`.
macro_rules! impl_suite_cell {
    ($cell:ty, $summarize:path) => {
        impl $crate::suite::SuiteCell for $cell {
            fn status(&self) -> $crate::suite::Status {
                self.status
            }

            fn note(&self) -> Option<&str> {
                self.note.as_deref()
            }

            fn fail(&mut self, note: String) {
                self.status = $crate::suite::Status::Failed;
                self.note = Some(note);
            }

            fn summarize(&mut self) {
                self.summary = $summarize(self);
            }
        }
    };
}
pub(crate) use impl_suite_cell;

impl_suite_cell!(Cell, summarize);

/// Runs the runnable `cells` (status ok) interleaved over `rounds` rounds, each round
/// every cell once in order (A B C A B C …): `run(cell, serial)` makes one run (`serial`
/// counts the runs of the suite from 1) and keeps its output, or returns why it failed,
/// which fails the cell for the rounds left (the suite goes on); `progress(done, total,
/// round, cell)` follows every run, a failed cell's skipped runs counted as done.
pub fn interleave<C: SuiteCell>(
    cells: &mut [C],
    rounds: u32,
    mut run: impl FnMut(&mut C, u64) -> Result<(), String>,
    mut progress: impl FnMut(Progress<'_, C>),
) {
    let runnable = cells.iter().filter(|c| c.status() == Status::Ok).count();
    let total = runnable * rounds as usize;
    let mut done = 0;
    let mut serial = 0u64;
    for round in 0..rounds {
        for cell in cells.iter_mut() {
            if cell.status() != Status::Ok {
                let failed_in_a_run = cell.status() == Status::Failed
                    && cell.note().is_some_and(|n| n.starts_with("round "));
                if failed_in_a_run {
                    // Failed in an earlier round: count its remaining runs as done.
                    done += 1;
                }
                continue;
            }
            serial += 1;
            let t = Instant::now();
            if let Err(e) = run(cell, serial) {
                cell.fail(failed_run_note(round, rounds, t.elapsed(), &e));
            }
            done += 1;
            progress(Progress {
                done: done.min(total),
                total,
                round,
                cell,
            });
        }
    }
}

/// Runs a suite's `cells` ([`interleave`], with `run` and `progress`), then summarises
/// each.
pub fn run_cells<C: SuiteCell>(
    mut cells: Vec<C>,
    rounds: u32,
    run: impl FnMut(&mut C, u64) -> Result<(), String>,
    progress: impl FnMut(Progress<'_, C>),
) -> Vec<C> {
    interleave(&mut cells, rounds, run, progress);
    for cell in &mut cells {
        cell.summarize();
    }
    cells
}

/// Runs the suite with driver and peer processes started from `exe` (the `shmlink`
/// binary). A failed run marks its cell failed and the suite goes on.
pub fn run(exe: &Path, config: &SuiteConfig, progress: impl FnMut(Progress)) -> Vec<Cell> {
    let pid = std::process::id();
    // The probe between two runs is the one after the first and the one before the
    // second.
    let probe = || config.cpus.and_then(|cpus| placement::probe(cpus).ok());
    let mut last = probe();
    let mut cells = run_cells(
        plan(config),
        config.rounds,
        |cell, serial| {
            let spec = RunSpec {
                method: cell.method.clone(),
                size: cell.size,
                mode: cell.mode,
                window: window(config, cell),
                warmup_ms: config.warmup_ms,
                stop: config.stop,
                sampling: config.sampling,
                cpus: config.cpus,
                tag: format!("shmlink-bench-{pid}-{serial}"),
            };
            let mut out = run_isolated(exe, &spec, timeout(config));
            let next = probe();
            if let Ok(out) = &mut out {
                out.line_ns = last.zip(next).map(|(a, b)| [a, b]);
            }
            last = next;
            cell.runs.push(out?);
            Ok(())
        },
        progress,
    );
    let probes = cells.iter().flat_map(|c| &c.runs).flat_map(|r| r.line_ns);
    if let Some(split) = placement::split(probes.flatten()) {
        for run in cells.iter_mut().flat_map(|c| &mut c.runs) {
            run.placement = Some(Placement::of(run.line_ns, split));
        }
    }
    cells
}

#[cfg(test)]
mod tests {
    use super::default_window;

    #[test]
    fn the_default_window_holds_64_kib_and_at_least_64_messages() {
        assert_eq!(default_window(64), 1024);
        assert_eq!(default_window(1000), 65);
        assert_eq!(default_window(1 << 10), 64);
        assert_eq!(default_window(1 << 20), 64);
        assert_eq!(default_window(0), 64 << 10);
    }
}
