//! Framing shared by the socket transports (being written).
