//! `redis`, `rabbitmq`: publish/subscribe through a message broker on loopback, with
//! maintained clients (the `redis` crate and `lapin`, wrapped in [`crate::brokers`]): Redis `PUBLISH`/`SUBSCRIBE` on a
//! channel named after the run, and a RabbitMQ fanout exchange named after the run with
//! one server-named queue per subscriber (AMQP 0-9-1). The broker is a third process: a
//! message goes publisher → broker → each subscriber over TCP.
//!
//! The brokers are not started by the benchmark: `scripts/brokers.sh start` runs them
//! (Redis on 127.0.0.1:16379, RabbitMQ on 127.0.0.1:15673, or `SHMLINK_REDIS_ADDR` /
//! `SHMLINK_AMQP_ADDR`); when one is not reachable its method is skipped with the reason.
//!
//! Readiness: a subscriber's `connect` returns once the broker confirmed its
//! subscription, and the run starts only after every subscriber said so on its side
//! channel; with Redis the publisher also waits until `PUBSUB NUMSUB` counts them all.
//! Publishing: the Redis client waits for each `PUBLISH` reply (a plain Redis client);
//! AMQP's Basic.Publish does not wait for the server (no publisher confirms). Receiving:
//! `try_recv` for a moment, then a blocking `recv`.

use std::io;
use std::net::SocketAddr;
use std::time::Duration;

use super::super::{Ctx, Method, Prepared, Publish, Receive};
use super::spin_then_block;
use crate::brokers::{self, amqp, redis};
use crate::method::arg;
use crate::sys::err;

#[derive(Clone, Copy, PartialEq, Eq)]
enum Kind {
    Redis,
    Amqp,
}

pub struct Broker {
    kind: Kind,
}

pub const REDIS: Broker = Broker { kind: Kind::Redis };
pub const RABBITMQ: Broker = Broker { kind: Kind::Amqp };

impl Broker {
    fn addr(&self) -> Result<SocketAddr, String> {
        match self.kind {
            Kind::Redis => brokers::redis_addr(),
            Kind::Amqp => brokers::amqp_addr(),
        }
    }
}

/// The channel (Redis) or exchange (RabbitMQ) of a run.
fn topic(c: &Ctx) -> String {
    c.tag.clone()
}

struct RedisPub(redis::Publisher);

impl Publish for RedisPub {
    fn publish(&mut self, msg: &[u8]) -> io::Result<()> {
        self.0.publish(msg)
    }
}

/// Closes the connection at the end (Connection.Close, waiting for CloseOk).
struct AmqpPub(Option<amqp::Publisher>);

impl Publish for AmqpPub {
    fn publish(&mut self, msg: &[u8]) -> io::Result<()> {
        self.0
            .as_mut()
            .ok_or_else(|| err("amqp: publisher closed"))?
            .publish(msg)
    }
}

impl Drop for AmqpPub {
    fn drop(&mut self) {
        if let Some(p) = self.0.take() {
            let _ = p.close();
        }
    }
}

/// A broker's subscriber: both clients have the same receiving interface.
trait Client {
    fn recv(&mut self, buf: &mut Vec<u8>) -> io::Result<()>;
    fn try_recv(&mut self, buf: &mut Vec<u8>) -> io::Result<bool>;
}

impl Client for redis::Subscriber {
    fn recv(&mut self, buf: &mut Vec<u8>) -> io::Result<()> {
        redis::Subscriber::recv(self, buf)
    }
    fn try_recv(&mut self, buf: &mut Vec<u8>) -> io::Result<bool> {
        redis::Subscriber::try_recv(self, buf)
    }
}

impl Client for amqp::Subscriber {
    fn recv(&mut self, buf: &mut Vec<u8>) -> io::Result<()> {
        amqp::Subscriber::recv(self, buf)
    }
    fn try_recv(&mut self, buf: &mut Vec<u8>) -> io::Result<bool> {
        amqp::Subscriber::try_recv(self, buf)
    }
}

struct Sub<C> {
    client: C,
    buf: Vec<u8>,
    spin: Duration,
}

impl<C: Client> Receive for Sub<C> {
    fn recv(&mut self, read: &mut dyn FnMut(&[u8]) -> io::Result<()>) -> io::Result<()> {
        spin_then_block(
            self.spin,
            self,
            |s| Ok(s.client.try_recv(&mut s.buf)?.then_some(())),
            |s| s.client.recv(&mut s.buf),
        )?;
        read(&self.buf)
    }
}

impl Method for Broker {
    fn name(&self) -> &'static str {
        match self.kind {
            Kind::Redis => "redis",
            Kind::Amqp => "rabbitmq",
        }
    }

    fn about(&self) -> &'static str {
        match self.kind {
            Kind::Redis => {
                "Redis PUBLISH/SUBSCRIBE through a local redis-server (TCP loopback), redis crate"
            }
            Kind::Amqp => {
                "RabbitMQ fanout exchange, a queue per subscriber, AMQP 0-9-1 (TCP loopback), lapin"
            }
        }
    }

    fn unavailable(&self) -> Option<String> {
        self.addr().err()
    }

    fn prepare(&self, c: &Ctx) -> io::Result<Prepared> {
        let addr = self.addr().map_err(err)?;
        let topic = topic(c);
        let args = vec![addr.to_string(), topic.clone()];
        let n = c.subscribers;
        match self.kind {
            Kind::Redis => {
                let mut p = redis::Publisher::connect(addr, &topic)?;
                Ok(Prepared::same_args(n, args, move |timeout| {
                    p.wait_for_subscribers(n, timeout)?;
                    Ok(Box::new(RedisPub(p)) as Box<dyn Publish>)
                }))
            }
            Kind::Amqp => {
                let p = amqp::Publisher::connect(addr, &topic)?;
                // Every subscriber's queue is bound once it said ready (its connect
                // returned after Queue.BindOk and Basic.ConsumeOk).
                Ok(Prepared::same_args(n, args, move |_| {
                    Ok(Box::new(AmqpPub(Some(p))) as Box<dyn Publish>)
                }))
            }
        }
    }

    fn subscribe(&self, c: &Ctx, args: &[String]) -> io::Result<Box<dyn Receive>> {
        let text = arg(args, 0, "broker address")?;
        let addr: SocketAddr = text
            .parse()
            .map_err(|e| err(format!("broker address {text:?}: {e}")))?;
        let topic = arg(args, 1, "channel or exchange")?;
        let buf = Vec::with_capacity(c.size);
        Ok(match self.kind {
            Kind::Redis => Box::new(Sub {
                client: redis::Subscriber::connect(addr, topic)?,
                buf,
                spin: c.spin,
            }),
            Kind::Amqp => Box::new(Sub {
                client: amqp::Subscriber::connect(addr, topic)?,
                buf,
                spin: c.spin,
            }),
        })
    }
}
