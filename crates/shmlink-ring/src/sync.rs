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

/// A cell for data the protocols hand between threads by their atomics: loom's under
/// `--cfg loom` (which reports any access not ordered by them), in a normal build a
/// plain `UnsafeCell` with the same closure interface.
#[cfg(loom)]
pub use loom::cell::UnsafeCell;

/// A cell for data the protocols hand between threads by their atomics: loom's under
/// `--cfg loom` (which reports any access not ordered by them), in a normal build a
/// plain `UnsafeCell` with the same closure interface.
#[cfg(not(loom))]
#[derive(Debug, Default)]
pub struct UnsafeCell<T>(std::cell::UnsafeCell<T>);

#[cfg(not(loom))]
impl<T> UnsafeCell<T> {
    /// A cell holding `value`.
    pub const fn new(value: T) -> UnsafeCell<T> {
        UnsafeCell(std::cell::UnsafeCell::new(value))
    }

    /// Calls `f` with a pointer to the contents, for reading.
    #[inline(always)]
    pub fn with<R>(&self, f: impl FnOnce(*const T) -> R) -> R {
        f(self.0.get())
    }

    /// Calls `f` with a pointer to the contents, for writing.
    #[inline(always)]
    pub fn with_mut<R>(&self, f: impl FnOnce(*mut T) -> R) -> R {
        f(self.0.get())
    }
}
