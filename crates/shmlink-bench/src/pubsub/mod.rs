//! The publish/subscribe pattern (`shmlink-bench --pattern pubsub`): one publisher
//! process, N subscriber processes, every message delivered to every subscriber.
//!
//! - [`method`]: what a pub/sub method provides ([`Method`]: a publisher that reaches N
//!   subscriber processes, and those subscribers); [`methods`]: one module per method.
//! - [`message`]: what every message carries (a timestamp, then the suite's verified
//!   payload) and how latency is read from it.
//! - [`run`]: one run as processes: the publisher process starts the subscriber
//!   processes, paces the messages (each is acknowledged by every subscriber over a side
//!   channel before the next), and reports latency and publisher cost.
//! - [`suite`]: every (size, subscriber count, method) cell in interleaved rounds;
//!   [`report`]: the table, JSON and CSV.

pub mod message;
pub mod method;
pub mod methods;
pub mod report;
pub mod run;
pub mod suite;

pub use method::{Ctx, Method, Prepared, Publish, PublishInPlace, Receive, SizeLimit};

/// Every pub/sub method, in table order (shmlink first: the table's ratios are against
/// it).
pub static METHODS: &[&dyn Method] = &[
    &methods::shmlink::COPY,
    &methods::shmlink::ZERO_COPY,
    &methods::iceoryx2::COPY,
    &methods::iceoryx2::ZERO_COPY,
    &methods::zmq::ZmqIpc,
    &methods::uds::Uds,
    &methods::brokers::REDIS,
    &methods::brokers::RABBITMQ,
];

/// The method ratios are taken against.
pub const REFERENCE: &str = "shmlink";

/// The method called `name`.
pub fn find(name: &str) -> Option<&'static dyn Method> {
    METHODS.iter().copied().find(|m| m.name() == name)
}

/// Every method's name, comma-separated (for error messages).
pub fn names() -> String {
    crate::method::comma_list(METHODS.iter().map(|m| m.name()))
}
