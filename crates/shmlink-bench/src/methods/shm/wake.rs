//! How a `shm-*` end waits for its peer, and how the peer wakes it.
//!
//! The blocking kinds share one protocol (the no-lost-wake-up check): the waiter reads
//! the slot's `word`, sets `waiting`, issues a full fence and re-checks its condition
//! before it sleeps; the waker publishes, issues a full fence, and wakes only if it finds
//! `waiting` set (clearing it). One of the two fences comes second, so either the waiter
//! sees the new data or the waker sees the flag. Every wake-up leaves a token (an eventfd
//! count, a pending signal, a changed futex word), so a wake-up that races with the
//! waiter's sleep is not lost; stale tokens only cause a spurious re-check.

use std::io;
use std::os::fd::{AsRawFd, OwnedFd};
use std::sync::atomic::{fence, Ordering};

use super::region::{self, Region};
use crate::sys::syscall;

/// The signal that wakes a `shm-signal` end (blocked in both processes, taken with
/// `sigwaitinfo`).
pub const SIGNAL: libc::c_int = libc::SIGUSR1;

/// The waiting primitive.
pub enum Wake {
    /// Busy-poll; `yield_` calls `sched_yield` between polls (both ends on one CPU).
    Spin { yield_: bool },
    /// One eventfd per wait slot, in the order ring 0 data, ring 0 space, ring 1 data,
    /// ring 1 space.
    EventFd([OwnedFd; 4]),
    /// `futex(2)` on the slot's word (shared, not private: two processes).
    Futex,
    /// `kill(SIGUSR1)` to the waiting process, `sigwaitinfo` to wait.
    Signal,
}

/// Blocks `SIGNAL` in the calling thread (and the threads it starts later), so it stays
/// pending for `sigwaitinfo` instead of killing the process.
pub fn block_signal() -> io::Result<()> {
    // SAFETY: sigset_t is plain data, initialised by sigemptyset before use.
    let mut set: libc::sigset_t = unsafe { std::mem::zeroed() };
    // SAFETY: `set` is a valid sigset_t.
    unsafe {
        libc::sigemptyset(&mut set);
        libc::sigaddset(&mut set, SIGNAL);
    }
    // SAFETY: `set` is a valid, initialised sigset_t; the old mask is not wanted.
    let rc = unsafe { libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut()) };
    if rc != 0 {
        return Err(io::Error::from_raw_os_error(rc));
    }
    Ok(())
}

/// The index of a slot offset among the four (for the eventfd array).
fn slot_index(slot: usize) -> usize {
    (slot / 512) * 2 + usize::from(slot % 512 == 384)
}

/// Which end waits in `slot`: the reader of ring r waits for data, the writer for space.
/// Ring 0 goes from the driver (end 0) to the peer (end 1).
fn waiter_of(slot: usize) -> usize {
    let r = slot / 512;
    let data = slot % 512 == 256;
    if data {
        1 - r
    } else {
        r
    }
}

impl Wake {
    /// Waits until `ready()` holds. `slot` is the region offset of this wait's slot.
    #[inline]
    pub fn wait(
        &self,
        reg: &Region,
        slot: usize,
        mut ready: impl FnMut() -> bool,
    ) -> io::Result<()> {
        if ready() {
            return Ok(());
        }
        if let Wake::Spin { yield_ } = *self {
            while !ready() {
                if yield_ {
                    std::thread::yield_now();
                } else {
                    std::hint::spin_loop();
                }
            }
            return Ok(());
        }
        let waiting = reg.u32_at(slot);
        let word = reg.u32_at(slot + 4);
        loop {
            let seen = word.load(Ordering::Acquire);
            waiting.store(1, Ordering::Relaxed);
            // SYNC POINT: pairs with the fence in `notify`.
            fence(Ordering::SeqCst);
            if ready() {
                waiting.store(0, Ordering::Relaxed);
                return Ok(());
            }
            self.sleep(slot, word.as_ptr(), seen)?;
            if ready() {
                return Ok(());
            }
        }
    }

    fn sleep(&self, slot: usize, word: *mut u32, seen: u32) -> io::Result<()> {
        match self {
            Wake::Spin { .. } => Ok(()),
            Wake::EventFd(fds) => {
                let mut count = 0u64;
                // SAFETY: `count` is valid for the 8 bytes an eventfd read writes.
                match syscall!(read(
                    fds[slot_index(slot)].as_raw_fd(),
                    (&mut count as *mut u64).cast(),
                    8
                )) {
                    Err(e) if e.kind() != io::ErrorKind::Interrupted => Err(e),
                    _ => Ok(()),
                }
            }
            Wake::Futex => {
                // SAFETY: `word` points to a live, aligned u32 in the shared mapping; a
                // null timeout waits without limit.
                let rc = unsafe {
                    libc::syscall(
                        libc::SYS_futex,
                        word,
                        libc::FUTEX_WAIT,
                        seen,
                        std::ptr::null::<libc::timespec>(),
                    )
                };
                let e = io::Error::last_os_error();
                match e.raw_os_error() {
                    _ if rc == 0 => Ok(()),
                    Some(libc::EAGAIN) | Some(libc::EINTR) => Ok(()),
                    _ => Err(e),
                }
            }
            Wake::Signal => {
                // SAFETY: as in `block_signal`.
                let mut set: libc::sigset_t = unsafe { std::mem::zeroed() };
                // SAFETY: `set` is a valid sigset_t.
                unsafe {
                    libc::sigemptyset(&mut set);
                    libc::sigaddset(&mut set, SIGNAL);
                }
                // SAFETY: `set` is initialised; no siginfo is wanted.
                match syscall!(sigwaitinfo(&set, std::ptr::null_mut())) {
                    Err(e) if e.kind() != io::ErrorKind::Interrupted => Err(e),
                    _ => Ok(()),
                }
            }
        }
    }

    /// Wakes the waiter of `slot` if it waits (or is about to); call after publishing.
    #[inline]
    pub fn notify(&self, reg: &Region, slot: usize) -> io::Result<()> {
        if let Wake::Spin { .. } = self {
            return Ok(());
        }
        // SYNC POINT: pairs with the fence in `wait`.
        fence(Ordering::SeqCst);
        let waiting = reg.u32_at(slot);
        if waiting.load(Ordering::Relaxed) == 0 || waiting.swap(0, Ordering::Relaxed) == 0 {
            return Ok(());
        }
        match self {
            Wake::Spin { .. } => {}
            Wake::EventFd(fds) => {
                let one = 1u64;
                // SAFETY: `one` is valid for the 8 bytes an eventfd write reads.
                syscall!(write(
                    fds[slot_index(slot)].as_raw_fd(),
                    (&one as *const u64).cast(),
                    8
                ))?;
            }
            Wake::Futex => {
                let word = reg.u32_at(slot + 4);
                word.fetch_add(1, Ordering::Release);
                // SAFETY: `word` is a live, aligned u32 in the shared mapping.
                unsafe { libc::syscall(libc::SYS_futex, word.as_ptr(), libc::FUTEX_WAKE, 1) };
            }
            Wake::Signal => {
                let pid = reg
                    .u32_at(region::pid(waiter_of(slot)))
                    .load(Ordering::Relaxed);
                // SAFETY: kill takes plain integers.
                syscall!(kill(pid as libc::pid_t, SIGNAL))?;
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slots_map_to_their_waiters() {
        use region::{data_slot, space_slot};
        assert_eq!(
            [data_slot(0), space_slot(0), data_slot(1), space_slot(1)].map(slot_index),
            [0, 1, 2, 3]
        );
        // Ring 0 goes driver → peer: the peer waits for data, the driver for space.
        assert_eq!(waiter_of(data_slot(0)), 1);
        assert_eq!(waiter_of(space_slot(0)), 0);
        assert_eq!(waiter_of(data_slot(1)), 0);
        assert_eq!(waiter_of(space_slot(1)), 1);
    }
}
