//! The suite's earlier clients, written against the protocols with `std` alone; kept for
//! one commit so the same run can measure them against the maintained ones.

pub mod amqp;
pub mod redis;

mod frame;
mod resp;
mod wire;

pub(crate) use super::{check_publish_size, CONNECT_TIMEOUT, HANDSHAKE_TIMEOUT, MAX_MESSAGE};
