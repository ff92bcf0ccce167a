//! Message brokers the pub/sub benchmark compares shmlink with: Redis pub/sub
//! ([`redis`], on the `redis` crate) and RabbitMQ over AMQP 0-9-1 ([`amqp`], on `lapin`),
//! behind one small blocking interface, and where to find the brokers.
//!
//! The brokers are private instances on loopback that `scripts/brokers.sh start` runs
//! (`scripts/brokers.sh install` installs the Debian packages first): Redis on
//! `127.0.0.1:16379`, RabbitMQ on `127.0.0.1:15673`. [`redis_addr`] and [`amqp_addr`] return
//! those addresses (or `SHMLINK_REDIS_ADDR` / `SHMLINK_AMQP_ADDR`), or why the broker is not
//! usable, as a skip reason.
//!
//! # API
//!
//! Both modules have the same shape: a `Publisher` and a `Subscriber`, one TCP connection
//! each.
//!
//! | | [`redis`] | [`amqp`] |
//! |---|---|---|
//! | publisher | `Publisher::connect(addr, channel)` | `Publisher::connect(addr, exchange)` |
//! | publish | `publish(&mut self, &[u8])`: `PUBLISH`, waits for the reply | `publish(&mut self, &[u8])`: Basic.Publish, no publisher confirms; `close()` |
//! | subscriber | `Subscriber::connect(addr, channel)` | `Subscriber::connect(addr, exchange)` |
//! | receive | `recv(&mut self, &mut Vec<u8>)`, `try_recv(..) -> bool`, `set_read_timeout` | the same, and `close()` |
//! | readiness | `Publisher::subscribers(channel) -> usize` (`PUBSUB NUMSUB`), `wait_for_subscribers(n, timeout)` | see below |
//!
//! - `recv` puts the payload of the next message in the buffer (replacing its contents);
//!   it blocks, or stops with `TimedOut` after the read timeout. `try_recv` never blocks:
//!   `Ok(false)` when no message has arrived. Each subscriber's connection runs on a tokio
//!   runtime of its own with one worker thread, which reads while the caller does not
//!   wait; the Redis publisher is the crate's blocking connection.
//! - **Readiness.** `Subscriber::connect` returns only after the broker confirmed the
//!   subscription (Redis: the `subscribe` reply; RabbitMQ: Queue.BindOk, then
//!   Basic.ConsumeOk), so every message published after `connect` returned reaches the
//!   subscriber. With Redis a publisher can also count subscribers. AMQP 0-9-1 offers no
//!   way to count the queues bound to an exchange, so with RabbitMQ the subscribers say
//!   they are ready themselves, through whatever channel the benchmark already has to
//!   them, once `connect` returned.
//! - Messages are binary, up to [`MAX_MESSAGE`] (16 MiB) each. Publishing more is
//!   `InvalidInput`; receiving more is `InvalidData` (after the client read it: the
//!   clients' own limits are theirs).
//! - AMQP: both sides declare the exchange (fanout, not durable, auto-delete), whichever
//!   connects first creates it. Each subscriber has an exclusive auto-delete queue named
//!   by the server, consumed with no-ack. Frames of at most 128 KiB, heartbeats off.
//!   [`amqp::Publisher::close`] waits for Connection.CloseOk, after which RabbitMQ has
//!   routed everything published.
//!
//! # Errors
//!
//! Every error names the broker and its address. An error reply of the server (Redis
//! `-ERR ...`, AMQP Connection.Close/Channel.Close) is an error of kind `Other` with the
//! server's text; what the clients make of malformed input is theirs (both are
//! maintained crates; the suite's earlier hand-written clients were replaced by them).
//!
//! # Example
//!
//! Compiled by the doc tests, not run: `tests/brokers.rs` makes the same calls against
//! the brokers, and is skipped visibly where they are not running.
//!
//! ```no_run
//! use std::time::Duration;
//! use shmlink_bench::brokers::{self, redis};
//!
//! fn main() -> std::io::Result<()> {
//!     let addr = match brokers::redis_addr() {
//!         Ok(addr) => addr,
//!         Err(reason) => {
//!             eprintln!("no Redis to talk to: {reason}");
//!             return Ok(());
//!         }
//!     };
//!     let mut sub = redis::Subscriber::connect(addr, "shmlink-doc-example")?;
//!     sub.set_read_timeout(Some(Duration::from_secs(10)))?;
//!     let mut publisher = redis::Publisher::connect(addr, "shmlink-doc-example")?;
//!     publisher.wait_for_subscribers(1, Duration::from_secs(10))?;
//!     publisher.publish(b"hello")?;
//!     let mut buf = Vec::new();
//!     sub.recv(&mut buf)?;
//!     assert_eq!(buf, b"hello");
//!     Ok(())
//! }
//! ```

use std::io;
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

pub mod amqp;
pub mod redis;

/// The largest message either client sends or accepts: 16 MiB.
pub const MAX_MESSAGE: usize = 16 << 20;

/// Refuses a message to publish over [`MAX_MESSAGE`].
pub(crate) fn check_publish_size(msg: &[u8]) -> io::Result<()> {
    if msg.len() > MAX_MESSAGE {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!(
                "message of {} bytes is over the limit of {MAX_MESSAGE}",
                msg.len()
            ),
        ));
    }
    Ok(())
}

/// Where `scripts/brokers.sh start` runs Redis.
pub const REDIS_DEFAULT_ADDR: &str = "127.0.0.1:16379";
/// Where `scripts/brokers.sh start` runs RabbitMQ's AMQP listener.
pub const AMQP_DEFAULT_ADDR: &str = "127.0.0.1:15673";
/// Overrides [`REDIS_DEFAULT_ADDR`] for [`redis_addr`].
pub const REDIS_ADDR_ENV: &str = "SHMLINK_REDIS_ADDR";
/// Overrides [`AMQP_DEFAULT_ADDR`] for [`amqp_addr`].
pub const AMQP_ADDR_ENV: &str = "SHMLINK_AMQP_ADDR";

/// How long a client's TCP connect may take.
pub(crate) const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// How long each reply during connecting (login, declarations, subscription) may take.
pub(crate) const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
/// How long [`redis_addr`] and [`amqp_addr`] try to connect.
const PROBE_TIMEOUT: Duration = Duration::from_millis(500);

/// The Redis server's address (`SHMLINK_REDIS_ADDR`, else `127.0.0.1:16379`) if something
/// accepts TCP connections there; otherwise why not, as a reason to skip.
pub fn redis_addr() -> Result<SocketAddr, String> {
    probe("redis", REDIS_ADDR_ENV, REDIS_DEFAULT_ADDR)
}

/// RabbitMQ's AMQP address (`SHMLINK_AMQP_ADDR`, else `127.0.0.1:15673`) if something
/// accepts TCP connections there; otherwise why not, as a reason to skip.
pub fn amqp_addr() -> Result<SocketAddr, String> {
    probe("rabbitmq", AMQP_ADDR_ENV, AMQP_DEFAULT_ADDR)
}

fn probe(broker: &str, env: &str, default: &str) -> Result<SocketAddr, String> {
    let text = std::env::var(env).unwrap_or_else(|_| default.to_owned());
    let addr: SocketAddr = text
        .parse()
        .map_err(|e| format!("{env}={text:?} is not an address like {default}: {e}"))?;
    match TcpStream::connect_timeout(&addr, PROBE_TIMEOUT) {
        Ok(_) => Ok(addr),
        Err(_) => Err(format!(
            "{broker} not running on {addr} (start it with scripts/brokers.sh start)"
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unreachable_broker_is_a_skip_reason() {
        // Nothing listens on port 1 (privileged, unassigned on loopback).
        let err = probe("redis", "SHMLINK_TEST_UNSET_VARIABLE", "127.0.0.1:1").unwrap_err();
        assert_eq!(
            err,
            "redis not running on 127.0.0.1:1 (start it with scripts/brokers.sh start)"
        );
    }

    #[test]
    fn a_bad_address_says_which_variable() {
        // PATH is set and not an address.
        let err = probe("redis", "PATH", "127.0.0.1:1").unwrap_err();
        assert!(
            err.starts_with("PATH=") && err.contains("is not an address"),
            "{err}"
        );
    }
}
