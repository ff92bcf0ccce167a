//! Events for the optional `tracing` cargo feature: accept, refusal (with the reason),
//! peer death, pub/sub detach and lag.
//!
//! [`event!`] forwards to the `tracing` crate's macro of the same level, with the target
//! `shmlink`, when the feature is on; without it the call expands to nothing — its
//! arguments are not even evaluated — so the feature costs nothing when off.

/// `event!(LEVEL, fields…, "message")`: a `tracing` event at `LEVEL` (`debug`, `info`,
/// `warn`) with target `shmlink`, or nothing without the `tracing` feature.
macro_rules! event {
    ($level:ident, $($arg:tt)+) => {{
        #[cfg(feature = "tracing")]
        ::tracing::$level!(target: "shmlink", $($arg)+);
    }};
}
pub(crate) use event;
