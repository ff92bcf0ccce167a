//! What the serving commands (`pong --server`, `recv`) share around a listener: waiting
//! for it between non-blocking accepts, and which accept errors concern one client only.

use std::os::fd::{BorrowedFd, RawFd};
use std::time::{Duration, Instant};

use shmlink::ErrorKind;
use shmlink_sys::{poll_fd, Interest};

/// Waits until the listener's `fd` is readable (or reports an error, or was closed by
/// the signal thread), or a second passed: a blocking `accept` also woke at the
/// handshake deadlines of clients that went silent, to drop them; a second bounds how
/// long they wait for that here.
pub fn wait_readable(fd: RawFd) {
    // SAFETY: only polled, never closed or read through; if the signal thread closed the
    // listener meanwhile, poll reports the number as invalid and returns at once.
    let fd = unsafe { BorrowedFd::borrow_raw(fd) };
    let _ = poll_fd(
        fd,
        Interest::READABLE,
        Some(Instant::now() + Duration::from_secs(1)),
    );
}

/// Accept errors that concern one client, after which the listener serves on.
pub fn per_client(kind: ErrorKind) -> bool {
    matches!(
        kind,
        ErrorKind::ConnectionRefused
            | ErrorKind::ConnectionReset
            | ErrorKind::TimedOut
            | ErrorKind::ProtocolViolation
            | ErrorKind::VersionMismatch
            | ErrorKind::PermissionDenied
    )
}
