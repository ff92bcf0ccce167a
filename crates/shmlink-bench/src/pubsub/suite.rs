//! Many pub/sub runs: every (size, subscriber count, method) cell, in rounds with the
//! methods interleaved so drift of the machine hits every method alike; then each
//! cell's median across rounds.

use std::path::Path;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::find;
use super::run::{run_isolated, RunOutput, RunSpec};
use crate::suite::{impl_suite_cell, planned_status, run_cells, Status};
use shmlink_measure::stats::{median_f64, spread_pct, Percentiles};

/// What to run.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Config {
    pub methods: Vec<String>,
    pub sizes: Vec<usize>,
    /// Subscriber counts.
    pub subscribers: Vec<usize>,
    /// Runs per cell; the methods are interleaved within each round.
    pub rounds: u32,
    /// Messages before the measured ones, per run.
    pub warmup: u64,
    /// Measured messages per run (each to every subscriber).
    pub count: u64,
    /// CPUs of the publisher and of every subscriber; `None`: not pinned.
    pub cpus: Option<(usize, usize)>,
}

/// A cell's summary across rounds: each figure's median.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Summary {
    /// Over all subscribers.
    pub latency_ns: Percentiles,
    /// Each subscriber's (by index).
    pub per_subscriber_ns: Vec<Percentiles>,
    pub pub_us_per_msg: f64,
    pub pub_cpu_us_per_msg: f64,
    pub pub_process_cpu_us_per_msg: f64,
    pub sub_cpu_us_per_msg: f64,
    /// `(max - min) / median` of p50 across rounds, in %.
    pub spread_pct: f64,
}

/// One (method, size, subscriber count) cell.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Cell {
    pub method: String,
    pub size: usize,
    pub subscribers: usize,
    pub status: Status,
    pub note: Option<String>,
    /// One entry per successful round.
    pub runs: Vec<RunOutput>,
    pub summary: Option<Summary>,
}

impl Cell {
    /// The headline figure: p50 latency over all subscribers, ns.
    pub fn headline(&self) -> Option<f64> {
        Some(self.summary.as_ref()?.latency_ns.p50 as f64)
    }
}

/// Progress of a suite, for a progress bar.
pub type Progress<'a> = crate::suite::Progress<'a, Cell>;

fn summarize(cell: &Cell) -> Option<Summary> {
    let first = cell.runs.first()?;
    let med = |f: fn(&RunOutput) -> f64| {
        median_f64(&cell.runs.iter().map(f).collect::<Vec<_>>()).unwrap_or(0.0)
    };
    let lats: Vec<Percentiles> = cell.runs.iter().map(|r| r.latency_ns).collect();
    let per_subscriber_ns = (0..first.per_subscriber_ns.len())
        .filter_map(|i| {
            let v: Vec<Percentiles> = cell
                .runs
                .iter()
                .filter_map(|r| r.per_subscriber_ns.get(i).copied())
                .collect();
            Percentiles::median_of(&v)
        })
        .collect();
    let heads: Vec<f64> = lats.iter().map(|p| p.p50 as f64).collect();
    Some(Summary {
        latency_ns: Percentiles::median_of(&lats)?,
        per_subscriber_ns,
        pub_us_per_msg: med(|r| r.pub_us_per_msg),
        pub_cpu_us_per_msg: med(|r| r.pub_cpu_us_per_msg),
        pub_process_cpu_us_per_msg: med(|r| r.pub_process_cpu_us_per_msg),
        sub_cpu_us_per_msg: med(|r| r.sub_cpu_us_per_msg),
        spread_pct: spread_pct(&heads),
    })
}

/// The cells of `config` in table order, with the methods that cannot run marked.
pub fn plan(config: &Config) -> Vec<Cell> {
    let mut cells = Vec::new();
    for &size in &config.sizes {
        for &subscribers in &config.subscribers {
            for name in &config.methods {
                let found = find(name).map(|m| (m.unavailable(), m.size_limit()));
                let (status, note) = planned_status(name, size, found);
                cells.push(Cell {
                    method: name.clone(),
                    size,
                    subscribers,
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

/// How long one run may take before it is killed: generous, it only catches hangs.
pub fn timeout(config: &Config, subscribers: usize) -> Duration {
    let messages = config.warmup.saturating_add(config.count);
    let ms = messages
        .saturating_mul(subscribers as u64)
        .saturating_mul(2);
    Duration::from_secs(30).saturating_add(Duration::from_millis(ms))
}

impl_suite_cell!(Cell, summarize);

/// Runs the suite with publisher and subscriber processes started from `exe` (the
/// `shmlink-bench` binary). A failed run marks its cell failed and the suite goes on.
pub fn run(exe: &Path, config: &Config, progress: impl FnMut(Progress)) -> Vec<Cell> {
    let pid = std::process::id();
    run_cells(
        plan(config),
        config.rounds,
        |cell, serial| {
            let spec = RunSpec {
                method: cell.method.clone(),
                size: cell.size,
                subscribers: cell.subscribers,
                warmup: config.warmup,
                count: config.count,
                cpus: config.cpus,
                tag: format!("shmlink-bench-pub-{pid}-{serial}"),
            };
            cell.runs
                .push(run_isolated(exe, &spec, timeout(config, cell.subscribers))?);
            Ok(())
        },
        progress,
    )
}
