//! shmlink's C API: `libshmlink.so` / `libshmlink.a` with the header
//! `include/shmlink.h`, generated from this crate by cbindgen (`cbindgen.toml`;
//! `tests/header.rs` fails when the committed header is stale).
//!
//! The calls follow XCM and BSD sockets: opaque handles (`shmlink_socket` for
//! connections and listeners, `shmlink_publisher`, `shmlink_subscriber`, options
//! builders), `-1` or `NULL` plus `errno` on failure, and the library's message in
//! `shmlink_last_error()`. No Rust panic crosses into C: every entry point catches it and
//! fails with `EIO`. docs/c.md has the guide, the errno table and complete examples.
//!
//! Install with `scripts/capi.sh install PREFIX` (library, header, `shmlink.pc`).
#![deny(missing_docs)]

mod args;
mod error;
mod options;
mod pubsub;
mod socket;
mod version;

pub use error::{shmlink_last_error, shmlink_last_missed};
pub use options::*;
pub use pubsub::*;
pub use socket::*;
pub use version::*;
