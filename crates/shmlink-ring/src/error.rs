//! The one error of the rings: the other side wrote something no correct peer writes.

use std::fmt;

/// A value read from shared memory that no correct peer writes (a position going back, a
/// record header beyond what was published, a slot stamped for another slot…), with what
/// was found and what was expected. The ring that reports it stays memory-safe; the
/// connection or topic it belongs to should be dropped.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Violation {
    what: String,
}

impl Violation {
    pub(crate) fn new(what: impl Into<String>) -> Violation {
        Violation { what: what.into() }
    }

    /// What was read and why it is impossible.
    pub fn message(&self) -> &str {
        &self.what
    }
}

impl fmt::Display for Violation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.what)
    }
}

impl std::error::Error for Violation {}

/// What the rings' fallible operations return.
pub type Result<T> = std::result::Result<T, Violation>;
