//! `redis`, `rabbitmq`: publish/subscribe through a message broker (a Redis server's
//! `PUBLISH`/`SUBSCRIBE`, a RabbitMQ fanout exchange). The broker clients are not part
//! of this build yet, so both methods are listed and skipped with that reason: no
//! numbers without a measurement.

use std::io;

use super::super::{Ctx, Method, Prepared, Receive};
use crate::sys::err;

pub struct Broker {
    name: &'static str,
    about: &'static str,
}

pub const REDIS: Broker = Broker {
    name: "redis",
    about: "Redis PUBLISH/SUBSCRIBE through a local redis-server (broker)",
};
pub const RABBITMQ: Broker = Broker {
    name: "rabbitmq",
    about:
        "RabbitMQ fanout exchange, one queue per subscriber, through a local broker (AMQP 0-9-1)",
};

const REASON: &str = "no broker client in this build yet";

impl Method for Broker {
    fn name(&self) -> &'static str {
        self.name
    }

    fn about(&self) -> &'static str {
        self.about
    }

    fn unavailable(&self) -> Option<String> {
        Some(REASON.to_string())
    }

    fn prepare(&self, _c: &Ctx) -> io::Result<Prepared> {
        Err(err(REASON))
    }

    fn subscribe(&self, _c: &Ctx, _args: &[String]) -> io::Result<Box<dyn Receive>> {
        Err(err(REASON))
    }
}
