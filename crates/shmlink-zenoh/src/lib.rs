//! Topics across hosts through [Zenoh](https://zenoh.io): a bridge that keeps local
//! traffic on shared memory and sends one copy of each message of the topics it is
//! told to export to Zenoh, under the key `<prefix><topic>` (default prefix
//! `shmlink/`), and publishes what Zenoh delivers for the keys it is told to import
//! into local topics. Any Zenoh application (Python, C, Rust, `zenohd`) can subscribe
//! to `shmlink/<topic>` or publish to it. See docs/zenoh.md.
//!
//! ```no_run
//! use shmlink_zenoh::{Bridge, BridgeConfig, Pattern};
//! let config = BridgeConfig {
//!     export: vec![Pattern::new("sensors.*").unwrap()],
//!     import: vec![Pattern::new("commands").unwrap()],
//!     listen: vec!["tcp/0.0.0.0:7447".into()],
//!     ..BridgeConfig::default()
//! };
//! let bridge = Bridge::open(config)?;
//! // ... later
//! bridge.close();
//! # Ok::<(), shmlink_zenoh::Error>(())
//! ```
//!
//! A publishing process can also send its topic to Zenoh itself, with an
//! [`ExportingPublisher`]: the same keys and attachments as a bridge's, one hop and one
//! wake-up less on the way out. A subscribing process can bring its topic in itself, with
//! an [`ImportingSubscriber`]: Zenoh's receive thread calls its handler and fills the
//! local topic for the host's other subscribers, one hop and one wake-up less on the way
//! in.
//!
//! Modules: [`config`] (allow-lists, key prefix, Zenoh session options, access control), [`header`] (the
//! attachment every bridged message carries), and the bridge itself.

mod bridge;
pub mod config;
pub mod header;
mod publisher;
mod status;
mod subscriber;

pub use bridge::{Bridge, Direction, Error, TopicStats};
pub use config::{BridgeConfig, Grant, Mode, Pattern, Tls, DEFAULT_PREFIX};
pub use publisher::ExportingPublisher;
pub use subscriber::ImportingSubscriber;
