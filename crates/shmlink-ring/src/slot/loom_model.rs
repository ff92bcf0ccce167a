//! Loom model of the slot handshake (`vm:`'s connection slots, docs/vms.md).
//!
//! Run with the ring's other models: `RUSTFLAGS="--cfg loom" LOOM_MAX_PREEMPTIONS=3
//! cargo test -p shmlink-ring --release loom`.
//!
//! A client and a listener thread share one slot's state word and two of its fields (the
//! client's maximum message size, written before `request`, and the listener's, written
//! before `accept`), both Relaxed as in the region: the state transitions alone must
//! carry them. [`handshake_carries_both_sides_fields`] checks that each side sees the
//! other's field once it sees the state; [`withdraw_and_accept_have_one_winner`] that a
//! client giving up while its listener accepts ends with exactly one of them having won,
//! and the slot FREE only if the client did.

use loom::sync::Arc;
use loom::thread;

use super::*;
use crate::sync::AtomicU64;

struct Shared {
    state: AtomicU32,
    client_max: AtomicU64,
    server_max: AtomicU64,
}

fn shared() -> Arc<Shared> {
    Arc::new(Shared {
        state: AtomicU32::new(State::Free as u32),
        client_max: AtomicU64::new(0),
        server_max: AtomicU64::new(0),
    })
}

/// Spins (yielding to loom) until `slot` holds `want`.
fn wait_for(slot: Slot<'_>, want: State) {
    while slot.load() != want as u32 {
        thread::yield_now();
    }
}

#[test]
fn loom_slot_handshake_carries_both_sides_fields() {
    loom::model(|| {
        let s = shared();
        let l = s.clone();
        let listener = thread::spawn(move || {
            let slot = Slot::new(&l.state);
            wait_for(slot, State::Request);
            // SYNC POINT (model): Relaxed, as the region's fields: `request` carries it.
            assert_eq!(
                l.client_max.load(Ordering::Relaxed),
                7,
                "request without its field"
            );
            // SYNC POINT (model): Relaxed, as the region's fields: `accept` publishes it.
            l.server_max.store(9, Ordering::Relaxed);
            assert!(slot.accept());
        });
        let slot = Slot::new(&s.state);
        assert!(slot.claim(State::Free as u32));
        // SYNC POINT (model): Relaxed, as the region's fields: `request` publishes it.
        s.client_max.store(7, Ordering::Relaxed);
        slot.request();
        wait_for(slot, State::Accepted);
        // SYNC POINT (model): Relaxed, as the region's fields: `accept` carries it.
        assert_eq!(
            s.server_max.load(Ordering::Relaxed),
            9,
            "accepted without its field"
        );
        listener.join().unwrap();
    });
}

#[test]
fn loom_slot_withdraw_and_accept_have_one_winner() {
    loom::model(|| {
        let s = shared();
        let l = s.clone();
        let listener = thread::spawn(move || {
            let slot = Slot::new(&l.state);
            // The listener looks once: it may come before the request, see it, or see
            // it already withdrawn.
            slot.load() == State::Request as u32 && slot.accept()
        });
        let slot = Slot::new(&s.state);
        assert!(slot.claim(State::Free as u32));
        slot.request();
        let withdrew = slot.withdraw();
        let accepted = listener.join().unwrap();
        assert!(
            withdrew != accepted,
            "withdrew {withdrew}, accepted {accepted}"
        );
        let end = State::of(slot.load());
        assert_eq!(
            end,
            Some(if withdrew {
                State::Free
            } else {
                State::Accepted
            })
        );
    });
}
