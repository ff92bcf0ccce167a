//! The measurement core of `shmlink pong` and `shmlink-bench`: one implementation of
//! what both measure and how, so their numbers mean the same.
//!
//! - [`payload`], [`checksum`], [`verify`]: what every data message carries and how the
//!   receiver checks it.
//! - [`protocol`]: the latency (ping-pong) and throughput (windowed) drivers and the
//!   peer's side, over any [`Endpoint`](endpoint::Endpoint); [`link`]: the shmlink one.
//! - [`stats`]: percentiles and medians; [`cpus`]: CPU lists and placement; [`sys`]: CPU
//!   time, pinning, random seeds.
//! - [`Mode`]: latency or throughput; [`size`]: byte counts to and from text.
//!
//! A run over a connected pair of shmlink connections (here in one process, two
//! threads; pong and the bench put the ends in two processes):
//!
//! ```
//! use shmlink::{Connection, Listener, Options};
//! use shmlink_measure::link::{Access, ShmlinkEndpoint};
//! use shmlink_measure::protocol::{self, Plan, Stop, Warmup};
//! use shmlink_measure::verify::Sampling;
//! use shmlink_measure::Mode;
//!
//! let path = std::env::temp_dir().join(format!("measure-doc-{}.sock", std::process::id()));
//! let addr = format!("ux:{}", path.display());
//! let mut listener = Listener::bind(&addr, &Options::default())?;
//! let peer = std::thread::spawn(move || {
//!     let conn = Connection::connect(&addr, &Options::default()).unwrap();
//!     let mut ep = ShmlinkEndpoint::new(conn, Access::InPlace);
//!     protocol::serve(&mut ep, 64, Mode::Latency, 1, (Sampling::ALL, 0), None).unwrap()
//! });
//! let mut ep = ShmlinkEndpoint::new(listener.accept()?, Access::InPlace);
//! let plan = Plan {
//!     size: 64,
//!     mode: Mode::Latency,
//!     window: 1,
//!     warmup: Warmup::Count(10),
//!     stop: Stop::Count(100),
//!     sampling: Sampling::ALL,
//!     seed: 0,
//!     fault: None,
//! };
//! let measured = protocol::drive(&mut ep, &plan)?;
//! assert_eq!(measured.count, 100);
//! assert_eq!(peer.join().unwrap().msgs, 100);
//! # drop(listener);
//! # let _ = std::fs::remove_file(&path);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

pub mod checksum;
pub mod clock;
pub mod cpus;
pub mod endpoint;
pub mod link;
mod mode;
pub mod payload;
pub mod protocol;
pub mod size;
pub mod stats;
pub mod sys;
pub mod verify;

pub use mode::Mode;
