//! RabbitMQ over AMQP 0-9-1 with `lapin`: a [`Publisher`] and a [`Subscriber`], one
//! connection and one channel each, on a one-thread tokio runtime of their own (so the
//! connection reads and writes while the caller is not inside it, and
//! [`Subscriber::try_recv`] can look for a message without blocking).
//!
//! Both log in as `guest`/`guest` (RabbitMQ allows it from loopback), ask for frames of
//! at most 128 KiB and heartbeats off, and declare the exchange the same way: fanout, not
//! durable, auto-delete. Each subscriber consumes, with no-ack, an exclusive auto-delete
//! queue named by the server and bound to the exchange.

use std::io;
use std::net::SocketAddr;
use std::time::Duration;

use futures_util::{FutureExt, StreamExt};
use lapin::options::{
    BasicConsumeOptions, BasicPublishOptions, ExchangeDeclareOptions, QueueBindOptions,
    QueueDeclareOptions,
};
use lapin::types::FieldTable;
use lapin::{BasicProperties, Channel, Connection, ConnectionProperties, Consumer, ExchangeKind};

use super::redis::runtime;
use super::{check_publish_size, CONNECT_TIMEOUT, HANDSHAKE_TIMEOUT, MAX_MESSAGE};

/// The client's error as an `io::Error` naming the broker and its address; a refusal of
/// the server (Connection.Close, Channel.Close) is of kind `Other` with its text.
fn error(addr: SocketAddr, e: lapin::Error) -> io::Error {
    io::Error::other(format!("rabbitmq {addr}: {e}"))
}

/// One connection with one channel, and the runtime that drives it.
struct Conn {
    addr: SocketAddr,
    runtime: tokio::runtime::Runtime,
    connection: Connection,
    channel: Channel,
}

impl Conn {
    /// Connects, opens a channel and declares the fanout exchange `exchange`.
    fn open(addr: SocketAddr, exchange: &str) -> io::Result<Conn> {
        let runtime = runtime("rabbitmq")?;
        let uri = format!(
            "amqp://guest:guest@{addr}/%2f?heartbeat=0&frame_max=131072&connection_timeout={}",
            CONNECT_TIMEOUT.as_millis()
        );
        let (connection, channel) = runtime.block_on(async {
            let open = async {
                let connection = Connection::connect(&uri, ConnectionProperties::default()).await?;
                let channel = connection.create_channel().await?;
                channel
                    .exchange_declare(
                        exchange.into(),
                        ExchangeKind::Fanout,
                        ExchangeDeclareOptions {
                            auto_delete: true,
                            ..ExchangeDeclareOptions::default()
                        },
                        FieldTable::default(),
                    )
                    .await?;
                Ok::<_, lapin::Error>((connection, channel))
            };
            match tokio::time::timeout(CONNECT_TIMEOUT + HANDSHAKE_TIMEOUT, open).await {
                Ok(r) => r.map_err(|e| error(addr, e)),
                Err(_) => Err(io::Error::new(
                    io::ErrorKind::TimedOut,
                    format!("rabbitmq {addr}: no connection and exchange {exchange:?} in time"),
                )),
            }
        })?;
        Ok(Conn {
            addr,
            runtime,
            connection,
            channel,
        })
    }

    /// Closes the connection cleanly, waiting for Connection.CloseOk.
    fn close(self) -> io::Result<()> {
        let addr = self.addr;
        self.runtime
            .block_on(self.connection.close(200, "bye".into()))
            .map_err(|e| error(addr, e))
    }
}

/// Publishes to one fanout exchange with Basic.Publish (no publisher confirms: it does
/// not wait for the server).
pub struct Publisher {
    conn: Conn,
    exchange: String,
}

impl Publisher {
    /// Connects to RabbitMQ at `addr` and declares the fanout exchange `exchange` (at most
    /// 255 bytes).
    pub fn connect(addr: SocketAddr, exchange: &str) -> io::Result<Publisher> {
        Ok(Publisher {
            conn: Conn::open(addr, exchange)?,
            exchange: exchange.to_owned(),
        })
    }

    /// Sends `msg` (binary, up to [`MAX_MESSAGE`] bytes) to the exchange.
    pub fn publish(&mut self, msg: &[u8]) -> io::Result<()> {
        check_publish_size(msg)?;
        let c = &self.conn;
        c.runtime
            .block_on(c.channel.basic_publish(
                self.exchange.as_str().into(),
                "".into(),
                BasicPublishOptions::default(),
                msg,
                BasicProperties::default(),
            ))
            .map(drop)
            .map_err(|e| error(c.addr, e))
    }

    /// Closes the connection cleanly: RabbitMQ has routed every message published before
    /// its Connection.CloseOk, which this waits for.
    pub fn close(self) -> io::Result<()> {
        self.conn.close()
    }
}

/// Receives the messages of one fanout exchange through a queue of its own.
pub struct Subscriber {
    conn: Conn,
    consumer: Consumer,
    read_timeout: Option<Duration>,
}

impl Subscriber {
    /// Connects to RabbitMQ at `addr`, declares the fanout exchange `exchange` (as the
    /// publisher does; whichever comes first creates it), declares its queue, binds it and
    /// starts consuming. Returns after Basic.ConsumeOk: every message published to the
    /// exchange after that reaches this subscriber.
    pub fn connect(addr: SocketAddr, exchange: &str) -> io::Result<Subscriber> {
        let conn = Conn::open(addr, exchange)?;
        let channel = &conn.channel;
        let consumer = conn
            .runtime
            .block_on(async {
                let queue = channel
                    .queue_declare(
                        "".into(),
                        QueueDeclareOptions {
                            exclusive: true,
                            auto_delete: true,
                            ..QueueDeclareOptions::default()
                        },
                        FieldTable::default(),
                    )
                    .await?;
                channel
                    .queue_bind(
                        queue.name().clone(),
                        exchange.into(),
                        "".into(),
                        QueueBindOptions::default(),
                        FieldTable::default(),
                    )
                    .await?;
                channel
                    .basic_consume(
                        queue.name().clone(),
                        "".into(),
                        BasicConsumeOptions {
                            no_ack: true,
                            ..BasicConsumeOptions::default()
                        },
                        FieldTable::default(),
                    )
                    .await
            })
            .map_err(|e| error(addr, e))?;
        Ok(Subscriber {
            conn,
            consumer,
            read_timeout: None,
        })
    }

    /// How long [`recv`](Self::recv) waits (`None`: for ever); after it, `TimedOut`.
    pub fn set_read_timeout(&mut self, timeout: Option<Duration>) -> io::Result<()> {
        if timeout == Some(Duration::ZERO) {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "a read timeout of zero",
            ));
        }
        self.read_timeout = timeout;
        Ok(())
    }

    /// Puts the body of the next message in `buf` (replacing its contents), waiting for it.
    pub fn recv(&mut self, buf: &mut Vec<u8>) -> io::Result<()> {
        let addr = self.conn.addr;
        let next = self.consumer.next();
        let delivery = match self.read_timeout {
            None => self.conn.runtime.block_on(next),
            Some(t) => self
                .conn
                .runtime
                .block_on(async { tokio::time::timeout(t, next).await })
                .map_err(|_| {
                    io::Error::new(
                        io::ErrorKind::TimedOut,
                        format!("rabbitmq {addr}: no message within {t:?}"),
                    )
                })?,
        };
        take(addr, delivery, buf)
    }

    /// Like [`recv`](Self::recv) if a message has arrived; `Ok(false)` at once if not.
    pub fn try_recv(&mut self, buf: &mut Vec<u8>) -> io::Result<bool> {
        let _in_runtime = self.conn.runtime.enter();
        match self.consumer.next().now_or_never() {
            None => Ok(false),
            Some(delivery) => take(self.conn.addr, delivery, buf).map(|()| true),
        }
    }

    /// Closes the connection cleanly (the queue is deleted with it).
    pub fn close(self) -> io::Result<()> {
        self.conn.close()
    }
}

fn take(
    addr: SocketAddr,
    delivery: Option<lapin::Result<lapin::message::Delivery>>,
    buf: &mut Vec<u8>,
) -> io::Result<()> {
    let delivery = delivery
        .ok_or_else(|| {
            io::Error::new(
                io::ErrorKind::ConnectionAborted,
                format!("rabbitmq {addr}: the consumer was cancelled"),
            )
        })?
        .map_err(|e| error(addr, e))?;
    if delivery.data.len() > MAX_MESSAGE {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!(
                "rabbitmq {addr}: message of {} bytes is over the limit of {MAX_MESSAGE}",
                delivery.data.len()
            ),
        ));
    }
    *buf = delivery.data;
    Ok(())
}
