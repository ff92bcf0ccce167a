//! `Connection.reserve()`/`Publisher.reserve()` … `commit()`: room for one outgoing message lent to Python as
//! a writable buffer, `shmlink.SendBuffer` (docs/python.md, "Zero-copy sending").
//!
//! The room is the sender's own memory: on `shm:` between processes, for a message that
//! fits in one record, the ring itself (which only this process writes: the peer maps
//! it read-only, sealed, docs/design.md); otherwise a buffer of this binding's, sent as a
//! copy at commit. Two rules keep Python code from writing it after the message is gone:
//!
//! - The buffer protocol (`memoryview(buf)`, `struct.pack_into`, `sock.recv_into`, numpy)
//!   exports the memory itself, and CPython never takes an export back. Exports are
//!   counted (`__getbuffer__`/`__releasebuffer__`, in the limited API since 3.11), and
//!   `commit()`, `cancel()` and `close()` refuse with `BufferError` while any is alive.
//! - `SendBuffer`'s own indexing and slicing (a slice is a `SendBuffer` too) go through
//!   the shared state and raise `ValueError` once the reservation is committed or
//!   cancelled.

use std::ffi::c_int;
use std::ptr::NonNull;
use std::sync::{Arc, Mutex};

use pyo3::exceptions::{PyBufferError, PyIndexError, PyTypeError, PyValueError};
use pyo3::ffi;
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PySlice};

use crate::buffer::Msg;
use crate::handle::lock;

/// Where the lent bytes are.
pub(crate) enum Mem {
    /// Room reserved in the connection's own ring (`Connection::reserve_begin`).
    Ring(NonNull<u8>),
    /// A buffer of ours, sent as a copy at commit.
    Own(Vec<u8>),
    /// Nothing: committed or cancelled.
    Gone,
}

struct State {
    mem: Mem,
    len: usize,
    exports: usize,
}

/// One reservation, shared by its owner (the connection) and every `SendBuffer` over it.
pub(crate) struct Lent {
    state: Mutex<State>,
}

// SAFETY: the pointer in `Mem::Ring` is into the owning connection's ring, which lives
// as long as the connection (the `SendBuffer` keeps the Python connection object alive);
// every access goes through the mutex and copies through raw pointers.
unsafe impl Send for State {}

impl Lent {
    pub(crate) fn new(mem: Mem, len: usize) -> Arc<Lent> {
        Arc::new(Lent {
            state: Mutex::new(State {
                mem,
                len,
                exports: 0,
            }),
        })
    }

    /// The reserved length.
    pub(crate) fn len(&self) -> usize {
        lock(&self.state).len
    }

    /// Ends the reservation for a commit of `n` bytes (all when `None`) or a cancel:
    /// refused while buffer exports live or when `n` exceeds the reservation (it then
    /// stays open). Returns the memory and `n`.
    pub(crate) fn take(&self, n: Option<usize>, what: &str) -> PyResult<(Mem, usize)> {
        let mut st = lock(&self.state);
        if st.exports > 0 {
            return Err(PyBufferError::new_err(format!(
                "{what}: {} buffer export(s) of the reservation are alive (a memoryview, \
                 numpy array, …): release them first",
                st.exports
            )));
        }
        let n = n.unwrap_or(st.len);
        if n > st.len {
            return Err(PyValueError::new_err(format!(
                "{what}({n}) on a reservation of {} bytes",
                st.len
            )));
        }
        Ok((std::mem::replace(&mut st.mem, Mem::Gone), n))
    }

    /// Gives back our own buffer after a commit that failed (the reservation is open
    /// again, the bytes as they were).
    pub(crate) fn restore(&self, v: Vec<u8>) {
        lock(&self.state).mem = Mem::Own(v);
    }

    /// The address of byte `off` of `len` bytes, while the reservation is open.
    fn at(st: &mut State, off: usize, len: usize) -> PyResult<*mut u8> {
        debug_assert!(off + len <= st.len);
        let base = match &mut st.mem {
            Mem::Ring(p) => p.as_ptr(),
            Mem::Own(v) => v.as_mut_ptr(),
            Mem::Gone => {
                return Err(PyValueError::new_err(
                    "the reservation was committed or cancelled: this buffer is no longer \
                     writable",
                ))
            }
        };
        // SAFETY: `off` is within the reservation (the caller's slice bounds).
        Ok(unsafe { base.add(off) })
    }
}

/// Where a connection or publisher keeps its open reservation (at most one).
pub(crate) struct Slot(Mutex<Option<Arc<Lent>>>);

impl Slot {
    pub(crate) fn new() -> Slot {
        Slot(Mutex::new(None))
    }

    /// An error for a call that sends (on `what`) while a reservation is open: it
    /// would overwrite the room lent, or change the order of messages.
    pub(crate) fn check(&self, what: &str) -> shmlink::Result<()> {
        if lock(&self.0).is_some() {
            return Err(shmlink::Error::new(
                shmlink::ErrorKind::InvalidInput,
                format!("a reserve() is open on this {what}: commit() or cancel() it first"),
            ));
        }
        Ok(())
    }

    pub(crate) fn is_open(&self) -> bool {
        lock(&self.0).is_some()
    }

    /// Records the reservation just made.
    pub(crate) fn open(&self, lent: Arc<Lent>) {
        *lock(&self.0) = Some(lent);
    }

    /// Forgets the reservation (committed or cancelled).
    pub(crate) fn clear(&self) {
        *lock(&self.0) = None;
    }

    /// Records `lent` again after a commit that failed, unless another took its place.
    pub(crate) fn reopen(&self, lent: Arc<Lent>) {
        lock(&self.0).get_or_insert(lent);
    }

    /// Ends the open reservation for `what` (`commit`/`cancel`) with `n` bytes to send:
    /// the reservation, its memory, `n`. See [`Lent::take`] for the refusals.
    pub(crate) fn take(&self, n: Option<usize>, what: &str) -> PyResult<(Arc<Lent>, Mem, usize)> {
        let Some(lent) = lock(&self.0).clone() else {
            return Err(PyValueError::new_err(format!("{what}() without reserve()")));
        };
        let (mem, n) = lent.take(n, what)?;
        Ok((lent, mem, n))
    }
}

/// Room for one outgoing message, from :meth:`Connection.reserve` or
/// :meth:`Publisher.reserve`: a writable buffer
/// (``memoryview(buf)``, ``buf[i] = x``, ``buf[a:b] = data``, ``struct.pack_into``,
/// ``sock.recv_into(buf)``, …). :meth:`Connection.commit` sends it. Once committed or
/// cancelled it raises ``ValueError``, slices too; buffer exports must be released
/// before the commit (``BufferError`` otherwise).
#[pyclass(module = "shmlink", name = "SendBuffer", frozen)]
pub(crate) struct PySendBuffer {
    lent: Arc<Lent>,
    /// The connection: its ring must outlive every export.
    _owner: PyObject,
    start: usize,
    len: usize,
}

impl PySendBuffer {
    pub(crate) fn new(lent: Arc<Lent>, owner: PyObject) -> PySendBuffer {
        let len = lent.len();
        PySendBuffer {
            lent,
            _owner: owner,
            start: 0,
            len,
        }
    }

    /// Copies `src` to offset `off` of this view.
    fn write(&self, off: usize, src: &[u8]) -> PyResult<()> {
        let mut st = lock(&self.lent.state);
        let dst = Lent::at(&mut st, self.start + off, src.len())?;
        // SAFETY: `dst` has `src.len()` bytes of the open reservation (bounds checked by
        // the callers), memory only this process writes; `src` is a Python object's or
        // ours, never the reservation (a `SendBuffer` as `src` was copied to bytes).
        unsafe { dst.copy_from_nonoverlapping(src.as_ptr(), src.len()) };
        Ok(())
    }

    /// A copy of `len` bytes at offset `off` of this view.
    fn read(&self, off: usize, len: usize) -> PyResult<Vec<u8>> {
        let mut st = lock(&self.lent.state);
        let src = Lent::at(&mut st, self.start + off, len)?;
        let mut out = vec![0u8; len];
        // SAFETY: as in `write`, read instead.
        unsafe { out.as_mut_ptr().copy_from_nonoverlapping(src, len) };
        Ok(out)
    }

    /// The index `i` (negative from the end) within this view.
    fn index(&self, i: isize) -> PyResult<usize> {
        let j = if i < 0 { i + self.len as isize } else { i };
        if j < 0 || j as usize >= self.len {
            return Err(PyIndexError::new_err("index out of range"));
        }
        Ok(j as usize)
    }

    /// The `(start, len)` of a step-1 slice within this view.
    fn range(&self, s: &Bound<'_, PySlice>) -> PyResult<(usize, usize)> {
        let ix = s.indices(self.len as isize)?;
        if ix.step != 1 {
            return Err(PyValueError::new_err("SendBuffer slices take no step"));
        }
        Ok((ix.start as usize, ix.slicelength))
    }
}

#[pymethods]
impl PySendBuffer {
    fn __len__(&self) -> usize {
        self.len
    }

    /// The size in bytes.
    #[getter]
    fn nbytes(&self) -> usize {
        self.len
    }

    /// ``False``: the buffer is for writing.
    #[getter]
    fn readonly(&self) -> bool {
        false
    }

    /// ``True`` when the bytes are the ring itself (zero-copy: ``shm:`` between
    /// processes, a message in one record, and every topic), ``False`` when they are a
    /// buffer that the commit sends as a copy. ``False`` once committed or cancelled.
    #[getter]
    fn in_place(&self) -> bool {
        matches!(lock(&self.lent.state).mem, Mem::Ring(_))
    }

    /// ``buf[i]`` is a byte (an int); ``buf[a:b]`` is a ``SendBuffer`` over those bytes.
    fn __getitem__(&self, py: Python<'_>, key: &Bound<'_, PyAny>) -> PyResult<PyObject> {
        if let Ok(s) = key.downcast::<PySlice>() {
            let (start, len) = self.range(s)?;
            let sub = PySendBuffer {
                lent: self.lent.clone(),
                _owner: self._owner.clone_ref(py),
                start: self.start + start,
                len,
            };
            return Ok(Py::new(py, sub)?.into_any());
        }
        let i = self.index(key.extract()?)?;
        Ok(self.read(i, 1)?[0].into_pyobject(py)?.into_any().unbind())
    }

    /// ``buf[i] = byte``; ``buf[a:b] = data`` with ``len(data) == b - a``.
    fn __setitem__(
        &self,
        py: Python<'_>,
        key: &Bound<'_, PyAny>,
        value: &Bound<'_, PyAny>,
    ) -> PyResult<()> {
        if let Ok(s) = key.downcast::<PySlice>() {
            let (start, len) = self.range(s)?;
            // A SendBuffer (or an export of one) as the source: a copy first, so that the
            // two never overlap.
            let msg = Msg::get(value)?;
            let src = msg.with_gil(py).to_vec();
            if src.len() != len {
                return Err(PyValueError::new_err(format!(
                    "SendBuffer slice assignment: {} bytes into a slice of {len}",
                    src.len()
                )));
            }
            return self.write(start, &src);
        }
        let i = self.index(key.extract()?)?;
        let b: u8 = value
            .extract()
            .map_err(|_| PyTypeError::new_err("a SendBuffer byte is an int in 0..=255"))?;
        self.write(i, &[b])
    }

    /// A copy of the bytes.
    fn tobytes<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyBytes>> {
        Ok(PyBytes::new(py, &self.read(0, self.len)?))
    }

    /// The buffer protocol: the reserved memory itself, writable, counted until released.
    ///
    /// # Safety
    /// Called by CPython with a `Py_buffer` to fill.
    unsafe fn __getbuffer__(
        slf: Bound<'_, Self>,
        view: *mut ffi::Py_buffer,
        flags: c_int,
    ) -> PyResult<()> {
        let this = slf.get();
        let mut st = lock(&this.lent.state);
        let ptr = Lent::at(&mut st, this.start, this.len)?;
        // SAFETY: `view` is CPython's to fill; `ptr` has `len` bytes of the open
        // reservation, which stays open (and in place) while the export is counted:
        // commit, cancel and close refuse while `exports` > 0, and the export holds a
        // reference to `slf`, which holds the connection.
        let r = unsafe {
            ffi::PyBuffer_FillInfo(
                view,
                slf.as_ptr(),
                ptr.cast(),
                this.len as ffi::Py_ssize_t,
                0,
                flags,
            )
        };
        if r != 0 {
            return Err(PyErr::fetch(slf.py()));
        }
        st.exports += 1;
        Ok(())
    }

    /// # Safety
    /// Called by CPython once per successful `__getbuffer__`.
    unsafe fn __releasebuffer__(&self, _view: *mut ffi::Py_buffer) {
        let mut st = lock(&self.lent.state);
        st.exports = st.exports.saturating_sub(1);
    }

    fn __repr__(&self) -> String {
        let open = !matches!(lock(&self.lent.state).mem, Mem::Gone);
        format!(
            "<shmlink.SendBuffer {} bytes{}>",
            self.len,
            if open {
                ""
            } else {
                " (committed or cancelled)"
            }
        )
    }
}
