//! Waiting: spin, then yield, then park (docs/design.md §4.1).
//!
//! [`spin_then_yield`] is the first two phases; parking is the transport's (it sleeps on
//! its connection fd, which also reports the peer's death).

use std::hint::spin_loop;
use std::time::Instant;

use crate::error::Result;
use crate::options::WaitPolicy;
use crate::sys;

/// Polls `ready` with the CPU's pause hint for `policy.spin`, then with `sched_yield` for
/// `policy.yield_`. Returns `Ok(true)` as soon as `ready` does, `Ok(false)` when the
/// budget is spent (the caller then parks).
pub(crate) fn spin_then_yield(
    policy: &WaitPolicy,
    mut ready: impl FnMut() -> Result<bool>,
) -> Result<bool> {
    if policy.spin.is_zero() && policy.yield_.is_zero() {
        return Ok(false);
    }
    let start = Instant::now();
    let spin_end = start + policy.spin;
    let yield_end = spin_end + policy.yield_;
    loop {
        // Reading the clock costs more than a check; look at it every few rounds.
        for _ in 0..32 {
            if ready()? {
                return Ok(true);
            }
            spin_loop();
        }
        let now = Instant::now();
        if now >= yield_end {
            return Ok(false);
        }
        if now >= spin_end {
            sys::yield_now();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn spinning_stops_when_ready_or_when_the_budget_is_spent() {
        // A budget no preemption of a loaded CI machine outlasts: only readiness ends it.
        let patient = WaitPolicy {
            spin: Duration::from_secs(30),
            yield_: Duration::from_secs(30),
        };
        let mut n = 0;
        assert!(spin_then_yield(&patient, || {
            n += 1;
            Ok(n == 100)
        })
        .unwrap());
        assert_eq!(n, 100);
        let short = WaitPolicy {
            spin: Duration::from_micros(50),
            yield_: Duration::from_micros(50),
        };
        assert!(!spin_then_yield(&short, || Ok(false)).unwrap());
        assert!(!spin_then_yield(&WaitPolicy::BLOCKING, || Ok(true)).unwrap());
    }
}
