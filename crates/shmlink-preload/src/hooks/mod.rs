//! The exported C functions that take the place of the C library's, one file per family
//! of calls, and what they share: [`hook!`] (the "ours, else the real call" shape), the
//! lookup of the shm connection behind an fd, and the `fork` handlers.
//!
//! Each hook passes straight to the C library unless the fd is one this library looks
//! after (a shm connection, a registered listener, an epoll set with shm members) and the
//! call does not come from the library itself ([`inside`]).
//!
//! - `socket`: `connect`, `listen`, `accept`, `accept4`, `shutdown` (where a TCP
//!   connection moves onto shared memory, and its half-close);
//! - `io`: the `read`/`recv*`/`write`/`send*` families, with `readv`/`writev` and
//!   `sendmmsg`/`recvmmsg`;
//! - `zerocopy`: `sendfile`, `sendfile64`, `splice` (copied through a buffer on ours);
//! - `fd`: `close`, `close_range`, `closefrom`, `dup*`, `fcntl*`, `ioctl` (the fd table);
//! - `sockopt`: `getsockname`, `getpeername`, `getsockopt`, `setsockopt` (answered by
//!   the TCP socket underneath);
//! - `poll`: `poll`, `ppoll`, `select`, `pselect`, `epoll_*` (waits with shm members);
//! - `spawn`: the `exec*` family, `posix_spawn*`, `system`, `popen` (shm connections
//!   continue over TCP first).
#![allow(clippy::missing_safety_doc)]

mod fd;
mod io;
mod poll;
mod socket;
mod sockopt;
mod spawn;
mod zerocopy;

use std::sync::atomic::Ordering;
use std::sync::{Arc, Once};

use libc::c_int;

use crate::sock::Entry;
use crate::state::{self, FORKS};
use crate::{inside, table};

/// Defines the exported C function `$name`, which does what its body says when the call
/// is ours and otherwise passes its arguments unchanged to the C library's `$name`.
///
/// - `if let PAT = EXPR => { BODY }`: ours when `EXPR` matches `PAT` (usually
///   `Some(e) = shm(fd)`); the value of `BODY` is returned.
/// - `if COND => { BODY }`: ours when `COND` holds.
/// - `before_real { PRE }` (alone, or after either form above): `PRE` runs before the
///   call goes to the C library (and may `return` instead).
macro_rules! hook {
    (
        $(#[$attr:meta])*
        fn $name:ident($($arg:ident: $ty:ty),* $(,)?) -> $ret:ty;
        if let $pat:pat = $ours:expr => $body:block
        $(before_real $pre:block)?
    ) => {
        $(#[$attr])*
        #[no_mangle]
        pub unsafe extern "C" fn $name($($arg: $ty),*) -> $ret {
            if let $pat = $ours {
                return $body;
            }
            $($pre)?
            // SAFETY: the caller's arguments, passed on unchanged.
            unsafe { crate::real::$name($($arg),*) }
        }
    };
    (
        $(#[$attr:meta])*
        fn $name:ident($($arg:ident: $ty:ty),* $(,)?) -> $ret:ty;
        if $ours:expr => $body:block
        $(before_real $pre:block)?
    ) => {
        $(#[$attr])*
        #[no_mangle]
        pub unsafe extern "C" fn $name($($arg: $ty),*) -> $ret {
            if $ours {
                return $body;
            }
            $($pre)?
            // SAFETY: the caller's arguments, passed on unchanged.
            unsafe { crate::real::$name($($arg),*) }
        }
    };
    (
        $(#[$attr:meta])*
        fn $name:ident($($arg:ident: $ty:ty),* $(,)?) -> $ret:ty;
        before_real $pre:block
    ) => {
        $(#[$attr])*
        #[no_mangle]
        pub unsafe extern "C" fn $name($($arg: $ty),*) -> $ret {
            $pre
            // SAFETY: the caller's arguments, passed on unchanged.
            unsafe { crate::real::$name($($arg),*) }
        }
    };
}
use hook;

/// The shm connection behind `fd`, unless the call comes from the library itself.
#[inline]
fn shm(fd: c_int) -> Option<Arc<Entry>> {
    if !table::any() || inside() {
        return None;
    }
    table::sock(fd)
}

extern "C" fn before_fork() {
    FORKS.fetch_add(1, Ordering::Relaxed);
    state::fork_prepare();
}

extern "C" fn after_fork() {
    state::fork_done();
}

extern "C" fn after_fork_child() {
    state::own();
    crate::wake::after_fork_child();
    state::fork_done();
}

/// Counts forks, and keeps the fd table's lock out of them, from the first connection
/// or registration on.
fn watch_forks() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        state::own();
        // SAFETY: registers handlers that only touch atomics and the table's lock.
        unsafe {
            libc::pthread_atfork(Some(before_fork), Some(after_fork), Some(after_fork_child))
        };
    });
}

/// Sends SIGPIPE to this thread, as the kernel does for a write on a broken TCP socket.
fn sigpipe() {
    // SAFETY: signals this thread.
    unsafe { libc::pthread_kill(libc::pthread_self(), libc::SIGPIPE) };
}
