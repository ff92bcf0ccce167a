//! The doorbell pipes of a `shm:` connection (handshake feature `FEATURE_PIPE_BELL`,
//! docs/design.md §4.4): one pipe per direction, whose only write end the ringing side
//! holds. A blocking wait sleeps in one `read` of its pipe — the pipe's own cost per
//! wake-up, cheaper than a `recv` on the control socket — and that `read` returns
//! end-of-file when the peer's process is gone, as the socket does.
//!
//! The listener makes both pipes and sends the client its three ends with the answer
//! (`Accept`/`Upgraded`, after the segment's memfd): the read end it sleeps on, the
//! write end it rings, and a read end of that same pipe (the guard: a writer holding a
//! read end never gets SIGPIPE or EPIPE, whatever the peer did with its own). The
//! listener closes its copy of the write end it gave away, so that end is the client's
//! alone.

use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd, RawFd};

use super::handshake::FEATURE_PIPE_BELL;
use crate::error::{Error, Result};
use crate::sys::pipe::{self, End};

/// One side's doorbell pipes.
pub(crate) struct PipeBell {
    /// The read end this side sleeps on; the peer holds the only write end.
    sleep: OwnedFd,
    /// The write end of the peer's pipe (non-blocking): a byte wakes the peer's sleep.
    ring: OwnedFd,
    /// A read end of the peer's pipe, only held: see the module's documentation.
    guard: OwnedFd,
}

/// The write end the listener made for the client, until the answer carries it.
pub(crate) struct ClientRing(OwnedFd);

impl ClientRing {
    /// The write end.
    pub(crate) fn fd(&self) -> BorrowedFd<'_> {
        self.0.as_fd()
    }
}

impl PipeBell {
    /// The listener's side: makes both pipes; returns ours and the client's write end,
    /// which must be dropped once [`PipeBell::client_fds`] went out with the answer.
    pub(crate) fn for_listener() -> io::Result<(PipeBell, ClientRing)> {
        // To the client: it sleeps on `c_sleep`, we ring `s_ring`.
        let (c_sleep, s_ring) = pipe::doorbell()?;
        // To us: we sleep on `s_sleep`, the client rings `c_ring`.
        let (s_sleep, c_ring) = pipe::doorbell()?;
        // Our guard is the client's sleeping end itself: we keep it after sending it.
        let bell = PipeBell {
            sleep: s_sleep,
            ring: s_ring,
            guard: c_sleep,
        };
        Ok((bell, ClientRing(c_ring)))
    }

    /// The descriptors the answer carries after the memfd, in the order
    /// [`PipeBell::from_listener`] takes them: the client's read end to sleep on, its
    /// write end to ring, and its guard (our own sleeping end).
    pub(crate) fn client_fds(&self, ring: &ClientRing) -> [RawFd; 3] {
        [
            self.guard.as_raw_fd(),
            ring.0.as_raw_fd(),
            self.sleep.as_raw_fd(),
        ]
    }

    /// The client's side: checks the three descriptors the listener's answer carried
    /// (after the memfd). A listener that sends anything else is a protocol violation.
    pub(crate) fn from_listener(fds: Vec<OwnedFd>) -> Result<PipeBell> {
        let bad = |why: String| Error::violation(format!("listener's doorbell pipes: {why}"));
        let [sleep, ring, guard] = <[OwnedFd; 3]>::try_from(fds)
            .map_err(|fds| bad(format!("{} descriptors, expected 3", fds.len())))?;
        let check = |fd: &OwnedFd, end: End, what: &str| {
            pipe::check_end(fd.as_fd(), end).map_err(|e| bad(format!("{what}: {e}")))
        };
        let ours = check(&sleep, End::Read, "the read end to sleep on")?.id;
        let ring_end = check(&ring, End::Write, "the write end to ring")?;
        let theirs = ring_end.id;
        if check(&guard, End::Read, "the guard")?.id != theirs {
            return Err(bad("the guard is not a read end of the pipe we ring".into()));
        }
        if ours == theirs {
            return Err(bad("one pipe for both directions".into()));
        }
        // Whatever the listener did with the flags: ringing never blocks. (Sleeping
        // copes with a non-blocking read end: `ShmConn::sleep` then polls.)
        pipe::set_nonblocking_with(ring.as_fd(), ring_end.flags)
            .map_err(|e| Error::io("doorbell pipe: O_NONBLOCK", e))?;
        Ok(PipeBell { sleep, ring, guard })
    }

    /// The read end this side sleeps on.
    pub(crate) fn sleep_fd(&self) -> BorrowedFd<'_> {
        self.sleep.as_fd()
    }

    /// The peer's doorbell.
    pub(crate) fn ring_fd(&self) -> BorrowedFd<'_> {
        self.ring.as_fd()
    }
}

/// Whether a side whose connection's socket is `sock` keeps room for doorbell pipes
/// (docs/design.md §4.4, "descriptor budget"): they cost three descriptors per side and
/// connection, which a process with thousands of idle connections cannot all hold (10,000
/// connections would need 40,000 on the listener's side). A side offers (the client) or
/// grants (the listener) the pipes only while the socket's number, the lowest descriptor
/// that was free, is below half the soft limit on open files; past that its connections
/// keep the socket alone, the wake-up path of a peer without the feature. The number is at
/// most the count of open descriptors, so the half left over is never taken by pipes.
pub(crate) fn pipes_fit(sock: BorrowedFd<'_>) -> bool {
    match crate::sys::process::fd_limit() {
        Ok(limit) => (sock.as_raw_fd() as u64).saturating_add(3) < limit / 2,
        Err(_) => true,
    }
}

/// Splits the descriptors of the listener's answer: the memfd, then the doorbell pipes
/// when the answer kept [`FEATURE_PIPE_BELL`] (and nothing else otherwise).
pub(crate) fn answer_fds(fds: Vec<OwnedFd>, features: u64) -> Result<(OwnedFd, Option<PipeBell>)> {
    let want = if features & FEATURE_PIPE_BELL != 0 {
        4
    } else {
        1
    };
    if fds.len() != want {
        return Err(Error::violation(format!(
            "accept carried {} descriptors, expected {want}",
            fds.len()
        )));
    }
    let mut fds = fds.into_iter();
    let memfd = fds.next().expect("checked: at least one");
    let bell = match want {
        1 => None,
        _ => Some(PipeBell::from_listener(fds.collect())?),
    };
    Ok((memfd, bell))
}
