//! Events for the optional `tracing` cargo feature: accept, refusal (with the reason),
//! peer death, pub/sub detach and lag; with the `log-stderr` feature, [`log_to_stderr`]
//! prints them for the front ends (`SHMLINK_LOG`: docs/c.md and docs/python.md, "Logging").
//!
//! The crate's `event!` macro forwards to the `tracing` crate's macro of the same level,
//! with the target `shmlink`, when the feature is on; without it the call expands to
//! nothing — its arguments are not even evaluated — so the feature costs nothing when off.

/// `event!(LEVEL, fields…, "message")`: a `tracing` event at `LEVEL` (`debug`, `info`,
/// `warn`) with target `shmlink`, or nothing without the `tracing` feature.
macro_rules! event {
    ($level:ident, $($arg:tt)+) => {{
        #[cfg(feature = "tracing")]
        ::tracing::$level!(target: "shmlink", $($arg)+);
    }};
}
pub(crate) use event;

/// Prints the library's `tracing` events on stderr, one line each, filtered by
/// `$SHMLINK_LOG` — a level (`SHMLINK_LOG=info`: accepts and refusals with their
/// reasons; `debug`) or `target=level` pairs (`shmlink=debug,warn`) — or, when that is
/// unset or empty, by `default` (`None`: nothing is printed). What the `shmlink` command
/// (`-v`), the C library and the Python package call at their start. Does nothing when
/// the process has a global `tracing` subscriber already; a `$SHMLINK_LOG` that does not
/// parse is reported on stderr and ignored. Returns whether it installed the subscriber.
#[cfg(feature = "log-stderr")]
pub fn log_to_stderr(default: Option<&str>) -> bool {
    use tracing_subscriber::filter::Targets;
    use tracing_subscriber::layer::{Layer, SubscriberExt};
    use tracing_subscriber::util::SubscriberInitExt;

    let env = std::env::var("SHMLINK_LOG").ok();
    let Some(spec) = env.as_deref().filter(|s| !s.trim().is_empty()).or(default) else {
        return false;
    };
    let filter: Targets = match spec.parse() {
        Ok(f) => f,
        Err(e) => {
            eprintln!(
                "shmlink: SHMLINK_LOG={spec:?} ignored ({e}): give a level (SHMLINK_LOG=info) \
                 or target=level pairs (shmlink=debug,warn)"
            );
            return false;
        }
    };
    let layer = tracing_subscriber::fmt::layer()
        .with_writer(std::io::stderr)
        .with_ansi(false)
        .without_time()
        .with_filter(filter);
    tracing_subscriber::registry()
        .with(layer)
        .try_init()
        .is_ok()
}
