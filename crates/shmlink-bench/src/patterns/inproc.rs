//! `shmlink-bench --pattern inproc`: in-process shmlink against the thread channels, round
//! trip and throughput, 64 B to 1 MiB (see `crate::methods::inproc`). Methods are
//! interleaved over the rounds (A B C A B C …); the table shows each figure's median.

use std::path::PathBuf;
use std::process::ExitCode;

use crate::methods::inproc::{self, Row, METHODS};

use crate::cli::{method_list, positive, size_list, Cli, UsageError};
use crate::pattern::Pattern;

struct Args {
    methods: Vec<&'static inproc::InprocMethod>,
    sizes: Vec<usize>,
    round_trips: u64,
    messages: u64,
    rounds: u32,
    json: Option<PathBuf>,
}

/// `--pattern inproc`.
pub struct Inproc;

impl Pattern for Inproc {
    fn name(&self) -> &'static str {
        "inproc"
    }

    fn help(&self) -> &'static str {
        "both ends in one process (threads): shmlink's in-process connection against
std mpsc, crossbeam-channel, flume and tokio mpsc; round trip and throughput, 64 B to
1 MiB. Options: --methods, --sizes, --iterations (round trips; 20 x as many streamed
messages), --rounds, --quick, --json FILE."
    }

    fn flags(&self) -> &'static [&'static str] {
        FLAGS
    }

    fn run(&self, cli: &Cli) -> Result<ExitCode, UsageError> {
        Ok(run(config(cli)?))
    }
}

/// The options `--pattern inproc` takes.
const FLAGS: &[&str] = &["methods", "sizes", "iterations", "rounds", "quick", "json"];

fn config(cli: &Cli) -> Result<Args, UsageError> {
    let mut a = Args {
        methods: METHODS.iter().collect(),
        sizes: vec![64, 1024, 16 << 10, 64 << 10, 1 << 20],
        round_trips: 100_000,
        messages: 2_000_000,
        rounds: 3,
        json: cli.json.clone(),
    };
    if cli.quick {
        a.round_trips = 10_000;
        a.messages = 200_000;
        a.rounds = 1;
    }
    if let Some(text) = &cli.methods {
        let names: Vec<&str> = METHODS.iter().map(|m| m.name).collect();
        if let Some(ms) = method_list(text, "inproc", &names, inproc::find)? {
            a.methods = ms;
        }
    }
    if let Some(text) = &cli.sizes {
        a.sizes = size_list(text, "inproc", 8..=(16 << 20), "8 B to 16 MiB")?;
    }
    if let Some(text) = &cli.iterations {
        let n: u64 = positive(text, "--iterations")?;
        a.round_trips = n;
        a.messages = 20 * n;
    }
    if let Some(text) = &cli.rounds {
        a.rounds = positive(text, "--rounds")?;
    }
    Ok(a)
}

/// Scales a count for 64-byte messages down for larger ones (by bytes, with a floor),
/// so that every size takes a similar time.
fn scaled(n: u64, size: usize, floor: u64) -> u64 {
    let factor = (size as u64 / 1024).max(1);
    (n / factor).max(floor)
}

fn run(a: Args) -> ExitCode {
    // corrupt:N, scribble:N (main refused the other faults).
    let fault = crate::fault::data_fault();
    let mut rtt: Vec<Vec<Row>> = Vec::new();
    let mut tput: Vec<Vec<Row>> = Vec::new();
    for _ in 0..a.sizes.len() * a.methods.len() {
        rtt.push(Vec::new());
        tput.push(Vec::new());
    }
    for round in 0..a.rounds {
        eprintln!("round {} of {}", round + 1, a.rounds);
        let mut i = 0;
        for &size in &a.sizes {
            for m in &a.methods {
                rtt[i].push(inproc::round_trip(
                    m,
                    size,
                    scaled(a.round_trips, size, 500),
                    fault,
                ));
                tput[i].push(inproc::throughput(
                    m,
                    size,
                    scaled(a.messages, size, 1000),
                    fault,
                ));
                i += 1;
            }
        }
    }
    let rtt: Vec<Row> = rtt.iter().map(|r| inproc::median(r)).collect();
    let tput: Vec<Row> = tput.iter().map(|r| inproc::median(r)).collect();
    print!("{}", table(&rtt, &tput));
    if let Some(path) = &a.json {
        let all: Vec<&Row> = rtt.iter().chain(&tput).collect();
        let text = serde_json::to_string_pretty(&all).expect("rows serialize");
        if let Err(e) = std::fs::write(path, text) {
            eprintln!("shmlink-bench: write {}: {e}", path.display());
            return ExitCode::FAILURE;
        }
    }
    if rtt.iter().chain(&tput).any(|r| r.error.is_some()) {
        return ExitCode::FAILURE;
    }
    ExitCode::SUCCESS
}

fn table(rtt: &[Row], tput: &[Row]) -> String {
    let mut s = String::new();
    let sizes: std::collections::BTreeSet<usize> = rtt.iter().map(|r| r.size).collect();
    for size in sizes {
        let base = rtt
            .iter()
            .find(|r| r.method == "crossbeam-channel" && r.size == size && r.error.is_none())
            .map(|r| r.p50_us);
        s += &format!(
            "\n## in-process, {} (medians over {} round(s))\n{:<22} {:>9} {:>9} {:>14} {:>12} {:>14}\n",
            shmlink_measure::size::human(size),
            rtt.first().map_or(0, |r| r.rounds),
            "method",
            "rtt p50 us",
            "rtt p99 us",
            "p50 vs xbeam",
            "msg/s",
            "MB/s"
        );
        for r in rtt.iter().filter(|r| r.size == size) {
            let t = tput.iter().find(|t| t.size == size && t.method == r.method);
            match (&r.error, t.and_then(|t| t.error.as_ref())) {
                (Some(e), _) | (None, Some(e)) => s += &format!("{:<22} failed: {e}\n", r.method),
                (None, None) => {
                    let per_s = t.map_or(0.0, |t| t.per_s);
                    s += &format!(
                        "{:<22} {:>9.3} {:>9.3} {:>13.2}x {:>12.0} {:>14.0}\n",
                        r.method,
                        r.p50_us,
                        r.p99_us,
                        base.map_or(f64::NAN, |b| r.p50_us / b),
                        per_s,
                        per_s * size as f64 / 1e6
                    );
                }
            }
        }
    }
    s
}
