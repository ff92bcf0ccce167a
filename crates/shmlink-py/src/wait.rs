//! Blocking calls made from non-blocking ones, so that Python keeps control.
//!
//! Every shmlink object under a Python object is in non-blocking mode. A Python call in
//! blocking mode (or with a timeout) first tries once with the GIL held — the fast path,
//! no system call when a message is waiting — and on `WouldBlock` releases the GIL and
//! waits: it retries for the connection's spin budget (so a round trip between awake
//! peers never sleeps in the kernel), then sleeps in `poll()` on the object's fd, which
//! shmlink makes readable when the call is worth retrying or the peer is gone. Every
//! [`SLICE`] (and at once when `poll` is interrupted by a signal) it takes the GIL back
//! to run Python's signal handlers: Ctrl-C raises `KeyboardInterrupt` in a blocked
//! `recv()` within that time.

use std::hint::spin_loop;
use std::os::fd::{BorrowedFd, RawFd};
use std::time::{Duration, Instant};

use pyo3::exceptions::PyTimeoutError;
use pyo3::prelude::*;
use shmlink::{Error, ErrorKind};
use shmlink_sys::{poll_fd_once, Interest};

use crate::options::Spin;

/// Longest sleep between two looks at Python's pending signals.
const SLICE: Duration = Duration::from_millis(50);

/// How a Python object's calls wait (`settimeout` / `setblocking`).
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) enum Mode {
    /// Wait as long as it takes (`settimeout(None)`, the default).
    Blocking,
    /// Never wait: raise `BlockingIOError` (`settimeout(0)`, `setblocking(False)`).
    NonBlocking,
    /// Wait at most this long, then raise `TimeoutError`.
    Timeout(Duration),
}

impl Mode {
    /// The mode `settimeout(value)` asks for.
    pub(crate) fn from_timeout(value: Option<f64>) -> PyResult<Mode> {
        Ok(match value {
            None => Mode::Blocking,
            Some(0.0) => Mode::NonBlocking,
            Some(t) => Mode::Timeout(crate::options::seconds("timeout", t)?),
        })
    }

    /// What `gettimeout()` returns.
    pub(crate) fn timeout(self) -> Option<f64> {
        match self {
            Mode::Blocking => None,
            Mode::NonBlocking => Some(0.0),
            Mode::Timeout(d) => Some(d.as_secs_f64()),
        }
    }
}

/// Whether a result says "try again later".
fn would_block<T>(r: &shmlink::Result<T>) -> bool {
    matches!(r, Err(e) if e.kind() == ErrorKind::WouldBlock)
}

/// What one `poll` ended with.
enum Polled {
    /// The fd is readable, or the time is up: retry.
    Retry,
    /// A signal arrived: give Python a chance to handle it.
    Interrupted,
}

/// Sleeps until `fd` is readable, `until` passes, or a signal arrives.
fn poll_readable(fd: RawFd, until: Instant) -> std::io::Result<Polled> {
    // SAFETY: the fd of a connection or subscriber the caller holds (and keeps open
    // across the call); it is only polled.
    let fd = unsafe { BorrowedFd::borrow_raw(fd) };
    match poll_fd_once(fd, Interest::READABLE, Some(until)) {
        Ok(_) => Ok(Polled::Retry),
        Err(e) if e.kind() == std::io::ErrorKind::Interrupted => Ok(Polled::Interrupted),
        Err(e) => Err(e),
    }
}

/// Finishes a call whose first, non-blocking try (`first`, made by the caller with the
/// GIL held) said `WouldBlock`: in `mode`, retries `attempt` (a non-blocking try) with
/// the GIL released until it gives anything but `WouldBlock`, and returns that.
/// `Err` is a Python exception of the wait itself: `TimeoutError` after the timeout,
/// or whatever a signal handler raised (`KeyboardInterrupt`).
pub(crate) fn finish<T: Send>(
    py: Python<'_>,
    first: shmlink::Result<T>,
    fd: RawFd,
    mode: Mode,
    spin: Spin,
    what: &str,
    mut attempt: impl FnMut() -> shmlink::Result<T> + Send,
) -> PyResult<shmlink::Result<T>> {
    if !would_block(&first) {
        return Ok(first);
    }
    let deadline = match mode {
        Mode::NonBlocking => return Ok(first),
        Mode::Blocking => None,
        Mode::Timeout(d) => Some(Instant::now() + d),
    };
    let cap = |t: Instant| deadline.map_or(t, |d| d.min(t));
    if !(spin.spin.is_zero() && spin.yield_.is_zero()) {
        let got = py.allow_threads(|| {
            let start = Instant::now();
            let spin_end = cap(start + spin.spin);
            let yield_end = cap(start + spin.spin + spin.yield_);
            loop {
                let r = attempt();
                if !would_block(&r) {
                    return Some(r);
                }
                let now = Instant::now();
                if now >= yield_end {
                    return None;
                }
                if now < spin_end {
                    for _ in 0..16 {
                        spin_loop();
                    }
                } else {
                    std::thread::yield_now();
                }
            }
        });
        if let Some(r) = got {
            return Ok(r);
        }
    }
    loop {
        if deadline.is_some_and(|d| Instant::now() >= d) {
            return Err(PyTimeoutError::new_err((
                libc::ETIMEDOUT,
                format!("{what} timed out"),
            )));
        }
        let got = py.allow_threads(|| {
            let slice_end = cap(Instant::now() + SLICE);
            loop {
                match poll_readable(fd, slice_end) {
                    Ok(Polled::Retry) => {}
                    Ok(Polled::Interrupted) => return None,
                    Err(e) => {
                        return Some(Err(Error::new(
                            ErrorKind::Other,
                            format!("{what}: poll: {e}"),
                        )))
                    }
                }
                let r = attempt();
                if !would_block(&r) {
                    return Some(r);
                }
                if Instant::now() >= slice_end {
                    return None;
                }
            }
        });
        if let Some(r) = got {
            return Ok(r);
        }
        py.check_signals()?;
    }
}
