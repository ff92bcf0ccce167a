//! Waiting: spin, then yield, then park (docs/design.md §4.1).
//!
//! [`spin_then_yield`] is the first two phases; parking is the transport's (it sleeps on
//! its connection fd, which also reports the peer's death). [`take_doorbell`] and
//! [`drain`] are the doorbell socket's side of parking, shared by the `shm:` connection
//! and the shared-memory subscriber.

use std::hint::spin_loop;
use std::io;
use std::os::fd::BorrowedFd;
use std::time::Instant;

use crate::error::Result;
use crate::options::WaitPolicy;
use crate::sys;

/// The policy for a wait whose peer's CPU is not known yet (a handshake's, a listener's
/// for its next client): without the spin when this thread may run on one CPU only,
/// where a peer that shares the CPU could not run while we spin; the spin's budget goes
/// to the yields, as a connection's wait does when its peer last waited on its CPU
/// (docs/design.md §4.1). A peer on another CPU is then looked for between yields.
pub(crate) fn setup_policy(policy: &WaitPolicy) -> WaitPolicy {
    match sys::allowed_cpus() {
        Some(1) => WaitPolicy {
            spin: std::time::Duration::ZERO,
            yield_: policy.spin + policy.yield_,
        },
        _ => *policy,
    }
}

/// Looks a wait that may spin makes before its first pause hint: about a microsecond
/// (an empty ring's look costs 1.7 ns in cache), a small message's round trip several
/// times over. A `pause` costs tens of nanoseconds on recent x86 cores (some 140
/// cycles), and a message that arrives during one waits for its end: 64 B round trips
/// 0.43 µs p50 with a pause after every look, 0.395 with these first (p99 0.65 against
/// 0.61; docs/benchmarks.md, "Short copies"). Past them the wait paces itself as before,
/// so a long wait is no harder on a sibling hyperthread or the power budget.
const EAGER_LOOKS: u32 = 512;

/// Polls `ready` with the CPU's pause hint for `policy.spin` (the first
/// [`EAGER_LOOKS`] looks without it), then with `sched_yield` for `policy.yield_`.
/// Returns `Ok(true)` as soon as `ready` does, `Ok(false)` when the budget is spent (the
/// caller then parks).
pub(crate) fn spin_then_yield(
    policy: &WaitPolicy,
    mut ready: impl FnMut() -> Result<bool>,
) -> Result<bool> {
    if policy.spin.is_zero() {
        // Sharing a CPU with the peer (or never spinning): looks only between yields.
        if policy.yield_.is_zero() {
            return Ok(false);
        }
    } else {
        for _ in 0..EAGER_LOOKS {
            if ready()? {
                return Ok(true);
            }
        }
    }
    // Reading the clock costs more than a check (about 50 ns on the VM of
    // docs/benchmarks.md, a sixth of a small message's round trip): the first looks go
    // before it, so a message that comes within them is taken without one, and then the
    // clock is read every few looks.
    let mut budget = None;
    loop {
        for _ in 0..32 {
            if ready()? {
                return Ok(true);
            }
            spin_loop();
        }
        let now = Instant::now();
        let (spin_end, yield_end) = *budget.get_or_insert_with(|| {
            let spin_end = now + policy.spin;
            (spin_end, spin_end + policy.yield_)
        });
        if now >= yield_end {
            return Ok(false);
        }
        if now >= spin_end {
            sys::yield_now();
        }
    }
}

/// What one look at a doorbell socket found.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Doorbell {
    /// A packet of `len` bytes (its real length: a doorbell is one byte) starting with
    /// `first`.
    Packet { len: usize, first: u8 },
    /// Nothing waiting.
    None,
    /// End-of-file or a reset: the peer is gone.
    Gone,
}

/// Takes one packet off a doorbell socket (with `wait`, a blocking receive: the socket
/// must be blocking for it to wait). Errors other than "nothing there" and the peer's end
/// are the caller's to report.
pub(crate) fn take_doorbell(sock: BorrowedFd<'_>, wait: bool) -> io::Result<Doorbell> {
    let mut buf = [0u8; 16];
    let got = if wait {
        sys::socket::recv_wait(sock, &mut buf)
    } else {
        sys::socket::recv(sock, &mut buf)
    };
    match got {
        Ok(0) => Ok(Doorbell::Gone),
        Ok(len) => Ok(Doorbell::Packet { len, first: buf[0] }),
        Err(e) if e.kind() == io::ErrorKind::WouldBlock => Ok(Doorbell::None),
        Err(e)
            if matches!(
                e.kind(),
                io::ErrorKind::ConnectionReset | io::ErrorKind::BrokenPipe
            ) =>
        {
            Ok(Doorbell::Gone)
        }
        Err(e) => Err(e),
    }
}

/// The most doorbells one [`drain`] takes: a peer that keeps ringing cannot keep the
/// caller there.
const DRAIN_MAX: usize = 64;

/// Drains waiting doorbells, so that the fd stops being readable for them: calls `take`
/// (take one, say whether there was one) until it finds none, at most [`DRAIN_MAX`] times.
pub(crate) fn drain(mut take: impl FnMut() -> Result<bool>) -> Result<()> {
    for _ in 0..DRAIN_MAX {
        if !take()? {
            break;
        }
    }
    Ok(())
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

    #[test]
    fn a_thread_on_one_cpu_yields_instead_of_spinning_before_it_knows_its_peer() {
        let d = WaitPolicy::default();
        // In a thread of its own: pinning it leaves the test harness's threads alone.
        std::thread::spawn(move || {
            sys::pin_to_cpu(sys::current_cpu() as usize).unwrap();
            let p = setup_policy(&d);
            assert_eq!((p.spin, p.yield_), (Duration::ZERO, d.spin + d.yield_));
        })
        .join()
        .unwrap();
        if sys::allowed_cpus().is_some_and(|n| n > 1) {
            assert_eq!(setup_policy(&d), d);
        }
    }
}
