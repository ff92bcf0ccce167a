//! Settings read once from the environment ([`config`]), the debug log that
//! `SHMLINK_LOG=debug` turns on ([`log`], [`debug!`]), and what reading them starts: the
//! exit report of `SHMLINK_STATS` and the refusal events of the debug log.

use std::sync::OnceLock;
use std::time::Duration;

use crate::guard::Guard;
use crate::{refusals, stats};

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
            .filter(|&n| {
                (shmlink::options::MIN_RING_SIZE..=shmlink::options::MAX_RING_SIZE).contains(&n)
            })
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
                .clamp(64 * 1024, shmlink::options::MAX_RING_SIZE),
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
    if config().debug {
        crate::log::write_line(args);
    }
}

/// `debug!("...", args)`: one line of the debug log ([`log`]).
macro_rules! debug {
    ($($t:tt)*) => { $crate::settings::log(format_args!($($t)*)) };
}
pub(crate) use debug;
