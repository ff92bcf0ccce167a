//! The `errno` values code outside this crate compares `io::Error::raw_os_error` with or
//! makes errors from, so that no crate but this one names libc.

pub use libc::{ECONNREFUSED, EINVAL, EMFILE, ENFILE, EPROTOTYPE};
