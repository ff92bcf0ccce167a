//! What the serving commands (`pong --server`, `recv`) share around a listener: the
//! accept loop, waiting for the listener between non-blocking accepts, and which accept
//! errors concern one client only.

use std::os::fd::{BorrowedFd, RawFd};
use std::time::{Duration, Instant};

use shmlink::{Connection, ErrorKind, Listener};
use shmlink_sys::{poll_fd, Interest};

use crate::error::in_cli_terms;
use crate::stop::DropOnStop;

/// The next client of the non-blocking `listener` (`fd` its fd, `addr` its address), for
/// the command `cmd`: between attempts it waits for the listener ([`wait_readable`]); an
/// error that concerns one client ([`per_client`]) is said and passed over if
/// `serve_on`, any other is returned. Once a signal has taken the listener, it parks
/// for good: the signal thread exits the process.
pub fn next_client(
    listener: &DropOnStop<Listener>,
    fd: RawFd,
    cmd: &str,
    addr: &str,
    serve_on: bool,
) -> shmlink::Result<Connection> {
    loop {
        let accepted = listener.lock().as_mut().map(|l| l.accept());
        match accepted {
            None => loop {
                std::thread::park();
            },
            Some(Ok(c)) => return Ok(c),
            Some(Err(e)) if e.kind() == ErrorKind::WouldBlock => wait_readable(fd),
            Some(Err(e)) if serve_on && per_client(e.kind()) => {
                eprintln!(
                    "shmlink {cmd}: accept on {addr}: {}",
                    in_cli_terms(&e.to_string())
                );
            }
            Some(Err(e)) => return Err(e),
        }
    }
}

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
