//! Arguments from C, checked before use: NULL handles, strings that are not UTF-8,
//! NULL buffers with a non-zero length.

use std::ffi::{c_char, c_void, CStr};

use crate::error::{Fail, Res};

/// The string behind `p`, which C promises is NUL-terminated when not NULL.
///
/// # Safety
/// `p` is NULL or points to a NUL-terminated string that stays valid during the call.
pub(crate) unsafe fn text<'a>(p: *const c_char, what: &str) -> Res<&'a str> {
    if p.is_null() {
        return Err(Fail::inval(format!("{what} is NULL")));
    }
    // SAFETY: non-NULL, and the caller promises a NUL-terminated string.
    let s = unsafe { CStr::from_ptr(p) };
    s.to_str()
        .map_err(|_| Fail::inval(format!("{what} is not valid UTF-8: {s:?}")))
}

/// The object behind a handle, or EINVAL for NULL.
///
/// # Safety
/// `p` is NULL or a live handle of type `T` that no other thread uses during the call.
pub(crate) unsafe fn obj<'a, T>(p: *mut T, what: &str) -> Res<&'a mut T> {
    // SAFETY: forwarded to the caller.
    unsafe { p.as_mut() }.ok_or_else(|| Fail::inval(format!("{what} is NULL")))
}

/// The object behind a handle for reading, or EINVAL for NULL.
///
/// # Safety
/// `p` is NULL or a live handle of type `T` that no other thread changes during the call.
pub(crate) unsafe fn obj_ref<'a, T>(p: *const T, what: &str) -> Res<&'a T> {
    // SAFETY: forwarded to the caller.
    unsafe { p.as_ref() }.ok_or_else(|| Fail::inval(format!("{what} is NULL")))
}

/// `len` bytes at `buf` to read (an empty slice for `len == 0`, whatever `buf`).
///
/// # Safety
/// `buf` is NULL or points to `len` readable bytes that stay valid during the call.
pub(crate) unsafe fn bytes<'a>(buf: *const c_void, len: usize) -> Res<&'a [u8]> {
    if len == 0 {
        return Ok(&[]);
    }
    if buf.is_null() {
        return Err(Fail::inval(format!(
            "buffer is NULL but its length is {len}"
        )));
    }
    if len > isize::MAX as usize {
        return Err(Fail::inval(format!("buffer length {len} is impossible")));
    }
    // SAFETY: non-NULL, `len` bytes readable as the caller promises, len <= isize::MAX.
    Ok(unsafe { std::slice::from_raw_parts(buf.cast(), len) })
}

/// `cap` bytes at `buf` to write (an empty slice for `cap == 0`, whatever `buf`).
///
/// # Safety
/// `buf` is NULL or points to `cap` writable bytes, not otherwise used during the call.
pub(crate) unsafe fn bytes_mut<'a>(buf: *mut c_void, cap: usize) -> Res<&'a mut [u8]> {
    if cap == 0 {
        return Ok(&mut []);
    }
    if buf.is_null() {
        return Err(Fail::inval(format!(
            "buffer is NULL but its capacity is {cap}"
        )));
    }
    if cap > isize::MAX as usize {
        return Err(Fail::inval(format!("buffer capacity {cap} is impossible")));
    }
    // SAFETY: non-NULL, `cap` bytes writable and unaliased as the caller promises.
    Ok(unsafe { std::slice::from_raw_parts_mut(buf.cast(), cap) })
}

/// A length returned to C as `ssize_t`.
pub(crate) fn ssize(n: usize) -> isize {
    // Message sizes are bounded by 1 GiB (MAX_MSG_SIZE_LIMIT).
    n as isize
}
