//! `ShmConn`'s doorbells and sleep (docs/design.md §4.4): ringing the peer where it
//! sleeps (pipe or control socket), taking and draining doorbells without stealing the
//! other direction's cue, the wait policy, and sleeping until a doorbell comes.

use std::io;
use std::os::fd::AsFd;
use std::time::Duration;

use super::{Bell, ShmConn};
use crate::error::{Error, Result};
use crate::notify::{self, Doorbell};
use crate::options::WaitPolicy;
use crate::sys::{self, pipe, poll_fd, socket};
use crate::transport::shm::segment::{Place, Wait};

impl ShmConn {
    /// Rings the peer's doorbell where the peer said it sleeps for that wait: a byte in its
    /// pipe, or one packet on the control socket, whose byte says which of its
    /// directions may progress ([`Bell`]).
    #[cold]
    pub(super) fn doorbell(&mut self, bell: Bell) {
        if bell == Bell::Data {
            if let Some(group) = &self.wake_group {
                // The peer sleeps on this token on several connections at once, and a
                // doorbell for it went out on one of them: it looks at this ring too
                // before it sleeps again (`WakeGroup`).
                if !group.claim(self.tx.woken()) {
                    return;
                }
            }
        }
        if let Some(pipes) = &self.bell {
            // After the fence that loaded the peer's announcement, which the peer made
            // after storing its place (`ShmConn::place`).
            if self.seg.peer_place(bell.wait()) == Place::Pipe {
                // A full pipe already holds doorbells the peer has not taken; we hold a
                // read end of it (the guard), so a dead peer is no error either.
                let _ = pipe::ring(pipes.ring_fd(), bell as u8);
                return;
            }
        }
        match socket::send(self.sock.as_fd(), &[bell as u8]) {
            // A full socket already holds doorbells the peer has not drained.
            Ok(_) => {}
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
            Err(_) => self.peer_eof = true,
        }
    }

    /// Takes one doorbell off the control socket, noticing EOF; `Ok(false)` if none was
    /// there. With `wait`, sleeps until one comes (or the peer is gone).
    fn take_doorbell(&mut self, wait: bool) -> Result<bool> {
        let sock = self.sock.as_fd();
        match notify::take_doorbell(sock, wait) {
            Ok(Doorbell::Gone) => self.peer_eof = true,
            Ok(Doorbell::Packet { len: 1, first })
                if first == Bell::Data as u8 || first == Bell::Room as u8 =>
            {
                return Ok(true)
            }
            Ok(Doorbell::Packet { len: n, .. }) => {
                // Not a doorbell (`recv` says a packet's real length): bytes written to
                // the peer's end of this socket past its library (transparent mode: a
                // raw `write` on a moved fd), or a peer's deliberate reset. Dropping
                // them would leave a silent hole in someone's stream: the connection
                // is broken instead, and every later call says so.
                let e = Error::violation(format!(
                    "{}: a {n}-byte packet on the control socket is not a doorbell",
                    self.peer
                ));
                return Err(self.fail(e));
            }
            // Only without `wait`, or if the socket could not be made blocking.
            Ok(Doorbell::None) if wait => {
                poll_fd(sock, sys::Interest::READABLE, None)
                    .map_err(|e| Error::io(format!("{}: poll", self.peer), e))?;
                return self.take_doorbell(false);
            }
            Ok(Doorbell::None) => {}
            Err(e) => return Err(Error::io(format!("{}: control socket", self.peer), e)),
        }
        Ok(false)
    }

    /// Drains the doorbells waiting on the control socket, so that the fd stops being
    /// readable before a non-blocking caller goes back to its event loop. The caller
    /// re-checks `own`'s direction after this; a doorbell for the other direction stops
    /// the drain while a caller still waits on that direction, because it is that
    /// caller's only cue: taking it would leave the fd quiet with work to do.
    fn drain(&mut self, own: Bell) -> Result<()> {
        let other_waits = match own {
            Bell::Data => self.tx_waiting,
            Bell::Room => self.rx_waiting,
        };
        // Bounded by `notify::drain`: a peer that keeps ringing cannot keep us here.
        notify::drain(|| {
            if other_waits && !self.may_take_next_doorbell(own) {
                return Ok(false);
            }
            self.take_doorbell(false)
        })
    }

    /// Whether the first packet on the control socket may be taken by a drain for `own`:
    /// `own`'s doorbell, a packet that is no doorbell, end-of-file or an error (which
    /// `take_doorbell` reports). `false` if there is none.
    fn may_take_next_doorbell(&self, own: Bell) -> bool {
        let mut buf = [0u8; 16];
        match socket::peek(self.sock.as_fd(), &mut buf) {
            Ok(0) => true,
            Ok(n) => n != 1 || buf[0] != own.other() as u8,
            Err(e) => e.kind() != io::ErrorKind::WouldBlock,
        }
    }

    /// The wait policy for this wait: without the spin phase when the peer last waited on
    /// our CPU (same-core placement), so it gets the CPU at once through `sched_yield`.
    pub(super) fn policy(&self) -> WaitPolicy {
        if self.seg.note_cpu(sys::current_cpu()) {
            WaitPolicy {
                spin: Duration::ZERO,
                yield_: self.wait.spin + self.wait.yield_,
            }
        } else {
            self.wait
        }
    }

    /// Before announcing: a non-blocking caller returns to its event loop, which must not
    /// see the fd readable for doorbells already dealt with; a blocking one must not wake
    /// at once for a doorbell nobody slept for. Each announcement brings at most one
    /// doorbell, so in blocking mode only a left-over one needs draining.
    pub(super) fn drain_stale(&mut self, blocking: bool, own: Bell) -> Result<()> {
        if !blocking || self.stale_doorbell {
            self.stale_doorbell = false;
            self.drain(own)?;
        }
        Ok(())
    }

    /// Says where the wait about to be announced for `wait` sleeps: on the doorbell pipe
    /// when the call blocks and the connection has pipes, else on the control socket
    /// (which event loops watch). Before the announcement (`Segment::set_place` fences).
    /// Returns whether it is the pipe.
    #[inline]
    pub(super) fn place(&mut self, wait: Wait, blocking: bool) -> bool {
        let pipe = blocking && self.bell.is_some();
        let place = if pipe { Place::Pipe } else { Place::Socket };
        self.seg.set_place(wait, place);
        pipe
    }

    /// Sleeps until a doorbell comes or the peer is gone, and takes that doorbell (a stale
    /// one costs one more round): on the control socket, one blocking `recv`; on the pipe
    /// (`on_pipe`), one blocking `read`, which takes every byte waiting there at once.
    #[cold]
    #[inline(never)]
    pub(super) fn sleep(&mut self, on_pipe: bool) -> Result<()> {
        match &self.bell {
            Some(pipes) if on_pipe => {
                let fd = pipes.sleep_fd();
                let mut buf = [0u8; 64];
                match pipe::read_wait(fd, &mut buf) {
                    // Every write end is closed: the peer's process is gone (or it
                    // closed the connection).
                    Ok(0) => self.peer_eof = true,
                    Ok(_) => {}
                    // Someone made the read end non-blocking (the peer shares it): wait
                    // for it to be readable; the caller looks again and reads.
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                        poll_fd(fd, sys::Interest::READABLE, None)
                            .map_err(|e| Error::io(format!("{}: poll", self.peer), e))?;
                    }
                    Err(e) => return Err(Error::io(format!("{}: doorbell pipe", self.peer), e)),
                }
                Ok(())
            }
            _ => self.take_doorbell(true).map(drop),
        }
    }
}
