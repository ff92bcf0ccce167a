//! Process-wide state below every other module of the library: the one lock that `fork`
//! holds (and what it guards besides the fd table: the library's own fds), the fork
//! count, and which process owns the fd table.
//!
//! Lookups are what every hooked call on a plain fd pays, so the lock is a small spin
//! lock, held only for map operations (never while the library runs, which may call
//! hooks), and `fork` takes it in the parent before the fork and releases it on both
//! sides after ([`fork_prepare`], [`fork_done`]): a child never inherits it held by a
//! thread that does not exist there.

use std::cell::UnsafeCell;
use std::collections::HashSet;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};

use libc::c_int;

/// Bumped in the parent before every `fork`: a connection created before it may be held
/// by two processes, so closing it in one must not end it for the other.
pub(crate) static FORKS: AtomicU64 = AtomicU64::new(0);

/// The process whose fd table this library's table describes: set at the first
/// connection or registration, and in a `fork` child by the atfork handler. A `vfork`
/// child (no atfork handlers run) shares the parent's memory but not its fds: there the
/// table must not change (closing fds before exec would end the parent's connections).
static OWNER: AtomicU32 = AtomicU32::new(0);

/// Whether this process owns the table (false in a `vfork` child).
pub(crate) fn owner() -> bool {
    let o = OWNER.load(Ordering::Relaxed);
    o == 0 || o == std::process::id()
}

/// This process owns the table from now on.
pub(crate) fn own() {
    OWNER.store(std::process::id(), Ordering::Relaxed);
}

/// The lock: held while a [`Shared`] value is reached, and across `fork`.
static BUSY: AtomicBool = AtomicBool::new(false);

fn acquire() {
    let mut spins = 0u32;
    // SYNC POINT: Acquire here pairs with the Release in `release`: the holder's map
    // updates are visible to the next holder.
    while BUSY
        .compare_exchange_weak(false, true, Ordering::Acquire, Ordering::Relaxed)
        .is_err()
    {
        spins += 1;
        if spins < 64 {
            std::hint::spin_loop();
        } else {
            std::thread::yield_now();
        }
    }
}

fn release() {
    // SYNC POINT: pairs with the Acquire in `acquire`.
    BUSY.store(false, Ordering::Release);
}

/// `pthread_atfork` prepare: holds the lock across `fork`.
pub(crate) fn fork_prepare() {
    acquire();
}

/// `pthread_atfork` parent and child: releases it.
pub(crate) fn fork_done() {
    release();
}

/// A value reached only under the lock (short critical sections only).
pub(crate) struct Shared<T>(UnsafeCell<T>);

// SAFETY: the value is only reached through `with`, which holds the lock.
unsafe impl<T> Sync for Shared<T> {}

impl<T> Shared<T> {
    pub(crate) const fn new(value: T) -> Shared<T> {
        Shared(UnsafeCell::new(value))
    }

    /// Runs `f` on the value with the lock held (`f` must not take it again).
    pub(crate) fn with<R>(&self, f: impl FnOnce(&mut T) -> R) -> R {
        struct Unlock;
        impl Drop for Unlock {
            fn drop(&mut self) {
                release();
            }
        }
        acquire();
        let _unlock = Unlock;
        // SAFETY: the lock is held: no other reference to any `Shared` value exists
        // until `release`.
        f(unsafe { &mut *self.0.get() })
    }
}

/// The library's own fds behind shm connections and registrations (control sockets, the
/// TCP sockets underneath, a registration's sockets): the program never opened them, so
/// its `close` of such a number gets what it would get without the library (EBADF), and
/// cannot pull a connection's socket away (a later doorbell would go to whatever reuses
/// the number).
static INTERNAL: Shared<Option<HashSet<c_int>>> = Shared::new(None);

/// Marks (`on`) or unmarks the library's own fds.
pub(crate) fn set_internal(fds: &[c_int], on: bool) {
    INTERNAL.with(|set| {
        let set = set.get_or_insert_with(Default::default);
        for fd in fds {
            if on {
                set.insert(*fd);
            } else {
                set.remove(fd);
            }
        }
    });
}

/// Whether `fd` is one of the library's own fds.
pub(crate) fn is_internal(fd: c_int) -> bool {
    INTERNAL.with(|set| set.as_ref().is_some_and(|s| s.contains(&fd)))
}

/// The library's own fds, in increasing order.
pub(crate) fn internal_fds() -> Vec<c_int> {
    let mut v: Vec<c_int> = INTERNAL
        .with(|set| set.as_ref().map(|s| s.iter().copied().collect()))
        .unwrap_or_default();
    v.sort_unstable();
    v
}
