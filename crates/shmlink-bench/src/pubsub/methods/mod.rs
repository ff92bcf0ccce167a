//! One module per pub/sub method.

pub mod brokers;
pub mod iceoryx2;
pub mod shmlink;
pub mod uds;
pub mod zmq;

use std::io;
use std::time::{Duration, Instant};

/// How long a waiting subscriber that shares its CPU with other processes busy-polls
/// before it blocks in the kernel (shmlink's default spin; it then also yields for
/// 30 µs before sleeping).
pub const SPIN: Duration = Duration::from_micros(20);

/// How long a waiting subscriber that has a CPU to itself busy-polls before it blocks:
/// longer than the pause between two messages, so it is polling when the next one
/// comes — what a latency-sensitive user does with a dedicated core — yet bounded, so a
/// stalled run does not burn a CPU.
pub const OWN_CPU_SPIN: Duration = Duration::from_millis(1);

/// Polls `try_now` (which must not block) for up to `spin`, then waits with `block`;
/// both work on `state`. Every method's subscriber waits this way, with the budget
/// of its run ([`Ctx::spin`](super::Ctx::spin)).
pub fn spin_then_block<S: ?Sized, T>(
    spin: Duration,
    state: &mut S,
    mut try_now: impl FnMut(&mut S) -> io::Result<Option<T>>,
    block: impl FnOnce(&mut S) -> io::Result<T>,
) -> io::Result<T> {
    let start = Instant::now();
    loop {
        if let Some(v) = try_now(state)? {
            return Ok(v);
        }
        if start.elapsed() >= spin {
            return block(state);
        }
        std::hint::spin_loop();
    }
}
