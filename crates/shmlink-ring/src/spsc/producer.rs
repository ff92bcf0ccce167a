//! [`Producer`]: the writing end of a ring: reserve room, write the payload in place,
//! publish its header (and `tail`), wake a consumer that announced sleep.

use std::ptr::NonNull;

use super::layout::{prefetch_write, RingRef, LINE, PREFETCH_AHEAD};
use super::message::{
    header_word, record_size, stamped, ALIGN, FLAGS_MASK, FLAG_SKIP, HEADER, RESTART_MIN,
};
use super::notify::{announce, take_waiter, withdraw, FenceMode};
#[cfg(doc)]
use super::WakeGroup;
use crate::error::{Result, Violation};
use crate::sync::Ordering;

/// The writing end of a ring.
pub struct Producer {
    pub(super) ring: RingRef,
    pub(super) mode: FenceMode,
    /// Our position; the shared `tail` only ever receives this value.
    pub(super) tail: u64,
    /// The consumer's position as last read and validated.
    pub(super) cached_head: u64,
    /// The consumer's announcement count we last woke it for.
    pub(super) woken: u64,
    /// The last value stored to the shared `tail` ([`Producer::publish`]); below `tail`
    /// while records written with [`Producer::write`] await their publication.
    published: u64,
    /// The tail from which records check whether the ring is empty and restart it: half
    /// a ring into the current or next lap (never on a ring below twice [`RESTART_MIN`]).
    next_restart: u64,
    /// What [`Producer::sent`] was last told: the position of the other direction's
    /// consumer.
    rx_at_send: u64,
    /// Whether [`Producer::sent`] expects the next record to follow at once (a stream's,
    /// a pipeline's answer): [`Producer::clear_slot`] then always zeroes.
    zero_ahead: bool,
}

impl Producer {
    /// The producer of a fresh (all-zero) ring.
    pub fn new(ring: RingRef, mode: FenceMode) -> Producer {
        Producer {
            ring,
            mode,
            tail: 0,
            cached_head: 0,
            woken: 0,
            published: 0,
            next_restart: if ring.cap >= 2 * RESTART_MIN {
                ring.cap as u64 / 2
            } else {
                u64::MAX
            },
            rx_at_send: u64::MAX,
            zero_ahead: false,
        }
    }

    /// The ring.
    #[inline]
    pub fn ring(&self) -> &RingRef {
        &self.ring
    }

    /// Free bytes for a record according to the cached head: the ring less what is
    /// unread and less the next record's header slot, which every commit zeroes.
    #[inline(always)]
    fn free(&self) -> usize {
        (self.ring.cap - HEADER).saturating_sub((self.tail - self.cached_head) as usize)
    }

    /// Reloads and validates the consumer's position (only when the cached one says
    /// full: off the fast path).
    #[cold]
    #[inline(never)]
    fn refresh_head(&mut self) -> Result<()> {
        // SYNC POINT (data): Acquire pairs with the Release store in `Consumer::advance`:
        // the consumer has finished reading every byte before `head`, so we may reuse it.
        let head = self.ring.cons().head.0.load(Ordering::Acquire);
        if head < self.cached_head || head > self.tail || head % ALIGN as u64 != 0 {
            return Err(Violation::new(format!(
                "ring head {head} invalid (previous {}, tail {})",
                self.cached_head, self.tail
            )));
        }
        self.cached_head = head;
        Ok(())
    }

    /// Whether the consumer has yet to take some of the records published so far
    /// (reloads its position). For a peer that is gone: did it leave data unread?
    pub fn unconsumed(&mut self) -> Result<bool> {
        self.refresh_head()?;
        Ok(self.cached_head != self.tail)
    }

    /// Calls `f` with the payload and flags of every record the consumer has not taken
    /// yet (from its published position to ours, published or only written), in order;
    /// skip records are passed over. For a peer that is gone, or that asked to have them
    /// sent again another way. Our own records, in our own memory: a header that is not
    /// the one we wrote is a violation all the same.
    pub fn for_each_unconsumed(&mut self, mut f: impl FnMut(&[u8], u32)) -> Result<()> {
        self.refresh_head()?;
        let mut pos = self.cached_head;
        while pos < self.tail {
            let word = self.ring.load_header(pos);
            let len = (word & 0xffff_ffff) as usize;
            let flags = ((word & FLAGS_MASK) >> 32) as u32;
            let size = record_size(len);
            if !stamped(word, pos) || size > self.ring.cap - HEADER || pos + size as u64 > self.tail
            {
                return Err(Violation::new(format!(
                    "own record at {pos} unreadable (header {word:#x}, tail {})",
                    self.tail
                )));
            }
            if flags != FLAG_SKIP {
                // SAFETY: a record of ours (at most half the ring, or a skip, which is not
                // read) starting below cap lies in the 2*cap mapped bytes; only this
                // producer writes it, and not while we read (`&mut self`).
                let payload = unsafe {
                    std::slice::from_raw_parts(self.ring.at(pos).add(HEADER).as_ptr(), len)
                };
                f(payload, flags);
            }
            pos += size as u64;
        }
        Ok(())
    }

    /// Whether `need` bytes are free, reloading the head if the cache says no.
    #[inline(always)]
    pub fn has_room(&mut self, need: usize) -> Result<bool> {
        if self.free() >= need {
            return Ok(true);
        }
        self.refresh_head()?;
        Ok(self.free() >= need)
    }

    /// Where the payload of a record with `len` bytes goes, if there is room for it.
    /// `record_size(len)` must not exceed [`RingRef::max_record`].
    #[inline(always)]
    pub fn try_reserve(&mut self, len: usize) -> Result<Option<NonNull<u8>>> {
        debug_assert!(record_size(len) <= self.ring.max_record());
        if record_size(len) >= RESTART_MIN.max(self.ring.cap / 16) {
            self.restart_if_empty(record_size(len))?;
        } else if self.tail >= self.next_restart {
            self.restart_lap(record_size(len))?;
        }
        if !self.has_room(record_size(len))? {
            return Ok(None);
        }
        // SAFETY: the header starts below `cap` and the record is at most cap/2 bytes, so
        // it lies within the 2*cap mapped bytes.
        Ok(Some(unsafe { self.ring.at(self.tail).add(HEADER) }))
    }

    /// [`try_reserve`](Producer::try_reserve) without its restart at the ring's start: for
    /// the fragments of a split message, which the sender restarts as a whole before the
    /// first ([`restart_if_empty`](Producer::restart_if_empty) with all their sizes) or
    /// not at all. A restart per fragment would put the next fragment at the ring's
    /// start even when the message's rest does not fit before the skipped space: a ring
    /// of 256 KiB with 64 KiB fragments then could not take a 200 KiB message at once,
    /// and a sender that receives on the same thread waited forever.
    #[inline(always)]
    pub fn try_reserve_in_turn(&mut self, len: usize) -> Result<Option<NonNull<u8>>> {
        debug_assert!(record_size(len) <= self.ring.max_record());
        if !self.has_room(record_size(len))? {
            return Ok(None);
        }
        // SAFETY: as in `try_reserve`.
        Ok(Some(unsafe { self.ring.at(self.tail).add(HEADER) }))
    }

    /// The tail is half a ring or more into its lap (or has left the lap it was in):
    /// traffic that never fills the ring (round trips, paced messages) goes back to its
    /// start, so it keeps to half the ring and a record instead of touching every page
    /// and cache line of it in turn. Only when the skip (the lap's rest) leaves room for
    /// the largest record behind this one, so that what fitted behind one record on an
    /// empty ring still does; the check reads the consumer's `head`, once per lap.
    #[cold]
    #[inline(never)]
    fn restart_lap(&mut self, size: usize) -> Result<()> {
        let cap = self.ring.cap as u64;
        let half = (self.tail & !(cap - 1)) + cap / 2;
        if self.tail >= half {
            if self.tail - half < (HEADER + size) as u64 {
                return Ok(()); // Not far enough for this record: the next one looks.
            }
            self.restart_if_empty(size)?;
        }
        // Half a ring into the lap the tail is in now, or else into the next one.
        let half = (self.tail & !(cap - 1)) + cap / 2;
        self.next_restart = if half > self.tail { half } else { half + cap };
        Ok(())
    }

    /// Before a large record of `size` bytes (or records: the fragments of a message, in
    /// all): if the ring is empty and they fit at its start, writes a skip record
    /// ([`FLAG_SKIP`]) to the end of the ring, so they land at the start, where the
    /// previous ones did. The skip is published with the next record (by `commit`'s
    /// `tail`: no wake-up of its own, which would use up the consumer's announcement); a
    /// consumer that finds its header first passes over it. [`try_reserve`] does this
    /// itself for a record of at least [`RESTART_MIN`] and a sixteenth of the ring.
    ///
    /// [`try_reserve`]: Producer::try_reserve
    #[cold]
    pub fn restart_if_empty(&mut self, size: usize) -> Result<()> {
        let off = self.tail as usize & (self.ring.cap - 1);
        // The skip (cap - off bytes), the record and the next header slot must fit.
        if off == 0 || off < size + HEADER {
            return Ok(());
        }
        if self.tail != self.cached_head {
            self.refresh_head()?;
            if self.tail != self.cached_head {
                return Ok(());
            }
        }
        let skip = (self.ring.cap - off) as u64;
        self.clear_slot(self.tail, skip);
        // SYNC POINT (data): Release pairs with the Acquire in `Consumer::peek` (the
        // cleared slot first, as in `commit`).
        self.ring.store_header(
            self.tail,
            header_word(self.tail, skip as usize - HEADER, FLAG_SKIP),
            Ordering::Release,
        );
        self.tail += skip;
        Ok(())
    }

    /// Publishes the record reserved by the last successful [`try_reserve`] with `len`
    /// payload bytes (the same `len`) and `flags`. Returns whether the consumer announced
    /// sleep and must be woken. [`write`] then [`publish`], in one call.
    ///
    /// [`try_reserve`]: Producer::try_reserve
    /// [`write`]: Producer::write
    /// [`publish`]: Producer::publish
    #[inline(always)]
    pub fn commit(&mut self, len: usize, flags: u32) -> bool {
        self.write(len, flags);
        self.publish()
    }

    /// Writes the header of the record reserved by the last successful [`try_reserve`]
    /// (`len` payload bytes, the same `len`, and `flags`) without publishing `tail`: a
    /// consumer that is reading finds the record by its header, but one that sleeps or is
    /// about to is neither woken nor told (its re-check reads `tail`). Several records
    /// written this way are published together by one [`publish`]: one store of `tail`
    /// and one full fence for all of them. The caller must [`publish`] before it waits
    /// for anything (room included) and when the batch ends.
    ///
    /// [`try_reserve`]: Producer::try_reserve
    /// [`publish`]: Producer::publish
    #[inline(always)]
    pub fn write(&mut self, len: usize, flags: u32) {
        let size = record_size(len) as u64;
        // `try_reserve` kept the next record's header slot free (`free` leaves HEADER
        // bytes for it).
        self.clear_slot(self.tail, size);
        // SYNC POINT (data): Release pairs with the Acquire in `Consumer::peek`: the
        // payload and the cleared slot are visible before the header is.
        self.ring.store_header(
            self.tail,
            header_word(self.tail, len, flags),
            Ordering::Release,
        );
        self.tail += size;
    }

    /// Makes the free header slot after the record of `size` bytes at `start` read
    /// "nothing yet" before a header published after this call says the record ends
    /// there: a consumer that takes that record never takes stale bytes in the slot (an
    /// earlier lap's header, or payload that looks like one) for the next. Only a word
    /// [`stamped`] for the slot's position could be taken for one, and the slot is in our
    /// own memory, which no one else writes (a peer that writes it anyway misleads only
    /// its own reading): so behind a record of whole lines, the slot is read first and
    /// zeroed only if it holds such a word. A store there would take the line from the
    /// consumer, which polls it next (and asks for it with the line before,
    /// `Consumer::poll`), and the header's store waited for it: round trips of 56 B (a
    /// record of one line) 0.46 µs p50 with the store, 0.38 without; 120 B 0.56 and 0.42
    /// (docs/benchmarks.md). Zeroed anyway: a slot inside a line the record ends in (the
    /// line is ours by now) or behind a record that starts inside one (other sizes were
    /// not measured faster, and a 64 B zero-copy window slower), and whenever
    /// [`sent`](Producer::sent) expects the next record to follow at once (a stream's, a
    /// pipeline's answer), where the store takes that record's line ahead of it (a 56 B
    /// stream 12 M msg/s with the read, 17 with the store).
    #[inline(always)]
    fn clear_slot(&self, start: u64, size: u64) {
        let pos = start + size;
        if self.zero_ahead || (start | size) % LINE != 0 || stamped(self.ring.load_header(pos), pos)
        {
            self.ring.store_header(pos, 0, Ordering::Relaxed);
        }
    }

    /// After a record, for a producer whose end also consumes the other direction of the
    /// connection: `rx_at` is that consumer's position now, `rx_waited` whether it had to
    /// wait for data since the previous record. A record sent with nothing received since
    /// the previous one is a stream's, and the line 512 bytes past the tail, which the
    /// next records will fill, is asked for in a writable state now, so that the stores
    /// to it do not wait for the consumer's core to give it up. A record that follows a
    /// received message is likely a round trip's answer, where the request cost the round
    /// trip (64 B: 0.55 against 0.50 µs p50, docs/benchmarks.md). When that message was
    /// waited for, the next record is not expected soon either, and only then may its
    /// header slot go unwritten (`clear_slot`); behind an answer to a message that was
    /// found waiting (a pipeline's), the next one follows at once, and the slot's zero
    /// takes its line ahead of it.
    #[inline(always)]
    pub fn sent(&mut self, rx_at: u64, rx_waited: bool) {
        let stream = rx_at == self.rx_at_send;
        if stream {
            self.prefetch_ahead();
        }
        self.zero_ahead = stream || !rx_waited;
        self.rx_at_send = rx_at;
    }

    #[inline(always)]
    fn prefetch_ahead(&self) {
        // `at` + the distance stays inside the double mapping (PREFETCH_AHEAD < cap).
        prefetch_write(
            self.ring
                .at(self.tail)
                .as_ptr()
                .wrapping_add(PREFETCH_AHEAD),
        );
    }

    /// Publishes every record written since the last publication (one store of `tail`,
    /// one full fence). Returns whether the consumer announced sleep and must be woken;
    /// `false` at once, without a fence, if nothing was written since.
    #[inline(always)]
    pub fn publish(&mut self) -> bool {
        if self.published == self.tail {
            return false;
        }
        self.published = self.tail;
        // SYNC POINT (data): Release pairs with the Acquire load in `Consumer::refresh_tail`
        // (the consumer reads `tail` only before it sleeps: this line stays ours).
        self.ring.prod().tail.0.store(self.tail, Ordering::Release);
        // SYNC POINT (notify): the wake-up protocol orders this `tail` store (which covers
        // every record written before it) against the consumer's announcement.
        take_waiter(&self.ring.cons().waiting.0, &mut self.woken, self.mode)
    }

    /// Announces that the producer will sleep until `need` bytes are free, then checks
    /// again. `Ok(true)`: room appeared, do not sleep (the announcement is withdrawn; a
    /// doorbell rung before that may still come); also when the asymmetric fence failed,
    /// where sleeping could miss the wake-up (check the room again instead).
    pub fn arm(&mut self, need: usize) -> Result<bool> {
        debug_assert!(
            self.published == self.tail,
            "publish written records before waiting for room"
        );
        if !announce(&self.ring.prod().waiting.0, self.mode) {
            return Ok(true);
        }
        self.refresh_head()?;
        let room = self.free() >= need;
        if room {
            self.withdraw();
        }
        Ok(room)
    }

    /// Withdraws the producer's standing announcement (it no longer sleeps on it): the
    /// consumer rings no doorbell for it. Only for a producer that checks the ring again
    /// before it sleeps (with a new [`arm`](Producer::arm)). A doorbell the consumer rang
    /// before it saw this may still arrive.
    pub fn withdraw(&mut self) {
        withdraw(&self.ring.prod().waiting.0);
    }

    /// The consumer announcement this producer last decided to wake (what
    /// [`commit`](Producer::commit)/[`publish`](Producer::publish)/[`close`](Producer::close)
    /// returning `true` was for): the value a [`WakeGroup`] decides on.
    pub fn woken(&self) -> u64 {
        self.woken
    }

    /// Marks the end of the stream after the last record. Returns whether the consumer
    /// must be woken.
    pub fn close(&mut self) -> bool {
        // Records written and not yet published go out with the mark (the fence below
        // follows both stores).
        if self.published != self.tail {
            self.published = self.tail;
            // SYNC POINT (data): as in `publish`.
            self.ring.prod().tail.0.store(self.tail, Ordering::Release);
        }
        // SYNC POINT (close): Release pairs with the Acquire in `Consumer::peer_closed`:
        // a consumer that sees `closed` also sees every record published before it.
        self.ring.prod().closed.0.store(1, Ordering::Release);
        take_waiter(&self.ring.cons().waiting.0, &mut self.woken, self.mode)
    }
}
