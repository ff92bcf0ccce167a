//! The benchmark suite behind `shmlink bench`: every IPC method between two separate
//! processes, measured by the same drivers.
//!
//! - [`method`]: the [`Method`](method::Method) trait every method implements, and
//!   [`methods`]: one module per method.
//! - [`protocol`]: the latency (ping-pong) and throughput (windowed) drivers and the
//!   peer's side, with verification of every message ([`payload`], [`checksum`],
//!   [`verify`]).
//! - [`run`]: one run as a driver process and a peer process.
//! - [`suite`]: many runs, interleaved across methods in rounds, summarised;
//!   [`report`]: the table, JSON and CSV; [`plot`]: the SVG/PNG charts.
//! - [`brokers`]: Redis and RabbitMQ pub/sub clients, the brokers' addresses.
//! - [`stats`], [`cpus`]: percentiles and medians; CPU lists and placement.

pub mod brokers;
pub mod checksum;
pub mod cpus;
pub mod method;
pub mod methods;
pub mod payload;
pub mod plot;
pub mod protocol;
pub mod pubsub;
pub mod report;
pub mod run;
pub mod stats;
pub mod suite;
mod sys;
pub mod verify;
