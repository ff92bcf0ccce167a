//! The doorbell both loom models share: a counter of rings and a way to wait for it to
//! move, standing for the socket byte and `poll` of the real transports.
//!
//! A `shm:` side sleeps in one of two places (the control socket or its doorbell pipe,
//! docs/design.md §4.4) and stores which before it announces the wait; the waker reads
//! that place after the fence that loaded the announcement and rings there. Each place
//! here is a counter; [`Doorbell::set_place`] is the sleeper's store, [`Doorbell::ring`]
//! reads it (place 0 unless a model sets another).

use loom::sync::atomic::{fence, AtomicUsize, Ordering};
use loom::sync::{Condvar, Mutex};

/// Places a sleeper can choose between.
pub(crate) const PLACES: usize = 2;

/// Rings counted under a mutex per place; waiting is a condition variable.
#[derive(Default)]
pub(crate) struct Doorbell {
    rings: [Mutex<u64>; PLACES],
    cv: [Condvar; PLACES],
    /// Where the sleeper said it sleeps (a word in its own segment in `shm:`).
    place: AtomicUsize,
    /// Whether the sleeper chooses places ([`Doorbell::with_places`]); without, a ring
    /// neither fences nor reads the place, as the transports without pipes.
    places: bool,
}

impl Doorbell {
    /// A doorbell whose sleeper says where it sleeps (`shm:` with doorbell pipes).
    pub(crate) fn with_places() -> Doorbell {
        Doorbell {
            places: true,
            ..Doorbell::default()
        }
    }

    /// The waker's side: rings where the sleeper said it sleeps. Called after the
    /// waker's fence and its load of the announcement (`commit`/`advance` returned true).
    pub(crate) fn ring(&self) {
        let p = if self.places {
            // Pairs with the Release fence of `set_place` through the announcement count
            // the waker loaded (`segment::Segment::peer_place` in `shm:`).
            fence(Ordering::Acquire);
            self.place.load(Ordering::Relaxed)
        } else {
            0
        };
        *self.rings[p].lock().unwrap() += 1;
        self.cv[p].notify_one();
    }
    /// The sleeper's side, before it announces (`arm`, whose fence orders the two).
    pub(crate) fn set_place(&self, place: usize) {
        if self.places {
            self.place.store(place, Ordering::Relaxed);
            fence(Ordering::Release);
        }
    }
    /// What has been rung so far at place 0 ("drain").
    pub(crate) fn seen(&self) -> u64 {
        self.seen_at(0)
    }
    /// What has been rung so far at `place`.
    pub(crate) fn seen_at(&self, place: usize) -> u64 {
        *self.rings[place].lock().unwrap()
    }
    /// Sleeps until a ring at place 0 after `seen` ("poll").
    pub(crate) fn wait_past(&self, seen: u64) {
        self.wait_past_at(0, seen)
    }
    /// Sleeps until a ring at `place` after `seen` (a blocking `recv` or `read`).
    pub(crate) fn wait_past_at(&self, place: usize, seen: u64) {
        let mut n = self.rings[place].lock().unwrap();
        while *n == seen {
            n = self.cv[place].wait(n).unwrap();
        }
    }
}
