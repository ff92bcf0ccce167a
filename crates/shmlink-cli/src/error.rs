//! The error of a failed run: a message that says which address, which message and what
//! went wrong.

use std::fmt;

/// A failed run (exit code 1).
#[derive(Debug)]
pub struct RunError(String);

/// `Result` with [`RunError`].
pub type Result<T> = std::result::Result<T, RunError>;

impl RunError {
    pub fn new(msg: impl Into<String>) -> RunError {
        RunError(msg.into())
    }
}

impl fmt::Display for RunError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for RunError {}

macro_rules! from_display {
    ($($t:ty),*) => {$(
        impl From<$t> for RunError {
            fn from(e: $t) -> RunError {
                RunError(e.to_string())
            }
        }
    )*};
}
from_display!(shmlink::Error, std::io::Error);

/// Puts what was being done in front of an error.
pub trait Context<T> {
    fn context(self, what: impl FnOnce() -> String) -> Result<T>;
}

impl<T, E: Into<RunError>> Context<T> for std::result::Result<T, E> {
    fn context(self, what: impl FnOnce() -> String) -> Result<T> {
        self.map_err(|e| RunError(format!("{}: {}", what(), e.into().0)))
    }
}
