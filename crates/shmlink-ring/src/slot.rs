//! The handshake state machines of a memory region that several processes (or virtual
//! machines) share without a socket between them: `vm:`'s connection slots, listener
//! entries and once-written values. Each is one `u32` word in the region, changed only
//! by the transitions here, each an atomic operation whose ordering publishes the fields
//! written before it (SYNC POINT tags name both halves).
//!
//! ```text
//! slot:     FREE ─claim→ CLAIMED ─request→ REQUEST ─accept→ ACCEPTED ─leave→ ONE_GONE ─leave→ FREE
//!                                             │ └─refuse→ REFUSED ─withdraw→ FREE
//!                                             └─withdraw→ FREE
//! listener: FREE ─take→ BUSY ─publish→ LIVE ─unpublish→ FREE      (a stale entry: take from any)
//! once:     NONE ─begin→ WRITING ─set→ SET                          (or back to NONE)
//! ```
//!
//! Every word is peer-writable: a load returns the raw value ([`State::of`] names the
//! known ones) and the callers treat an unknown one as a protocol violation; a
//! compare-and-swap from an expected state is how each side claims its next step, so that
//! of two racing transitions (a client withdrawing, its listener accepting) exactly one
//! wins. The loom model (`slot/loom_model.rs`, run as the ring's other models) checks that
//! a request's and an acceptance's fields arrive with their state, and that the race has
//! one winner.

use crate::sync::{AtomicU32, Ordering};

#[cfg(all(test, loom))]
mod loom_model;

/// Connection slot states (the slot's state word).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u32)]
pub enum State {
    /// Nobody uses the slot.
    Free = 0,
    /// A client took it and is writing its request.
    Claimed = 1,
    /// The request is complete: a listener may accept it.
    Request = 2,
    /// Accepted: the connection is live.
    Accepted = 3,
    /// One side has left; the other frees the slot when it leaves.
    OneGone = 4,
    /// The listener refused the request; the client frees the slot.
    Refused = 5,
}

impl State {
    /// The state a raw word holds, if it is one.
    pub fn of(word: u32) -> Option<State> {
        [
            State::Free,
            State::Claimed,
            State::Request,
            State::Accepted,
            State::OneGone,
            State::Refused,
        ]
        .into_iter()
        .find(|s| *s as u32 == word)
    }
}

/// A connection slot's state word, as either side of the handshake sees it.
#[derive(Clone, Copy)]
pub struct Slot<'a> {
    word: &'a AtomicU32,
}

impl<'a> Slot<'a> {
    /// The slot whose state word is `word` (in the shared region).
    pub fn new(word: &'a AtomicU32) -> Slot<'a> {
        Slot { word }
    }

    /// The raw state (peer-written: compare with [`State`]s, or [`State::of`]).
    pub fn load(&self) -> u32 {
        // SYNC POINT (handshake): Acquire pairs with every Release/AcqRel transition
        // below: `request` (for the listener), `accept`/`refuse` (for the client),
        // `leave` (for the side that stays): the fields written before them are visible.
        self.word.load(Ordering::Acquire)
    }

    /// A client takes the slot from state `from` (FREE, or a stale slot's state read
    /// before): whether it won.
    pub fn claim(&self, from: u32) -> bool {
        // SYNC POINT (claim): AcqRel CAS: one client wins; pairs with the Release/AcqRel
        // transitions that freed the slot (`withdraw`, `leave`), so their writes are
        // behind us before we write the request.
        self.cas(from, State::Claimed as u32)
    }

    /// The client's request is complete: publishes every field written since `claim`.
    pub fn request(&self) {
        // SYNC POINT (handshake): Release pairs with the listener's Acquire `load` that
        // sees REQUEST: the request fields (listener, nonce, maximum) and the zeroed ring
        // blocks are visible to it.
        self.word.store(State::Request as u32, Ordering::Release);
    }

    /// The listener accepts a request: whether it won (the client may have withdrawn).
    /// Publishes the listener's fields written before it.
    pub fn accept(&self) -> bool {
        // SYNC POINT (handshake): AcqRel CAS REQUEST → ACCEPTED pairs with the client's
        // Acquire `load` that sees ACCEPTED (our maximum, written before, is visible) and
        // with its `withdraw` CAS: exactly one of the two wins.
        self.cas(State::Request as u32, State::Accepted as u32)
    }

    /// The listener refuses a request (a bad field): whether it won.
    pub fn refuse(&self) -> bool {
        // SYNC POINT (handshake): AcqRel CAS REQUEST → REFUSED pairs with the client's
        // Acquire `load` and its `withdraw` (REFUSED → FREE).
        self.cas(State::Request as u32, State::Refused as u32)
    }

    /// The client gives up its request (refused, timed out, or the listener went away):
    /// frees the slot if the listener did not accept meanwhile. Whether it freed it;
    /// `false` means the listener won (the slot is ACCEPTED and the listener's side
    /// finds the client never beats).
    pub fn withdraw(&self) -> bool {
        // SYNC POINT (handshake): AcqRel CAS REQUEST → FREE pairs with the listener's
        // `accept`/`refuse` CAS: exactly one wins.
        if self.cas(State::Request as u32, State::Free as u32) {
            return true;
        }
        // SYNC POINT (handshake): AcqRel CAS REFUSED → FREE pairs with the listener's
        // `refuse`: the slot was ours to free.
        self.cas(State::Refused as u32, State::Free as u32)
    }

    /// One side of a live connection leaves: the first turns ACCEPTED into ONE_GONE
    /// (unless `peer_dead`: then it frees the slot at once), the last frees it. Whether
    /// this side was the first (the slot stays in use by the peer). Any other state means
    /// someone else took or broke the slot: it is left alone.
    pub fn leave(&self, peer_dead: bool) -> bool {
        let cur = self.load();
        // SYNC POINT (handshake): AcqRel CAS ACCEPTED → ONE_GONE pairs with the peer's
        // Acquire `load` that sees ONE_GONE and its own `leave` CAS below.
        if cur == State::Accepted as u32 && !peer_dead && self.cas(cur, State::OneGone as u32) {
            return true;
        }
        let cur = self.load();
        if cur == State::OneGone as u32 || cur == State::Accepted as u32 {
            // SYNC POINT (handshake): AcqRel CAS to FREE pairs with the next client's
            // `claim` CAS.
            self.cas(cur, State::Free as u32);
        }
        false
    }

    /// Moves the slot from state `from` to ONE_GONE (a client that finds the accepted
    /// connection unusable, e.g. a maximum out of range): whether it did.
    pub fn abandon(&self, from: u32) -> bool {
        // SYNC POINT (handshake): AcqRel CAS, as in `leave`.
        self.cas(from, State::OneGone as u32)
    }

    fn cas(&self, from: u32, to: u32) -> bool {
        // SYNC POINT (handshake, claim): AcqRel on success, Acquire on failure: the
        // ordering of every transition above; each caller's tag names its pairing.
        self.word
            .compare_exchange(from, to, Ordering::AcqRel, Ordering::Acquire)
            .is_ok()
    }
}

/// A listener entry's state word: an entry nobody serves (FREE), one being written by a
/// binding listener (BUSY), or one serving (LIVE).
#[derive(Clone, Copy)]
pub struct Entry<'a> {
    word: &'a AtomicU32,
}

impl<'a> Entry<'a> {
    /// Nobody serves the entry.
    pub const FREE: u32 = 0;
    /// A binding listener writes it.
    pub const BUSY: u32 = 1;
    /// A listener serves it.
    pub const LIVE: u32 = 2;

    /// The entry whose state word is `word`.
    pub fn new(word: &'a AtomicU32) -> Entry<'a> {
        Entry { word }
    }

    /// The raw state (peer-written).
    pub fn load(&self) -> u32 {
        // SYNC POINT (bind): Acquire pairs with the Release store of `publish`: a LIVE
        // entry's name and nonce are complete; and with `unpublish`.
        self.word.load(Ordering::Acquire)
    }

    /// A binder takes the entry from state `from` (FREE, the same name's stale LIVE, or
    /// any stale state read before): whether it won.
    pub fn take(&self, from: u32) -> bool {
        // SYNC POINT (bind): AcqRel CAS to BUSY: one binder wins; pairs with the
        // Release/AcqRel stores that freed the entry (`unpublish`).
        self.word
            .compare_exchange(from, Self::BUSY, Ordering::AcqRel, Ordering::Acquire)
            .is_ok()
    }

    /// The entry serves: publishes the name and nonce written since `take`.
    pub fn publish(&self) {
        // SYNC POINT (bind): Release pairs with the Acquire `load` of clients and
        // binders: a client that sees LIVE sees the name and nonce.
        self.word.store(Self::LIVE, Ordering::Release);
    }

    /// The binder gives the entry back (it lost the name to a lower entry).
    pub fn release(&self) {
        // SYNC POINT (bind): Release pairs with the next binder's `take` CAS and the
        // Acquire `load` of clients.
        self.word.store(Self::FREE, Ordering::Release);
    }

    /// A listener that leaves frees its entry if it is still LIVE: whether it did.
    pub fn unpublish(&self) -> bool {
        // SYNC POINT (bind): AcqRel CAS LIVE → FREE pairs with a later binder's `take`
        // and the Acquire `load` of clients.
        self.word
            .compare_exchange(Self::LIVE, Self::FREE, Ordering::AcqRel, Ordering::Acquire)
            .is_ok()
    }
}

/// A value written once into the region by whichever user comes first (`vm:`'s region
/// id): a state word that elects the writer and then publishes what it wrote.
#[derive(Clone, Copy)]
pub struct Once<'a> {
    word: &'a AtomicU32,
}

impl<'a> Once<'a> {
    /// Nobody has written the value.
    pub const NONE: u32 = 0;
    /// The elected writer is writing it.
    pub const WRITING: u32 = 1;
    /// The value is complete.
    pub const SET: u32 = 2;

    /// The value whose state word is `word`.
    pub fn new(word: &'a AtomicU32) -> Once<'a> {
        Once { word }
    }

    /// The raw state (peer-written).
    pub fn load(&self) -> u32 {
        // SYNC POINT (region id): Acquire pairs with the Release store of `set`: the
        // value read after seeing SET is complete.
        self.word.load(Ordering::Acquire)
    }

    /// Elects the caller the writer if nobody wrote yet: whether it must write.
    pub fn begin(&self) -> bool {
        // SYNC POINT (region id): AcqRel CAS NONE → WRITING elects one writer; pairs with
        // `abandon`, which gives the election back.
        self.word
            .compare_exchange(
                Self::NONE,
                Self::WRITING,
                Ordering::AcqRel,
                Ordering::Acquire,
            )
            .is_ok()
    }

    /// The writer finished: publishes the value.
    pub fn set(&self) {
        // SYNC POINT (region id): Release pairs with the Acquire `load` of readers.
        self.word.store(Self::SET, Ordering::Release);
    }

    /// The writer could not write: the next user may try.
    pub fn abandon(&self) {
        // SYNC POINT (region id): Release pairs with the next user's `begin` CAS.
        self.word.store(Self::NONE, Ordering::Release);
    }
}
