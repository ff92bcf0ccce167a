//! shmlink errors as Python exceptions: the built-in `OSError` subclasses where one
//! fits (with `errno` set), the package's own `OSError` subclasses otherwise.

use pyo3::create_exception;
use pyo3::exceptions::{
    PyBlockingIOError, PyBrokenPipeError, PyConnectionAbortedError, PyConnectionRefusedError,
    PyConnectionResetError, PyEOFError, PyFileNotFoundError, PyOSError, PyPermissionError,
    PyTimeoutError, PyValueError,
};
use pyo3::prelude::*;
use shmlink::{Error, ErrorKind};

create_exception!(
    shmlink,
    ProtocolError,
    PyOSError,
    "The peer broke the protocol or speaks another version (errno EPROTO). The \
     connection is unusable afterwards."
);
create_exception!(
    shmlink,
    MessageTooLargeError,
    PyOSError,
    "A message is larger than the connection's maximum, or (recv_into) than the buffer; \
     in the second case the message stays queued (errno EMSGSIZE)."
);
create_exception!(
    shmlink,
    LaggedError,
    PyOSError,
    "Pub/sub, overwrite policy: the publisher overwrote messages this subscriber had not \
     read. The attribute `missed` says how many; the next recv() returns a message again."
);
create_exception!(
    shmlink,
    DetachedError,
    PyConnectionAbortedError,
    "Pub/sub, block policy: the publisher detached this subscriber because it stalled. \
     Subscribe again to go on."
);

/// Which call failed: a reset seen while sending is a broken pipe, as for sockets.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum Op {
    Send,
    Other,
}

/// The Python exception for `e`, raised by an operation of kind `op`.
pub(crate) fn to_py(py: Python<'_>, e: Error, op: Op) -> PyErr {
    let msg = in_python_terms(&e.to_string());
    let errno = |code: i32| (code, msg.clone());
    match e.kind() {
        ErrorKind::WouldBlock => PyBlockingIOError::new_err(errno(libc::EAGAIN)),
        ErrorKind::ConnectionReset if op == Op::Send => {
            PyBrokenPipeError::new_err(errno(libc::EPIPE))
        }
        ErrorKind::ConnectionReset => PyConnectionResetError::new_err(errno(libc::ECONNRESET)),
        ErrorKind::ConnectionRefused => {
            PyConnectionRefusedError::new_err(errno(libc::ECONNREFUSED))
        }
        ErrorKind::EndOfStream => PyEOFError::new_err(msg),
        ErrorKind::TimedOut => PyTimeoutError::new_err(errno(libc::ETIMEDOUT)),
        ErrorKind::InvalidInput | ErrorKind::InvalidAddress => PyValueError::new_err(msg),
        ErrorKind::PermissionDenied => PyPermissionError::new_err(errno(libc::EACCES)),
        ErrorKind::AddrInUse => PyOSError::new_err(errno(libc::EADDRINUSE)),
        ErrorKind::VersionMismatch | ErrorKind::ProtocolViolation => {
            ProtocolError::new_err(errno(libc::EPROTO))
        }
        ErrorKind::MessageTooLarge => MessageTooLargeError::new_err(errno(libc::EMSGSIZE)),
        ErrorKind::Closed => PyOSError::new_err(errno(libc::EBADF)),
        ErrorKind::Lagged => {
            let err = LaggedError::new_err(errno(libc::EIO));
            let missed = e.missed().unwrap_or(0);
            if let Err(set) = err.value(py).setattr("missed", missed) {
                return set;
            }
            err
        }
        ErrorKind::Detached => DetachedError::new_err(errno(libc::ECONNABORTED)),
        ErrorKind::NotFound => PyFileNotFoundError::new_err(errno(libc::ENOENT)),
        _ => {
            let code = std::error::Error::source(&e)
                .and_then(|s| s.downcast_ref::<std::io::Error>())
                .and_then(std::io::Error::raw_os_error)
                .unwrap_or(libc::EIO);
            PyOSError::new_err(errno(code))
        }
    }
}

/// `msg`, a library error, in the terms of a Python caller: the keywords of
/// `shmlink.connect`/`listen`/`Publisher`/`Subscriber` where the library names Rust calls.
pub(crate) fn in_python_terms(msg: &str) -> String {
    shmlink::terms::rephrase(
        msg,
        &shmlink::terms::Vocabulary {
            shared_rendezvous_dir: "shared_rendezvous_dir=True",
            allow_uids: "allow_uids=[{uid}] (a listen() keyword)",
            expect_uids: "expect_uids=[UID]",
            allow_writable_topic: "allow_writable_topic (Rust and C only, no Python keyword)",
            subscribe: "subscribe with shmlink.Subscriber(addr)",
            plain_listener: "this is a plain listener (shmlink.listen), not a topic: \
                             shmlink.connect() talks to it",
        },
    )
}

/// `__next__` of an iterator over messages: the end of the stream ends the iteration.
pub(crate) fn until_eof<T>(py: Python<'_>, r: PyResult<T>) -> PyResult<Option<T>> {
    match r {
        Ok(b) => Ok(Some(b)),
        Err(e) if e.is_instance_of::<PyEOFError>(py) => Ok(None),
        Err(e) => Err(e),
    }
}

/// The error of a call on an object that `close()` already closed.
pub(crate) fn closed(what: &str) -> Error {
    Error::new(ErrorKind::Closed, format!("{what} is closed"))
}

/// Registers the package's exception classes in the module.
pub(crate) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    let py = m.py();
    m.add("ProtocolError", py.get_type::<ProtocolError>())?;
    m.add(
        "MessageTooLargeError",
        py.get_type::<MessageTooLargeError>(),
    )?;
    m.add("LaggedError", py.get_type::<LaggedError>())?;
    m.add("DetachedError", py.get_type::<DetachedError>())?;
    Ok(())
}
