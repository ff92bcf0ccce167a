//! One doorbell per sleep, not one per connection (docs/transparent.md, "Performance").
//!
//! An `epoll_wait`/`poll` that sleeps on many shm connections announces one *wait token*
//! on each ([`Announcing`], `shmlink::shm::ShmControl::set_wait_token`); a process that
//! answers several of them while it sleeps rings one doorbell for the token, not one per
//! connection, because its connections to that peer process share a
//! `shmlink::shm::WakeGroup` ([`group_for`]). Once woken, the wait looks at every member again
//! (from shared memory) before it sleeps again, with a new token: what the skipped
//! doorbells would have said is found there.
//!
//! A token is unique in this process and among the processes a peer could group
//! together: the low [`LANE_BITS`] bits are our pid (reset in a `fork` child), the bits
//! above count this process's sleeps from a clock-based start (a recycled pid does not
//! repeat its predecessor's tokens). Groups are keyed by the peer's pid as the kernel
//! reports it on the control socket (`SO_PEERCRED`): a peer's token values then decide
//! only the doorbells of its own connections; a peer the kernel does not show us (pid 0)
//! gets no group.

use std::cell::Cell;
use std::os::fd::RawFd;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};

use shmlink::shm::WakeGroup;

/// Bits of a token that hold the pid (Linux pids are below 2^22).
const LANE_BITS: u32 = 22;
/// The sleep counter's bits above the lane (the ring uses the token's low 62 bits).
const COUNT_MASK: u64 = (1 << (62 - LANE_BITS)) - 1;

/// The next sleep's count (0: not started yet).
static NEXT: AtomicU64 = AtomicU64::new(0);
/// Our pid as a token lane (`u64::MAX`: to be read, after start and in a fork child).
static LANE: AtomicU64 = AtomicU64::new(u64::MAX);

thread_local! {
    /// The token of the announcement pass this thread is in (0: none).
    static CURRENT: Cell<u64> = const { Cell::new(0) };
}

/// In a `fork` child: the child's tokens take its own pid.
pub(crate) fn after_fork_child() {
    LANE.store(u64::MAX, Ordering::Relaxed);
}

fn next_count() -> u64 {
    let mut n = NEXT.load(Ordering::Relaxed);
    loop {
        let base = if n == 0 {
            let nanos = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(1, |d| d.as_nanos() as u64);
            // Microseconds: a process started later starts higher.
            ((nanos >> 10) & COUNT_MASK).max(1)
        } else {
            n
        };
        let next = (base + 1) & COUNT_MASK;
        match NEXT.compare_exchange_weak(n, next.max(1), Ordering::Relaxed, Ordering::Relaxed) {
            Ok(_) => return base,
            Err(v) => n = v,
        }
    }
}

/// A token no sleep of this process used before.
fn new_token() -> u64 {
    let mut lane = LANE.load(Ordering::Relaxed);
    if lane == u64::MAX {
        lane = u64::from(std::process::id()) & ((1 << LANE_BITS) - 1);
        LANE.store(lane, Ordering::Relaxed);
    }
    (next_count() << LANE_BITS) | lane
}

/// One announcement pass of a wait over its shm members: while it lives, the members
/// that find nothing announce its token ([`current`]). A new pass (the next sleep) takes
/// a new token.
pub(crate) struct Announcing(());

impl Announcing {
    pub(crate) fn new() -> Announcing {
        if crate::config().wait_tokens {
            CURRENT.with(|c| c.set(new_token()));
        }
        Announcing(())
    }
}

impl Drop for Announcing {
    fn drop(&mut self) {
        CURRENT.with(|c| c.set(0));
    }
}

/// The token of this thread's announcement pass, if it is in one.
pub(crate) fn current() -> Option<u64> {
    let t = CURRENT.with(Cell::get);
    (t != 0).then_some(t)
}

/// Groups by peer pid; dead groups (no connection left) are dropped when another is
/// made.
static GROUPS: Mutex<Vec<(u32, Weak<WakeGroup>)>> = Mutex::new(Vec::new());

/// The group of the connections to the process at the other end of control socket
/// `ctl`; `None` if the kernel does not tell us who that is.
pub(crate) fn group_for(ctl: RawFd) -> Option<Arc<WakeGroup>> {
    if !crate::config().wait_tokens {
        return None;
    }
    let pid = peer_pid(ctl)?;
    // Never wait here: a lock held across a `fork` by another thread would stay held in
    // the child. Without a group the connection rings as before.
    let mut groups = GROUPS.try_lock().ok()?;
    groups.retain(|(_, g)| g.strong_count() > 0);
    if let Some(g) = groups
        .iter()
        .find(|(p, _)| *p == pid)
        .and_then(|(_, g)| g.upgrade())
    {
        return Some(g);
    }
    let g = Arc::new(WakeGroup::new());
    groups.push((pid, Arc::downgrade(&g)));
    Some(g)
}

/// The peer's pid in our PID namespace (`SO_PEERCRED`), if it is visible.
fn peer_pid(fd: RawFd) -> Option<u32> {
    // SAFETY: ucred is plain data.
    let mut cred: libc::ucred = unsafe { std::mem::zeroed() };
    let mut len = std::mem::size_of::<libc::ucred>() as libc::socklen_t;
    // SAFETY: a valid out-parameter of the size given.
    let rc = unsafe {
        libc::getsockopt(
            fd,
            libc::SOL_SOCKET,
            libc::SO_PEERCRED,
            (&mut cred as *mut libc::ucred).cast(),
            &mut len,
        )
    };
    (rc == 0 && cred.pid > 0).then_some(cred.pid as u32)
}
