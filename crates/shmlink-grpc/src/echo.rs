//! `shmlink.echo.Echo`, a small gRPC service written without protoc:
//!
//! ```proto
//! syntax = "proto3";
//! package shmlink.echo;
//! message EchoMsg { bytes payload = 1; uint64 seq = 2; }
//! message StreamRequest { uint64 count = 1; uint32 size = 2; uint64 interval_us = 3; }
//! service Echo {
//!   rpc Unary(EchoMsg) returns (EchoMsg);                 // the message back
//!   rpc Stream(StreamRequest) returns (stream EchoMsg);   // count messages, seq 0..count
//! }
//! ```
//!
//! The messages are prost structs written by hand; [`EchoServer`] and [`EchoClient`]
//! are the glue tonic's code generator would write, on tonic's public server and client
//! API.

use std::convert::Infallible;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use futures_util::Stream;
use tonic::body::Body;
use tonic::codegen::{http, BoxFuture, Service, StdError};
use tonic::server::{Grpc, NamedService, ServerStreamingService, UnaryService};
use tonic::{Request, Response, Status};
use tonic_prost::ProstCodec;

/// The service's full name.
pub const SERVICE: &str = "shmlink.echo.Echo";
const UNARY_PATH: &str = "/shmlink.echo.Echo/Unary";
const STREAM_PATH: &str = "/shmlink.echo.Echo/Stream";

/// A message: its bytes and a sequence number.
#[derive(Clone, PartialEq, prost::Message)]
pub struct EchoMsg {
    /// The bytes.
    #[prost(bytes = "vec", tag = "1")]
    pub payload: Vec<u8>,
    /// The message's number in a stream (0 in unary calls).
    #[prost(uint64, tag = "2")]
    pub seq: u64,
}

/// What `Stream` sends: `count` messages of `size` bytes, `interval_us` apart.
#[derive(Clone, PartialEq, prost::Message)]
pub struct StreamRequest {
    /// How many messages.
    #[prost(uint64, tag = "1")]
    pub count: u64,
    /// Bytes per message (at most 1 MiB).
    #[prost(uint32, tag = "2")]
    pub size: u32,
    /// Pause between messages, in microseconds (0: none).
    #[prost(uint64, tag = "3")]
    pub interval_us: u64,
}

/// The payload of message `seq` of a stream: `size` bytes derived from `seq`.
pub fn stream_payload(seq: u64, size: usize) -> Vec<u8> {
    (0..size)
        .map(|i| (seq as usize).wrapping_mul(131).wrapping_add(i) as u8)
        .collect()
}

/// The server's stream of replies.
pub type ReplyStream = Pin<Box<dyn Stream<Item = Result<EchoMsg, Status>> + Send + 'static>>;

/// The echo service as a tonic server (`Server::builder().add_service(EchoServer::default())`).
#[derive(Clone, Debug, Default)]
pub struct EchoServer {
    _private: (),
}

impl NamedService for EchoServer {
    const NAME: &'static str = SERVICE;
}

struct UnarySvc;

impl UnaryService<EchoMsg> for UnarySvc {
    type Response = EchoMsg;
    type Future = BoxFuture<Response<EchoMsg>, Status>;

    fn call(&mut self, request: Request<EchoMsg>) -> Self::Future {
        Box::pin(async move { Ok(Response::new(request.into_inner())) })
    }
}

struct StreamSvc;

impl ServerStreamingService<StreamRequest> for StreamSvc {
    type Response = EchoMsg;
    type ResponseStream = ReplyStream;
    type Future = BoxFuture<Response<ReplyStream>, Status>;

    fn call(&mut self, request: Request<StreamRequest>) -> Self::Future {
        Box::pin(async move {
            let req = request.into_inner();
            if req.size > 1 << 20 {
                return Err(Status::invalid_argument("size above 1 MiB"));
            }
            let size = req.size as usize;
            let pause = Duration::from_micros(req.interval_us);
            let stream = futures_util::stream::unfold(0u64, move |seq| async move {
                if seq >= req.count {
                    return None;
                }
                if !pause.is_zero() && seq > 0 {
                    tokio::time::sleep(pause).await;
                }
                let msg = EchoMsg {
                    payload: stream_payload(seq, size),
                    seq,
                };
                Some((Ok(msg), seq + 1))
            });
            Ok(Response::new(Box::pin(stream) as ReplyStream))
        })
    }
}

impl<B> Service<http::Request<B>> for EchoServer
where
    B: tonic::codegen::Body + Send + 'static,
    B::Error: Into<StdError> + Send + 'static,
{
    type Response = http::Response<Body>;
    type Error = Infallible;
    type Future = BoxFuture<Self::Response, Self::Error>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: http::Request<B>) -> Self::Future {
        match req.uri().path() {
            UNARY_PATH => Box::pin(async move {
                let mut grpc = Grpc::new(ProstCodec::<EchoMsg, EchoMsg>::default());
                Ok(grpc.unary(UnarySvc, req).await)
            }),
            STREAM_PATH => Box::pin(async move {
                let mut grpc = Grpc::new(ProstCodec::<EchoMsg, StreamRequest>::default());
                Ok(grpc.server_streaming(StreamSvc, req).await)
            }),
            _ => Box::pin(async move { Ok(Status::unimplemented("no such method").into_http()) }),
        }
    }
}

/// A client of the echo service over any tonic channel (e.g. [`crate::channel`]).
/// Cloning is cheap (calls on clones share the channel's connection).
#[derive(Clone, Debug)]
pub struct EchoClient {
    inner: tonic::client::Grpc<crate::ShmChannel>,
}

impl EchoClient {
    /// A client on `channel`.
    pub fn new(channel: crate::ShmChannel) -> EchoClient {
        EchoClient {
            inner: tonic::client::Grpc::new(channel),
        }
    }

    async fn ready(&mut self) -> Result<(), Status> {
        self.inner
            .ready()
            .await
            .map_err(|e| Status::unavailable(format!("channel not ready: {e}")))
    }

    /// `Unary`: sends `payload`, returns what came back.
    pub async fn unary(&mut self, payload: Vec<u8>) -> Result<Vec<u8>, Status> {
        self.ready().await?;
        let path = http::uri::PathAndQuery::from_static(UNARY_PATH);
        let req = Request::new(EchoMsg { payload, seq: 0 });
        let reply = self
            .inner
            .unary(req, path, ProstCodec::<EchoMsg, EchoMsg>::default())
            .await?;
        Ok(reply.into_inner().payload)
    }

    /// `Stream`: the server's stream of replies.
    pub async fn stream(
        &mut self,
        req: StreamRequest,
    ) -> Result<tonic::codec::Streaming<EchoMsg>, Status> {
        self.ready().await?;
        let path = http::uri::PathAndQuery::from_static(STREAM_PATH);
        let reply = self
            .inner
            .server_streaming(
                Request::new(req),
                path,
                ProstCodec::<StreamRequest, EchoMsg>::default(),
            )
            .await?;
        Ok(reply.into_inner())
    }
}
