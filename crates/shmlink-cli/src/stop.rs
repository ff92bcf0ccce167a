//! Stopping `pong --server` with SIGTERM or SIGINT (a service manager, Ctrl-C): the
//! listener is dropped, which removes its socket file, and the process exits with
//! status 0. Without this the default action killed the process on the spot and left a
//! stale socket behind.
//!
//! The two signals are blocked in the serving thread before it binds, so every thread
//! started later inherits the mask, and one thread takes them with `sigwait`. It waits
//! for the listener between two (non-blocking) accepts, never in the middle of one.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use shmlink_sys::process::{signal_name, Signals};

use crate::error::{Result, RunError};

/// SIGTERM and SIGINT, blocked in the calling thread; see [`StopSignals::block`].
pub struct StopSignals {
    set: Signals,
}

impl StopSignals {
    /// Blocks SIGTERM and SIGINT in the calling thread (and the threads it starts from
    /// now on): they stay pending until [`StopSignals::drop_on_signal`] takes them.
    pub fn block() -> Result<StopSignals> {
        let set = Signals::block_stop()
            .map_err(|e| RunError::new(format!("block SIGTERM and SIGINT: {e}")))?;
        Ok(StopSignals { set })
    }

    /// Starts the thread that waits for SIGTERM or SIGINT, then sets `stop` (for a loop
    /// that checks it and ends by itself).
    pub fn flag_on_signal(self, stop: Arc<AtomicBool>) -> Result<()> {
        let set = self.set;
        std::thread::Builder::new()
            .name("shmlink-stop".into())
            .spawn(move || {
                set.wait();
                stop.store(true, Ordering::Relaxed);
            })
            .map(drop)
            .map_err(|e| RunError::new(format!("start the signal thread: {e}")))
    }

    /// Starts the thread that waits for SIGTERM or SIGINT, then drops `value` (taking
    /// the lock of the returned holder) and exits the process with status 0.
    pub fn drop_on_signal<T: Send + 'static>(self, value: T) -> Result<DropOnStop<T>> {
        let set = self.set;
        let slot = Arc::new(Mutex::new(Some(value)));
        let holder = DropOnStop(slot.clone());
        std::thread::Builder::new()
            .name("shmlink-stop".into())
            .spawn(move || {
                let sig = set.wait();
                let held = slot.lock().unwrap_or_else(|p| p.into_inner()).take();
                drop(held);
                eprintln!("shmlink pong: stopped by {}", signal_name(sig));
                std::process::exit(0);
            })
            .map(|_| holder)
            .map_err(|e| RunError::new(format!("start the signal thread: {e}")))
    }
}

/// A value the signal thread drops on SIGTERM or SIGINT; dropped as usual otherwise (the
/// signal thread's reference would keep it alive past the end of the process).
pub struct DropOnStop<T>(Arc<Mutex<Option<T>>>);

impl<T> DropOnStop<T> {
    /// The value, or `None` once the signal thread took it.
    pub fn lock(&self) -> MutexGuard<'_, Option<T>> {
        self.0.lock().unwrap_or_else(|p| p.into_inner())
    }
}

impl<T> Drop for DropOnStop<T> {
    fn drop(&mut self) {
        let held = self.lock().take();
        drop(held);
    }
}
