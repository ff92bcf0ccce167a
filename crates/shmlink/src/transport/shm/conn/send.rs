//! `ShmConn`'s sending side: room in the ring (waiting for it per policy), one record
//! per message, or the ring's fragments for a large one (the rest of one accepted in
//! non-blocking mode waits in `pending`), batches, and a blocking close's linger.

use std::mem;
use std::os::fd::AsFd;
use std::ptr::NonNull;
use std::time::Instant;

use super::{
    fragment_payload, pipeline_fragment, run_ahead, Bell, Reservation, ShmConn, SPLIT_MIN,
};
use crate::error::{Error, ErrorKind, Result};
use crate::notify::spin_then_yield;
use crate::ring::{record_size, split_size, Fragment, RESTART_MIN};
use crate::sys::{self, poll_fd};
use crate::transport::shm::segment::Wait;
use crate::transport::CLOSE_LINGER;

impl ShmConn {
    /// Room for a record with `len` payload bytes: waits per policy when blocking,
    /// `Ok(None)` when non-blocking and full (the fd will signal when to retry).
    #[inline(always)]
    pub(super) fn room(&mut self, len: usize, blocking: bool) -> Result<Option<NonNull<u8>>> {
        if let Ok(Some(p)) = self.tx.try_reserve(len) {
            self.tx_waiting = false;
            return Ok(Some(p));
        }
        self.wait_room(len, 0, blocking, false)
    }

    /// [`room`](Self::room) for a whole message copied in, within [`run_ahead`] of the
    /// receiver for a record of at least `RESTART_MIN` where `copy_ahead` says so:
    /// `keep_free` more bytes than the record must be free, so that at most the ring's
    /// size less `keep_free` is in use once it is written.
    #[inline]
    fn room_ahead(&mut self, len: usize, blocking: bool) -> Result<Option<NonNull<u8>>> {
        let record = record_size(len);
        let bounded = self.copy_ahead && record >= RESTART_MIN;
        let keep_free = match bounded {
            true => self.tx.ring().capacity().saturating_sub(run_ahead(record)),
            false => 0,
        };
        if keep_free == 0 {
            return self.room(len, blocking);
        }
        if let Ok(true) = self.tx.has_room(record + keep_free) {
            if let Ok(Some(p)) = self.tx.try_reserve(len) {
                self.tx_waiting = false;
                return Ok(Some(p));
            }
        }
        self.wait_room(len, keep_free, blocking, false)
    }

    /// [`room`](Self::room) for a fragment: never restarted at the ring's start on its
    /// own (`Producer::try_reserve_in_turn`).
    #[inline]
    fn fragment_room(&mut self, len: usize, blocking: bool) -> Result<Option<NonNull<u8>>> {
        if let Ok(Some(p)) = self.tx.try_reserve_in_turn(len) {
            self.tx_waiting = false;
            return Ok(Some(p));
        }
        self.wait_room(len, 0, blocking, true)
    }

    /// `keep_free`: bytes that must be free besides the record's; `in_turn`: reserve
    /// with `Producer::try_reserve_in_turn`.
    #[cold]
    #[inline(never)]
    fn wait_room(
        &mut self,
        len: usize,
        keep_free: usize,
        blocking: bool,
        in_turn: bool,
    ) -> Result<Option<NonNull<u8>>> {
        let need = record_size(len) + keep_free;
        // A batch's records go out before waiting: the consumer may be asleep.
        self.publish_tx();
        let mut spun = false;
        self.drain_stale(blocking, Bell::Room)?;
        loop {
            let reserved = match self.tx.has_room(need) {
                Ok(false) => Ok(None),
                Ok(true) if in_turn => self.tx.try_reserve_in_turn(len),
                Ok(true) => self.tx.try_reserve(len),
                Err(e) => Err(e),
            };
            match reserved {
                Ok(Some(p)) => {
                    self.tx_waiting = false;
                    return Ok(Some(p));
                }
                Ok(None) => {}
                Err(e) => return Err(self.fail(e)),
            }
            if self.peer_eof {
                return Err(self.peer_gone());
            }
            if blocking && !spun {
                spun = true;
                let policy = self.policy();
                let tx = &mut self.tx;
                match spin_then_yield(&policy, || Ok(tx.has_room(need)?)) {
                    Ok(true) => continue,
                    Ok(false) => {}
                    Err(e) => return Err(self.fail(e)),
                }
            }
            let on_pipe = self.place(Wait::Room, blocking);
            match self.tx.arm(need) {
                Ok(true) => {
                    // A doorbell on the pipe is taken by the next sleep there.
                    self.stale_doorbell |= !on_pipe;
                    continue;
                }
                Ok(false) => {}
                Err(e) => return Err(self.fail(e)),
            }
            if !blocking {
                self.tx_waiting = true;
                return Ok(None);
            }
            self.sleep(on_pipe)?;
        }
    }

    /// Writes one whole message as a record (no flag) at `dst`, reserved by `room`.
    #[inline]
    fn write_record(&mut self, dst: NonNull<u8>, body: &[u8]) {
        // SAFETY: `room` reserved `body.len()` bytes at `dst`, in our own segment (the peer
        // maps it read-only); the ring never overlaps `body`.
        unsafe { sys::copy_to_shared(dst.as_ptr(), body.as_ptr(), body.len()) };
        self.commit_record(body.len(), 0);
    }

    /// [`write_record`](Self::write_record) for a large message: the copy is
    /// `copy_shared`'s, which stays fast where `memcpy`'s `rep movsb` is twenty times
    /// slower (the record 1 to 63 bytes after the caller's buffer modulo 4 KiB,
    /// docs/design.md §3.2).
    fn write_large_record(&mut self, dst: NonNull<u8>, body: &[u8]) {
        // SAFETY: as in `write_record`.
        unsafe { sys::copy_shared(dst.as_ptr(), body.as_ptr(), body.len()) };
        self.commit_record(body.len(), 0);
    }

    /// Publishes the record just written, or only writes its header inside a batch.
    #[inline(always)]
    pub(super) fn commit_record(&mut self, len: usize, flags: u32) {
        if self.batching {
            self.tx.write(len, flags);
        } else if self.tx.commit(len, flags) {
            self.doorbell(Bell::Data);
        }
        self.tx
            .sent(self.rx.position(), mem::take(&mut self.rx_waited));
    }

    /// Publishes the records a batch wrote so far (one `tail` store and one fence).
    #[inline]
    pub(super) fn publish_tx(&mut self) {
        if self.tx.publish() {
            self.doorbell(Bell::Data);
        }
    }

    /// Sends `data` as fragments; `total` is set for the start of a message (its first
    /// fragment carries the length). Returns how many bytes of `data` went out; fewer
    /// than all only in non-blocking mode.
    /// `frag_payload` is the records' largest payload.
    fn write_fragments(
        &mut self,
        data: &[u8],
        mut total: Option<usize>,
        frag_payload: usize,
        blocking: bool,
    ) -> Result<usize> {
        let mut pos = 0;
        while pos < data.len() {
            let frag = Fragment::next(total.is_some(), data.len() - pos, frag_payload);
            let Some(dst) = self.fragment_room(frag.len(), blocking)? else {
                return Ok(pos);
            };
            // SAFETY: `room` reserved `frag.len()` bytes at `dst`, in our own segment (the
            // peer maps it read-only, and reads the record only once it is committed).
            unsafe { frag.write(dst, total.take().unwrap_or(0), &data[pos..pos + frag.chunk]) };
            self.commit_record(frag.len(), frag.flags);
            pos += frag.chunk;
        }
        Ok(pos)
    }

    /// Sends one message of any size. A split message that the ring cannot take whole in
    /// non-blocking mode is accepted: its rest waits in `pending`. A message shorter than
    /// any ring's fragment is one record: one comparison with a constant on the path of
    /// small messages, the rest out of line (64 B streams measured 5 % slower with the
    /// split decision on this path, docs/benchmarks.md).
    #[inline]
    pub(super) fn send_message(&mut self, msg: &[u8], blocking: bool) -> Result<()> {
        if msg.len() < SPLIT_MIN {
            self.send_whole(msg, blocking)
        } else {
            self.send_large(msg, blocking)
        }
    }

    #[inline(always)]
    fn send_whole(&mut self, msg: &[u8], blocking: bool) -> Result<()> {
        let Some(dst) = self.room(msg.len(), blocking)? else {
            return Err(Error::would_block());
        };
        self.write_record(dst, msg);
        Ok(())
    }

    /// A message of at least [`SPLIT_MIN`] bytes. One that fits one record goes whole if
    /// it is too short for two pipeline fragments (`pipeline_fragment`), the receiver is
    /// behind or we are in a batch (published at its end). Otherwise it is split: in
    /// full fragments when it does not fit one record, and on an empty ring (the receiver
    /// has taken everything and waits for it) in `pipeline_fragment`'s equal parts, so
    /// that the receiver copies one fragment while we write the next instead of waiting
    /// for the whole message; the fragments then restart at the ring's start when they
    /// all fit there, so a blocking send into the empty ring never waits (docs/design.md
    /// §3.2).
    #[inline(never)]
    fn send_large(&mut self, msg: &[u8], blocking: bool) -> Result<()> {
        let mut frag = fragment_payload(self.tx.ring());
        if record_size(msg.len()) <= self.tx.ring().max_record() {
            let pipelined = pipeline_fragment(msg.len(), self.tx.ring());
            let whole = pipelined.is_none()
                || self.batching
                || match self.tx.unconsumed() {
                    Ok(behind) => behind,
                    Err(e) => return Err(self.fail(e)),
                };
            match pipelined {
                Some(piece) if !whole => frag = piece,
                _ => {
                    let Some(dst) = self.room_ahead(msg.len(), blocking)? else {
                        return Err(Error::would_block());
                    };
                    self.write_large_record(dst, msg);
                    return Ok(());
                }
            }
            if let Err(e) = self.tx.restart_if_empty(split_size(msg.len(), frag)) {
                return Err(self.fail(e));
            }
        }
        let sent = self.write_fragments(msg, Some(msg.len()), frag, blocking)?;
        if sent == 0 {
            return Err(Error::would_block());
        }
        debug_assert!(self.pending.is_empty());
        self.pending.extend_from_slice(&msg[sent..]);
        self.pending_pos = 0;
        Ok(())
    }

    /// Pushes out the rest of a split message accepted earlier.
    #[inline]
    pub(super) fn flush_pending(&mut self, blocking: bool) -> Result<()> {
        if self.pending.is_empty() {
            return Ok(());
        }
        self.flush_pending_slow(blocking)
    }

    #[cold]
    #[inline(never)]
    fn flush_pending_slow(&mut self, blocking: bool) -> Result<()> {
        let data = mem::take(&mut self.pending);
        let frag = fragment_payload(self.tx.ring());
        let sent = self.write_fragments(&data[self.pending_pos..], None, frag, blocking);
        self.pending = data;
        self.pending_pos += sent?;
        if self.pending_pos < self.pending.len() {
            return Err(Error::would_block());
        }
        self.pending.clear();
        self.pending_pos = 0;
        Ok(())
    }

    /// A blocking close's delivery of the rest of a split message accepted in non-blocking
    /// mode: waits for the peer as long as it takes some of it, and fails with
    /// [`ErrorKind::TimedOut`] once it has taken nothing for [`CLOSE_LINGER`]. A peer that
    /// stays connected but never reads must not hold `close` forever.
    #[cold]
    pub(super) fn linger(&mut self) -> Result<()> {
        let mut deadline = Instant::now() + CLOSE_LINGER;
        loop {
            let before = self.pending_pos;
            match self.flush_pending(false) {
                Err(e) if e.kind() == ErrorKind::WouldBlock => {}
                done => return done,
            }
            let now = Instant::now();
            if self.pending_pos != before {
                deadline = now + CLOSE_LINGER;
            } else if now >= deadline {
                return Err(Error::new(
                    ErrorKind::TimedOut,
                    format!(
                        "{}: close: the peer took nothing for {CLOSE_LINGER:?}; {} bytes of a \
                         split message were not delivered",
                        self.peer,
                        self.pending.len().saturating_sub(self.pending_pos)
                    ),
                ));
            }
            // The failed reservation armed the peer's doorbell for the room we need: sleep
            // until it rings, the peer goes away (EOF), or the deadline. The next
            // `flush_pending` drains what woke us.
            poll_fd(self.sock.as_fd(), sys::Interest::READABLE, Some(deadline))
                .map_err(|e| Error::io(format!("{}: close: poll", self.peer), e))?;
        }
    }

    /// Whether a reservation of `n` bytes is written in place in the ring (else it is
    /// staged, and a non-blocking commit of it can fail with `WouldBlock`).
    #[inline]
    pub(crate) fn fits_in_place(&self, n: usize) -> bool {
        record_size(n) <= self.tx.ring().max_record()
    }

    /// See [`crate::shm::ShmControl::unconsumed_sent`].
    pub(crate) fn unconsumed_sent(&mut self) -> Option<Vec<u8>> {
        if !self.pending.is_empty() || !matches!(self.reservation, Reservation::None) {
            return None;
        }
        let mut out = Vec::new();
        let mut whole = true;
        self.tx
            .for_each_unconsumed(|payload, flags| {
                whole &= flags == 0;
                out.extend_from_slice(payload);
            })
            .ok()?;
        whole.then_some(out)
    }

    /// Whether the peer has yet to take some of what we sent (the tx ring holds records
    /// it did not consume). A broken ring counts as unread.
    pub(crate) fn peer_unread(&mut self) -> bool {
        self.tx.unconsumed().unwrap_or(true)
    }
}
