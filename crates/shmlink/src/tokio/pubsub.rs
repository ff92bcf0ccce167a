//! [`Publisher`] and [`Subscriber`] on tokio's reactor.

use std::fmt;
use std::future::{poll_fn, Future};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd};
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use ::tokio::io::unix::AsyncFd;
use ::tokio::time::Sleep;

use super::{poll_until_done, reactor_error, register, would_block, Fd};
use crate::error::{Error, ErrorKind, Result};
use crate::pubsub::{Loan, Policy, PubSubOptions, PublisherStats, Sample, SubscriberStats};
use crate::Transport;

/// How often an awaiting subscriber looks at the ring even though its fd stayed quiet:
/// as the blocking `recv` does, because another (hostile) subscriber can clear the bell
/// bit that makes the publisher ring ours (docs/design.md §7.5).
const SUBSCRIBER_RECHECK: Duration = Duration::from_millis(100);

/// An async publisher: [`crate::Publisher`] in non-blocking mode on tokio's reactor.
/// Only [`Policy::Block`] topics ever wait (for the slowest subscriber).
///
/// ```
/// # std::env::set_var("SHMLINK_DIR", std::env::temp_dir().join(format!("shmlink-doc-{}", std::process::id())));
/// # ::tokio::runtime::Builder::new_multi_thread().enable_all().build().unwrap().block_on(async {
/// use futures_util::StreamExt;
/// use shmlink::tokio::{Publisher, Subscriber};
/// use shmlink::PubSubOptions;
///
/// let mut publisher = Publisher::bind("shm:doc-async-topic", &PubSubOptions::default())?;
/// let mut sub = Subscriber::connect("shm:doc-async-topic", &PubSubOptions::default()).await?;
/// publisher.get_ref().wait_for_subscribers(1, std::time::Duration::from_secs(5))?;
/// for i in 0..3u8 {
///     publisher.publish(&[i]).await?;
/// }
/// publisher.close().await?;
/// let all: Vec<_> = (&mut sub).map(|m| m.unwrap()).collect().await;
/// assert_eq!(all, vec![vec![0], vec![1], vec![2]]);
/// # Ok::<(), shmlink::Error>(())
/// # }).unwrap();
/// ```
///
/// `Send`, not `Sync`.
pub struct Publisher {
    // Declared before `inner`: the registration goes before the fd it names.
    fd: AsyncFd<Fd>,
    inner: crate::Publisher,
}

impl Publisher {
    /// Binds a topic like [`crate::Publisher::bind`].
    pub fn bind(addr: &str, opts: &PubSubOptions) -> Result<Publisher> {
        Publisher::from_std(crate::Publisher::bind(addr, opts)?)
    }

    /// Wraps a publisher (switched to non-blocking mode).
    pub fn from_std(mut inner: crate::Publisher) -> Result<Publisher> {
        inner.set_nonblocking(true);
        let fd = register(inner.as_raw_fd())?;
        Ok(Publisher { fd, inner })
    }

    /// Publishes one message to every subscriber; under [`Policy::Block`] awaits the
    /// slowest subscriber (a subscriber that stalls past the stall timeout is detached,
    /// as with the blocking publisher).
    ///
    /// Cancel safe: a dropped future published nothing.
    pub async fn publish(&mut self, msg: &[u8]) -> Result<()> {
        poll_fn(|cx| self.poll_publish(cx, msg)).await
    }

    /// Polls to publish `msg` (what [`publish`](Self::publish) awaits).
    pub fn poll_publish(&mut self, cx: &mut Context<'_>, msg: &[u8]) -> Poll<Result<()>> {
        self.poll_op(cx, |p| p.publish(msg))
    }

    /// Lends the next slot to fill in place (zero-copy), awaiting room like
    /// [`publish`](Self::publish); [`Loan::publish`] publishes it, dropping the loan
    /// publishes nothing (see [`crate::Publisher::loan`]). A `Loan` is not `Send`: fill
    /// and publish it before the next `.await`.
    ///
    /// Cancel safe: a dropped future loaned nothing.
    pub async fn loan(&mut self, len: usize) -> Result<Loan<'_>> {
        // The wait: a loan that succeeds is dropped at once, unpublished; its slot stays
        // stamped for us, and the loan below takes it again without waiting (see
        // `crate::Publisher::loan`). Both happen in the same poll.
        poll_fn(|cx| self.poll_op(cx, |p| p.loan(len).map(drop))).await?;
        self.inner.loan(len)
    }

    fn poll_op(
        &mut self,
        cx: &mut Context<'_>,
        mut op: impl FnMut(&mut crate::Publisher) -> Result<()>,
    ) -> Poll<Result<()>> {
        poll_until_done(&self.fd, cx, || op(&mut self.inner))
    }

    /// Closes the topic like [`crate::Publisher::close`] (on the blocking pool: it
    /// waits for remote subscribers within the stall timeout).
    ///
    /// Not cancel safe: a dropped future lets the close finish on the blocking pool.
    pub async fn close(self) -> Result<()> {
        let Publisher { fd, inner } = self;
        drop(fd);
        ::tokio::task::spawn_blocking(move || inner.close())
            .await
            .map_err(|e| Error::new(ErrorKind::Other, format!("close task failed: {e}")))?
    }

    /// The blocking publisher inside (subscribers, stats, `wait_for_subscribers`, …).
    pub fn get_ref(&self) -> &crate::Publisher {
        &self.inner
    }

    /// Publisher counters.
    pub fn stats(&self) -> PublisherStats {
        self.inner.stats()
    }

    /// The topic's policy.
    pub fn policy(&self) -> Policy {
        self.inner.policy()
    }

    /// Gives the blocking publisher back (in blocking mode).
    pub fn into_std(self) -> crate::Publisher {
        let Publisher { fd, mut inner } = self;
        drop(fd);
        inner.set_nonblocking(false);
        inner
    }
}

impl AsFd for Publisher {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.inner.as_fd()
    }
}

impl fmt::Debug for Publisher {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("shmlink::tokio::Publisher")
            .field("addr", &self.inner.local_addr())
            .finish()
    }
}

/// An async subscriber: [`crate::Subscriber`] in non-blocking mode on tokio's reactor.
///
/// It is a [`Stream`](futures_core::Stream) of messages (also through `&mut`), with the
/// items of [`crate::Subscriber::iter`]: `Ok(msg)` per message, `Err` of kind
/// [`ErrorKind::Lagged`] (the count lost in [`Error::missed`]) after which it goes on,
/// the end at [`ErrorKind::EndOfStream`], and any other error once, then the end.
///
/// An awaiting subscriber also looks at the ring every 100 ms (as the blocking one does:
/// another subscriber of the topic could silence its doorbell).
///
/// `Send`, not `Sync`.
pub struct Subscriber {
    // Declared before `inner`: the registration goes before the fd it names.
    fd: AsyncFd<Fd>,
    inner: crate::Subscriber,
    recheck: Option<Pin<Box<Sleep>>>,
    done: bool,
}

impl Subscriber {
    /// Subscribes like [`crate::Subscriber::connect`]; the handshake runs on tokio's
    /// blocking pool.
    ///
    /// Not cancel safe: a dropped future lets the handshake finish, then unsubscribes.
    ///
    /// The future owns copies of `addr` and `opts`: it is `'static`.
    pub fn connect(
        addr: &str,
        opts: &PubSubOptions,
    ) -> impl std::future::Future<Output = Result<Subscriber>> + Send + 'static {
        let (addr, opts) = (addr.to_owned(), opts.clone());
        async move {
            let sub =
                ::tokio::task::spawn_blocking(move || crate::Subscriber::connect(&addr, &opts))
                    .await
                    .map_err(|e| {
                        Error::new(ErrorKind::Other, format!("subscribe task failed: {e}"))
                    })??;
            Subscriber::from_std(sub)
        }
    }

    /// Wraps a subscriber (switched to non-blocking mode).
    pub fn from_std(mut inner: crate::Subscriber) -> Result<Subscriber> {
        inner.set_nonblocking(true);
        let fd = register(inner.as_raw_fd())?;
        Ok(Subscriber {
            fd,
            inner,
            recheck: None,
            done: false,
        })
    }

    fn poll_op<T>(
        &mut self,
        cx: &mut Context<'_>,
        mut op: impl FnMut(&mut crate::Subscriber) -> Result<T>,
    ) -> Poll<Result<T>> {
        loop {
            let r = op(&mut self.inner);
            if !would_block(&r) {
                self.recheck = None;
                return Poll::Ready(r);
            }
            if let Err(e) = std::task::ready!(self.poll_retry(cx)) {
                return Poll::Ready(Err(e));
            }
        }
    }

    /// After an attempt that would block: `Ready(Ok)` when it is time to try again (the
    /// fd reported progress, or the periodic recheck is due), `Pending` until then.
    fn poll_retry(&mut self, cx: &mut Context<'_>) -> Poll<Result<()>> {
        match self.fd.poll_read_ready(cx) {
            Poll::Ready(Err(e)) => return Poll::Ready(Err(reactor_error(e))),
            Poll::Ready(Ok(mut guard)) => {
                guard.clear_ready();
                return Poll::Ready(Ok(()));
            }
            Poll::Pending => {}
        }
        let timer = self
            .recheck
            .get_or_insert_with(|| Box::pin(::tokio::time::sleep(SUBSCRIBER_RECHECK)));
        std::task::ready!(timer.as_mut().poll(cx));
        self.recheck = None;
        Poll::Ready(Ok(()))
    }

    /// Receives the next message and lends it (zero-copy over `shm:`: in place in the
    /// shared ring, consumed when the [`Sample`] drops; see
    /// [`crate::Subscriber::recv_ref`]). A `Sample` is not `Send`: drop it before the
    /// next `.await`.
    ///
    /// Cancel safe: a dropped future took nothing.
    pub async fn recv_ref(&mut self) -> Result<Sample<'_>> {
        loop {
            {
                let inner: *mut crate::Subscriber = &mut self.inner;
                // SAFETY: `inner` is the field of `self`, which we borrow mutably for the
                // returned lifetime; the reborrow is the only live reference to it. The
                // pointer only works around the borrow checker's rule that a borrow
                // returned on one branch lasts on the others too (the `WouldBlock`
                // branch holds nothing): the loop touches `inner` again only after
                // that branch, and `recheck` below is a different field.
                match unsafe { &mut *inner }.recv_ref() {
                    Err(e) if e.kind() == ErrorKind::WouldBlock => {}
                    r => {
                        self.recheck = None;
                        return r;
                    }
                }
            }
            poll_fn(|cx| self.poll_retry(cx)).await?;
        }
    }

    /// Receives the next message into `buf`; returns its length (see
    /// [`crate::Subscriber::recv`]).
    ///
    /// Cancel safe: a dropped future took nothing.
    pub async fn recv(&mut self, buf: &mut [u8]) -> Result<usize> {
        poll_fn(|cx| self.poll_op(cx, |s| s.recv(buf))).await
    }

    /// Receives the next message into a new vector.
    ///
    /// Cancel safe: a dropped future took nothing.
    pub async fn recv_vec(&mut self) -> Result<Vec<u8>> {
        poll_fn(|cx| self.poll_op(cx, |s| s.recv_vec())).await
    }

    /// Subscriber counters.
    pub fn stats(&self) -> SubscriberStats {
        self.inner.stats()
    }

    /// What the messages travel over (`shm:` or the network).
    pub fn transport(&self) -> Transport {
        self.inner.transport()
    }

    /// The blocking subscriber inside.
    pub fn get_ref(&self) -> &crate::Subscriber {
        &self.inner
    }

    /// Gives the blocking subscriber back (in blocking mode).
    pub fn into_std(self) -> crate::Subscriber {
        let Subscriber { fd, mut inner, .. } = self;
        drop(fd);
        inner.set_nonblocking(false);
        inner
    }
}

impl futures_core::Stream for Subscriber {
    type Item = Result<Vec<u8>>;

    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Vec<u8>>>> {
        let me = self.get_mut();
        if me.done {
            return Poll::Ready(None);
        }
        match me.poll_op(cx, |s| s.recv_vec()) {
            Poll::Pending => Poll::Pending,
            Poll::Ready(Ok(m)) => Poll::Ready(Some(Ok(m))),
            Poll::Ready(Err(e)) if e.kind() == ErrorKind::Lagged => Poll::Ready(Some(Err(e))),
            Poll::Ready(Err(e)) => {
                me.done = true;
                if e.kind() == ErrorKind::EndOfStream {
                    Poll::Ready(None)
                } else {
                    Poll::Ready(Some(Err(e)))
                }
            }
        }
    }
}

impl AsFd for Subscriber {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.inner.as_fd()
    }
}

impl fmt::Debug for Subscriber {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("shmlink::tokio::Subscriber")
            .field("addr", &self.inner.addr())
            .finish()
    }
}
