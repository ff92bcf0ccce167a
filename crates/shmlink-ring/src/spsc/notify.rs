//! The wake-up protocol's shared half (docs/design.md §4): announcing sleep in an
//! announcement count, deciding whether to wake a peer after publishing a position, the
//! two fence modes and why the asymmetric one is sound, withdrawn announcements and
//! shared wait tokens ([`WakeGroup`]). The ring's `arm`/`commit`/`advance` call these.

#[cfg(doc)]
use super::{Consumer, Producer};
use crate::sync::{compiler_fence, fence, AtomicU64, Ordering};

/// How a side orders "publish my position" against "read the sleeper's flag".
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FenceMode {
    /// Both the waker and the sleeper issue a full fence (docs/design.md §4.2; the
    /// protocol the loom model checks).
    Symmetric,
    /// The waker, on every record, only stops the compiler from reordering; the sleeper,
    /// before it re-checks, runs `membarrier(GLOBAL_EXPEDITED)`, which makes every CPU
    /// running a registered process (the waker's) execute a full fence. That is the same
    /// StoreLoad ordering as two fences, paid on the rare path only (the argument is at
    /// `announce`: loom cannot check it). Both processes must be registered
    /// ([`shmlink_sys::membarrier_register`]); the handshake checks it.
    Asymmetric,
}

// # Why the asymmetric fence is sound (an argument: loom cannot check it)
//
// The loom model checks `Symmetric`: the waker W stores its position, fences, loads the
// sleeper's count; the sleeper S stores its count, fences, loads W's position (the
// re-check). Of two SeqCst fences one comes first, so one side sees the other's store.
// `Asymmetric` removes W's fence (a compiler barrier remains) and adds to S, after its
// fence, `membarrier(MEMBARRIER_CMD_GLOBAL_EXPEDITED)`. Loom has no operation by which one
// thread makes another execute a fence at a point the other does not choose, which is
// what membarrier does; modelling it as a fence on S's own side would check nothing new.
// What loom does show (`loom_asymmetric_mode_without_its_membarrier_loses_a_wakeup`): the
// mode without the membarrier's effect loses a wake-up, so everything rests on the
// guarantee below.
//
// What the kernel guarantees (membarrier(2); the ordering table in the syscall's comment
// in kernel/sched/membarrier.c): when GLOBAL_EXPEDITED returns, every thread of every
// process registered with MEMBARRIER_CMD_REGISTER_GLOBAL_EXPEDITED that was running has
// passed through a full memory barrier (an IPI to its CPU) between the call's entry and
// its return; a thread that was not running is in that state already (the scheduler
// fences on context switch). The call fences the caller at entry and at exit. The table
// lists "compiler barrier on one side, sys_membarrier on the other" as ordered, like two
// full barriers. The IPI's barrier lands at some point P of W's instruction stream:
// - P before W's position store: S's count store came before the IPI was sent (S's fence,
//   then the entry barrier), and W's count load comes after P (the compiler barrier keeps
//   it there in program order; a CPU does not hoist loads above a full barrier), so W
//   sees the count and wakes S.
// - P between W's store and its load: a full fence between them, the symmetric case.
// - P after W's load: W's store precedes P, so it is globally visible before membarrier
//   returns, and S's re-check, after the return, sees W's position: S does not sleep.
// The compiler barrier is what makes "P between the store and the load" the only way to
// split them: without it the compiler could sink the store below the load. (Rust's
// `compiler_fence` is specified for exactly this: ordering against code that runs
// asynchronously on the same thread, as a signal handler — here, the IPI's barrier.)
//
// Across processes: the two sides are different processes that share memory, so the
// command must be GLOBAL_EXPEDITED, as `shmlink_sys::membarrier_global` issues.
// PRIVATE_EXPEDITED fences only the threads of the caller's own process (those sharing
// its mm) and would leave the peer unfenced. Both sides register before offering the
// feature (shmlink's `transport::shm::own_features`) and the handshake enables the mode
// only if both offered it. Registration belongs to the mm: a forked child inherits it (checked on
// Linux 6.18: a child of a registered process may issue PRIVATE_EXPEDITED, which refuses
// unregistered callers) and exec clears it, as it clears `membarrier_register`'s
// cached answer. The call can still fail after that: ENOMEM (the kernel allocates a CPU
// mask), or a seccomp filter installed after the handshake. W was then perhaps not
// fenced, so `announce` reports it and the sleeper polls instead of sleeping.

/// Set in an announcement count by a side that no longer sleeps on its announcement
/// ([`Consumer::withdraw`]): wakers ring nothing for it. A peer that predates the bit
/// never sets it (its counts stay far below 2^63), and one that ignores it rings once
/// more for the changed count: a spurious wake-up, as before the bit existed.
pub const WITHDRAWN: u64 = 1 << 63;

/// Full fence (or its light half), then read the other side's announcement count: `true`
/// (wake it) if it announced sleep since the last wake-up we sent, which `woken` records,
/// and has not withdrawn it.
#[inline(always)]
pub(super) fn take_waiter(count: &AtomicU64, woken: &mut u64, mode: FenceMode) -> bool {
    match mode {
        // SYNC POINT (notify): pairs with the fence in `announce` on the other side. Our
        // position store (Release) precedes this fence and the count load follows it; the
        // sleeper's count store precedes its fence and its position load follows. Of two
        // SeqCst fences one is first, so at least one side sees the other's store: no lost
        // wake-up.
        FenceMode::Symmetric => fence(Ordering::SeqCst),
        // SYNC POINT (notify, asymmetric): pairs with the membarrier in `announce`. If our
        // count load ran before the sleeper's membarrier, the membarrier made our earlier
        // position store visible before the sleeper re-checks; if it ran after, it sees
        // the count the sleeper stored before its membarrier.
        FenceMode::Asymmetric => compiler_fence(Ordering::SeqCst),
    }
    // The count lives in the peer's memory: any value may be there, and all it decides is
    // whether to ring a doorbell. An honest count only grows, so a new announcement always
    // differs from the last one woken for.
    let now = count.load(Ordering::Relaxed);
    // A withdrawn announcement: the peer is awake and checks the ring before it sleeps
    // again, which it announces with a new count (the fence argument then holds anew).
    if now == *woken || now & WITHDRAWN != 0 {
        return false;
    }
    *woken = now;
    true
}

/// Announce sleep: count one more announcement, then the heavy fence (the check that
/// follows is the caller's). Returns `false` if the heavy half of an asymmetric fence
/// failed: the waker may then miss the announcement, so the caller must not sleep.
#[must_use]
pub(super) fn announce(count: &AtomicU64, mode: FenceMode) -> bool {
    // Only this side writes its count (it lives in our own memory), so load and store
    // need no read-modify-write. Clearing `WITHDRAWN` and counting on gives a value no
    // waker has woken for (wakers remember counts without the bit).
    // A count never carries `SHARED_TOKEN` (a token before it counts on without it).
    count.store(
        (count.load(Ordering::Relaxed) & COUNT_BITS).wrapping_add(1) & COUNT_BITS,
        Ordering::Relaxed,
    );
    // SYNC POINT (notify): pairs with `take_waiter` on the other side.
    fence(Ordering::SeqCst);
    match mode {
        FenceMode::Symmetric => true,
        // SYNC POINT (notify, asymmetric): the fence the waker's compiler barrier pairs
        // with (see "Why the asymmetric fence is sound" above).
        FenceMode::Asymmetric => membarrier_global(),
    }
}

/// Set in an announcement made with a shared wait token ([`Consumer::arm_token`]): a waiter
/// that sleeps on several rings at once (an event loop's `epoll_wait`) announced the same
/// value on each, and a producer process that rang for that value on one of them may skip
/// the others ([`WakeGroup`]). Counts ([`Consumer::arm`]) never carry the bit.
pub const SHARED_TOKEN: u64 = 1 << 62;

/// The bits of an announcement that count: they only grow, whatever mix of counts and
/// tokens a side announces, so an announcement never equals one a waker woke for.
const COUNT_BITS: u64 = !(WITHDRAWN | SHARED_TOKEN);

/// Announce sleep with a shared wait token (see [`SHARED_TOKEN`]): the token if it is above
/// the ring's last announcement, else the next count, without the bit (a waker then
/// rings as for any count: only a missed skip, never a lost wake-up). Either way the
/// value's [`COUNT_BITS`] grow, as `announce`'s do.
#[must_use]
pub(super) fn announce_token(count: &AtomicU64, token: u64, mode: FenceMode) -> bool {
    let last = count.load(Ordering::Relaxed) & COUNT_BITS;
    let token = token & COUNT_BITS;
    let next = if token > last {
        token | SHARED_TOKEN
    } else {
        last.wrapping_add(1) & COUNT_BITS
    };
    count.store(next, Ordering::Relaxed);
    // SYNC POINT (notify): pairs with `take_waiter` on the other side, as in `announce`.
    fence(Ordering::SeqCst);
    match mode {
        FenceMode::Symmetric => true,
        // SYNC POINT (notify, asymmetric): as in `announce`.
        FenceMode::Asymmetric => membarrier_global(),
    }
}

/// What a producer process remembers of one peer process's shared wait tokens: the last
/// one it rang a doorbell for, on any of the connections to that peer. A waiter that
/// announced one token on several rings sleeps on all of their doorbells in one wait and,
/// once woken, looks at every one of those rings before it sleeps again, with a new token
/// (the ring makes each announcement's value new, [`Consumer::arm_token`]). So one
/// doorbell per token suffices: a producer that finds the token already rung for skips
/// its own. Its data is then either seen by the waiter's scan after that doorbell, or
/// the scan ran before the data's fence, and the waiter's next announcement (a new
/// value, then a full fence) is ordered after it and sees the data, or the producer
/// reads the new value and rings. Only the existence of a ringer matters, so the swap is
/// Relaxed. Keep one group per peer process: token values are unique only within the
/// process that announced them, and a peer's values decide only its own wake-ups.
#[derive(Debug, Default)]
pub struct WakeGroup {
    last: AtomicU64,
}

impl WakeGroup {
    /// A group that has rung for nothing yet.
    pub fn new() -> WakeGroup {
        WakeGroup {
            last: AtomicU64::new(0),
        }
    }

    /// Whether to ring the doorbell for `announced` (what the waker woke for,
    /// [`Producer::woken`]): always for a count; for a shared token, only if nobody in
    /// the group rang for it already (the first caller claims it).
    #[inline]
    pub fn claim(&self, announced: u64) -> bool {
        if announced & SHARED_TOKEN == 0 || announced & WITHDRAWN != 0 {
            return true;
        }
        // SYNC POINT (notify, shared token): Relaxed: see the type's documentation.
        self.last.swap(announced, Ordering::Relaxed) != announced
    }
}

/// Withdraw the standing announcement, if any: no fence, because a waker that still
/// reads the old count only rings a doorbell the side treats as stale.
pub(super) fn withdraw(count: &AtomicU64) {
    let now = count.load(Ordering::Relaxed);
    if now & WITHDRAWN == 0 {
        // SYNC POINT (notify, withdraw): Relaxed: see above; ordered for wakers by the
        // fence of the next `announce`, which clears the bit.
        count.store(now | WITHDRAWN, Ordering::Relaxed);
    }
}

/// `shmlink_sys::membarrier_global`, whether it ran (tests can make it fail).
fn membarrier_global() -> bool {
    #[cfg(all(test, not(loom)))]
    if super::tests::MEMBARRIER_FAILS.with(std::cell::Cell::get) {
        return false;
    }
    // Loom cannot model the call's effect (see above): its models see a no-op.
    cfg!(loom) || shmlink_sys::membarrier_global().is_ok()
}
