//! Python bytes-like objects as byte slices. Written for the stable ABI of CPython 3.9
//! (no buffer protocol); the wheel is abi3-py311 now (for `lend.rs`), whose limited API
//! could read other buffers in place too (not done yet).
//!
//! `bytes` is read in place, `bytearray` in place while the GIL is held; any other
//! object with the buffer protocol (`memoryview`, `array.array`, …) goes through a
//! `memoryview` of it, which costs one copy.

use pyo3::exceptions::{PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyByteArray, PyBytes, PySlice};

/// The bytes of a message to send.
pub(crate) enum Msg<'py> {
    /// A `bytes` object: never changes, readable with the GIL released too.
    Immutable(Bound<'py, PyBytes>),
    /// A `bytearray`: read it only while the GIL is held (Python code may resize it).
    Mutable(Bound<'py, PyByteArray>),
    /// A copy of another buffer.
    Owned(Vec<u8>),
}

impl<'py> Msg<'py> {
    /// The message in `obj`: a `TypeError` if it is no bytes-like object.
    pub(crate) fn get(obj: &Bound<'py, PyAny>) -> PyResult<Msg<'py>> {
        if let Ok(b) = obj.downcast_exact::<PyBytes>() {
            return Ok(Msg::Immutable(b.clone()));
        }
        if let Ok(b) = obj.downcast::<PyByteArray>() {
            return Ok(Msg::Mutable(b.clone()));
        }
        let view = memoryview(obj)?;
        let bytes = view.call_method0("tobytes")?;
        Ok(Msg::Owned(bytes.downcast::<PyBytes>()?.as_bytes().to_vec()))
    }

    /// The bytes. With the GIL held only (the borrow of `py` says so), except for
    /// [`Msg::Immutable`], see [`without_gil`](Self::without_gil).
    pub(crate) fn with_gil(&self, _py: Python<'py>) -> &[u8] {
        match self {
            Msg::Immutable(b) => b.as_bytes(),
            // SAFETY: the caller holds the GIL for as long as the slice is used (it
            // borrows the `Python` token's lifetime and the caller runs no Python code
            // meanwhile), so nothing can resize or write the bytearray.
            Msg::Mutable(b) => unsafe { b.as_bytes() },
            Msg::Owned(v) => v,
        }
    }

    /// The bytes if they may be read with the GIL released (a `bytes` object or a copy).
    pub(crate) fn without_gil(&self) -> Option<&[u8]> {
        match self {
            Msg::Immutable(b) => Some(b.as_bytes()),
            Msg::Mutable(_) => None,
            Msg::Owned(v) => Some(v),
        }
    }
}

/// `memoryview(obj)`, with the error socket.send gives for objects without buffers.
fn memoryview<'py>(obj: &Bound<'py, PyAny>) -> PyResult<Bound<'py, PyAny>> {
    let py = obj.py();
    let builtins = py.import("builtins")?;
    builtins.getattr("memoryview")?.call1((obj,)).map_err(|_| {
        PyTypeError::new_err(format!(
            "a bytes-like object is required, not '{}'",
            obj.get_type()
                .name()
                .map(|n| n.to_string())
                .unwrap_or_default()
        ))
    })
}

/// Where `recv_into` puts a message.
pub(crate) enum Target<'py> {
    /// A `bytearray`, written in place while the GIL is held.
    ByteArray(Bound<'py, PyByteArray>),
    /// A writable `memoryview` (format `B`) of another buffer, written by slice
    /// assignment.
    View(Bound<'py, PyAny>, usize),
}

impl<'py> Target<'py> {
    /// The writable buffer `obj`: a `TypeError` if it is none.
    pub(crate) fn get(obj: &Bound<'py, PyAny>) -> PyResult<Target<'py>> {
        if let Ok(b) = obj.downcast::<PyByteArray>() {
            return Ok(Target::ByteArray(b.clone()));
        }
        let view = memoryview(obj)?;
        if view.getattr("readonly")?.is_truthy()? {
            return Err(PyTypeError::new_err(
                "recv_into() needs a writable buffer (bytearray, memoryview of one, …)",
            ));
        }
        let view = view
            .call_method1("cast", ("B",))
            .map_err(|_| PyValueError::new_err("recv_into() needs a C-contiguous buffer"))?;
        let len = view.len()?;
        Ok(Target::View(view, len))
    }

    /// Its size in bytes now.
    pub(crate) fn len(&self) -> usize {
        match self {
            Target::ByteArray(b) => b.len(),
            Target::View(_, len) => *len,
        }
    }

    /// Runs `f` on the writable bytes in place, if the target has them (with the GIL
    /// held, which the `Python` token proves; `f` must run no Python code).
    pub(crate) fn in_place<R>(
        &self,
        _py: Python<'py>,
        f: impl FnOnce(&mut [u8]) -> R,
    ) -> Option<R> {
        match self {
            // SAFETY: the caller holds the GIL while `f` runs and `f` runs no Python
            // code, so nothing else reads, writes or resizes the bytearray meanwhile.
            Target::ByteArray(b) => Some(f(unsafe { b.as_bytes_mut() })),
            Target::View(..) => None,
        }
    }

    /// Copies `data` to the start of the target (GIL held).
    pub(crate) fn fill(&self, data: &[u8]) -> PyResult<()> {
        match self {
            Target::ByteArray(b) => {
                // SAFETY: as in `in_place`; the length is checked first because Python
                // code may have resized the bytearray while the GIL was released.
                let dst = unsafe { b.as_bytes_mut() };
                if dst.len() < data.len() {
                    return Err(PyValueError::new_err(
                        "the bytearray shrank during recv_into(); the message is lost",
                    ));
                }
                dst[..data.len()].copy_from_slice(data);
                Ok(())
            }
            Target::View(view, _) => {
                let py = view.py();
                let slice = PySlice::new(py, 0, data.len() as isize, 1);
                view.set_item(slice, PyBytes::new(py, data))
            }
        }
    }
}
