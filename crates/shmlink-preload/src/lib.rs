//! `libshmlink_preload.so`: transparent mode. Loaded with `LD_PRELOAD` (or by
//! `shmlink run -- CMD`), it takes over the socket calls of an unmodified program and
//! moves each TCP connection whose two ends are preloaded processes on one kernel onto a
//! shmlink shared-memory connection; everything else goes to the kernel untouched.
//!
//! How (docs/transparent.md says it for users):
//! - A listening TCP socket of a preloaded process is registered as a shmlink listener in
//!   the rendezvous directory, named after its network namespace, address and port
//!   (`peer`). A helper thread answers claims on it.
//! - A preloaded client connects over TCP as usual. If the destination is local and a
//!   registration exists, it connects to that listener and claims the TCP connection by
//!   its four addresses; the server side answers yes only if its program has not accepted
//!   that TCP connection yet (else it already treats it as plain TCP). Nothing is ever
//!   written into the TCP stream, so a plain peer on either side sees plain TCP.
//! - Once both sides agree, the application's fd number is re-pointed (`dup3`) at the
//!   shmlink connection's control socket, which the kernel makes readable on doorbells and
//!   on the peer's death, so `epoll`, `poll` and `select` keep working on it; the real TCP
//!   socket stays open underneath (for `getsockname`, `getpeername`, socket options).
//! - Calls on such an fd go through `stream` (the blocking calls) to `sock::Sock`: bytes
//!   travel as messages in the rings, a partly read message waits in a buffer, a
//!   zero-length message is the FIN of `shutdown(SHUT_WR)`.
//!
//! Calls this library makes itself reach the C library directly (`real`, guarded per
//! thread by `Guard`), so it never recurses into its own hooks.

mod exec;
mod hooks;
mod peer;
mod real;
mod refusals;
mod sock;
mod state;
mod stats;
mod stream;
mod switch;
mod table;
mod tcp;
mod wait;
mod wake;

use std::cell::Cell;
use std::sync::OnceLock;
use std::time::Duration;

thread_local! {
    /// Set while this thread runs the library's own code: hooks then pass straight to the
    /// C library.
    static INSIDE: Cell<bool> = const { Cell::new(false) };
}

/// While alive, this thread's socket calls bypass the hooks (the library's own calls).
pub(crate) struct Guard {
    was: bool,
}

impl Guard {
    /// Enters the library's own code on this thread.
    pub(crate) fn enter() -> Guard {
        let was = INSIDE.try_with(|c| c.replace(true)).unwrap_or(true);
        Guard { was }
    }
}

impl Drop for Guard {
    fn drop(&mut self) {
        let was = self.was;
        let _ = INSIDE.try_with(|c| c.set(was));
    }
}

/// Whether this thread is inside the library (or tearing down its thread-locals), so a
/// hooked call must go straight to the C library.
pub(crate) fn inside() -> bool {
    INSIDE.try_with(|c| c.get()).unwrap_or(true)
}

/// Settings read once from the environment.
pub(crate) struct Config {
    /// `SHMLINK_PRELOAD=off` turns every hook into a plain pass-through.
    pub enabled: bool,
    /// `SHMLINK_LOG=debug` (or `trace`): each decision on stderr.
    pub debug: bool,
    /// `SHMLINK_SPIN_US`: how long a blocking call polls the ring before sleeping.
    pub spin: Duration,
    /// `SHMLINK_SPIN_MAX_US`: how far a thread whose sleeps keep ending soon may stretch
    /// its spin (`stream::spin`); never below `spin`.
    pub spin_max: Duration,
    /// `SHMLINK_RING_SIZE`: each direction's ring, in bytes.
    pub ring_size: usize,
    /// `SHMLINK_STATS=1`: count how waits end, print the counts at exit (`stats`).
    pub stats: bool,
    /// `SHMLINK_WAIT_TOKENS=off`: every shm member of a wait announces its own count and
    /// every answered connection rings (`wake`; on by default).
    pub wait_tokens: bool,
    /// The cross-uid policy (docs/transparent.md, "Across users").
    pub policy: UidPolicy,
}

/// Which other users a preloaded process deals with over shared memory, besides its own
/// uid and root (the default: none). Read from the environment `shmlink run` sets.
#[derive(Default)]
pub(crate) struct UidPolicy {
    /// `SHMLINK_ALLOW_UIDS`: client uids this process's registrations admit.
    pub allow_uids: Vec<u32>,
    /// `SHMLINK_ALLOW_GIDS`: client primary gids its registrations admit.
    pub allow_gids: Vec<u32>,
    /// `SHMLINK_EXPECT_UIDS`: server uids this process trusts as a client (the uid that
    /// bound a registration, and the owner of the rendezvous directory).
    pub expect_uids: Vec<u32>,
    /// Entries of those variables that are not ids, to report once.
    pub bad: Vec<String>,
}

impl UidPolicy {
    /// Reads the three variables (ids separated by commas or spaces).
    fn from_env(var: impl Fn(&str) -> Option<String>) -> UidPolicy {
        let mut bad = Vec::new();
        let mut ids = |k: &str| -> Vec<u32> {
            let Some(v) = var(k) else {
                return Vec::new();
            };
            let mut out = Vec::new();
            for t in v.split([',', ' ']).filter(|t| !t.is_empty()) {
                match t.parse::<u32>() {
                    Ok(id) if id != u32::MAX => out.push(id),
                    _ => bad.push(format!("{k}: {t:?} is not a uid or gid")),
                }
            }
            out
        };
        let allow_uids = ids("SHMLINK_ALLOW_UIDS");
        let allow_gids = ids("SHMLINK_ALLOW_GIDS");
        let expect_uids = ids("SHMLINK_EXPECT_UIDS");
        UidPolicy {
            allow_uids,
            allow_gids,
            expect_uids,
            bad,
        }
    }

    /// Whether registrations admit any other user.
    pub(crate) fn allows_others(&self) -> bool {
        !self.allow_uids.is_empty() || !self.allow_gids.is_empty()
    }
}

/// The default spin budget of a blocking wait before it sleeps on the kernel.
pub(crate) const DEFAULT_SPIN_US: u64 = 20;
/// The default ceiling of a stretched spin (docs/transparent.md, "How the waiting works").
pub(crate) const DEFAULT_SPIN_MAX_US: u64 = 200;
/// The default ring size per direction.
pub(crate) const DEFAULT_RING_SIZE: usize = 256 * 1024;

pub(crate) fn config() -> &'static Config {
    static CONFIG: OnceLock<Config> = OnceLock::new();
    let mut fresh = false;
    let c = CONFIG.get_or_init(|| {
        fresh = true;
        let _g = Guard::enter();
        let var = |k: &str| std::env::var(k).ok().filter(|v| !v.is_empty());
        let enabled = !matches!(var("SHMLINK_PRELOAD").as_deref(), Some("off" | "0"));
        let debug = matches!(var("SHMLINK_LOG").as_deref(), Some("debug" | "trace"));
        let us = |k: &str, default: u64| {
            var(k)
                .and_then(|v| v.parse::<u64>().ok())
                .unwrap_or(default)
                .min(1_000_000)
        };
        let spin = us("SHMLINK_SPIN_US", DEFAULT_SPIN_US);
        let spin_max = us("SHMLINK_SPIN_MAX_US", DEFAULT_SPIN_MAX_US).max(spin);
        let ring_size = var("SHMLINK_RING_SIZE")
            .and_then(|v| v.parse::<usize>().ok())
            .filter(|&n| (shmlink::MIN_RING_SIZE..=shmlink::MAX_RING_SIZE).contains(&n))
            .unwrap_or(DEFAULT_RING_SIZE);
        let stats = matches!(var("SHMLINK_STATS").as_deref(), Some("1" | "on"));
        let wait_tokens = !matches!(var("SHMLINK_WAIT_TOKENS").as_deref(), Some("off" | "0"));
        Config {
            policy: UidPolicy::from_env(var),
            stats,
            wait_tokens,
            enabled,
            debug,
            spin: Duration::from_micros(spin),
            spin_max: Duration::from_micros(spin_max),
            // At least 64 KiB: a write's 16 KiB messages then always fit one record.
            ring_size: ring_size
                .next_power_of_two()
                .clamp(64 * 1024, shmlink::MAX_RING_SIZE),
        }
    });
    if fresh && c.stats {
        stats::install();
    }
    if fresh && c.debug {
        refusals::install();
    }
    if fresh {
        for why in &c.policy.bad {
            log(format_args!("ignored {why}"));
        }
    }
    c
}

/// Writes one line to stderr with the C library's `write` when `SHMLINK_LOG=debug`.
pub(crate) fn log(args: std::fmt::Arguments<'_>) {
    if !config().debug {
        return;
    }
    let _g = Guard::enter();
    let line = format!("shmlink-preload[{}]: {args}\n", std::process::id());
    let mut rest = line.as_bytes();
    while !rest.is_empty() {
        // SAFETY: `rest` is a valid buffer; fd 2 may be closed, which write reports.
        let n = unsafe { real::write(2, rest.as_ptr().cast(), rest.len()) };
        if n <= 0 {
            break;
        }
        rest = &rest[n as usize..];
    }
}

macro_rules! debug {
    ($($t:tt)*) => { $crate::log(format_args!($($t)*)) };
}
pub(crate) use debug;

/// Sets errno and returns -1 in the given integer type.
pub(crate) fn fail<T: From<i8>>(errno: libc::c_int) -> T {
    set_errno(errno);
    T::from(-1)
}

pub(crate) fn set_errno(errno: libc::c_int) {
    // SAFETY: errno is this thread's.
    unsafe { *libc::__errno_location() = errno };
}

pub(crate) fn errno() -> libc::c_int {
    // SAFETY: errno is this thread's.
    unsafe { *libc::__errno_location() }
}
