//! The library's version, for C: `SHMLINK_VERSION_MAJOR`, `_MINOR` and `_PATCH` in the
//! header (what a program was compiled against) and `shmlink_version()` (the library it
//! runs with). Both come from this crate's version; a unit test keeps the constants equal
//! to it (cbindgen writes constants only from literals).

use std::ffi::c_char;

/// The major version of the shmlink.h this program was compiled with.
pub const SHMLINK_VERSION_MAJOR: i32 = 0;
/// The minor version of the shmlink.h this program was compiled with.
pub const SHMLINK_VERSION_MINOR: i32 = 1;
/// The patch version of the shmlink.h this program was compiled with.
pub const SHMLINK_VERSION_PATCH: i32 = 0;

/// The version of the shmlink library in use, as "MAJOR.MINOR.PATCH" (say "0.1.0"):
/// compare it with the SHMLINK_VERSION_* macros to tell the header a program was
/// compiled with from the library it runs with. Never NULL; a static string, never to
/// be freed.
///
/// Thread safety: any thread, any time.
#[no_mangle]
pub extern "C" fn shmlink_version() -> *const c_char {
    concat!(env!("CARGO_PKG_VERSION"), "\0").as_ptr().cast()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_header_constants_are_the_crate_version() {
        let part = |s: &str| s.parse::<i32>().unwrap();
        assert_eq!(SHMLINK_VERSION_MAJOR, part(env!("CARGO_PKG_VERSION_MAJOR")));
        assert_eq!(SHMLINK_VERSION_MINOR, part(env!("CARGO_PKG_VERSION_MINOR")));
        assert_eq!(SHMLINK_VERSION_PATCH, part(env!("CARGO_PKG_VERSION_PATCH")));
        // SAFETY: a static NUL-terminated string.
        let v = unsafe { std::ffi::CStr::from_ptr(shmlink_version()) };
        assert_eq!(v.to_str().unwrap(), env!("CARGO_PKG_VERSION"));
    }
}
