//! `SHMLINK_BENCH_FAULT`, for tests of failure handling, in every pattern: which faults a
//! pattern injects, and a refusal (a usage error, exit status 2) for the ones it cannot,
//! so that a fault is never silently ignored.
//!
//! | pattern | injects | refuses |
//! |---|---|---|
//! | point-to-point, `sessions` | `exit:N`, `corrupt:N`, `scribble:N` ([`Fault`]) | — |
//! | `pubsub` | `exit:N`, `hang:N` (a subscriber), `corrupt:N`, `scribble:N` (the publisher) | — |
//! | `async`, `inproc`, `connect` | `corrupt:N`, `scribble:N` (the sender of message #N) | `exit:N`, `hang:N` |
//! | `apps` | — | every fault: the data are the programs' own, not the bench's |
//!
//! `corrupt:N` flips the last byte of data message #N, `scribble:N` one byte in the middle
//! of every message from #N on; the receiver's verification must catch it and the run
//! fail. A run that would end before message #N fails too ([`reached`]): the fault asked
//! for was not injected, so the run proves nothing.

use shmlink_measure::protocol::Fault;

/// The environment variable (see the module docs).
pub const FAULT_ENV: &str = "SHMLINK_BENCH_FAULT";

/// Whether `pattern` ("p2p", "pubsub", "async", "inproc", "connect", "apps") injects the
/// fault in [`FAULT_ENV`]: `Ok` when it is unset, empty or injected, `Err` (a usage error,
/// exit status 2) when it is not a fault or one the pattern does not inject.
pub fn check(pattern: &str) -> Result<(), String> {
    let Some(text) = std::env::var(FAULT_ENV).ok().filter(|t| !t.is_empty()) else {
        return Ok(());
    };
    let hang = text
        .strip_prefix("hang:")
        .is_some_and(|n| n.parse::<u64>().is_ok());
    let parsed = Fault::parse(&text);
    let known = hang || parsed.is_some();
    if !known {
        return Err(format!(
            "{FAULT_ENV}={text:?} is not a fault (exit:N, corrupt:N, scribble:N; hang:N with \
             --pattern pubsub)"
        ));
    }
    let ok = match pattern {
        "p2p" | "sessions" => !hang,
        "pubsub" => true,
        "async" | "inproc" | "connect" => {
            matches!(parsed, Some(Fault::Corrupt(_) | Fault::Scribble(_)))
        }
        _ => false,
    };
    if ok {
        return Ok(());
    }
    Err(match pattern {
        "apps" => format!(
            "{FAULT_ENV}={text} cannot be applied with --pattern apps: its data are the \
             programs' own (redis, nginx, iperf3, sockperf), which the bench neither writes \
             nor verifies"
        ),
        _ => format!(
            "{FAULT_ENV}={text} cannot be applied with --pattern {pattern} (it injects \
             corrupt:N and scribble:N)"
        ),
    })
}

/// The data-damaging fault in [`FAULT_ENV`] (`corrupt:N` or `scribble:N`), if any; the
/// others are left to the pattern that injects them (or refused by [`check`]).
pub fn data_fault() -> Option<Fault> {
    std::env::var(FAULT_ENV)
        .ok()
        .and_then(|t| Fault::parse(&t))
        .filter(|f| f.first_damaged().is_some())
}

/// `Err` if `fault` would not be injected in a run of `total` data messages (numbered
/// from 0): the run must fail rather than pass with the fault asked for not applied.
pub fn reached(fault: Option<Fault>, total: u64) -> Result<(), String> {
    match fault.and_then(Fault::first_damaged) {
        Some(n) if n >= total => Err(format!(
            "{FAULT_ENV}={}: this run has {total} data messages (#0 to #{}), so the fault \
             would not be injected; make the run longer or the number smaller",
            fault.expect("a fault"),
            total.saturating_sub(1)
        )),
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_fault_past_the_run_fails_it() {
        let f = Some(Fault::Corrupt(5000));
        assert!(reached(f, 5000).is_err());
        assert!(reached(f, 5001).is_ok());
        assert!(reached(Some(Fault::Scribble(0)), 0).is_err());
        assert!(reached(Some(Fault::Exit(9)), 1).is_ok());
        assert!(reached(None, 0).is_ok());
    }
}
