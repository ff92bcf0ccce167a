//! The doorbell both loom models share: a counter of rings and a way to wait for it to
//! move, standing for the socket byte and `poll` of the real transports.

use loom::sync::{Condvar, Mutex};

/// Rings counted under a mutex; waiting is a condition variable.
#[derive(Default)]
pub(crate) struct Doorbell {
    rings: Mutex<u64>,
    cv: Condvar,
}

impl Doorbell {
    pub(crate) fn ring(&self) {
        *self.rings.lock().unwrap() += 1;
        self.cv.notify_one();
    }
    /// What has been rung so far ("drain").
    pub(crate) fn seen(&self) -> u64 {
        *self.rings.lock().unwrap()
    }
    /// Sleeps until a ring after `seen` ("poll").
    pub(crate) fn wait_past(&self, seen: u64) {
        let mut n = self.rings.lock().unwrap();
        while *n == seen {
            n = self.cv.wait(n).unwrap();
        }
    }
}
