//! gRPC over shmlink with [tonic]: a server runs on a shmlink listener through
//! `Server::serve_with_incoming(`[`incoming`]`(listener))`, a client reaches it through
//! [`channel()`] (`Endpoint::connect_with_connector` with a connector that opens a shmlink
//! connection). Addresses are shmlink's: `shm:NAME` on one machine, `auto:HOST:PORT`
//! where a client elsewhere falls back to TCP (and one on the same kernel moves to
//! shared memory), or `ux:`/`tcp:`/`tls:`.
//!
//! HTTP/2 runs over a [`ByteStream`] (`AsyncRead +
//! AsyncWrite` over the connection's messages). [`echo`] is a small service written
//! without protoc (prost messages by hand, the service glue as tonic's code generator
//! would write it): the example, the test and the benchmark use it.
//!
//! Rust 1.88 or later (tonic 0.14's requirement); the `shmlink` library itself and its
//! `tokio` feature build with 1.80.
#![deny(missing_docs)]

mod channel;
pub mod echo;

pub use channel::{unavailable_if_lost, LostBody, ResponseFuture, ShmChannel};

use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};

use futures_util::StreamExt;
use hyper_util::rt::TokioIo;
use shmlink::tokio::{ByteStream, Connection, Listener};
use shmlink::Options;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tonic::transport::server::Connected;
use tonic::transport::Endpoint;

/// A shmlink connection as tonic takes it: the byte stream plus [`Connected`] (its
/// connect info is [`ShmConnectInfo`]).
#[derive(Debug)]
pub struct ShmIo(pub ByteStream);

/// What a request's extensions carry about the shmlink connection it came on.
#[derive(Clone, Debug)]
pub struct ShmConnectInfo {
    /// The peer's address (for `shm:`, its pid and uid).
    pub peer: String,
    /// What the connection travels over.
    pub transport: shmlink::Transport,
}

impl Connected for ShmIo {
    type ConnectInfo = ShmConnectInfo;

    fn connect_info(&self) -> ShmConnectInfo {
        let conn = self.0.get_ref();
        ShmConnectInfo {
            peer: conn.peer_addr(),
            transport: conn.transport(),
        }
    }
}

impl AsyncRead for ShmIo {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().0).poll_read(cx, buf)
    }
}

impl AsyncWrite for ShmIo {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().0).poll_write(cx, buf)
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().0).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().0).poll_shutdown(cx)
    }
}

/// The listener's connections as the stream `serve_with_incoming` takes. An error item
/// (the listener's own; refused clients never appear) is skipped by tonic, which keeps
/// serving.
///
/// ```no_run
/// # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
/// let listener = shmlink::tokio::Listener::bind("shm:greeter", &shmlink::Options::default())?;
/// tonic::transport::Server::builder()
///     .add_service(shmlink_grpc::echo::EchoServer::default())
///     .serve_with_incoming(shmlink_grpc::incoming(listener))
///     .await?;
/// # Ok(()) }
/// ```
pub fn incoming(
    listener: Listener,
) -> impl futures_util::Stream<Item = Result<ShmIo, shmlink::Error>> + Send + 'static {
    listener
        .into_incoming()
        .map(|conn| conn.map(|c| ShmIo(c.into_byte_stream())))
}

/// A channel to the gRPC server at the shmlink address `addr`: each (re)connection opens
/// a shmlink connection; a connection lost mid-call fails the call with `Unavailable`
/// (see [`ShmChannel`]). Connects once before returning (an unreachable server fails
/// here with the shmlink error in the source chain).
///
/// ```no_run
/// # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
/// let channel = shmlink_grpc::channel("shm:greeter", &shmlink::Options::default()).await?;
/// let mut client = shmlink_grpc::echo::EchoClient::new(channel);
/// let reply = client.unary(b"hello".to_vec()).await?;
/// assert_eq!(reply, b"hello");
/// # Ok(()) }
/// ```
pub async fn channel(addr: &str, opts: &Options) -> Result<ShmChannel, tonic::transport::Error> {
    let channel = endpoint()
        .connect_with_connector(connector(addr, opts))
        .await?;
    Ok(ShmChannel::new(channel))
}

/// Like [`channel()`], but connects on first use (and reconnects after a failure then).
pub fn channel_lazy(addr: &str, opts: &Options) -> ShmChannel {
    ShmChannel::new(endpoint().connect_with_connector_lazy(connector(addr, opts)))
}

/// The endpoint: its URI only names the HTTP/2 authority (the connector ignores it).
fn endpoint() -> Endpoint {
    Endpoint::from_static("http://shmlink.invalid")
}

/// A connector (a `tower::Service<Uri>`) that opens a shmlink connection to `addr`.
fn connector(
    addr: &str,
    opts: &Options,
) -> impl tower::Service<
    http::Uri,
    Response = TokioIo<ShmIo>,
    Error = shmlink::Error,
    Future = impl std::future::Future<Output = Result<TokioIo<ShmIo>, shmlink::Error>> + Send,
> + Clone
       + Send
       + 'static {
    let (addr, opts) = (addr.to_owned(), opts.clone());
    tower::service_fn(move |_: http::Uri| {
        let (addr, opts) = (addr.clone(), opts.clone());
        async move {
            let conn = Connection::connect(&addr, &opts).await?;
            Ok(TokioIo::new(ShmIo(conn.into_byte_stream())))
        }
    })
}
