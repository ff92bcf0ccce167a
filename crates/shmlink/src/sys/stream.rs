//! Socket helpers for the stream/packet transports.
