//! The C side of errors: `-1` (or `NULL`) plus `errno`, the library's message in a
//! thread-local buffer for `shmlink_last_error()`, and the guard that keeps a Rust panic
//! from crossing into C.

use std::cell::{Cell, RefCell};
use std::ffi::{c_char, CString};
use std::panic::{catch_unwind, AssertUnwindSafe};

use shmlink::ErrorKind;
use shmlink_sys::process::set_errno;

/// An error on its way to C: the errno it becomes and the message behind it.
#[derive(Debug)]
pub(crate) struct Fail {
    pub errno: i32,
    pub msg: String,
    /// For [`ErrorKind::Lagged`]: the messages lost.
    pub missed: u64,
}

/// `EMSGSIZE` for a receive whose buffer (`cap` bytes) is too small for the `n`-byte
/// message, which the object keeps for the next receive.
pub(crate) fn too_small(n: usize, cap: usize) -> Fail {
    Fail {
        errno: libc::EMSGSIZE,
        msg: format!(
            "message of {n} bytes does not fit the {cap}-byte buffer (kept: receive it with a larger one)"
        ),
        missed: 0,
    }
}

/// `Result` of the C API's internals.
pub(crate) type Res<T> = Result<T, Fail>;

impl Fail {
    /// An argument the C caller got wrong (NULL, a bad value, a call in the wrong state).
    pub fn inval(msg: impl Into<String>) -> Fail {
        Fail {
            errno: libc::EINVAL,
            msg: msg.into(),
            missed: 0,
        }
    }
}

/// The errno an [`ErrorKind`] becomes (docs/c.md has the table; keep them together).
pub(crate) fn errno_of(kind: ErrorKind) -> i32 {
    match kind {
        ErrorKind::WouldBlock => libc::EAGAIN,
        ErrorKind::ConnectionRefused => libc::ECONNREFUSED,
        ErrorKind::ConnectionReset => libc::ECONNRESET,
        ErrorKind::EndOfStream => libc::EPIPE,
        ErrorKind::TimedOut => libc::ETIMEDOUT,
        ErrorKind::InvalidInput | ErrorKind::InvalidAddress => libc::EINVAL,
        ErrorKind::PermissionDenied => libc::EACCES,
        ErrorKind::AddrInUse => libc::EADDRINUSE,
        ErrorKind::VersionMismatch | ErrorKind::ProtocolViolation => libc::EPROTO,
        ErrorKind::MessageTooLarge => libc::EMSGSIZE,
        ErrorKind::Closed => libc::ENOTCONN,
        ErrorKind::Lagged => libc::EOVERFLOW,
        ErrorKind::Detached => libc::ECONNABORTED,
        ErrorKind::NotFound => libc::ENOENT,
        _ => libc::EIO,
    }
}

impl From<shmlink::Error> for Fail {
    fn from(e: shmlink::Error) -> Fail {
        let mut errno = errno_of(e.kind());
        if e.kind() == ErrorKind::Other {
            // The OS error behind it, if there is one.
            if let Some(os) = std::error::Error::source(&e)
                .and_then(|s| s.downcast_ref::<std::io::Error>())
                .and_then(|io| io.raw_os_error())
            {
                errno = os;
            }
        }
        Fail {
            errno,
            msg: in_c_terms(&e.to_string()),
            missed: e.missed().unwrap_or(0),
        }
    }
}

/// `msg`, a library error, in the terms of a C caller: the `shmlink_options_set_*`
/// setters where the library names Rust calls.
pub(crate) fn in_c_terms(msg: &str) -> String {
    shmlink::terms::rephrase(
        msg,
        &shmlink::terms::Vocabulary {
            shared_rendezvous_dir: "shmlink_options_set_shared_rendezvous_dir(opts, true)",
            allow_uids: "shmlink_options_set_allow_uids (uid {uid}) on the listener's options",
            expect_uids: "shmlink_options_set_expect_uids",
            allow_writable_topic: "allow_writable_topic (Rust only, no C setter)",
            subscribe: "subscribe with shmlink_subscribe",
            plain_listener: "this is a plain listener (shmlink_listen), not a topic: \
                             shmlink_connect talks to it",
        },
    )
}

thread_local! {
    /// The message of this thread's last failed call (NUL-terminated for C).
    static LAST: RefCell<CString> = RefCell::new(CString::default());
    /// The pointer handed out for `LAST` stays valid until the next failure replaces it.
    static MISSED: Cell<u64> = const { Cell::new(0) };
}

fn record(f: Fail) {
    let text = CString::new(f.msg.replace('\0', "\\0")).unwrap_or_default();
    // `try_with`: a call during thread teardown still sets errno.
    let _ = LAST.try_with(|l| *l.borrow_mut() = text);
    let _ = MISSED.try_with(|m| m.set(f.missed));
    set_errno(f.errno);
}

/// Runs one entry point's body: its error becomes `errno` and the last-error message and
/// the call returns `failed`; a panic becomes `EIO` ("internal error") the same way, so
/// no unwinding reaches C.
pub(crate) fn call<T>(failed: T, body: impl FnOnce() -> Res<T>) -> T {
    // The first call of the process reads SHMLINK_LOG (docs/c.md, "Logging").
    static LOG: std::sync::Once = std::sync::Once::new();
    LOG.call_once(|| {
        shmlink::trace::log_to_stderr(None);
    });
    match catch_unwind(AssertUnwindSafe(body)) {
        Ok(Ok(v)) => v,
        Ok(Err(f)) => {
            record(f);
            failed
        }
        Err(panic) => {
            let what = panic
                .downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| panic.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "unknown panic".into());
            record(Fail {
                errno: libc::EIO,
                msg: format!("internal error in libshmlink (a bug, please report it): {what}"),
                missed: 0,
            });
            failed
        }
    }
}

/// The message of the calling thread's last failed shmlink call: what went wrong, with
/// which address, option or operation (say `connect shm:foo: nobody listens`). Never
/// NULL; an empty string before any failure.
///
/// The pointer stays valid until this thread's next failing shmlink call; successful
/// calls leave it alone (like `errno`, check it only after a call returned -1 or NULL).
///
/// Thread safety: per thread (thread-local), like `errno`.
#[no_mangle]
pub extern "C" fn shmlink_last_error() -> *const c_char {
    LAST.try_with(|l| l.borrow().as_ptr())
        .unwrap_or(c"".as_ptr())
}

/// After a call failed with `EOVERFLOW` (a subscriber of an `overwrite` topic lagged
/// behind its publisher): exactly how many messages it lost. 0 after other failures.
///
/// Thread safety: per thread (thread-local), like `errno`.
#[no_mangle]
pub extern "C" fn shmlink_last_missed() -> u64 {
    MISSED.try_with(Cell::get).unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kinds_map_to_the_documented_errnos() {
        assert_eq!(errno_of(ErrorKind::WouldBlock), libc::EAGAIN);
        assert_eq!(errno_of(ErrorKind::ConnectionReset), libc::ECONNRESET);
        assert_eq!(errno_of(ErrorKind::EndOfStream), libc::EPIPE);
        assert_eq!(errno_of(ErrorKind::MessageTooLarge), libc::EMSGSIZE);
        assert_eq!(errno_of(ErrorKind::ProtocolViolation), libc::EPROTO);
        assert_eq!(errno_of(ErrorKind::PermissionDenied), libc::EACCES);
        assert_eq!(errno_of(ErrorKind::TimedOut), libc::ETIMEDOUT);
        assert_eq!(errno_of(ErrorKind::InvalidAddress), libc::EINVAL);
    }

    #[test]
    fn a_panic_becomes_eio_with_a_message() {
        let r = call(-1, || -> Res<i32> { panic!("boom") });
        assert_eq!(r, -1);
        assert_eq!(shmlink_sys::process::errno(), libc::EIO);
        // SAFETY: the pointer is a valid NUL-terminated string until the next failure.
        let msg = unsafe { std::ffi::CStr::from_ptr(shmlink_last_error()) };
        assert!(msg.to_str().unwrap().contains("boom"), "{msg:?}");
    }
}
