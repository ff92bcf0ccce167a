//! The atomics the lock-free protocols use, from one place so that loom can replace them
//! (`RUSTFLAGS="--cfg loom" cargo test -p shmlink --lib loom`).
#![allow(clippy::disallowed_types)]

#[cfg(loom)]
pub(crate) use loom::sync::atomic::{fence, AtomicU32, AtomicU64, Ordering};
#[cfg(not(loom))]
pub(crate) use std::sync::atomic::{fence, AtomicU32, AtomicU64, Ordering};
