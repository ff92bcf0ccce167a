//! The output every pattern shares: the progress line on stderr, where the reports go
//! (`--json`, `--csv`, `--plot`, or by default `bench-results/<timestamp>/`), writing
//! them, `--list`'s method lines, and the exit status of a suite.

use std::io::{IsTerminal, Write};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use crate::cli::Cli;
use crate::method::SizeLimit;

/// Where the default run writes: `bench-results/<timestamp>/` under the current directory.
pub const DEFAULT_DIR: &str = "bench-results";

/// The files a run writes.
#[derive(Debug, PartialEq, Eq)]
pub struct Outputs {
    /// The directory to create first (the default run's).
    pub dir: Option<PathBuf>,
    /// The JSON report's file.
    pub json: Option<PathBuf>,
    /// The CSV report's file.
    pub csv: Option<PathBuf>,
    /// The charts' files.
    pub plots: Vec<PathBuf>,
}

impl Outputs {
    /// The files named by `--json`, `--csv` and `--plot`; without any of them,
    /// `results.json`, `results.csv`, `plot.svg` and `plot.png` in
    /// `bench-results/<timestamp>/` (UTC of `started_unix`).
    pub fn of(args: &Cli, started_unix: u64) -> Outputs {
        if args.json.is_none() && args.csv.is_none() && args.plot.is_none() {
            let dir = Path::new(DEFAULT_DIR).join(timestamp(started_unix));
            return Outputs {
                json: Some(dir.join("results.json")),
                csv: Some(dir.join("results.csv")),
                plots: vec![dir.join("plot.svg"), dir.join("plot.png")],
                dir: Some(dir),
            };
        }
        Outputs {
            dir: None,
            json: args.json.clone(),
            csv: args.csv.clone(),
            plots: args.plot.iter().cloned().collect(),
        }
    }
}

/// Width of the progress bar in characters.
pub const BAR: usize = 24;

pub fn bar_line(
    done: usize,
    total_runs: usize,
    round: u32,
    what: &str,
    elapsed: Duration,
) -> String {
    let total = total_runs.max(1);
    let filled = done * BAR / total;
    let left = if done == 0 {
        "?".to_string()
    } else {
        let secs = elapsed.as_secs_f64() * (total - done.min(total)) as f64 / done as f64;
        format!("{}:{:02}", secs as u64 / 60, secs as u64 % 60)
    };
    format!(
        "[{}{}] {:>3}% {}/{} runs, {left} left; round {}: {what}",
        "#".repeat(filled),
        ".".repeat(BAR - filled),
        done * 100 / total,
        done,
        total_runs,
        round + 1,
    )
}

/// Shows progress on stderr: a line redrawn on a terminal, one line per tenth of the
/// runs in a log, and every failure.
pub struct ProgressOut {
    tty: bool,
    tenth: usize,
}

impl Default for ProgressOut {
    fn default() -> ProgressOut {
        ProgressOut::new()
    }
}

impl ProgressOut {
    pub fn new() -> ProgressOut {
        ProgressOut {
            tty: std::io::stderr().is_terminal(),
            tenth: 0,
        }
    }

    pub fn show(&mut self, done: usize, total: usize, line: &str, failure: Option<String>) {
        if self.tty {
            let mut err = std::io::stderr().lock();
            let _ = write!(err, "\r\x1b[2K{line}");
            let _ = err.flush();
        } else if done * 10 / total.max(1) > self.tenth {
            self.tenth = done * 10 / total.max(1);
            eprintln!("{line}");
        }
        if let Some(f) = failure {
            if self.tty {
                eprintln!();
            }
            eprintln!("shmlink-bench: {f}");
        }
    }

    pub fn finish(&self) {
        if self.tty {
            eprint!("\r\x1b[2K");
        }
    }
}

/// `YYYYMMDD-HHMMSS` in UTC for seconds since the Unix epoch.
fn timestamp(unix: u64) -> String {
    let (days, secs) = ((unix / 86_400) as i64, unix % 86_400);
    // Days to a civil date (Howard Hinnant's algorithm, proleptic Gregorian calendar).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}{month:02}{day:02}-{:02}{:02}{:02}",
        secs / 3600,
        secs / 60 % 60,
        secs % 60
    )
}

/// Writes the JSON and CSV texts and the plots to the files of `out` and says where;
/// false if one could not be written.
pub fn write_files(
    out: &Outputs,
    json: &str,
    csv: &str,
    plot: &dyn Fn(&Path) -> Result<(), String>,
) -> bool {
    if let Some(dir) = &out.dir {
        if let Err(e) = std::fs::create_dir_all(dir) {
            eprintln!("shmlink-bench: create {}: {e}", dir.display());
            return false;
        }
    }
    let mut ok = true;
    let mut report_error = |what: String| {
        eprintln!("shmlink-bench: {what}");
        ok = false;
    };
    for (path, text) in [(&out.json, json), (&out.csv, csv)] {
        if let Some(path) = path {
            match std::fs::write(path, text) {
                Ok(()) => println!("# wrote {}", path.display()),
                Err(e) => report_error(format!("write {}: {e}", path.display())),
            }
        }
    }
    for path in &out.plots {
        match plot(path) {
            Ok(()) => println!("# wrote {}", path.display()),
            Err(e) => report_error(e),
        }
    }
    ok
}

/// `--list`: one method's line, its name and what it measures with its size limit, or
/// why it is skipped here.
pub fn print_method(
    name: &str,
    about: &str,
    unavailable: Option<String>,
    limit: Option<SizeLimit>,
) {
    let limit = limit.map_or(String::new(), |l| {
        format!(" [max {} bytes: {}]", l.max, l.why)
    });
    match unavailable {
        Some(reason) => println!("{name:<22} skipped here: {reason}"),
        None => println!("{name:<22} {about}{limit}"),
    }
}

/// Where an end runs, for the run's first line: `on CPU N` or `unpinned`.
pub fn on_cpu(cpu: Option<usize>) -> String {
    cpu.map_or("unpinned".to_string(), |c| format!("on CPU {c}"))
}

/// Seconds since the Unix epoch (0 if the clock is before it).
pub fn unix_now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// Says how many of the `cells` failed, if any; success only if none did and every
/// output was `written`.
pub fn exit_status(failed: usize, cells: usize, written: bool) -> ExitCode {
    if failed > 0 {
        eprintln!("shmlink-bench: {failed} of {cells} cells failed");
    }
    if written && failed == 0 {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cli(args: &str) -> Cli {
        let argv = std::iter::once("shmlink-bench").chain(args.split_whitespace());
        Cli::parse_from(argv, String::new()).unwrap()
    }

    #[test]
    fn outputs_default_to_a_timestamped_directory() {
        let d = Outputs::of(&cli("--quick"), 1_795_314_600);
        let dir = Path::new("bench-results/20261122-023000");
        assert_eq!(d.dir.as_deref(), Some(dir));
        assert_eq!(d.json, Some(dir.join("results.json")));
        assert_eq!(d.csv, Some(dir.join("results.csv")));
        assert_eq!(d.plots, vec![dir.join("plot.svg"), dir.join("plot.png")]);
        let only = Outputs::of(&cli("--plot out/b.png"), 0);
        assert_eq!(only.dir, None);
        assert_eq!(only.json, None);
        assert_eq!(only.plots, vec![PathBuf::from("out/b.png")]);
        assert_eq!(timestamp(0), "19700101-000000");
        assert_eq!(timestamp(951_825_599), "20000229-115959");
    }
}
