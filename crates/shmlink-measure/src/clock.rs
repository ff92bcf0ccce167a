//! The clock of the latency driver: cheap enough that timing a round trip costs the
//! harness well under 20 ns ([`crate::protocol::timing_cost`] shows it). `Instant::now`
//! is a vDSO `clock_gettime`, about 20-25 ns a read on a VM; on x86-64 with an invariant
//! TSC (`constant_tsc` and `nonstop_tsc`, and `rdtscp`, which Linux reports in /proc/cpuinfo) the
//! driver reads the TSC instead, about 10 cycles, and converts ticks to nanoseconds
//! with a rate calibrated against `Instant` when the clock is made.

use std::time::{Duration, Instant};

/// A monotonic tick counter and its rate.
#[derive(Clone, Copy, Debug)]
pub struct Clock {
    /// Nanoseconds per tick; `None`: ticks are `Instant` nanoseconds.
    ns_per_tick: Option<f64>,
    origin: Instant,
}

/// Whether this CPU's TSC runs at a constant rate in every state (Linux's view).
fn invariant_tsc() -> bool {
    cfg!(target_arch = "x86_64")
        && std::fs::read_to_string("/proc/cpuinfo").is_ok_and(|info| {
            info.lines()
                .find(|l| l.starts_with("flags"))
                .is_some_and(|l| {
                    let has = |f: &str| l.split_whitespace().any(|w| w == f);
                    has("constant_tsc") && has("nonstop_tsc") && has("rdtscp")
                })
        })
}

#[inline(always)]
fn tsc() -> u64 {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: rdtscp has no memory effects and writes only `aux`; CPUs with an invariant
    // TSC have it (checked before a Clock uses the TSC). Unlike rdtsc it waits for the
    // instructions before it (the round trip's last load) to execute.
    unsafe {
        let mut aux = 0u32;
        std::arch::x86_64::__rdtscp(&mut aux)
    }
    #[cfg(not(target_arch = "x86_64"))]
    0
}

impl Clock {
    /// The TSC if it is invariant (calibrated over about 20 ms), else `Instant`.
    pub fn new() -> Clock {
        let origin = Instant::now();
        if !invariant_tsc() {
            return Clock {
                ns_per_tick: None,
                origin,
            };
        }
        let (t0, c0) = (Instant::now(), tsc());
        while t0.elapsed() < Duration::from_millis(20) {
            std::hint::spin_loop();
        }
        let (ns, ticks) = (t0.elapsed().as_nanos() as f64, tsc().wrapping_sub(c0));
        Clock {
            ns_per_tick: (ticks > 0).then(|| ns / ticks as f64),
            origin,
        }
    }

    /// The current tick.
    #[inline(always)]
    pub fn now(&self) -> u64 {
        match self.ns_per_tick {
            Some(_) => tsc(),
            None => self.origin.elapsed().as_nanos() as u64,
        }
    }

    /// Ticks in `ns` nanoseconds.
    pub fn ticks(&self, ns: u64) -> u64 {
        match self.ns_per_tick {
            Some(r) => (ns as f64 / r) as u64,
            None => ns,
        }
    }

    /// Nanoseconds between two ticks.
    #[inline(always)]
    pub fn ns(&self, from: u64, to: u64) -> u64 {
        let d = to.saturating_sub(from);
        match self.ns_per_tick {
            Some(r) => (d as f64 * r) as u64,
            None => d,
        }
    }
}

impl Default for Clock {
    fn default() -> Self {
        Clock::new()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ticks_convert_to_about_the_elapsed_time() {
        let c = Clock::new();
        let (t0, a) = (Instant::now(), c.now());
        std::thread::sleep(Duration::from_millis(30));
        let (b, wall) = (c.now(), t0.elapsed().as_nanos() as f64);
        let ns = c.ns(a, b) as f64;
        // Loose: a loaded machine may run the two reads apart; no timing is asserted
        // beyond the conversion being in the right unit.
        assert!(
            ns > wall * 0.5 && ns < wall * 2.0,
            "{ns} ns by ticks, {wall} ns"
        );
    }
}
