//! The per-thread guard of the library's own code: while a [`Guard`] lives, this
//! thread's hooked calls pass straight to the C library, so the library never recurses
//! into its own hooks.

use std::cell::Cell;

thread_local! {
    /// Set while this thread runs the library's own code: hooks then pass straight to the
    /// C library.
    static INSIDE: Cell<bool> = const { Cell::new(false) };
}

/// While alive, this thread's socket calls bypass the hooks (the library's own calls).
pub(crate) struct Guard {
    was: bool,
}

impl Guard {
    /// Enters the library's own code on this thread.
    pub(crate) fn enter() -> Guard {
        let was = INSIDE.try_with(|c| c.replace(true)).unwrap_or(true);
        Guard { was }
    }
}

impl Drop for Guard {
    fn drop(&mut self) {
        let was = self.was;
        let _ = INSIDE.try_with(|c| c.set(was));
    }
}

/// Whether this thread is inside the library (or tearing down its thread-locals), so a
/// hooked call must go straight to the C library.
pub(crate) fn inside() -> bool {
    INSIDE.try_with(|c| c.get()).unwrap_or(true)
}
