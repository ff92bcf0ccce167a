//! The broadcast ring: one publisher writes each message once into a slot; every
//! subscriber reads it in place with its own cursor (docs/design.md §7, Shimmy's lock-free
//! channel). Pure shared-memory algorithms on raw memory, loom-testable; the segments,
//! the subscriber table and the sockets around it are the publisher's and subscriber's.
//!
//! # Memory
//!
//! - **Slots**: `n` (a power of two) fixed-size slots; message `pos` (0, 1, 2, …) lives in
//!   slot `pos % n`. A slot is a [`SlotHeader`] — a `stamp` and the payload length — and
//!   the payload. The stamp is a per-slot sequence number (a seqlock): `2 (pos + 1)` once
//!   message `pos` is complete, `2 (pos + 1) + 1` while it is being written, 0 before the
//!   first write. A reader that expects `pos` tells from the stamp alone whether the slot
//!   holds its message, an older one (nothing new yet) or a newer one (it was overwritten:
//!   the reader lagged).
//! - **[`TopicCtl`]**: `written` (messages ever published) and `closed` (graceful end),
//!   written only by the publisher.
//! - **[`CursorPage`]**: one per subscriber, shared between that subscriber and the
//!   publisher only: the subscriber's `cursor` (the next position it will read; every
//!   position before it is read or skipped), its wake-me flag, and the publisher's
//!   wait-for-you flag and detach mark.
//! - **[`BellPage`]**: one bit per subscriber slot, set by a subscriber when it arms its
//!   wake-me flag, so that the publisher finds the sleepers with one load instead of a
//!   scan of every cursor page. Only the subscriber sets and clears its bit; the
//!   publisher only reads the bits (and then takes the flags they point to). A publisher
//!   that cleared bits could erase a bit a subscriber set again after re-arming its flag
//!   (two locations, no order between them): a lost wake-up the loom model found.
//!
//! # Orderings
//!
//! - *Data*: the publisher writes payload and length, then stores the stamp with Release;
//!   a reader loads the stamp with Acquire ([`Ring::peek`]).
//! - *Seqlock*: before reusing a slot the publisher stores the busy stamp, then issues a
//!   Release fence, then writes the payload ([`Ring::begin`]); a reader copies the payload,
//!   issues an Acquire fence and loads the stamp again ([`Ring::intact`]). If any byte it
//!   copied came from the newer write, it sees the busy (or a later) stamp: a torn read is
//!   always detected, never delivered.
//! - *Reuse* (`block` policy): a subscriber stores its cursor with Release after reading;
//!   the publisher loads cursors with Acquire before it reuses a slot
//!   ([`CursorPage::load_cursor`]).
//! - *Wake-ups* (docs/design.md §7.5, both directions): the side about to sleep stores its flag,
//!   issues a SeqCst fence and checks again; the side making progress stores its progress,
//!   issues a SeqCst fence and reads the flag. Of two SeqCst fences one comes first, so at
//!   least one side sees the other's store: no lost wake-up. Only the sleeper sets a flag
//!   and only the waker clears it (swap), so one announcement costs at most one wake-up.
//! - *Doorbell rule* ([`Ring::take_sleeper`], [`LastRing`]): a subscriber can announce
//!   sleep again right after every message without reading anything, and each
//!   announcement used to cost the publisher a doorbell system call. The publisher now
//!   remembers, per subscriber, the cursor at its last doorbell if the message at that
//!   cursor was already published when it rang. While the cursor has not moved, that
//!   doorbell still wakes the subscriber to a message: it is either unread in its socket,
//!   or read, and then the subscriber's re-check after announcing (ordered after the
//!   read, a system call that follows the commit) finds the message and it does not
//!   sleep. So another doorbell is needed only once the cursor moved, or when the last
//!   one found nothing to read (the subscriber had read everything: a stale doorbell it
//!   may drain without moving). The cursor the rule reads after its fence is at least
//!   the one stored before the subscriber's fence when the subscriber's re-check missed
//!   the commit (the same pair of fences as the wake-up itself). A subscriber thus
//!   costs the publisher at most one doorbell per message it consumes (what an honest
//!   subscriber that sleeps between messages costs), plus the topic lock and a few
//!   loads per publish while its bit stays set. A skip leaves the
//!   announcement in place (only a flag taken is answered by a doorbell; a version that
//!   took it and then skipped lost a wake-up in the loom model), so the next publish
//!   looks again.
//!
//! # Hostile peers
//!
//! A subscriber maps the topic read-only, so nothing it does reaches the slots or
//! `TopicCtl`. What it may write — its own cursor page and the shared bell bits — the
//! publisher reads as hints and validates (cursors must move forward and stay at or
//! below `written`). A subscriber in turn validates everything it reads from the topic:
//! stamps must name a position of the right slot, lengths must not exceed the maximum.
//! Indices are always reduced modulo the slot count, so no value read can lead outside
//! the mapping.

use std::ptr::NonNull;

use crate::error::{Result, Violation};
use crate::sync::{fence, AtomicU32, AtomicU64, Ordering};
use crate::Line;

#[cfg(all(test, loom))]
mod loom_model;

/// Most subscribers a topic can have at once (the width of the bell bitmap).
pub const MAX_SUBSCRIBERS: usize = 128;
/// Words of the bell bitmap.
const BELL_WORDS: usize = MAX_SUBSCRIBERS / 64;

/// The highest message position a subscriber accepts from shared memory (2^62: more
/// than a century at a billion messages a second). Bounding positions keeps every
/// stamp computation (`done`, `busy`) and cursor increment free of overflow, whatever a
/// hostile publisher writes.
pub const MAX_POSITION: u64 = 1 << 62;

/// Most slots a topic may have.
pub const MAX_SLOTS: usize = 1 << 24;
/// Largest slot area (slots × slot size) a topic may have.
pub const MAX_TOPIC_BYTES: usize = 1 << 32;

/// The stamp of a slot that holds message `pos`, complete.
#[inline(always)]
pub const fn done(pos: u64) -> u64 {
    (pos + 1) << 1
}

/// The stamp of a slot while message `pos` is written into it.
#[inline(always)]
pub const fn busy(pos: u64) -> u64 {
    done(pos) | 1
}

/// The publisher's shared state in the topic segment. An all-zero block is a topic with
/// nothing published.
#[repr(C)]
pub struct TopicCtl {
    /// Messages ever published: positions `0..written` are (or were) complete.
    written: Line<AtomicU64>,
    /// Set after the last message: graceful end of the topic.
    closed: Line<AtomicU32>,
}

impl TopicCtl {
    /// Byte offset of `written`.
    pub const WRITTEN_OFFSET: usize = std::mem::offset_of!(TopicCtl, written);
    /// Byte offset of `closed`.
    pub const CLOSED_OFFSET: usize = std::mem::offset_of!(TopicCtl, closed);

    /// An empty control block (for tests and models).
    pub fn new() -> TopicCtl {
        TopicCtl {
            written: Line(AtomicU64::new(0)),
            closed: Line(AtomicU32::new(0)),
        }
    }
}

impl Default for TopicCtl {
    fn default() -> Self {
        TopicCtl::new()
    }
}

/// The header of one slot; the payload follows it.
#[repr(C)]
pub struct SlotHeader {
    /// [`done`] or [`busy`] of the position the slot holds; 0 before its first write.
    stamp: AtomicU64,
    /// Payload length of the message the stamp names.
    len: AtomicU32,
}

impl SlotHeader {
    /// An empty slot header (for tests and models).
    pub fn new() -> SlotHeader {
        SlotHeader {
            stamp: AtomicU64::new(0),
            len: AtomicU32::new(0),
        }
    }
}

impl Default for SlotHeader {
    fn default() -> Self {
        SlotHeader::new()
    }
}

/// Bytes between a slot's start and its payload.
pub const PAYLOAD_OFFSET: usize = std::mem::size_of::<SlotHeader>();

#[cfg(not(loom))]
const _: () = assert!(PAYLOAD_OFFSET == 16);

/// The fields of a cursor page the subscriber writes, on one line.
#[repr(C)]
pub struct Progress {
    /// Next position the subscriber reads; every position before it is read or skipped.
    cursor: AtomicU64,
    /// Messages the subscriber lost to overwriting, in total (statistics only).
    missed: AtomicU64,
}

/// The fields of a cursor page the publisher writes, on one line.
#[repr(C)]
pub struct Control {
    /// Non-zero once the publisher detached the subscriber (`block` policy: stalled).
    detached: AtomicU32,
}

/// The page one subscriber shares with the publisher (and nobody else).
#[repr(C)]
pub struct CursorPage {
    progress: Line<Progress>,
    /// Set by the subscriber before it sleeps waiting for a message; cleared by the
    /// publisher when it wakes it.
    sub_waiting: Line<AtomicU32>,
    /// Set by the publisher before it sleeps waiting for this subscriber to free a slot;
    /// cleared by the subscriber when it wakes it.
    pub_waiting: Line<AtomicU32>,
    control: Line<Control>,
}

impl CursorPage {
    /// Byte offset of the detach mark (for fuzzing).
    pub const DETACHED_OFFSET: usize = std::mem::offset_of!(CursorPage, control);

    /// A page with the cursor at `start` (for tests and models).
    #[cfg(test)]
    pub fn new(start: u64) -> CursorPage {
        CursorPage {
            progress: Line(Progress {
                cursor: AtomicU64::new(start),
                missed: AtomicU64::new(0),
            }),
            sub_waiting: Line(AtomicU32::new(0)),
            pub_waiting: Line(AtomicU32::new(0)),
            control: Line(Control {
                detached: AtomicU32::new(0),
            }),
        }
    }

    /// Publisher, before sharing the page: the subscriber starts at `start`, and counts
    /// as asleep, so that the first message rings its doorbell and its fd turns readable
    /// without the application calling `recv` first.
    pub fn init(&self, start: u64) {
        self.progress.0.cursor.store(start, Ordering::Relaxed);
        self.sub_waiting.0.store(1, Ordering::Relaxed);
    }

    /// Publisher: the subscriber's cursor, to be validated by the caller.
    #[inline]
    pub fn load_cursor(&self) -> u64 {
        // SYNC POINT (reuse): Acquire pairs with the Release store in
        // `CursorPage::advance`: the subscriber finished reading every slot before the
        // cursor, so the publisher may write over them.
        self.progress.0.cursor.load(Ordering::Acquire)
    }

    /// Subscriber: its cursor as it stored it last (the subscriber keeps its own copy;
    /// this is for attaching).
    pub fn initial_cursor(&self) -> u64 {
        self.progress.0.cursor.load(Ordering::Relaxed)
    }

    /// Subscriber: everything before `cursor` is read (or skipped, `missed` in total).
    /// With `notify` (`block` policy) returns whether the publisher announced that it
    /// waits for us, and must be woken.
    #[inline]
    pub fn advance(&self, cursor: u64, missed: u64, notify: bool) -> bool {
        if missed != 0 {
            self.progress.0.missed.store(missed, Ordering::Relaxed);
        }
        // SYNC POINT (reuse): Release pairs with the Acquire in `load_cursor`.
        self.progress.0.cursor.store(cursor, Ordering::Release);
        if !notify {
            return false;
        }
        // SYNC POINT (notify, publisher waits): pairs with the fence in
        // `Ring::publisher_recheck` — our cursor store precedes this fence and the flag
        // load follows; the publisher's flag store precedes its fence and its cursor load
        // follows.
        fence(Ordering::SeqCst);
        take(&self.pub_waiting.0)
    }

    /// Subscriber: the missed count it stored (statistics; the publisher shows it).
    pub fn missed(&self) -> u64 {
        self.progress.0.missed.load(Ordering::Relaxed)
    }

    /// Publisher: announce that it waits for this subscriber. Issue
    /// [`Ring::publisher_recheck`]'s fence after announcing to every subscriber waited for,
    /// then load their cursors again before sleeping.
    pub fn arm_publisher(&self) {
        self.pub_waiting.0.store(1, Ordering::Relaxed);
    }

    /// Publisher: whether the subscriber announced sleep (clearing the announcement).
    #[inline]
    pub fn take_sub_waiting(&self) -> bool {
        take(&self.sub_waiting.0)
    }

    /// Publisher: mark the subscriber detached (it learns why when its socket closes).
    pub fn set_detached(&self) {
        // SYNC POINT (detach): Release pairs with the Acquire in `detached`: a subscriber
        // that sees the mark after the socket closed knows it was detached, not reset.
        self.control.0.detached.store(1, Ordering::Release);
    }

    /// Subscriber: whether the publisher detached us.
    pub fn detached(&self) -> bool {
        // SYNC POINT (detach): pairs with the Release in `set_detached`.
        self.control.0.detached.load(Ordering::Acquire) != 0
    }
}

/// The bits by which subscribers tell the publisher that they armed their wake-me flag.
#[repr(C)]
pub struct BellPage {
    bits: Line<[AtomicU64; BELL_WORDS]>,
}

impl BellPage {
    /// No bits set (for tests and models).
    pub fn new() -> BellPage {
        BellPage {
            bits: Line([AtomicU64::new(0), AtomicU64::new(0)]),
        }
    }

    fn word(&self, slot: usize) -> (&AtomicU64, u64) {
        let slot = slot % MAX_SUBSCRIBERS;
        (&self.bits.0[slot / 64], 1u64 << (slot % 64))
    }

    /// Publisher, before sharing a subscriber's page: its bit, set like its flag (see
    /// [`CursorPage::init`]).
    pub fn init(&self, slot: usize) {
        let (w, bit) = self.word(slot);
        w.fetch_or(bit, Ordering::Relaxed);
    }
}

impl Default for BellPage {
    fn default() -> Self {
        BellPage::new()
    }
}

/// What the publisher remembers of its last doorbell to one subscriber (the doorbell
/// rule in the module docs): the subscriber's cursor then, if the message there was
/// already published.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LastRing(u64);

impl LastRing {
    /// No doorbell that is sure to wake the subscriber to a message.
    pub const NONE: LastRing = LastRing(u64::MAX);
}

/// Clears a flag if it is set; whether it was. The load first keeps the line shared
/// while the flag is clear (the common case).
#[inline(always)]
fn take(flag: &AtomicU32) -> bool {
    flag.load(Ordering::Relaxed) != 0 && flag.swap(0, Ordering::Relaxed) != 0
}

/// Subscriber: announce sleep — our wake-me flag, then our bell bit, then the fence. The
/// caller checks its next slot again afterwards and sleeps only if it is still empty.
/// The flag stays set if something arrived meanwhile: only the publisher clears it. The
/// bit is ours: clear it with [`disarm_subscriber`] once awake and busy again, so the
/// publisher stops looking at our flag.
pub fn arm_subscriber(page: &CursorPage, bell: &BellPage, slot: usize) {
    page.sub_waiting.0.store(1, Ordering::Relaxed);
    let (w, bit) = bell.word(slot);
    w.fetch_or(bit, Ordering::Relaxed);
    // SYNC POINT (notify, subscriber sleeps): pairs with the fence in
    // `Ring::sleepers`: our flag and bit stores precede this fence and the stamp load of
    // the re-check follows; the publisher's stamp store precedes its fence and its bit
    // load follows.
    fence(Ordering::SeqCst);
}

/// Subscriber: clears our bell bit after an announcement, once we found a message (right
/// after arming, or after being woken). The flag may stay set; without the bit the
/// publisher does not look at it, and the next [`arm_subscriber`] sets both again.
pub fn disarm_subscriber(bell: &BellPage, slot: usize) {
    let (w, bit) = bell.word(slot);
    w.fetch_and(!bit, Ordering::Relaxed);
}

/// What a reader finds in the slot of the position it expects.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Peek {
    /// The slot holds an older message, or ours is still being written.
    Empty,
    /// Our message: payload at `ptr`, `len` bytes. Copy or use it, then confirm with
    /// [`Ring::intact`] that it was not overwritten meanwhile.
    Ready {
        /// Payload start.
        ptr: NonNull<u8>,
        /// Payload length (validated against the maximum).
        len: usize,
    },
    /// A newer message, `newer`, is in (or being written into) the slot: ours is lost.
    Overwritten {
        /// Position of the newer message.
        newer: u64,
    },
}

/// Slot count, slot size and largest payload of a topic.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Geometry {
    /// Number of slots, a power of two.
    pub slots: u64,
    /// Bytes per slot (header and payload), a multiple of 8.
    pub slot_size: usize,
    /// Largest payload; at most `slot_size - PAYLOAD_OFFSET`.
    pub max_msg: usize,
}

impl Geometry {
    /// Whether the numbers fit together (a hostile peer's header is checked with this).
    pub fn valid(&self) -> bool {
        // One slot works (the loom model uses it); the options ask for two or more. The
        // slot area is bounded before anything is added to it or multiplied out of it, so
        // no size derived from a valid geometry can overflow.
        self.slots.is_power_of_two()
            && self.slots <= MAX_SLOTS as u64
            && self.slot_size % 8 == 0
            && self.slot_size >= PAYLOAD_OFFSET
            && self.slot_size <= MAX_TOPIC_BYTES
            && self.max_msg <= self.slot_size - PAYLOAD_OFFSET
            && self.max_msg <= u32::MAX as usize
            && (self.slots as usize)
                .checked_mul(self.slot_size)
                .is_some_and(|n| n <= MAX_TOPIC_BYTES)
    }

    /// Bytes of the slot area (at most [`MAX_TOPIC_BYTES`] when the geometry is valid).
    pub fn data_len(&self) -> usize {
        self.slots as usize * self.slot_size
    }
}

/// Where a topic's ring lives: its control block and its slots.
#[derive(Clone, Copy)]
pub struct Ring {
    ctl: NonNull<TopicCtl>,
    slots: NonNull<u8>,
    geom: Geometry,
}

// SAFETY: a Ring is two pointers into shared memory that is valid for as long as the owner
// of the mapping keeps it (see `Ring::new`); all shared fields are atomics.
unsafe impl Send for Ring {}

impl Ring {
    /// # Safety
    /// `ctl` must point to a `TopicCtl` (or zeroed memory of its size, 128-aligned) and
    /// `slots` to `geom.data_len()` bytes, 8-aligned, whose slot headers are valid
    /// `SlotHeader`s (zeroed memory is); both must stay valid (readable, and writable if
    /// the publisher's methods are used) as long as this Ring or a copy is used.
    /// `geom` must be [`Geometry::valid`].
    pub unsafe fn new(ctl: NonNull<TopicCtl>, slots: NonNull<u8>, geom: Geometry) -> Ring {
        debug_assert!(geom.valid());
        debug_assert!(ctl.as_ptr() as usize % 128 == 0 && slots.as_ptr() as usize % 8 == 0);
        Ring { ctl, slots, geom }
    }

    #[inline(always)]
    fn ctl(&self) -> &TopicCtl {
        // SAFETY: valid for the Ring's life (contract of `new`); only atomics inside.
        unsafe { self.ctl.as_ref() }
    }

    /// The slot of `pos`: its header and payload.
    #[inline(always)]
    fn slot(&self, pos: u64) -> (&SlotHeader, NonNull<u8>) {
        let index = (pos & (self.geom.slots - 1)) as usize;
        // SAFETY: index < slots, so the slot lies inside the `data_len()` bytes of `new`'s
        // contract; slot_size is a multiple of 8, so the header is aligned; the payload
        // starts inside the same slot.
        unsafe {
            let at = self.slots.add(index * self.geom.slot_size);
            (at.cast::<SlotHeader>().as_ref(), at.add(PAYLOAD_OFFSET))
        }
    }

    // --- the publisher's side -----------------------------------------------------------

    /// Starts writing message `pos` into its slot; returns where its payload goes
    /// (`max_msg` bytes). The slot's previous message is gone from here on: a reader
    /// still copying it will notice ([`Ring::intact`]).
    #[inline(always)]
    pub fn begin(&self, pos: u64) -> NonNull<u8> {
        let (slot, payload) = self.slot(pos);
        // SYNC POINT (detach): Release pairs with the Acquire stamp loads in `peek` and
        // `intact`: a reader that sees this stamp also sees what the publisher did before
        // reusing the slot — in particular `CursorPage::set_detached` of the subscriber it
        // stopped waiting for.
        slot.stamp.store(busy(pos), Ordering::Release);
        // SYNC POINT (seqlock, writer): Release fence pairs with the Acquire fence in
        // `intact`: the busy stamp is ordered before every payload byte written after
        // this, so a reader that copied any of those bytes sees the busy stamp (or a
        // later one) when it checks again.
        fence(Ordering::Release);
        payload
    }

    /// Completes message `pos` of `len` bytes (written at the pointer `begin` returned)
    /// and publishes it: `written` becomes `pos + 1`.
    #[inline(always)]
    pub fn commit(&self, pos: u64, len: usize) {
        debug_assert!(len <= self.geom.max_msg);
        let (slot, _) = self.slot(pos);
        slot.len.store(len as u32, Ordering::Relaxed);
        // SYNC POINT (data): Release pairs with the Acquire stamp load in `peek`: payload
        // and length are visible to a reader that sees the stamp.
        slot.stamp.store(done(pos), Ordering::Release);
        // SYNC POINT (written): Release pairs with the Acquire in `written`: whoever sees
        // `pos + 1` there also sees the stamps of every message before it.
        self.ctl().written.0.store(pos + 1, Ordering::Release);
    }

    /// After [`commit`](Ring::commit): the full fence of the wake-up protocol, then the
    /// bell bits of the subscribers that armed (usually both zero).
    #[inline(always)]
    pub fn sleepers(&self, bell: &BellPage) -> [u64; BELL_WORDS] {
        // SYNC POINT (notify, subscriber sleeps): pairs with the fence in
        // `arm_subscriber`. The stamp and `written` stores (Release, in `commit`) precede
        // this fence and the bit loads follow.
        fence(Ordering::SeqCst);
        [
            bell.bits.0[0].load(Ordering::Relaxed),
            bell.bits.0[1].load(Ordering::Relaxed),
        ]
    }

    /// After [`sleepers`](Ring::sleepers) reported a subscriber's bit: applies the
    /// doorbell rule (module docs) with `last`, what the publisher remembers of its last
    /// doorbell to it, and `next`, the publisher's next position, then takes its flag.
    /// `Some` if it must be rung: store the value in `last` once the doorbell is in its
    /// socket, [`LastRing::NONE`] if it could not be delivered. A bit without a flag (a
    /// subscriber that was woken and has not cleared its bit yet, or a forged bit) costs
    /// two loads. The bit is left to its subscriber.
    #[inline]
    pub fn take_sleeper(&self, page: &CursorPage, last: LastRing, next: u64) -> Option<LastRing> {
        // The cursor first: when the rule skips, the flag (a line a hostile subscriber
        // may write without pause) is not touched and stays set, so only a flag taken is
        // answered by a doorbell and every announcement is either answered or still there
        // at the next publish. Any value a hostile subscriber stores in its cursor only
        // changes its own doorbells.
        let cursor = page.load_cursor();
        if cursor == last.0 || !page.take_sub_waiting() {
            return None;
        }
        Some(if cursor < next {
            LastRing(cursor)
        } else {
            LastRing::NONE
        })
    }

    /// Publisher, after reclaiming a dead subscriber's slot: clears the bit it may have
    /// left set (nobody else owns the bit until the slot is given out again).
    pub fn clear_bell(&self, bell: &BellPage, slot: usize) {
        disarm_subscriber(bell, slot);
    }

    /// The full fence between announcing a wait ([`CursorPage::arm_publisher`] on each
    /// subscriber waited for) and loading their cursors again.
    pub fn publisher_recheck(&self) {
        // SYNC POINT (notify, publisher waits): pairs with the fence in
        // `CursorPage::advance`.
        fence(Ordering::SeqCst);
    }

    /// Marks the end of the topic after the last message.
    pub fn close(&self) {
        // SYNC POINT (close): Release pairs with the Acquire in `closed`: a subscriber
        // that sees the mark also sees every message published before it.
        self.ctl().closed.0.store(1, Ordering::Release);
    }

    // --- the subscribers' side ----------------------------------------------------------

    /// Messages ever published (publisher-written: a subscriber validates it).
    #[inline]
    pub fn written(&self) -> u64 {
        // SYNC POINT (written): pairs with the Release store in `commit`.
        self.ctl().written.0.load(Ordering::Acquire)
    }

    /// Whether the publisher closed the topic gracefully. Load [`written`](Ring::written)
    /// after this returns `true`: every message before the mark is in it.
    #[inline]
    pub fn closed(&self) -> bool {
        // SYNC POINT (close): pairs with the Release in `close`.
        self.ctl().closed.0.load(Ordering::Acquire) != 0
    }

    /// What the slot of `pos` holds, validated. A value no correct publisher writes is a
    /// [`Violation`].
    #[inline(always)]
    pub fn peek(&self, pos: u64) -> Result<Peek> {
        let (slot, payload) = self.slot(pos);
        // SYNC POINT (data): Acquire pairs with the Release stamp store in `commit`;
        // (detach) and with the Release busy stamp in `begin`.
        let stamp = slot.stamp.load(Ordering::Acquire);
        if stamp == done(pos) {
            let len = slot.len.load(Ordering::Relaxed) as usize;
            if len <= self.geom.max_msg {
                return Ok(Peek::Ready { ptr: payload, len });
            }
            // A length no correct publisher writes — unless the slot was overwritten
            // since we read the stamp, and the length is the next message's.
            return if self.intact(pos) {
                Err(Violation::new(format!(
                    "message {pos}: length {len} exceeds the topic's maximum {}",
                    self.geom.max_msg
                )))
            } else {
                self.peek_overwritten(pos)
            };
        }
        self.classify(pos, stamp)
    }

    #[cold]
    fn peek_overwritten(&self, pos: u64) -> Result<Peek> {
        let (slot, _) = self.slot(pos);
        // SYNC POINT (detach): Acquire pairs with the Release busy stamp in `begin`: the
        // subscriber that sees the newer stamp sees the publisher's detach mark too.
        let stamp = slot.stamp.load(Ordering::Acquire);
        match self.classify(pos, stamp)? {
            Peek::Overwritten { newer } => Ok(Peek::Overwritten { newer }),
            other => Err(Violation::new(format!(
                "message {pos}: slot stamp went back ({other:?} after a complete message)"
            ))),
        }
    }

    /// A stamp other than `done(pos)`: older (empty) or newer (overwritten).
    #[inline(always)]
    fn classify(&self, pos: u64, stamp: u64) -> Result<Peek> {
        if stamp == 0 {
            return Ok(Peek::Empty);
        }
        // The position the stamp names; stamps 1 and beyond `MAX_POSITION` no correct
        // publisher writes.
        let at = (stamp >> 1).wrapping_sub(1);
        if at > MAX_POSITION {
            return Err(Violation::new(format!(
                "slot of message {pos} has the impossible stamp {stamp:#x}"
            )));
        }
        if at.wrapping_sub(pos) & (self.geom.slots - 1) != 0 {
            return Err(Violation::new(format!(
                "slot of message {pos} is stamped with message {at}, which belongs to another slot"
            )));
        }
        Ok(if at <= pos {
            Peek::Empty // an older message, or ours while it is written
        } else {
            Peek::Overwritten { newer: at }
        })
    }

    /// After copying or using what [`peek`](Ring::peek) returned: whether the slot still
    /// holds message `pos` (if not, what was read may be torn and must be dropped).
    #[inline(always)]
    pub fn intact(&self, pos: u64) -> bool {
        // SYNC POINT (seqlock, reader): Acquire fence pairs with the Release fence in
        // `begin`: the payload reads before it are ordered before the stamp load after it.
        fence(Ordering::Acquire);
        let (slot, _) = self.slot(pos);
        slot.stamp.load(Ordering::Relaxed) == done(pos)
    }

    /// For a reader at `pos` whose message was overwritten by `newer` (or who found the
    /// slot no longer intact): the oldest position that may still be in the ring, where
    /// it continues. Every position before it is lost — counted exactly as `next - pos`;
    /// if the publisher overwrites that one too before the reader gets to it, the reader
    /// skips again and counts again.
    pub fn skip_to(&self, pos: u64, newer: u64) -> u64 {
        let n = self.geom.slots;
        let written = self.written();
        // `newer` is being written or done: messages up to `newer - n` are gone. Of the
        // `written` messages, the last `n` are in the ring until the next write begins.
        let oldest = (newer.saturating_add(1))
            .saturating_sub(n)
            .max(written.saturating_sub(n));
        oldest.max(pos + 1)
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    /// A ring in process memory.
    struct HeapRing {
        ctl: Box<TopicCtl>,
        data: Vec<u64>,
        geom: Geometry,
    }

    impl HeapRing {
        fn new(slots: u64, slot_size: usize) -> HeapRing {
            let geom = Geometry {
                slots,
                slot_size,
                max_msg: slot_size - PAYLOAD_OFFSET,
            };
            HeapRing {
                ctl: Box::new(TopicCtl::new()),
                data: vec![0; geom.data_len() / 8],
                geom,
            }
        }
        fn ring(&mut self) -> Ring {
            // SAFETY: the Box and the Vec outlive every Ring of the test.
            unsafe {
                Ring::new(
                    NonNull::from(&mut *self.ctl),
                    NonNull::new(self.data.as_mut_ptr().cast()).unwrap(),
                    self.geom,
                )
            }
        }
    }

    fn publish(r: &Ring, pos: u64, msg: &[u8]) {
        let p = r.begin(pos);
        // SAFETY: the payload area holds max_msg bytes; the tests' messages fit.
        unsafe { p.as_ptr().copy_from_nonoverlapping(msg.as_ptr(), msg.len()) };
        r.commit(pos, msg.len());
    }

    fn read(r: &Ring, pos: u64) -> Result<Option<Vec<u8>>> {
        match r.peek(pos)? {
            Peek::Ready { ptr, len } => {
                // SAFETY: peek validated the payload inside the slot.
                let v = unsafe { std::slice::from_raw_parts(ptr.as_ptr(), len) }.to_vec();
                Ok(r.intact(pos).then_some(v))
            }
            _ => Ok(None),
        }
    }

    #[test]
    fn messages_are_read_in_place_and_overwrites_are_detected() {
        let mut h = HeapRing::new(4, 64);
        let r = h.ring();
        assert_eq!(r.peek(0).unwrap(), Peek::Empty);
        publish(&r, 0, b"zero");
        assert_eq!(read(&r, 0).unwrap().unwrap(), b"zero");
        assert_eq!(r.peek(1).unwrap(), Peek::Empty);
        for pos in 1..6 {
            publish(&r, pos, format!("m{pos}").as_bytes());
        }
        assert_eq!(r.written(), 6);
        // Slot 0 now holds message 4: message 0 is lost, message 4 is there.
        assert_eq!(r.peek(0).unwrap(), Peek::Overwritten { newer: 4 });
        assert_eq!(read(&r, 4).unwrap().unwrap(), b"m4");
        // Skipping: 6 written, 4 slots — messages 2..6 are still there.
        assert_eq!(r.skip_to(0, 4), 2);
        // A busy stamp on our position is "not yet"; on a later one "overwritten".
        r.begin(6);
        assert_eq!(r.peek(2).unwrap(), Peek::Overwritten { newer: 6 });
        assert_eq!(r.peek(6).unwrap(), Peek::Empty);
    }

    #[test]
    fn a_read_torn_by_the_next_write_is_not_intact() {
        let mut h = HeapRing::new(2, 32);
        let r = h.ring();
        publish(&r, 0, b"old");
        let Peek::Ready { .. } = r.peek(0).unwrap() else {
            panic!()
        };
        r.begin(2); // the publisher laps the reader mid-copy
        assert!(!r.intact(0));
    }

    #[test]
    fn hostile_stamps_and_lengths_are_violations() {
        let mut h = HeapRing::new(4, 32);
        let r = h.ring();
        publish(&r, 1, b"x");
        // Slot 1 stamped with message 2 (which belongs to slot 2).
        h.data[32 / 8] = done(2);
        assert!(r.peek(1).is_err());
        // A length beyond the maximum.
        h.data[32 / 8] = done(1);
        h.data[32 / 8 + 1] = 1000;
        assert!(r.peek(1).is_err());
        // Stamps that name no position or an impossible one.
        for stamp in [1, u64::MAX, done(MAX_POSITION + 4)] {
            h.data[0] = stamp;
            assert!(r.peek(0).is_err(), "stamp {stamp:#x}");
        }
    }

    #[test]
    fn the_doorbell_rule_rings_again_once_the_cursor_moves() {
        let page = CursorPage::new(0);
        let bell = BellPage::new();
        let mut h = HeapRing::new(2, 32);
        let r = h.ring();
        // Message 0 is published and the subscriber at 0 announced: ring, remember 0.
        arm_subscriber(&page, &bell, 0);
        let last = r.take_sleeper(&page, LastRing::NONE, 1).unwrap();
        assert_eq!(last, LastRing(0));
        // It announces again without reading: no doorbell, and the announcement stays.
        arm_subscriber(&page, &bell, 0);
        for next in 2..10 {
            assert_eq!(r.take_sleeper(&page, last, next), None);
        }
        assert!(page.take_sub_waiting());
        arm_subscriber(&page, &bell, 0);
        // Once it moved, it is owed one; at the end of what is published, that doorbell
        // finds nothing to read, so the next one is not skipped either.
        page.advance(10, 0, false);
        assert_eq!(r.take_sleeper(&page, last, 10), Some(LastRing::NONE));
        arm_subscriber(&page, &bell, 0);
        assert_eq!(
            r.take_sleeper(&page, LastRing::NONE, 11),
            Some(LastRing(10))
        );
    }

    #[test]
    fn wake_flags_are_taken_once() {
        let page = CursorPage::new(0);
        let bell = BellPage::new();
        let mut h = HeapRing::new(2, 32);
        let r = h.ring();
        assert_eq!(r.sleepers(&bell), [0, 0]);
        arm_subscriber(&page, &bell, 70);
        assert_eq!(r.sleepers(&bell), [0, 1 << 6]);
        assert_eq!(r.take_sleeper(&page, LastRing::NONE, 1), Some(LastRing(0)));
        assert_eq!(r.take_sleeper(&page, LastRing::NONE, 1), None);
        disarm_subscriber(&bell, 70);
        assert_eq!(r.sleepers(&bell), [0, 0]);
        // The publisher's wait-for-you flag, taken by the subscriber's advance.
        assert!(!page.advance(1, 0, true));
        page.arm_publisher();
        assert!(page.advance(2, 0, true));
        assert!(!page.advance(3, 0, true));
        assert_eq!(page.load_cursor(), 3);
    }
}
