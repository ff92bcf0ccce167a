//! The atomics the lock-free protocols use, from one place so that loom can replace them
//! (`RUSTFLAGS="--cfg loom" cargo test -p shmlink-ring --release loom`): std's in a normal
//! build, loom's under `--cfg loom`. The rings and the shmlink library take every atomic
//! type and fence only from here (crossbeam's `primitive` module habit), so the loom build
//! models all of them: `crates/shmlink/tests/layering.rs` checks both crates' sources.

#[cfg(loom)]
pub use loom::sync::atomic::{
    fence, AtomicBool, AtomicU32, AtomicU64, AtomicU8, AtomicUsize, Ordering,
};
// A compiler-only barrier has no memory-model effect for loom to track.
pub use std::sync::atomic::compiler_fence;
#[cfg(not(loom))]
pub use std::sync::atomic::{
    fence, AtomicBool, AtomicU32, AtomicU64, AtomicU8, AtomicUsize, Ordering,
};
