//! One module per pub/sub method.

pub mod brokers;
pub mod iceoryx2;
pub mod shmlink;
pub mod uds;
pub mod zmq;

use std::io;
use std::time::{Duration, Instant};

/// How long a waiting subscriber busy-polls before it blocks in the kernel (shmlink's
/// default spin; it then also yields for 30 µs before sleeping).
pub const SPIN: Duration = Duration::from_micros(20);

/// Polls `try_now` (which must not block) for up to [`SPIN`], then waits with `block`;
/// both work on `state`. Subscribers share a CPU, so none may spin for longer.
pub fn spin_then_block<S: ?Sized, T>(
    state: &mut S,
    mut try_now: impl FnMut(&mut S) -> io::Result<Option<T>>,
    block: impl FnOnce(&mut S) -> io::Result<T>,
) -> io::Result<T> {
    let start = Instant::now();
    loop {
        if let Some(v) = try_now(state)? {
            return Ok(v);
        }
        if start.elapsed() >= SPIN {
            return block(state);
        }
        std::hint::spin_loop();
    }
}
