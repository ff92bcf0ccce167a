//! The benchmark suite behind the `shmlink-bench` binary: every IPC method between two
//! separate processes, measured by the same drivers (those of the measurement core,
//! [`shmlink_measure`], which `shmlink pong` runs too).
//!
//! - [`cli`]: the command line (one clap parser for every pattern) and its value parsers;
//!   [`pattern`]: the [`Pattern`](pattern::Pattern) trait; [`patterns`]: one file per
//!   pattern (p2p, pubsub, async, inproc, connect, apps, containers, sessions), their
//!   list and the program's entry.
//! - [`method`]: the [`Method`](method::Method) trait every point-to-point method
//!   implements, and [`methods`]: one module per method; [`pubsub`]: the pub/sub
//!   methods, runs, suite and report.
//! - [`run`]: one run as a driver process and a peer process.
//! - [`suite`]: many runs, interleaved across methods in rounds, summarised;
//!   [`report`]: the table, JSON and CSV; [`plot`]: the SVG/PNG charts; [`output`]: the
//!   progress line, where the reports go and the exit status, for every pattern.
//! - [`brokers`]: Redis and RabbitMQ pub/sub clients, the brokers' addresses.
//! - [`fault`]: `SHMLINK_BENCH_FAULT`, which pattern injects which fault.

pub mod brokers;
pub mod cli;
pub mod fault;
pub mod method;
pub mod methods;
pub mod output;
pub mod pattern;
pub mod patterns;
pub mod placement;
pub mod plot;
pub mod pubsub;
pub mod report;
pub mod run;
pub mod suite;
mod sys;
