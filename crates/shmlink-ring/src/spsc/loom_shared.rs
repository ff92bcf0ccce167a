//! Loom model of shared wait tokens ([`WakeGroup`], [`Consumer::arm_token`]).
//!
//! Run with `RUSTFLAGS="--cfg loom" LOOM_MAX_PREEMPTIONS=3 cargo test -p shmlink-ring
//! --release loom_shared`.
//!
//! One waiter waits for a record on each of two rings, the way an event loop sleeps in
//! one `epoll_wait` on two connections: it looks at both rings, announces one token on
//! each (`announce_token`, a full fence per ring, then that ring's re-check), and sleeps
//! on one doorbell that a ring on either connection's control socket ends ([`Doorbell`],
//! standing for the kernel wait over both sockets). When it wakes it withdraws what it
//! announced (the preload's `Waiting` guard) and looks at both rings again before the next
//! sleep, with a new token. Producers publish a ring's `tail`, take the waiter's
//! announcement (`take_waiter`) and ring only if their [`WakeGroup`] has not rung for that
//! token yet. A lost wake-up leaves the waiter asleep, which loom reports as a deadlock.
//! The models check [`FenceMode::Symmetric`] (see loom_model.rs for the asymmetric mode).

use loom::sync::Arc;
use loom::thread;

use super::notify::*;
use crate::loom_doorbell::Doorbell;
use crate::sync::{fence, AtomicU64, Ordering};

/// Two rings as the wake-up protocol sees them: the producers' `tail` words, the
/// consumer's announcement words, the producer process's group, the waiter's one wait.
struct Two {
    tail: [AtomicU64; 2],
    waiting: [AtomicU64; 2],
    group: WakeGroup,
    bell: Doorbell,
}

#[derive(Clone, Copy)]
struct Cfg {
    /// One producer thread per ring (else one thread publishes both, in turn).
    two_producers: bool,
    /// The waiter announces the same token before every sleep.
    reuse_token: bool,
    /// Announce by storing the token as it is, without `announce_token`'s rule that
    /// each announcement's value is new on its ring.
    raw: bool,
}

/// The announcement as `announce_token` makes it, or a plain store of the token.
fn announce_with(cfg: Cfg, count: &AtomicU64, token: u64) {
    if cfg.raw {
        count.store(token | SHARED_TOKEN, Ordering::Relaxed);
        fence(Ordering::SeqCst);
    } else {
        assert!(announce_token(count, token, FenceMode::Symmetric));
    }
}

/// A producer's record on ring `i`: publish `tail`, then wake the waiter unless the group
/// already rang for its token.
fn publish(two: &Two, i: usize, woken: &mut u64) {
    // SYNC POINT (data): as `Producer::publish` stores `tail`.
    two.tail[i].store(1, Ordering::Release);
    if take_waiter(&two.waiting[i], woken, FenceMode::Symmetric) && two.group.claim(*woken) {
        two.bell.ring();
    }
}

fn run(cfg: Cfg) {
    loom::model(move || {
        let two = Arc::new(Two {
            tail: [AtomicU64::new(0), AtomicU64::new(0)],
            waiting: [AtomicU64::new(0), AtomicU64::new(0)],
            group: WakeGroup::new(),
            bell: Doorbell::default(),
        });
        let producers: Vec<_> = if cfg.two_producers {
            (0..2)
                .map(|i| {
                    let two = two.clone();
                    thread::spawn(move || publish(&two, i, &mut 0))
                })
                .collect()
        } else {
            let two = two.clone();
            vec![thread::spawn(move || {
                let mut woken = [0u64; 2];
                for (i, w) in woken.iter_mut().enumerate() {
                    publish(&two, i, w);
                }
            })]
        };
        // The waiter runs on the model's own thread (as the consumer of loom_model.rs
        // does): a deadlock then ends the model with loom's report.
        let mut got = [false; 2];
        let mut token = 0u64;
        loop {
            // Step 1: the rings, from shared memory.
            for (i, g) in got.iter_mut().enumerate() {
                *g |= two.tail[i].load(Ordering::Acquire) == 1;
            }
            if got == [true, true] {
                break;
            }
            // Drain, then announce one token on every ring still waited for, each
            // followed by its re-check.
            let seen = two.bell.seen();
            if !cfg.reuse_token || token == 0 {
                token += 1;
            }
            let mut ready = false;
            for i in 0..2 {
                if got[i] {
                    continue;
                }
                announce_with(cfg, &two.waiting[i], token);
                if two.tail[i].load(Ordering::Acquire) == 1 {
                    withdraw(&two.waiting[i]);
                    got[i] = true;
                    ready = true;
                }
            }
            if !ready {
                two.bell.wait_past(seen);
            }
            // The wait returns: its announcements are withdrawn.
            for w in &two.waiting {
                withdraw(w);
            }
        }
        for p in producers {
            p.join().unwrap();
        }
    });
}

const BASE: Cfg = Cfg {
    two_producers: false,
    reuse_token: false,
    raw: false,
};

#[test]
fn loom_shared_token_one_producer_two_rings() {
    run(BASE);
}

#[test]
fn loom_shared_token_two_producers_one_group() {
    run(Cfg {
        two_producers: true,
        ..BASE
    });
}

#[test]
fn loom_shared_token_reused_is_made_new_by_the_ring() {
    // A waiter that announces the same token again: `announce_token` turns it into the
    // next count on a ring that saw it, which the group does not skip.
    run(Cfg {
        reuse_token: true,
        ..BASE
    });
}

#[test]
#[should_panic(expected = "deadlock")]
fn loom_shared_token_reused_as_is_loses_a_wakeup() {
    // Without that rule: rung for the token on one ring, the waiter wakes, finds the
    // other ring empty and sleeps on the same token; the second record's producer then
    // skips the doorbell, and nobody wakes the waiter.
    run(Cfg {
        reuse_token: true,
        raw: true,
        ..BASE
    });
}
