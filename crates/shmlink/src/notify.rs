//! Waiting: spin, then yield, then park (DESIGN §4).
