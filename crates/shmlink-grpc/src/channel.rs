//! [`ShmChannel`]: a tonic channel whose calls fail with `Unavailable` when the
//! connection is lost.

use std::error::Error as StdError;
use std::future::Future;
use std::io;
use std::pin::Pin;
use std::task::{ready, Context, Poll};

use bytes::Bytes;
use http_body::Frame;
use tonic::body::Body;
use tonic::transport::Channel;
use tonic::{Code, Status};

/// A [`Channel`] to a shmlink address (from [`crate::channel()`]), usable by any tonic
/// client (`SomeClient::new(channel)`, generated or not).
///
/// tonic reports a connection lost in the middle of a call (the server process died) as
/// `Unknown` ("h2 protocol error: error reading a body from connection"): HTTP/2 hides
/// the I/O error below its own. gRPC names that case `UNAVAILABLE` (retry with backoff),
/// and this channel says so: errors of responses and of their bodies whose cause is a
/// reset, aborted or broken connection become [`Code::Unavailable`]
/// (see [`unavailable_if_lost`]). A call to a server that is gone fails with
/// `Unavailable` already in tonic (a connect error).
#[derive(Clone, Debug)]
pub struct ShmChannel {
    inner: Channel,
}

impl ShmChannel {
    /// Wraps a channel.
    pub fn new(inner: Channel) -> ShmChannel {
        ShmChannel { inner }
    }

    /// The channel inside.
    pub fn into_inner(self) -> Channel {
        self.inner
    }
}

impl tower::Service<http::Request<Body>> for ShmChannel {
    type Response = http::Response<LostBody>;
    type Error = Box<dyn StdError + Send + Sync>;
    type Future = ResponseFuture;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        tower::Service::poll_ready(&mut self.inner, cx).map_err(Into::into)
    }

    fn call(&mut self, req: http::Request<Body>) -> ResponseFuture {
        ResponseFuture {
            inner: tower::Service::call(&mut self.inner, req),
        }
    }
}

/// The future of a [`ShmChannel`] call.
pub struct ResponseFuture {
    inner: tonic::transport::channel::ResponseFuture,
}

impl Future for ResponseFuture {
    type Output = Result<http::Response<LostBody>, Box<dyn StdError + Send + Sync>>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let me = self.get_mut();
        match ready!(Pin::new(&mut me.inner).poll(cx)) {
            Ok(resp) => Poll::Ready(Ok(resp.map(|body| LostBody { inner: body }))),
            Err(e) => {
                let status = Status::from_error(e.into());
                Poll::Ready(Err(Box::new(unavailable_if_lost(status))))
            }
        }
    }
}

impl std::fmt::Debug for ResponseFuture {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ResponseFuture")
    }
}

/// A response body whose errors go through [`unavailable_if_lost`].
#[derive(Debug)]
pub struct LostBody {
    inner: Body,
}

impl http_body::Body for LostBody {
    type Data = Bytes;
    type Error = Status;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Status>>> {
        let me = self.get_mut();
        Pin::new(&mut me.inner)
            .poll_frame(cx)
            .map(|f| f.map(|r| r.map_err(unavailable_if_lost)))
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.inner.size_hint()
    }
}

/// `status` as [`Code::Unavailable`] when it is `Unknown`, `Internal` or `Cancelled` and
/// caused by a lost connection: an I/O error (directly, or inside an HTTP/2 error) of
/// kind `ConnectionReset`, `ConnectionAborted`, `BrokenPipe` or `NotConnected`, or hyper's
/// report that the connection closed under the call (a request it never sent is
/// "canceled" to hyper, which tonic passes on as `Cancelled`). Other statuses are returned
/// unchanged. For clients on a plain [`Channel`].
pub fn unavailable_if_lost(status: Status) -> Status {
    if !matches!(
        status.code(),
        Code::Unknown | Code::Internal | Code::Cancelled
    ) || !lost(&status)
    {
        return status;
    }
    Status::unavailable(format!("connection lost: {}", status.message()))
}

fn lost_kind(kind: io::ErrorKind) -> bool {
    matches!(
        kind,
        io::ErrorKind::ConnectionReset
            | io::ErrorKind::ConnectionAborted
            | io::ErrorKind::BrokenPipe
            | io::ErrorKind::NotConnected
    )
}

fn lost(err: &(dyn StdError + 'static)) -> bool {
    let mut cur = Some(err);
    // Bounded: a source chain is short, but never trust it to end.
    for _ in 0..32 {
        let Some(e) = cur else { return false };
        if let Some(io) = e.downcast_ref::<io::Error>() {
            if lost_kind(io.kind()) {
                return true;
            }
        }
        // h2's error has no `source`; its I/O error is behind `get_io`.
        if let Some(io) = e.downcast_ref::<h2::Error>().and_then(h2::Error::get_io) {
            if lost_kind(io.kind()) {
                return true;
            }
        }
        if let Some(h) = e.downcast_ref::<hyper::Error>() {
            if h.is_canceled() || h.is_closed() || h.is_incomplete_message() {
                return true;
            }
        }
        cur = e.source();
    }
    false
}
