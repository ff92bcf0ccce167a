//! What every Python class over a shmlink object shares: the object (until `close()`),
//! its fd for `fileno()`, how its calls wait (`settimeout`) and the spin budget.

use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicI32, Ordering};
use std::sync::{Mutex, MutexGuard};

use pyo3::prelude::*;
use shmlink::ErrorKind;

use crate::buffer::Target;
use crate::errors::{closed, to_py, Op};
use crate::options::Spin;
use crate::wait::{self, Mode};

/// Locks, shrugging off poisoning: the guarded objects stay consistent (a panic cannot
/// happen between two of their calls' effects that matter here).
pub(crate) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// A shmlink object under a Python object.
pub(crate) struct Handle<T> {
    inner: Mutex<Option<T>>,
    fd: AtomicI32,
    mode: Mutex<Mode>,
    pub(crate) spin: Spin,
    /// What it is, for "… is closed".
    what: &'static str,
}

impl<T: AsRawFd> Handle<T> {
    pub(crate) fn new(inner: T, spin: Spin, what: &'static str) -> Handle<T> {
        Handle {
            fd: AtomicI32::new(inner.as_raw_fd()),
            inner: Mutex::new(Some(inner)),
            mode: Mutex::new(Mode::Blocking),
            spin,
            what,
        }
    }
}

impl<T> Handle<T> {
    /// Runs `f` on the object, if it is still open.
    pub(crate) fn with<R>(
        &self,
        f: impl FnOnce(&mut T) -> shmlink::Result<R>,
    ) -> shmlink::Result<R> {
        match lock(&self.inner).as_mut() {
            Some(x) => f(x),
            None => Err(closed(self.what)),
        }
    }

    /// Reads something off the object: `OSError` (`EBADF`) once closed.
    pub(crate) fn get<R>(&self, py: Python<'_>, f: impl FnOnce(&T) -> R) -> PyResult<R> {
        match lock(&self.inner).as_ref() {
            Some(x) => Ok(f(x)),
            None => Err(to_py(py, closed(self.what), Op::Other)),
        }
    }

    /// The object, if open, under the lock (for `__repr__`).
    pub(crate) fn lock(&self) -> MutexGuard<'_, Option<T>> {
        lock(&self.inner)
    }

    /// Takes the object out (`close()`); -1 as the fd from now on.
    pub(crate) fn take(&self) -> Option<T> {
        self.fd.store(-1, Ordering::Relaxed);
        lock(&self.inner).take()
    }

    /// `fileno()`.
    pub(crate) fn fd(&self) -> i32 {
        self.fd.load(Ordering::Relaxed)
    }

    pub(crate) fn mode(&self) -> Mode {
        *lock(&self.mode)
    }

    /// `setblocking(flag)`.
    pub(crate) fn set_blocking(&self, flag: bool) {
        *lock(&self.mode) = if flag {
            Mode::Blocking
        } else {
            Mode::NonBlocking
        };
    }

    /// `settimeout(value)`.
    pub(crate) fn set_timeout(&self, value: Option<f64>) -> PyResult<()> {
        *lock(&self.mode) = Mode::from_timeout(value)?;
        Ok(())
    }

    /// Finishes a call whose first try gave `first` (see [`wait::finish`]), in this
    /// object's mode.
    pub(crate) fn finish<R: Send>(
        &self,
        py: Python<'_>,
        first: shmlink::Result<R>,
        what: &str,
        attempt: impl FnMut() -> shmlink::Result<R> + Send,
    ) -> PyResult<shmlink::Result<R>> {
        wait::finish(py, first, self.fd(), self.mode(), self.spin, what, attempt)
    }

    /// `recv_into(buffer)`: `recv` puts the next message into a byte slice. In place when
    /// the buffer allows it (a `bytearray`, with the GIL held); otherwise, or after a
    /// wait (with the GIL released), into a buffer of ours first, then copied.
    pub(crate) fn recv_into(
        &self,
        py: Python<'_>,
        buffer: &Bound<'_, PyAny>,
        recv: impl Fn(&mut T, &mut [u8]) -> shmlink::Result<usize> + Sync,
    ) -> PyResult<usize>
    where
        T: Send,
    {
        let target = Target::get(buffer)?;
        let first = target
            .in_place(py, |dst| self.with(|x| recv(x, dst)))
            .unwrap_or_else(|| Err(shmlink::Error::new(ErrorKind::WouldBlock, "")));
        if !matches!(&first, Err(e) if e.kind() == ErrorKind::WouldBlock) {
            return first.map_err(|e| to_py(py, e, Op::Other));
        }
        // Into our own buffer first: the target is written only with the GIL held.
        let mut tmp = vec![0u8; target.len()];
        let tmp_first = self.with(|x| recv(x, &mut tmp));
        let tmp_ref = &mut tmp;
        let recv = &recv;
        let r = self.finish(py, tmp_first, "recv_into", move || {
            self.with(|x| recv(x, tmp_ref))
        })?;
        let n = r.map_err(|e| to_py(py, e, Op::Other))?;
        target.fill(&tmp[..n])?;
        Ok(n)
    }
}
