//! `ShmConn`'s receiving side: a record read in place, a split message reassembled (or
//! copied fragment by fragment straight into the caller's buffer) with the ring's checks,
//! waiting for data (with extra patience after large messages), the peer's end.

use std::time::Duration;

use super::{fragment_payload, unsplit_max, Bell, Current, ShmConn};
use crate::error::{Error, ErrorKind, Result};
use crate::notify::spin_then_yield;
use crate::options::WaitPolicy;
use crate::ring::{first_total, Reassembly, Record, TOTAL_LEN};
use crate::sys;
use crate::transport::shm::segment::Wait;

/// Bytes taken between two waits for data from which a waiting receiver polls longer
/// (the size where large records restart at the ring's start).
const LARGE_TAKEN: u64 = crate::ring::RESTART_MIN as u64;
/// The longest extra polling [`large_message_patience`] grants.
const MAX_PATIENCE: Duration = Duration::from_millis(1);

/// How much longer than its policy's spin and yield phases a blocking receive that took
/// `taken` bytes since its previous wait polls (yielding) before it sleeps: half a
/// nanosecond per byte (the time a peer needs to write, or check and answer, a message of
/// that size at about 2 GB/s), at most [`MAX_PATIENCE`], none below [`LARGE_TAKEN`] or
/// under a policy that never polls. A peer producing a 1 MiB record takes longer than the
/// default 50 µs budget, and a receiver that slept would pay a wake-up per message on
/// top of it (docs/benchmarks.md, "Large messages"); after the extra time it sleeps as
/// before, so an idle connection still costs nothing.
fn large_message_patience(policy: &WaitPolicy, taken: u64) -> Duration {
    if taken < LARGE_TAKEN || (policy.spin.is_zero() && policy.yield_.is_zero()) {
        return Duration::ZERO;
    }
    Duration::from_nanos(taken / 2).min(MAX_PATIENCE)
}

impl ShmConn {
    /// Publishes the `head` that lazy consumption held back (before any wait for data).
    #[inline]
    pub(super) fn flush_rx(&mut self) {
        if self.rx.flush() {
            self.doorbell(Bell::Room);
        }
    }

    /// At the end of a split message: publishes the `head` that a small last fragment
    /// held back, so that the sender of the next large message finds the ring empty (and
    /// splits it from the ring's start) even if we have not waited again by then; measured
    /// one in three round trips otherwise (docs/benchmarks.md).
    #[inline]
    fn flush_rx_after_split(&mut self) {
        self.flush_rx();
    }

    /// Takes one fragment of a split message; returns the message length once complete.
    /// The bytes are copied out of the ring once, straight into the reassembly buffer
    /// (the peer may be writing them: only lengths and flags the ring validated, and the
    /// copied total, decide anything; the checks are the ring's, `Reassembly`).
    fn take_fragment(&mut self, rec: Record) -> Result<Option<usize>> {
        // SAFETY: `peek` returned `rec` and it is not consumed.
        let done = unsafe { self.reasm.take(&rec, self.max_recv) }?;
        if self.rx.consume(rec.size()) {
            self.doorbell(Bell::Room);
        }
        if done.is_some() {
            self.flush_rx_after_split();
            self.current = Current::Reassembled;
        }
        Ok(done)
    }

    /// Waits until the receive ring has a record; reports end-of-stream or reset once the
    /// peer is gone and everything it sent has been read.
    fn wait_data(&mut self, blocking: bool) -> Result<()> {
        self.rx_waited = true;
        // What we consumed and held back goes out before waiting: the producer may be
        // waiting for that room; and a batch's records, which the peer may be waiting
        // for before it answers.
        self.flush_rx();
        self.publish_tx();
        let taken = self.rx.position().wrapping_sub(self.rx_mark);
        self.rx_mark = self.rx.position();
        if blocking {
            let mut policy = self.policy();
            policy.yield_ += large_message_patience(&policy, taken);
            let rx = &mut self.rx;
            if spin_then_yield(&policy, || Ok(rx.poll()?))? {
                return Ok(());
            }
        }
        self.drain_stale(blocking, Bell::Data)?;
        loop {
            // A graceful close sets the ring's closed flag and rings the doorbell before
            // the control socket closes: either one ends the wait.
            if self.peer_eof || self.rx.peer_closed() {
                return self.end_of_data();
            }
            let on_pipe = self.place(Wait::Data, blocking);
            let armed = match self.wait_token {
                Some(token) if !blocking => self.rx.arm_token(token)?,
                _ => self.rx.arm()?,
            };
            if armed {
                // A doorbell on the pipe is taken by the next sleep there.
                self.stale_doorbell |= !on_pipe;
                return Ok(());
            }
            if !blocking {
                self.rx_waiting = true;
                return Err(Error::would_block());
            }
            self.sleep(on_pipe)?;
            if self.rx.has_data()? {
                return Ok(());
            }
        }
    }

    /// The largest message a peer running this code never splits through the receive
    /// ring (a hostile one may split anything: `recv_next` handles that too).
    #[inline]
    fn rx_unsplit_max(&self) -> usize {
        unsplit_max(fragment_payload(self.rx.ring()))
    }

    /// Whether `recv_next` would return at once: a record waits, something unusual
    /// (a current message, a broken ring, the peer's end) needs the slow path, or the
    /// peer closed. Reads shared memory only: no announcement, no system call.
    #[inline]
    pub(crate) fn recv_hint(&mut self) -> bool {
        if self.broken.is_some() || !matches!(self.current, Current::None) || self.peer_eof {
            return true;
        }
        self.rx.has_data().unwrap_or(true) || self.rx.peer_closed()
    }

    /// Withdraws the wait a non-blocking receive announced (it returned `WouldBlock`):
    /// the peer rings no doorbell for it. A doorbell rung before the peer saw this may
    /// still come and is drained as a stale one.
    pub(crate) fn withdraw_wait(&mut self) {
        if self.rx_waiting {
            self.rx.withdraw();
            self.stale_doorbell = true;
        }
    }

    /// The peer is gone: what it sent is still delivered, then end-of-stream if it closed
    /// gracefully, a reset if it did not.
    fn end_of_data(&mut self) -> Result<()> {
        // `closed` first: seeing it guarantees seeing every record before it.
        let closed = self.rx.peer_closed();
        if self.rx.has_data()? {
            return Ok(());
        }
        Err(if closed && !self.reasm.in_progress() {
            Error::eos()
        } else {
            self.peer_gone()
        })
    }

    /// Everything `recv_next` does beyond taking a waiting record: the current message,
    /// split messages, waiting, errors.
    #[cold]
    #[inline(never)]
    pub(super) fn recv_next_slow(&mut self, blocking: bool) -> Result<usize> {
        self.check_broken()?;
        match self.current {
            Current::InPlace { len, .. } => return Ok(len),
            Current::Reassembled => return Ok(self.reasm.message().len()),
            Current::None => {}
        }
        // A split message accepted in non-blocking mode moves on whenever we are called.
        if !self.pending.is_empty() {
            match self.flush_pending(false) {
                Err(e) if e.kind() != ErrorKind::WouldBlock => return Err(e),
                _ => {}
            }
        }
        loop {
            let rec = match self.rx.peek() {
                Ok(Some(rec)) => {
                    self.rx_waiting = false;
                    rec
                }
                Ok(None) => match self.wait_data(blocking) {
                    Ok(()) => continue,
                    Err(e) => return Err(self.fail(e)),
                },
                Err(e) => return Err(self.fail(e)),
            };
            if rec.is_skip() {
                // Padding before a large record that restarted at the ring's start.
                if self.rx.consume(rec.size()) {
                    self.doorbell(Bell::Room);
                }
                continue;
            }
            if !self.reasm.in_progress() && rec.flags == 0 {
                if rec.len > self.max_recv {
                    let e = Error::violation(format!(
                        "{}: message of {} bytes exceeds our maximum of {}",
                        self.peer, rec.len, self.max_recv
                    ));
                    return Err(self.fail(e));
                }
                self.current = Current::InPlace {
                    ptr: rec.ptr,
                    len: rec.len,
                };
                return Ok(rec.len);
            }
            match self.take_fragment(rec) {
                Ok(Some(n)) => return Ok(n),
                Ok(None) => {}
                Err(e) => return Err(self.fail(e)),
            }
        }
    }

    /// A split message, fragment by fragment, straight into `buf` (blocking only: a
    /// non-blocking receive could stop between fragments, and `buf` cannot hold a
    /// half-received message until the next call). `Ok(None)` before anything is taken:
    /// not a split message, something unusual going on, or one larger than `buf` (which
    /// `recv_next` then reassembles, so it stays queued for `recv_vec`).
    #[inline(never)]
    pub(super) fn recv_split_into(&mut self, buf: &mut [u8]) -> Result<Option<usize>> {
        if !self.pending.is_empty() || buf.len() <= self.rx_unsplit_max() {
            return Ok(None);
        }
        let first = match self.rx.peek() {
            Ok(Some(rec)) if rec.is_skip() => {
                // Padding before a first fragment that restarted at the ring's start.
                if self.rx.consume(rec.size()) {
                    self.doorbell(Bell::Room);
                }
                return self.recv_split_into(buf);
            }
            Ok(Some(rec)) => rec,
            Ok(None) => {
                self.wait_data(true).map_err(|e| self.fail(e))?;
                return self.recv_split_into(buf);
            }
            Err(e) => return Err(self.fail(e)),
        };
        // SAFETY: `peek` returned `first` and it is not consumed.
        let Some(total) = (unsafe { first_total(&first) }) else {
            return Ok(None); // not a split message, or one `take_fragment` reports
        };
        let first_len = (first.len - TOTAL_LEN) as u64;
        if total > self.max_recv as u64 || total <= first_len || total > buf.len() as u64 {
            return Ok(None); // `recv_next` reports it, or reassembles it for `recv_vec`
        }
        self.rx_waiting = false;
        // The checks of the sequence are the ring's; with `buf`'s length as the maximum,
        // every piece lies in `buf` whatever the peer writes meanwhile (`accept` reads the
        // total again and checks it anew).
        let max = self.max_recv.min(buf.len());
        let mut state = Reassembly::new();
        let mut rec = first;
        loop {
            // SAFETY: `peek` returned `rec` and it is not consumed.
            let piece = match unsafe { state.accept(&rec, max) } {
                Ok(piece) => piece,
                Err(e) => return Err(self.fail(e)),
            };
            // SAFETY: `src..src + len` lies in the validated payload and
            // `buf[at..at + len]` in the caller's buffer (at + len <= total <= max <=
            // buf.len()).
            unsafe {
                sys::copy_shared(
                    buf.as_mut_ptr().add(piece.at),
                    piece.src.as_ptr(),
                    piece.len,
                )
            };
            if self.rx.consume(rec.size()) {
                self.doorbell(Bell::Room);
            }
            if piece.last {
                self.flush_rx_after_split();
                return Ok(Some(piece.total));
            }
            // The next fragment (passing over skip records), waiting for it.
            rec = loop {
                match self.rx.peek() {
                    Ok(Some(r)) if r.is_skip() => {
                        if self.rx.consume(r.size()) {
                            self.doorbell(Bell::Room);
                        }
                    }
                    // `accept` checks its flags.
                    Ok(Some(r)) => break r,
                    Ok(None) => {
                        // A peer gone mid-message is a reset (`end_of_data`), never EOS.
                        if let Err(e) = self.wait_data(true) {
                            let e = if e.kind() == ErrorKind::EndOfStream {
                                self.peer_gone()
                            } else {
                                e
                            };
                            return Err(self.fail(e));
                        }
                    }
                    Err(e) => return Err(self.fail(e)),
                }
            };
        }
    }
}
