//! Publish/subscribe over shared memory (docs/design.md §7), with remote subscribers over
//! `tcp:`, `tls:` and `auto:`: one [`Publisher`] writes each message once into a
//! broadcast ring; any number of [`Subscriber`]s (up to 128), in other processes, read
//! it in place with their own cursors — or, on other hosts, receive it from the
//! publisher's fan-out thread, which reads the same ring for them.
//!
//! ```text
//!             ┌──────────── topic memfd (subscribers: read-only) ────────────┐
//! Publisher ─▶│ header │ written │ closed │ slot 0 │ slot 1 │ … │ slot n-1 │
//!             └──────────────────────────────────────────────────────────────┘
//!                  ▲ cursor page (one per subscriber, shared with the publisher only)
//! Subscriber ──────┘ + a Unix socket to the publisher: doorbells both ways, liveness
//! ```
//!
//! - **Addresses**: `shm:` addresses are resolved like a [`Listener`](crate::Listener)'s:
//!   the publisher binds a `SOCK_SEQPACKET` rendezvous socket there, with the same
//!   access rules (same uid or root, plus [`Options::allow_uids`] /
//!   [`Options::allow_gids`], checked with `SO_PEERCRED`). `tcp:HOST:PORT` and
//!   `tls:HOST:PORT` bind a network listener instead (no local socket), `auto:HOST:PORT`
//!   a network listener and a rendezvous socket that admits only subscribers holding a
//!   token handed out over the network (see [`Publisher`]).
//! - **One write per message**: the publisher's cost does not grow with the number of
//!   subscribers. It reads subscribers' cursors only when the ring looks full (the
//!   cached minimum says so) and wakes only subscribers that announced sleep.
//! - **Policies** ([`Policy`]): `Block` is lossless and waits for the slowest
//!   subscriber, detaching one that does not catch up within the stall timeout (see
//!   [`PubSubOptions::stall_timeout`]); `Overwrite` never
//!   waits and tells a lagging subscriber exactly how many messages it lost
//!   ([`ErrorKind::Lagged`](crate::ErrorKind::Lagged), [`Error::missed`](crate::Error::missed)).
//! - **Late joiners** start with the next message, or replay up to
//!   [`PubSubOptions::history`] messages still in the ring.
//! - **Robustness**: a subscriber that dies is removed the moment its socket closes
//!   (its slot is free for the next one); a publisher that dies gives every subscriber
//!   [`ErrorKind::ConnectionReset`](crate::ErrorKind::ConnectionReset), one that closes
//!   gives [`ErrorKind::EndOfStream`](crate::ErrorKind::EndOfStream) after the last
//!   message. Subscribers map the messages read-only (`F_SEAL_FUTURE_WRITE`), so a
//!   hostile subscriber cannot change what the others read, and every value a
//!   subscriber reads from shared memory is validated.
//!
//! # Over the network
//!
//! See [`Publisher`]'s docs ("Remote subscribers"): a fan-out thread ([`fanout`])
//! reads the ring once per remote subscriber and forwards the messages as records
//! ([`wire`]) on framed connections; [`remote`] is the subscriber's side.
//!
//! [`Options::allow_uids`]: crate::Options::allow_uids
//! [`Options::allow_gids`]: crate::Options::allow_gids

mod control;
mod fanout;
pub(crate) mod handshake;
mod options;
mod publisher;
mod remote;
pub(crate) use shmlink_ring::broadcast as ring;
// Offsets, raw constructors and fuzz entry points here serve `crate::testing` only.
#[cfg_attr(not(feature = "testing"), allow(dead_code))]
pub(crate) mod segment;
// Offsets, raw constructors and fuzz entry points here serve `crate::testing` only.
#[cfg_attr(not(feature = "testing"), allow(dead_code))]
pub(crate) mod shm_subscriber;
pub(crate) mod stats;
pub(crate) mod status;
pub(crate) mod subscriber;
mod topic;
// Offsets, raw constructors and fuzz entry points here serve `crate::testing` only.
#[cfg_attr(not(feature = "testing"), allow(dead_code))]
pub(crate) mod wire;

pub use options::{Policy, PubSubOptions};
pub use publisher::{Loan, Publisher, PublisherStats, SubscriberInfo};
pub use ring::MAX_SUBSCRIBERS;
pub use stats::SubscriberStats;
pub use status::{TopicStatus, TopicSubscriber};
pub use subscriber::{Messages, Sample, Subscriber};

/// A blocking receive that found no message within `PubSubOptions::recv_timeout`.
pub(crate) fn timed_out(addr: &str) -> crate::Error {
    crate::Error::new(
        crate::ErrorKind::TimedOut,
        format!("{addr}: no message within the receive timeout"),
    )
}
