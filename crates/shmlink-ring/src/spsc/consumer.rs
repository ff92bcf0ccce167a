//! [`Consumer`]: the reading end of a ring: find the next record by its header (or by
//! `tail` behind a batching producer), validate it, consume it, publish `head` (lazily if
//! asked), wake a producer that announced sleep.

use super::layout::{prefetch_read, RingRef, LINE, PREFETCH_AHEAD};
use super::message::{
    record_size, stamped, Record, ALIGN, FLAGS_MASK, FLAG_SKIP, HEADER, KNOWN_FLAGS,
};
use super::notify::{announce, announce_token, take_waiter, withdraw, FenceMode};
#[cfg(doc)]
use super::{WakeGroup, SHARED_TOKEN};
use crate::error::{Result, Violation};
use crate::sync::Ordering;

/// The reading end of a ring.
pub struct Consumer {
    pub(super) ring: RingRef,
    mode: FenceMode,
    /// Our position; the shared `head` only ever receives this value.
    pub(super) head: u64,
    /// The producer's position as last read and validated.
    cached_tail: u64,
    /// The producer's announcement count we last woke it for.
    woken: u64,
    /// The last value stored to the shared `head`; below `head` while records taken with
    /// [`Consumer::consume`] await their publication.
    published: u64,
    /// [`Consumer::consume`] publishes once this many bytes were taken unpublished (0:
    /// every time, as [`Consumer::advance`]).
    lazy: u64,
    /// Whether the last `tail` read revealed more than [`BATCH_SEEN`] bytes beyond
    /// `head`: the producer publishes in batches (or we fell behind). Past the records
    /// that read revealed, [`Consumer::peek`] then reads `tail` before the next header:
    /// the records of a batch are taken once the batch is published, while the producer
    /// fills the next one, instead of one by one as their headers appear, chasing the
    /// producer through the very lines it is writing (measured: 31-35 against 47-50 M
    /// msg/s for 64 B records in batches of 64, docs/benchmarks.md, round 3). After a
    /// small step (a producer publishing each record) the header comes first, as before.
    by_tail: bool,
}

/// A `tail` that moves by more than this many bytes past `head` at once says the producer
/// publishes in batches ([`Consumer::peek`]); one record of up to 500 bytes at a time
/// does not.
const BATCH_SEEN: u64 = PREFETCH_AHEAD as u64;

impl Consumer {
    /// The consumer of a fresh (all-zero) ring.
    pub fn new(ring: RingRef, mode: FenceMode) -> Consumer {
        Consumer {
            ring,
            mode,
            head: 0,
            cached_tail: 0,
            woken: 0,
            published: 0,
            lazy: 0,
            by_tail: false,
        }
    }

    /// Our position: bytes taken from the ring since it was created (skip records and
    /// headers included).
    #[inline]
    pub fn position(&self) -> u64 {
        self.head
    }

    /// Lets [`Consumer::consume`] hold back the publication of `head` until `bytes`
    /// bytes were taken (capped at half the ring; 0, the default, publishes every
    /// time). The producer then sees up to that much less room than there is, while the
    /// consumer still has records to read: it publishes whenever it finds the ring empty
    /// ([`Consumer::flush`] before it waits).
    pub fn set_lazy_head(&mut self, bytes: usize) {
        self.lazy = bytes.min(self.ring.cap / 2) as u64;
    }

    /// The ring.
    #[inline]
    pub fn ring(&self) -> &RingRef {
        &self.ring
    }

    /// Reloads and validates the producer's position. The header protocol lets the
    /// consumer run ahead of the `tail` it last read, and even of the one it reads now
    /// (the producer stores a record's header before its tail), so `tail` may lie below
    /// `head`; it never decreases and is never more than a ring ahead.
    #[inline]
    fn refresh_tail(&mut self) -> Result<()> {
        // SYNC POINT (data): Acquire pairs with the Release store in `Producer::commit`:
        // every record before `tail` is completely written.
        let tail = self.ring.prod().tail.0.load(Ordering::Acquire);
        if tail < self.cached_tail
            || tail > self.head + self.ring.cap as u64
            || tail % ALIGN as u64 != 0
        {
            return Err(Violation::new(format!(
                "ring tail {tail} invalid (previous {}, head {}, capacity {})",
                self.cached_tail, self.head, self.ring.cap
            )));
        }
        if tail > self.head && tail > self.cached_tail {
            self.by_tail = tail - self.head > BATCH_SEEN;
        } else if self.head > tail {
            // Records found by their headers run ahead of the published `tail`: the
            // producer publishes in batches (a consumer that polls headers, `poll`,
            // never sees `tail` jump). A producer publishing each record has its `tail`
            // out by the time we look (or a record's step switches back, above).
            self.by_tail = true;
        }
        self.cached_tail = tail;
        Ok(())
    }

    /// Whether a record is available, by the producer's `tail` (reloaded when the cached
    /// one says empty): what a consumer checks before it sleeps. A busy-polling consumer
    /// polls with [`Consumer::poll`] (the header while it follows headers).
    #[inline]
    pub fn has_data(&mut self) -> Result<bool> {
        self.has_data_by_tail()
    }

    /// Whether a record is available, for a consumer that busy-polls: the header at
    /// `head` when it follows headers (the line it polls is the line the record arrives
    /// in, so the record costs one line transfer, not a `tail` line and then the
    /// record's), else `tail` as [`Consumer::has_data`]. A `false` here proves nothing
    /// about `tail`: before it sleeps, a consumer checks with [`Consumer::arm`].
    #[inline]
    pub fn poll(&mut self) -> Result<bool> {
        if self.following_tail() || self.head < self.cached_tail {
            return self.has_data_by_tail();
        }
        // SYNC POINT (data): `load_header` is an Acquire load pairing with the Release
        // store of the header in `Producer::commit` (as in `peek`).
        if stamped(self.ring.load_header(self.head), self.head) {
            return Ok(true);
        }
        // Not there yet. A small record's payload runs into the line after its header's:
        // ask for that line on every look, so that when the record arrives both lines
        // are fetched at once, not the second only after the header was seen. `at` + one
        // line stays inside the double mapping.
        prefetch_read(
            self.ring
                .at(self.head | (LINE - 1))
                .as_ptr()
                .wrapping_add(1),
        );
        Ok(false)
    }

    /// Whether the producer's `tail` says a record is available (also the check after an
    /// announcement: the wake-up protocol orders `tail`, see the module's docs). A
    /// published tail beyond `head` with no header there is a violation.
    fn has_data_by_tail(&mut self) -> Result<bool> {
        if self.head >= self.cached_tail {
            self.refresh_tail()?;
        }
        if self.head >= self.cached_tail {
            return Ok(false);
        }
        if !stamped(self.ring.load_header(self.head), self.head) {
            return self.no_header();
        }
        Ok(true)
    }

    /// No header at `head`: nothing to read, unless a `tail` read earlier says the
    /// producer published a record there.
    #[cold]
    fn no_header(&self) -> Result<bool> {
        if self.head < self.cached_tail {
            return Err(Violation::new(format!(
                "no record header at {} (tail {})",
                self.head, self.cached_tail
            )));
        }
        Ok(false)
    }

    /// The next record, validated, or `None` if the ring is empty. The header at `head`
    /// is looked at first (the consumer reads its line next anyway): while the consumer
    /// is behind, records are found without touching the producer's `tail` line. Past the
    /// records a `tail` read revealed, after one that revealed a batch, `tail` is read
    /// first (see `by_tail`).
    #[inline]
    pub fn peek(&mut self) -> Result<Option<Record>> {
        // Past the last `tail` read, a producer that publishes in batches is best followed
        // by `tail` (see `by_tail`). Loom: always the tail first (the data area is plain
        // memory there, see loom_model.rs).
        if (cfg!(loom) || (self.following_tail() && self.head >= self.cached_tail))
            && !self.has_data_by_tail()?
        {
            return Ok(None);
        }
        // Read the header once into a local; everything below uses the local copy.
        let mut word = self.ring.load_header(self.head);
        if !stamped(word, self.head) {
            if !self.has_data_by_tail()? {
                return Ok(None);
            }
            // `has_data_by_tail` found the header stamped; a peer may change it, so read
            // it once more into the local and check again.
            word = self.ring.load_header(self.head);
            if !stamped(word, self.head) {
                return self.no_header().map(|_| None);
            }
        }
        let len = (word & 0xffff_ffff) as usize;
        let flags = ((word & FLAGS_MASK) >> 32) as u32;
        // A record is at most half the ring (`RingRef::max_record`), so one starting below
        // cap lies inside the 2*cap mapped bytes whatever the peer wrote; a skip record
        // ends exactly at the end of the ring (and is never read).
        let bad = if flags == FLAG_SKIP {
            (self.head as usize + record_size(len)) % self.ring.cap != 0
                || record_size(len) > self.ring.cap - HEADER
        } else {
            record_size(len) > self.ring.max_record()
        };
        if bad {
            return Err(Violation::new(format!(
                "bad record header at {}: length {len}, flags {flags:#x}, ring of {} bytes",
                self.head, self.ring.cap
            )));
        }
        debug_assert!(flags & !KNOWN_FLAGS == 0);
        Ok(Some(Record {
            // SAFETY: the record (≤ cap/2 bytes from a start below cap) lies in the 2*cap
            // mapped bytes.
            ptr: unsafe { self.ring.at(self.head).add(HEADER) },
            len,
            flags,
        }))
    }

    /// Consumes `bytes` (the size of the record(s) just read) and publishes the new
    /// `head`. Returns whether the producer announced sleep and must be woken.
    #[inline]
    pub fn advance(&mut self, bytes: usize) -> bool {
        self.take(bytes);
        self.publish()
    }

    /// Consumes `bytes` like [`Consumer::advance`], but publishes `head` (a store and a
    /// full fence) only once [`Consumer::set_lazy_head`]'s amount was taken since the last
    /// publication. The caller must [`Consumer::flush`] before it waits for data (and
    /// before [`Consumer::arm`]). Returns whether the producer must be woken.
    ///
    /// Only while it follows a producer that publishes in batches (see `by_tail`): one
    /// that publishes each record gets each `head` at once (holding it back measured
    /// slower there, 27-32 against 38-40 M msg/s for 64 B records; in batches of 64 it
    /// measured 90 against 13-15 M msg/s: the producer that waits for room no longer
    /// takes the `head` line from the consumer on every record).
    #[inline]
    pub fn consume(&mut self, bytes: usize) -> bool {
        self.take(bytes);
        if self.head - self.published < self.lazy && self.following_tail() {
            return false;
        }
        self.publish()
    }

    /// Whether the consumer follows `tail` rather than headers (`by_tail`; always under
    /// loom, whose models find records by `tail`).
    #[inline(always)]
    fn following_tail(&self) -> bool {
        cfg!(loom) || self.by_tail
    }

    /// Publishes what [`Consumer::consume`] held back, if anything. Returns whether the
    /// producer must be woken.
    #[inline]
    pub fn flush(&mut self) -> bool {
        if self.published == self.head {
            return false;
        }
        self.publish()
    }

    #[inline(always)]
    fn take(&mut self, bytes: usize) {
        self.head += bytes as u64;
        if self.cached_tail > self.head + PREFETCH_AHEAD as u64 {
            // Published records further on: fetch them while this one is handled.
            prefetch_read(
                self.ring
                    .at(self.head)
                    .as_ptr()
                    .wrapping_add(PREFETCH_AHEAD),
            );
        }
    }

    #[inline(always)]
    fn publish(&mut self) -> bool {
        self.published = self.head;
        // SYNC POINT (data): Release pairs with the Acquire load in `Producer::refresh_head`.
        self.ring.cons().head.0.store(self.head, Ordering::Release);
        // SYNC POINT (notify): the wake-up protocol orders this `head` store against the
        // producer's announcement; a `head` held back by `consume` is not stored, so it
        // needs no fence until `flush` or a later `consume` stores it.
        take_waiter(&self.ring.prod().waiting.0, &mut self.woken, self.mode)
    }

    /// Announces that the consumer will sleep until data arrives, then checks again.
    /// `Ok(true)`: data appeared, do not sleep (the announcement is withdrawn; a doorbell
    /// rung before that may still come); also when the asymmetric fence failed, where
    /// sleeping could miss the wake-up (peek again instead).
    pub fn arm(&mut self) -> Result<bool> {
        debug_assert!(
            self.published == self.head,
            "flush consumed records before waiting for data"
        );
        if !announce(&self.ring.cons().waiting.0, self.mode) {
            return Ok(true);
        }
        // SYNC POINT (notify): the re-check reads `tail`, the position the producer
        // stores before its fence in `commit` (the header alone is not ordered by it).
        let data = self.has_data_by_tail()?;
        if data {
            self.withdraw();
        }
        Ok(data)
    }

    /// [`arm`](Consumer::arm) with a shared wait token (a value the caller's process never
    /// used before, with the same token on every ring one wait sleeps on; see
    /// [`WakeGroup`]): the announcement is the token, with [`SHARED_TOKEN`], when it is
    /// above this ring's last announcement, else the next count.
    pub fn arm_token(&mut self, token: u64) -> Result<bool> {
        debug_assert!(
            self.published == self.head,
            "flush consumed records before waiting for data"
        );
        if !announce_token(&self.ring.cons().waiting.0, token, self.mode) {
            return Ok(true);
        }
        // SYNC POINT (notify): as in `arm`.
        let data = self.has_data_by_tail()?;
        if data {
            self.withdraw();
        }
        Ok(data)
    }

    /// Withdraws the consumer's standing announcement (it no longer sleeps on it): the
    /// producer rings no doorbell for it. Only for a consumer that checks the ring again
    /// before it sleeps (with a new [`arm`](Consumer::arm)). A doorbell the producer rang
    /// before it saw this may still arrive.
    pub fn withdraw(&mut self) {
        withdraw(&self.ring.cons().waiting.0);
    }

    /// Whether the producer marked the end of the stream. Check [`Consumer::has_data`]
    /// after this returns `true`: records published before the mark are still readable.
    pub fn peer_closed(&self) -> bool {
        // SYNC POINT (close): Acquire pairs with the Release in `Producer::close`.
        self.ring.prod().closed.0.load(Ordering::Acquire) != 0
    }
}
