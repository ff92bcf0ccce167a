//! Wait counters for troubleshooting (`SHMLINK_STATS=1`): how each `epoll_wait`/`poll`/
//! blocking `read` on shm connections ended (from shared memory, in the spin, after a
//! kernel sleep), printed to stderr when the process exits. Off by default: a disabled
//! counter costs one load of the configuration.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use crate::guard::Guard;
use crate::real;

/// One counter per way a wait can go.
#[derive(Clone, Copy)]
#[repr(usize)]
pub(crate) enum Stat {
    /// Waits (`epoll_wait`/`poll` calls with shm members, blocking reads that waited).
    Waits,
    /// Waits answered from shared memory before any spin.
    ReadyAtOnce,
    /// Spins that saw something ready.
    SpinHit,
    /// Spins that ran out their budget.
    SpinMiss,
    /// Nanoseconds spent spinning.
    SpinNs,
    /// Kernel waits with a timeout (a real sleep unless a doorbell stands).
    KernelSleep,
    /// Kernel sleeps that ended with an event on a shm member (a doorbell, an end).
    KernelWokeShm,
    /// Kernel sleeps that ended with nothing (timeout or cap).
    KernelTimeout,
    /// Kernel waits with a zero timeout (plain fds polled while shm members are ready).
    KernelZero,
    /// Rounds that found nothing to report after a kernel wake-up (a stale doorbell).
    Spurious,
    /// Backoff pauses after such rounds.
    Backoff,
}

const N: usize = Stat::Backoff as usize + 1;
const NAMES: [&str; N] = [
    "waits",
    "ready-at-once",
    "spin-hit",
    "spin-miss",
    "spin-ns",
    "kernel-sleep",
    "kernel-woke-shm",
    "kernel-timeout",
    "kernel-zero",
    "spurious",
    "backoff",
];

static COUNTS: [AtomicU64; N] = [const { AtomicU64::new(0) }; N];

/// Adds `n` to `s` when `SHMLINK_STATS` is on.
#[inline]
pub(crate) fn add(s: Stat, n: u64) {
    if ON.load(Ordering::Relaxed) {
        COUNTS[s as usize].fetch_add(n, Ordering::Relaxed);
    }
}

/// Set by [`install`]: counting is on.
static ON: AtomicBool = AtomicBool::new(false);

/// Turns counting on and registers the exit report (called once, when the settings are
/// read with `SHMLINK_STATS` on).
pub(crate) fn install() {
    ON.store(true, Ordering::Relaxed);
    extern "C" fn report() {
        let _g = Guard::enter();
        let mut line = format!("shmlink-preload[{}]: stats", std::process::id());
        for (name, c) in NAMES.iter().zip(&COUNTS) {
            line.push_str(&format!(" {name}={}", c.load(Ordering::Relaxed)));
        }
        line.push('\n');
        // SAFETY: a valid buffer; fd 2 may be closed, which write reports.
        unsafe { real::write(2, line.as_ptr().cast(), line.len()) };
    }
    // SAFETY: `report` is a plain function that stays valid for the process's life.
    unsafe { libc::atexit(report) };
}
