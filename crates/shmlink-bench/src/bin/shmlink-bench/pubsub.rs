//! `shmlink-bench --pattern pubsub`: the pub/sub options ([`config`]), and running the
//! pub/sub suite with a progress line, its table and its reports (the files as for the
//! point-to-point suite: see [`crate::bench`]).

use std::path::Path;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use shmlink_bench::plot;
use shmlink_bench::pubsub;
use shmlink_bench::report::Machine;
use shmlink_bench::suite::Status;
use shmlink_measure::protocol::Stop;
use shmlink_measure::size;

use shmlink_bench::cli::{unique_method_list, usage, UsageError};

use crate::bench::{
    bar_line, command_line, exit_status, on_cpu, print_method, unix_now, write_files, BenchArgs,
    Outputs, ProgressOut,
};

/// Measured messages per pub/sub run unless `--iterations` says otherwise.
pub const PUBSUB_MESSAGES: u64 = 1000;

/// Most subscriber processes of a pub/sub run.
pub const MAX_SUBSCRIBERS: usize = 64;

/// `--subscribers 1,2,4,8,16`.
pub fn parse_subscribers(text: &str) -> Result<Vec<usize>, UsageError> {
    let mut out = Vec::new();
    for s in text.split(',').map(str::trim) {
        match s.parse::<usize>() {
            Ok(n) if (1..=MAX_SUBSCRIBERS).contains(&n) => {
                if !out.contains(&n) {
                    out.push(n)
                }
            }
            _ => {
                return usage(format!(
                    "invalid value {s:?} for --subscribers (expected subscriber counts from 1 \
                     to {MAX_SUBSCRIBERS}, comma-separated, e.g. 1,2,4,8,16)"
                ))
            }
        }
    }
    Ok(out)
}

/// `--methods` with `--pattern pubsub`: the pub/sub methods.
fn parse_methods(text: &str) -> Result<Vec<String>, UsageError> {
    let all: Vec<&str> = pubsub::METHODS.iter().map(|m| m.name()).collect();
    unique_method_list(text, &all, |name| {
        format!(
            "unknown pubsub method {name:?} (valid with --pattern pubsub: all, {})",
            pubsub::names()
        )
    })
}

/// The pub/sub suite's configuration from `shmlink-bench`'s options: `--methods` (pub/sub
/// names), `--sizes`, `--subscribers`, `--rounds`, `--iterations` (measured messages per
/// run), `--quick`, and the placement.
pub fn config(
    methods: Option<&str>,
    sizes: Option<Vec<usize>>,
    subscribers: Option<Vec<usize>>,
    rounds: Option<u32>,
    stop: Option<Stop>,
    quick: bool,
    cpus: Option<(usize, usize)>,
) -> Result<pubsub::suite::Config, UsageError> {
    Ok(pubsub::suite::Config {
        methods: match methods {
            Some(t) => parse_methods(t)?,
            None => pubsub::METHODS
                .iter()
                .map(|m| m.name().to_string())
                .collect(),
        },
        sizes: sizes.unwrap_or(vec![64, 64 << 10]),
        subscribers: subscribers.unwrap_or(vec![1, 2, 4, 8, 16]),
        rounds: rounds.unwrap_or(if quick { 1 } else { 3 }),
        warmup: if quick { 20 } else { 50 },
        count: match stop {
            Some(Stop::Count(n)) => n,
            _ if quick => 100,
            _ => PUBSUB_MESSAGES,
        },
        cpus,
    })
}

/// The progress line of a pub/sub suite.
fn progress_line(p: &pubsub::suite::Progress, elapsed: Duration) -> String {
    let what = format!(
        "{} {} x{}",
        p.cell.method,
        size::human(p.cell.size),
        p.cell.subscribers
    );
    bar_line(p.done, p.total, p.round, &what, elapsed)
}

/// `--pattern pubsub --list`: the pub/sub methods.
pub fn list() -> ExitCode {
    for m in pubsub::METHODS {
        print_method(m.name(), m.about(), m.unavailable(), m.size_limit());
    }
    ExitCode::SUCCESS
}

/// `--pattern pubsub`: runs the pub/sub suite, prints its table, writes its reports.
pub fn run(args: &BenchArgs, c: &pubsub::suite::Config, exe: &Path) -> ExitCode {
    let cells = pubsub::suite::plan(c);
    let runnable = cells.iter().filter(|x| x.status == Status::Ok).count();
    println!(
        "# shmlink-bench --pattern pubsub: {} methods x {} sizes x {} subscriber counts x {} \
         rounds = {} runs of {} messages (+{} warm-up), each acknowledged by every subscriber \
         before the next; publisher {}, subscribers {}",
        c.methods.len(),
        c.sizes.len(),
        c.subscribers.len(),
        c.rounds,
        runnable * c.rounds as usize,
        c.count,
        c.warmup,
        on_cpu(c.cpus.map(|c| c.0)),
        on_cpu(c.cpus.map(|c| c.1)),
    );
    let started = unix_now();
    let t0 = Instant::now();
    let mut out = ProgressOut::new();
    let cells = pubsub::suite::run(exe, c, |p| {
        let line = progress_line(&p, t0.elapsed());
        let failure = (p.cell.status == Status::Failed).then(|| {
            format!(
                "pubsub {} {} x{} failed: {}",
                p.cell.method,
                size::human(p.cell.size),
                p.cell.subscribers,
                p.cell.note.as_deref().unwrap_or("")
            )
        });
        out.show(p.done, p.total, &line, failure);
    });
    out.finish();
    print!("{}", pubsub::report::table(&cells));
    let failed = cells.iter().filter(|x| x.status == Status::Failed).count();
    let report = pubsub::report::Report {
        schema: pubsub::report::SCHEMA,
        pattern: "pubsub".into(),
        shmlink_version: env!("CARGO_PKG_VERSION").to_string(),
        command: command_line(),
        started_unix: started,
        wall_s: t0.elapsed().as_secs_f64(),
        machine: Machine::this(),
        config: c.clone(),
        results: cells,
    };
    println!("\n# {:.1} s", report.wall_s);
    let outputs = Outputs::of(args, started);
    let written = write_files(
        &outputs,
        &report.to_json(),
        &pubsub::report::to_csv(&report.results),
        &|path| plot::write_pubsub(path, &report.results),
    );
    exit_status(failed, report.results.len(), written)
}
