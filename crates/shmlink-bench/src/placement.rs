//! Which placement a run had: this machine's two vCPUs move a cache line between them in
//! about 0.1 µs at one moment and 0.4–0.5 µs at another (the host moves them), and a
//! run takes the speed of the moment it ran in, whatever it measures. So the suite
//! measures a bare line round trip between the run's two CPUs between runs ([`probe`]),
//! each run keeps the probe before it and the one after it
//! ([`crate::run::RunOutput::line_ns`]), and the report sorts the runs into the fast and
//! the slow placement ([`split`], [`Placement::of`]) to compare methods within one
//! (docs/benchmarks.md, "Placement").

use std::hint;
use std::io;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

/// Round trips timed per probe (a few milliseconds in either placement), after as many
/// untimed ones as [`WARMUP`].
const ROUND_TRIPS: u64 = 20_000;
const WARMUP: u64 = 2_000;
/// Round trips per timed batch; the probe is the median of the batches' means.
const BATCH: u64 = 100;
/// A probe that is not done within this gives up: its threads do not have their CPUs to
/// themselves (on a busy machine a round trip can wait for a time slice), so it would
/// measure the load, not the placement, and hold up the suite. A probe takes 2-12 ms
/// here.
const BUDGET: Duration = Duration::from_millis(100);

/// The two words, each on its own 128-byte pair of lines (the adjacent-line prefetcher
/// fetches 128-byte pairs).
#[repr(C, align(128))]
struct Line(AtomicU64);

/// The median time of one round trip of a word between CPUs `cpus.0` and `cpus.1`, in
/// nanoseconds: one thread on each CPU, each spinning on the word the other writes, no
/// other work. On one CPU the two threads yield to each other, which this then measures.
/// An error if a thread cannot be pinned or the probe is not done within 100 ms.
pub fn probe(cpus: (usize, usize)) -> io::Result<u64> {
    let lines = [Line(AtomicU64::new(0)), Line(AtomicU64::new(0))];
    // Either thread that stops early says so here, and the other stops at its next look.
    let gave_up = AtomicBool::new(false);
    let deadline = Instant::now() + BUDGET;
    let same = cpus.0 == cpus.1;
    // Waits until `line` holds `want`; false if either side gave up or time ran out.
    let wait = |line: &Line, want: u64| -> bool {
        let mut spins = 0u32;
        // SYNC POINT: acquire pairs with the other thread's release store of `want`.
        while line.0.load(Ordering::Acquire) != want {
            spins = spins.wrapping_add(1);
            if same {
                std::thread::yield_now();
            } else {
                hint::spin_loop();
            }
            if spins.is_multiple_of(1024)
                && (gave_up.load(Ordering::Relaxed) || Instant::now() > deadline)
            {
                gave_up.store(true, Ordering::Relaxed);
                return false;
            }
        }
        true
    };
    let total = WARMUP + ROUND_TRIPS;
    let busy = || io::Error::other("placement probe: the CPUs are busy");
    std::thread::scope(|s| {
        let echo = s.spawn(|| -> io::Result<()> {
            if let Err(e) = shmlink_measure::sys::pin_to_cpu(cpus.1) {
                gave_up.store(true, Ordering::Relaxed);
                return Err(e);
            }
            for i in 1..=total {
                if !wait(&lines[0], i) {
                    break;
                }
                // SYNC POINT: release publishes the answer to the driver's acquire load.
                lines[1].0.store(i, Ordering::Release);
            }
            Ok(())
        });
        // Its own thread too: pinning must not narrow the caller's CPUs.
        let drive = s.spawn(|| -> io::Result<u64> {
            shmlink_measure::sys::pin_to_cpu(cpus.0)?;
            let mut means = Vec::with_capacity((ROUND_TRIPS / BATCH) as usize);
            let mut t = Instant::now();
            for i in 1..=total {
                if i == WARMUP + 1 {
                    t = Instant::now();
                }
                // SYNC POINT: release publishes `i` to the echo thread's acquire load.
                lines[0].0.store(i, Ordering::Release);
                if !wait(&lines[1], i) {
                    return Err(busy());
                }
                if i > WARMUP && (i - WARMUP).is_multiple_of(BATCH) {
                    means.push(t.elapsed().as_nanos() as u64 / BATCH);
                    if Instant::now() > deadline {
                        return Err(busy());
                    }
                    t = Instant::now();
                }
            }
            means.sort_unstable();
            Ok(means[means.len() / 2])
        });
        let out = drive
            .join()
            .map_err(|_| io::Error::other("placement probe panicked"))
            .and_then(|r| r);
        if out.is_err() {
            gave_up.store(true, Ordering::Relaxed);
        }
        let echoed = echo
            .join()
            .map_err(|_| io::Error::other("placement probe panicked"))?;
        // The echo's own error (a CPU it could not pin to) says more than "busy".
        echoed.and(out)
    })
}

/// The placement a run had: where its two probes fall against the suite's [`split`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Placement {
    /// Both probes at or below the split.
    Fast,
    /// Both above it.
    Slow,
    /// One of each: the placement changed during the run (or it has no probe).
    Mixed,
}

/// The smallest ratio between two probes that [`split`] takes for two placements (the
/// modes measured here are 2.8× or more apart: 95–130 against 360–490 ns; probes within
/// one mode differ by less than 1.6×, a third, rarer mode of 50–60 ns included).
pub const GAP: f64 = 2.0;

/// Where the probes split into two placements: the largest probe below the widest
/// ratio between two consecutive probes in sorted order with at least two probes on each
/// side, if that ratio is at least [`GAP`]; `None` if the probes form one placement (or
/// there are too few).
pub fn split(probes: impl IntoIterator<Item = u64>) -> Option<u64> {
    let mut v: Vec<u64> = probes.into_iter().filter(|&ns| ns > 0).collect();
    v.sort_unstable();
    let n = v.len();
    v.windows(2)
        .enumerate()
        // At least two probes on each side: one probe a load spike slowed is no placement.
        .filter(|&(i, _)| i >= 1 && n - (i + 1) >= 2)
        .map(|(_, w)| (w[1] as f64 / w[0] as f64, w[0]))
        .filter(|&(ratio, _)| ratio >= GAP)
        .max_by(|a, b| a.0.total_cmp(&b.0))
        .map(|(_, below)| below)
}

impl Placement {
    /// The placement of a run with probes `line_ns` in a suite whose probes [`split`] at
    /// `split` ns.
    pub fn of(line_ns: Option<[u64; 2]>, split: u64) -> Placement {
        match line_ns.map(|ns| ns.map(|ns| ns <= split)) {
            Some([true, true]) => Placement::Fast,
            Some([false, false]) => Placement::Slow,
            _ => Placement::Mixed,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_probe_between_two_cpus_reads_a_plausible_time_or_says_they_are_busy() {
        let cpus = shmlink_measure::cpus::allowed_cpus();
        let pair = (cpus[0], *cpus.last().unwrap());
        match probe(pair) {
            // A round trip cannot take less than a nanosecond nor, spinning, a millisecond.
            Ok(ns) => assert!((1..1_000_000).contains(&ns), "{ns} ns"),
            // On a machine too busy to measure, a clear error instead of a figure.
            Err(e) => assert!(e.to_string().contains("the CPUs are busy"), "{e}"),
        }
    }

    #[test]
    fn runs_sort_into_placements_at_the_widest_gap() {
        // Three modes, as measured here: the widest gap is between 130 and 360.
        let probes = [52, 58, 101, 130, 95, 360, 489, 420, 0];
        assert_eq!(split(probes), Some(130));
        assert_eq!(split([100, 120, 130, 190]), None, "one placement");
        assert_eq!(
            split([100, 120, 130, 4500]),
            None,
            "one slow probe is no placement"
        );
        assert_eq!(split([]), None);
        assert_eq!(Placement::of(Some([101, 130]), 130), Placement::Fast);
        assert_eq!(Placement::of(Some([52, 58]), 130), Placement::Fast);
        assert_eq!(Placement::of(Some([360, 489]), 130), Placement::Slow);
        assert_eq!(Placement::of(Some([120, 420]), 130), Placement::Mixed);
        assert_eq!(Placement::of(None, 130), Placement::Mixed);
    }
}
