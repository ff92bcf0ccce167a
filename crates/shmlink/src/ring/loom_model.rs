//! Loom model (written next).
