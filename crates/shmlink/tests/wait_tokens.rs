//! Shared wait tokens (docs/design.md §4.4): an event loop that sleeps on several `shm:`
//! connections announces one token on each, and the peer's connections in one
//! `WakeGroup` ring one doorbell for it, not one per connection; a new token (the next
//! sleep) rings again, and connections without a group ring as before.

mod common;

use std::os::fd::AsRawFd;
use std::sync::Arc;

use common::*;
use shmlink::shm::WakeGroup;
use shmlink::{Connection, ErrorKind};

/// Whether `fd` becomes readable within `ms` milliseconds.
fn readable_within(fd: i32, ms: i32) -> bool {
    let mut p = libc::pollfd {
        fd,
        events: libc::POLLIN,
        revents: 0,
    };
    // SAFETY: one valid pollfd.
    unsafe { libc::poll(&mut p, 1, ms) == 1 }
}

/// The waiter's announcement pass: a non-blocking receive that finds nothing, with
/// `token`, on each connection.
fn sleep_on(conns: &mut [&mut Connection], token: u64) {
    for c in conns.iter_mut() {
        c.shm().unwrap().set_wait_token(Some(token));
        assert_eq!(c.recv_vec().unwrap_err().kind(), ErrorKind::WouldBlock);
        c.shm().unwrap().set_wait_token(None);
    }
}

#[test]
fn a_shared_token_rings_one_doorbell_per_sleep() {
    let (mut c1, mut s1) = pair_with("shm", &kernel_opts());
    let (mut c2, mut s2) = pair_with("shm", &kernel_opts());
    let group = Arc::new(WakeGroup::new());
    c1.shm().unwrap().set_wake_group(Some(group.clone()));
    c2.shm().unwrap().set_wake_group(Some(group));
    s1.set_nonblocking(true);
    s2.set_nonblocking(true);

    // One sleep on both, both answered: one doorbell, on the first answered.
    sleep_on(&mut [&mut s1, &mut s2], 1 << 30);
    c1.send(b"one").unwrap();
    c2.send(b"two").unwrap();
    assert!(
        readable_within(s1.as_raw_fd(), 10_000),
        "no doorbell at all"
    );
    assert!(
        !readable_within(s2.as_raw_fd(), 200),
        "a second doorbell for the same token"
    );
    // Woken, the waiter looks at every connection of that sleep.
    assert_eq!(s1.recv_vec().unwrap(), b"one");
    assert_eq!(s2.recv_vec().unwrap(), b"two");

    // The next sleep has a new token: it rings again, once.
    sleep_on(&mut [&mut s1, &mut s2], 2 << 30);
    c2.send(b"three").unwrap();
    c1.send(b"four").unwrap();
    assert!(
        readable_within(s2.as_raw_fd(), 10_000),
        "a new token got no doorbell"
    );
    assert!(!readable_within(s1.as_raw_fd(), 200));
    assert_eq!(s2.recv_vec().unwrap(), b"three");
    assert_eq!(s1.recv_vec().unwrap(), b"four");

    // The same token announced again is made a count by the ring: it rings.
    sleep_on(&mut [&mut s1], 2 << 30);
    c1.send(b"five").unwrap();
    assert!(
        readable_within(s1.as_raw_fd(), 10_000),
        "a reused token was skipped"
    );
    assert_eq!(s1.recv_vec().unwrap(), b"five");

    // Without a group, every connection rings, as without tokens.
    c1.shm().unwrap().set_wake_group(None);
    c2.shm().unwrap().set_wake_group(None);
    sleep_on(&mut [&mut s1, &mut s2], 3 << 30);
    c1.send(b"six").unwrap();
    c2.send(b"seven").unwrap();
    assert!(readable_within(s1.as_raw_fd(), 10_000));
    assert!(readable_within(s2.as_raw_fd(), 10_000));
    assert_eq!(s1.recv_vec().unwrap(), b"six");
    assert_eq!(s2.recv_vec().unwrap(), b"seven");
}
