//! `shmlink_publisher` and `shmlink_subscriber`: publish/subscribe over shared memory
//! (and `tcp:`/`tls:`/`auto:` for remote subscribers), with the loan and the lent
//! sample kept by the handle between their two calls, as `socket.rs` does for
//! connections.

use std::ffi::{c_char, c_int, c_void, CString};
use std::os::fd::{AsRawFd, RawFd};
use std::ptr::{null, null_mut, NonNull};
use std::time::Duration;

use shmlink::{ErrorKind, Loan, Publisher, Sample, Subscriber};

use crate::args::{bytes, bytes_mut, obj, obj_ref, ssize, text};
use crate::error::{call, too_small, Fail, Res};
use crate::options::{pubsub_opts, ShmlinkPubsubOptions};

/// The publishing end of a topic (opaque): `shmlink_publisher_bind` …
/// `shmlink_publisher_close`. One thread at a time (any thread, but a loan must be
/// committed or cancelled by the thread that took it).
pub struct ShmlinkPublisher {
    /// From `Box::leak`; freed after `loan` (see `Drop`).
    publisher: Option<NonNull<Publisher>>,
    loan: Option<Loan<'static>>,
    fd: RawFd,
    addr: CString,
}

/// A subscription to a topic (opaque): `shmlink_subscribe` … `shmlink_sub_close`. One
/// thread at a time (any thread, but a lent sample must be released by the thread that
/// took it).
pub struct ShmlinkSubscriber {
    /// From `Box::leak`; freed after `sample` (see `Drop`).
    sub: Option<NonNull<Subscriber>>,
    sample: Option<Sample<'static>>,
    /// A message a too-small `shmlink_sub_recv` kept.
    stash: Option<Vec<u8>>,
    fd: RawFd,
}

/// Publisher counters (`shmlink_publisher_get_stats`).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct ShmlinkPublisherStats {
    /// Messages published.
    pub published: u64,
    /// Subscribers now.
    pub subscribers: u64,
    /// Subscribers admitted since the topic was bound.
    pub joined: u64,
    /// Subscribers that went away (unsubscribed, exited or died).
    pub left: u64,
    /// Subscribers the publisher detached (stalled, or broke the protocol).
    pub detached: u64,
}

/// Subscriber counters (`shmlink_sub_get_stats`).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct ShmlinkSubscriberStats {
    /// Messages received.
    pub received: u64,
    /// Messages lost to overwriting (overwrite policy), in total.
    pub missed: u64,
    /// Messages published and not read yet (0 over `tcp:`/`tls:`: not known).
    pub lag: u64,
    /// Position of the next message this subscriber reads (messages are numbered from 0).
    pub position: u64,
}

impl ShmlinkPublisher {
    fn publisher(&mut self) -> Res<&mut Publisher> {
        if self.loan.is_some() {
            return Err(Fail::inval(
                "a loan is open on this publisher: shmlink_loan_commit or shmlink_loan_cancel it first",
            ));
        }
        let mut p = self.publisher.expect("publisher taken only by close");
        // SAFETY: our own live allocation; no loan borrows it (checked above) and the
        // borrow is tied to `&mut self`.
        Ok(unsafe { p.as_mut() })
    }

    fn take(&mut self) -> Option<Box<Publisher>> {
        self.loan = None; // the loan borrows the publisher: it goes first
                          // SAFETY: our own allocation from Box::leak, nothing borrows it now, taken once.
        self.publisher
            .take()
            .map(|p| unsafe { Box::from_raw(p.as_ptr()) })
    }
}

impl Drop for ShmlinkPublisher {
    fn drop(&mut self) {
        drop(self.take());
    }
}

impl ShmlinkSubscriber {
    fn sub(&mut self) -> Res<&mut Subscriber> {
        if self.sample.is_some() {
            return Err(Fail::inval(
                "a sample is lent by this subscriber: shmlink_sub_release it first",
            ));
        }
        let mut s = self.sub.expect("subscriber taken only by close");
        // SAFETY: our own live allocation; no sample borrows it (checked above) and the
        // borrow is tied to `&mut self`.
        Ok(unsafe { s.as_mut() })
    }
}

impl Drop for ShmlinkSubscriber {
    fn drop(&mut self) {
        self.sample = None; // the sample borrows the subscriber: it goes first
        if let Some(s) = self.sub.take() {
            // SAFETY: our own allocation from Box::leak, nothing borrows it, freed once.
            drop(unsafe { Box::from_raw(s.as_ptr()) });
        }
    }
}

/// Creates a topic and binds it at `addr`: `shm:NAME` (a rendezvous socket, like
/// `shmlink_listen`), or `tcp:HOST:PORT`, `tls:HOST:PORT`, `auto:HOST:PORT` (remote
/// subscribers too, served from the same ring by a fan-out thread). `opts` NULL means the
/// defaults. Each message is written once whatever the number of subscribers.
///
/// Returns the publisher, or NULL with errno (`EINVAL`, `EADDRINUSE`, `EACCES`, `ENOENT`).
///
/// Thread safety: any thread.
///
/// # Safety
/// `addr` is NULL or a NUL-terminated string; `opts` NULL or live pub/sub options.
#[no_mangle]
pub unsafe extern "C" fn shmlink_publisher_bind(
    addr: *const c_char,
    opts: *const ShmlinkPubsubOptions,
) -> *mut ShmlinkPublisher {
    call(null_mut(), || {
        // SAFETY: forwarded to the caller.
        let addr = unsafe { text(addr, "address") }?;
        // SAFETY: forwarded to the caller.
        let opts = unsafe { pubsub_opts(opts) };
        let p = Publisher::bind(addr, &opts)?;
        Ok(Box::into_raw(Box::new(ShmlinkPublisher {
            fd: p.as_raw_fd(),
            addr: CString::new(p.local_addr()).unwrap_or_default(),
            publisher: Some(NonNull::from(Box::leak(Box::new(p)))),
            loan: None,
        })))
    })
}

/// Publishes the `len` bytes at `buf` to every subscriber. Block policy: waits while the
/// slowest subscriber holds the oldest slot (non-blocking: `EAGAIN`; the publisher's fd
/// is readable when trying again is worth it); a subscriber that stalls longer than the
/// stall timeout is detached. Overwrite policy: never waits.
///
/// Returns 0, or -1 with errno: `EMSGSIZE` (larger than the topic's maximum), `EAGAIN`,
/// `EINVAL` (NULL, or a loan open).
///
/// Thread safety: one thread at a time per publisher.
///
/// # Safety
/// `publisher` is NULL or live; `buf` NULL or `len` readable bytes.
#[no_mangle]
pub unsafe extern "C" fn shmlink_publish(
    publisher: *mut ShmlinkPublisher,
    buf: *const c_void,
    len: usize,
) -> c_int {
    call(-1, || {
        // SAFETY: forwarded to the caller.
        let p = unsafe { obj(publisher, "publisher") }?;
        // SAFETY: forwarded to the caller.
        let msg = unsafe { bytes(buf, len) }?;
        p.publisher()?.publish(msg)?;
        Ok(0)
    })
}

/// Zero-copy publishing, first half: lends the next slot to fill in place with up to
/// `len` bytes (at most the topic's maximum). Publish it with `shmlink_loan_commit`, drop
/// it with `shmlink_loan_cancel`. Waits like `shmlink_publish`.
///
/// Returns the pointer to `len` writable bytes (not NULL), or NULL with errno as for
/// `shmlink_publish`.
///
/// Thread safety: one thread at a time per publisher; commit or cancel on the thread
/// that took the loan.
///
/// # Safety
/// `publisher` is NULL or live.
#[no_mangle]
pub unsafe extern "C" fn shmlink_loan(publisher: *mut ShmlinkPublisher, len: usize) -> *mut c_void {
    call(null_mut(), || {
        // SAFETY: forwarded to the caller.
        let p = unsafe { obj(publisher, "publisher") }?;
        let pubr: *mut Publisher = p.publisher()?;
        // SAFETY: our own live allocation, no loan open (checked by `publisher()`); the
        // loan goes into `p.loan`, which every other access checks first, and `Drop`
        // drops it before the publisher.
        let pubr: &'static mut Publisher = unsafe { &mut *pubr };
        let mut loan = pubr.loan(len)?;
        let ptr = loan.as_mut_ptr();
        p.loan = Some(loan);
        Ok(ptr.cast())
    })
}

/// Zero-copy publishing, second half: publishes the first `len` bytes of the loan (`len`
/// at most what `shmlink_loan` asked for). 0, or -1 with `EINVAL` (no loan open, or
/// `len` too large: the loan stays open).
///
/// Thread safety: the thread that took the loan.
///
/// # Safety
/// `publisher` is NULL or live.
#[no_mangle]
pub unsafe extern "C" fn shmlink_loan_commit(
    publisher: *mut ShmlinkPublisher,
    len: usize,
) -> c_int {
    call(-1, || {
        // SAFETY: forwarded to the caller.
        let p = unsafe { obj(publisher, "publisher") }?;
        let Some(loan) = p.loan.take() else {
            return Err(Fail::inval("shmlink_loan_commit without shmlink_loan"));
        };
        if len > loan.len() {
            let n = loan.len();
            p.loan = Some(loan);
            return Err(Fail::inval(format!(
                "shmlink_loan_commit({len}) on a loan of {n} bytes"
            )));
        }
        loan.publish_len(len)?;
        Ok(0)
    })
}

/// Drops the loan: nothing is published (the slot is reused by the next publish).
/// 0, or -1 with `EINVAL` when no loan is open.
///
/// Thread safety: the thread that took the loan.
///
/// # Safety
/// `publisher` is NULL or live.
#[no_mangle]
pub unsafe extern "C" fn shmlink_loan_cancel(publisher: *mut ShmlinkPublisher) -> c_int {
    call(-1, || {
        // SAFETY: forwarded to the caller.
        let p = unsafe { obj(publisher, "publisher") }?;
        match p.loan.take() {
            Some(loan) => {
                drop(loan);
                Ok(0)
            }
            None => Err(Fail::inval("shmlink_loan_cancel without shmlink_loan")),
        }
    })
}

/// Waits until at least `n` subscribers are subscribed, or `timeout_ms` milliseconds
/// pass (`ETIMEDOUT`). 0, or -1 with errno.
///
/// Thread safety: one thread at a time per publisher.
///
/// # Safety
/// `publisher` is NULL or live.
#[no_mangle]
pub unsafe extern "C" fn shmlink_publisher_wait_subscribers(
    publisher: *mut ShmlinkPublisher,
    n: usize,
    timeout_ms: u64,
) -> c_int {
    call(-1, || {
        // SAFETY: forwarded to the caller.
        let p = unsafe { obj(publisher, "publisher") }?;
        p.publisher()?
            .wait_for_subscribers(n, Duration::from_millis(timeout_ms))?;
        Ok(0)
    })
}

/// Copies the publisher's counters into `*out`. 0, or -1 with `EINVAL`.
///
/// Thread safety: one thread at a time per publisher.
///
/// # Safety
/// `publisher` is NULL or live; `out` NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn shmlink_publisher_get_stats(
    publisher: *mut ShmlinkPublisher,
    out: *mut ShmlinkPublisherStats,
) -> c_int {
    call(-1, || {
        // SAFETY: forwarded to the caller.
        let p = unsafe { obj(publisher, "publisher") }?;
        // SAFETY: forwarded to the caller.
        let out = unsafe { obj(out, "stats") }?;
        let s = p.publisher()?.stats();
        *out = ShmlinkPublisherStats {
            published: s.published,
            subscribers: s.subscribers as u64,
            joined: s.joined,
            left: s.left,
            detached: s.detached,
        };
        Ok(0)
    })
}

/// The publisher's fd: readable when a publish that failed with `EAGAIN` may succeed.
/// -1 with `EINVAL` for NULL.
///
/// Thread safety: one thread at a time per publisher. The value stays the same for its
/// life: read it once and keep it.
///
/// # Safety
/// `publisher` is NULL or live.
#[no_mangle]
pub unsafe extern "C" fn shmlink_publisher_fd(publisher: *const ShmlinkPublisher) -> c_int {
    // SAFETY: forwarded to the caller.
    call(-1, || Ok(unsafe { obj_ref(publisher, "publisher") }?.fd))
}

/// Blocking (1, the default) or non-blocking (0) publishing. 0, or -1 with `EINVAL`.
///
/// Thread safety: one thread at a time per publisher.
///
/// # Safety
/// `publisher` is NULL or live.
#[no_mangle]
pub unsafe extern "C" fn shmlink_publisher_set_blocking(
    publisher: *mut ShmlinkPublisher,
    blocking: bool,
) -> c_int {
    call(-1, || {
        // SAFETY: forwarded to the caller.
        let p = unsafe { obj(publisher, "publisher") }?;
        p.publisher()?.set_nonblocking(!blocking);
        Ok(0)
    })
}

/// The bound address (with the port chosen for `tcp:HOST:0`), owned by the publisher.
/// NULL with `EINVAL` for NULL.
///
/// Thread safety: one thread at a time per publisher. The value stays the same for its
/// life: read it once and keep it.
///
/// # Safety
/// `publisher` is NULL or live.
#[no_mangle]
pub unsafe extern "C" fn shmlink_publisher_local_addr(
    publisher: *const ShmlinkPublisher,
) -> *const c_char {
    call(null(), || {
        // SAFETY: forwarded to the caller.
        Ok(unsafe { obj_ref(publisher, "publisher") }?.addr.as_ptr())
    })
}

/// Closes the topic gracefully and frees the publisher (NULL: nothing happens): every
/// subscriber receives what was published, then the end of the stream (`EPIPE`). An
/// open loan is dropped. 0, or -1 with errno (freed all the same).
///
/// Thread safety: no other thread may use the publisher during or after the call.
///
/// # Safety
/// `publisher` is NULL or live, not used again afterwards.
#[no_mangle]
pub unsafe extern "C" fn shmlink_publisher_close(publisher: *mut ShmlinkPublisher) -> c_int {
    if publisher.is_null() {
        return 0;
    }
    call(-1, || {
        // SAFETY: made by Box::into_raw in shmlink_publisher_bind, freed once (caller).
        let mut p = unsafe { Box::from_raw(publisher) };
        if let Some(inner) = p.take() {
            inner.close()?;
        }
        Ok(0)
    })
}

/// Subscribes to the topic a publisher bound at `addr` (`shm:`, `tcp:`, `tls:`,
/// `auto:`). `opts` NULL means the defaults. A new subscriber starts with the next
/// message published (or replays history, if both sides ask for it).
///
/// Returns the subscriber, or NULL with errno (`EINVAL`, `ECONNREFUSED`, `EACCES`,
/// `ETIMEDOUT`, `EPROTO`).
///
/// Thread safety: any thread.
///
/// # Safety
/// `addr` is NULL or a NUL-terminated string; `opts` NULL or live pub/sub options.
#[no_mangle]
pub unsafe extern "C" fn shmlink_subscribe(
    addr: *const c_char,
    opts: *const ShmlinkPubsubOptions,
) -> *mut ShmlinkSubscriber {
    call(null_mut(), || {
        // SAFETY: forwarded to the caller.
        let addr = unsafe { text(addr, "address") }?;
        // SAFETY: forwarded to the caller.
        let opts = unsafe { pubsub_opts(opts) };
        let s = Subscriber::connect(addr, &opts)?;
        Ok(Box::into_raw(Box::new(ShmlinkSubscriber {
            fd: s.as_raw_fd(),
            sub: Some(NonNull::from(Box::leak(Box::new(s)))),
            sample: None,
            stash: None,
        })))
    })
}

/// Receives the next message into `buf` (capacity `cap`) and returns its length. Waits
/// unless non-blocking (`EAGAIN`). A message longer than `cap` is kept (`EMSGSIZE`;
/// `shmlink_sub_pending_size` tells its length) for the next call with a large enough
/// buffer.
///
/// Returns the length, or -1 with errno: `EAGAIN`, `EMSGSIZE`, `EPIPE` (the publisher
/// closed and every message was received), `ECONNRESET` (the publisher died),
/// `EOVERFLOW` (overwrite policy: messages were lost; `shmlink_last_missed()` says how
/// many; the next call receives again), `ECONNABORTED` (block policy: the publisher
/// detached this slow subscriber), `EINVAL`.
///
/// Thread safety: one thread at a time per subscriber.
///
/// # Safety
/// `sub` is NULL or live; `buf` NULL or `cap` writable bytes.
#[no_mangle]
pub unsafe extern "C" fn shmlink_sub_recv(
    sub: *mut ShmlinkSubscriber,
    buf: *mut c_void,
    cap: usize,
) -> libc::ssize_t {
    call(-1, || {
        // SAFETY: forwarded to the caller.
        let s = unsafe { obj(sub, "subscriber") }?;
        // SAFETY: forwarded to the caller.
        let dst = unsafe { bytes_mut(buf, cap) }?;
        s.sub()?; // no sample lent
        if let Some(msg) = &s.stash {
            if msg.len() > cap {
                return Err(too_small(msg.len(), cap));
            }
            let n = msg.len();
            dst[..n].copy_from_slice(msg);
            s.stash = None;
            return Ok(ssize(n));
        }
        match s.sub()?.recv(dst) {
            Ok(n) => Ok(ssize(n)),
            Err(e) if e.kind() == ErrorKind::MessageTooLarge => {
                let msg = s.sub()?.recv_vec()?;
                let n = msg.len();
                s.stash = Some(msg);
                Err(too_small(n, cap))
            }
            Err(e) => Err(e.into()),
        }
    })
}

/// The length of the message a too-small `shmlink_sub_recv` kept, or 0 when none is
/// kept. -1 with `EINVAL` for NULL.
///
/// Thread safety: one thread at a time per subscriber.
///
/// # Safety
/// `sub` is NULL or live.
#[no_mangle]
pub unsafe extern "C" fn shmlink_sub_pending_size(sub: *mut ShmlinkSubscriber) -> libc::ssize_t {
    call(-1, || {
        // SAFETY: forwarded to the caller.
        let s = unsafe { obj(sub, "subscriber") }?;
        Ok(ssize(s.stash.as_ref().map_or(0, Vec::len)))
    })
}

/// Zero-copy receive: waits for the next message and lends it in place (`*data`,
/// `*len`) until `shmlink_sub_release`. Block policy: the publisher does not reuse the
/// slot before the release (unless it detaches this subscriber). Overwrite policy: it
/// may overwrite it at any time, even while you read; call `shmlink_sub_intact` after
/// reading and discard what you read when it returns 0.
///
/// Returns 0, or -1 with errno as for `shmlink_sub_recv` (a message kept by a too-small
/// `shmlink_sub_recv` must be received with `shmlink_sub_recv` first: `EINVAL`).
///
/// Thread safety: one thread at a time per subscriber; release on the same thread.
///
/// # Safety
/// `sub` is NULL or live; `data` and `len` NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn shmlink_sub_recv_ref(
    sub: *mut ShmlinkSubscriber,
    data: *mut *const c_void,
    len: *mut usize,
) -> c_int {
    call(-1, || {
        // SAFETY: forwarded to the caller.
        let s = unsafe { obj(sub, "subscriber") }?;
        if data.is_null() || len.is_null() {
            return Err(Fail::inval("shmlink_sub_recv_ref: data or len is NULL"));
        }
        if s.stash.is_some() {
            return Err(Fail::inval(
                "a message kept by a too-small shmlink_sub_recv waits: receive it with shmlink_sub_recv",
            ));
        }
        let subr: *mut Subscriber = s.sub()?;
        // SAFETY: our own live allocation, no sample lent (checked by `sub()`); the sample
        // goes into `s.sample`, which every other access checks first, and `Drop` drops
        // it before the subscriber.
        let subr: &'static mut Subscriber = unsafe { &mut *subr };
        let sample = subr.recv_ref()?;
        let (ptr, n) = {
            // SAFETY: the slice is made only to read its address and length; Rust never
            // reads through it. C reads the bytes under the contract documented above.
            let bytes = unsafe { sample.as_slice() };
            (bytes.as_ptr(), bytes.len())
        };
        s.sample = Some(sample);
        // SAFETY: both non-NULL (checked above) and writable as the caller promises.
        unsafe {
            *data = ptr.cast();
            *len = n;
        }
        Ok(0)
    })
}

/// Whether the publisher has left the lent sample alone so far: 1 yes, 0 it overwrote it
/// (what was read may be torn: discard it; it counts as lost), -1 with `EINVAL` when no
/// sample is lent. Always 1 over the network and under the block policy unless detached.
///
/// Thread safety: the thread that took the sample.
///
/// # Safety
/// `sub` is NULL or live.
#[no_mangle]
pub unsafe extern "C" fn shmlink_sub_intact(sub: *mut ShmlinkSubscriber) -> c_int {
    call(-1, || {
        // SAFETY: forwarded to the caller.
        let s = unsafe { obj(sub, "subscriber") }?;
        match &s.sample {
            Some(sample) => Ok(c_int::from(sample.intact())),
            None => Err(Fail::inval(
                "shmlink_sub_intact without shmlink_sub_recv_ref",
            )),
        }
    })
}

/// Releases the sample `shmlink_sub_recv_ref` lent; the pointer is invalid afterwards.
/// 0, or -1 with `EINVAL` when none is lent.
///
/// Thread safety: the thread that took the sample.
///
/// # Safety
/// `sub` is NULL or live.
#[no_mangle]
pub unsafe extern "C" fn shmlink_sub_release(sub: *mut ShmlinkSubscriber) -> c_int {
    call(-1, || {
        // SAFETY: forwarded to the caller.
        let s = unsafe { obj(sub, "subscriber") }?;
        match s.sample.take() {
            Some(sample) => {
                drop(sample);
                Ok(0)
            }
            None => Err(Fail::inval(
                "shmlink_sub_release without shmlink_sub_recv_ref",
            )),
        }
    })
}

/// The subscriber's fd: readable when a message may be received or the publisher is
/// gone. -1 with `EINVAL` for NULL.
///
/// Thread safety: one thread at a time per subscriber. The value stays the same for its
/// life: read it once and keep it.
///
/// # Safety
/// `sub` is NULL or live.
#[no_mangle]
pub unsafe extern "C" fn shmlink_sub_fd(sub: *const ShmlinkSubscriber) -> c_int {
    // SAFETY: forwarded to the caller.
    call(-1, || Ok(unsafe { obj_ref(sub, "subscriber") }?.fd))
}

/// Blocking (1, the default) or non-blocking (0) receiving. 0, or -1 with `EINVAL`.
///
/// Thread safety: one thread at a time per subscriber.
///
/// # Safety
/// `sub` is NULL or live.
#[no_mangle]
pub unsafe extern "C" fn shmlink_sub_set_blocking(
    sub: *mut ShmlinkSubscriber,
    blocking: bool,
) -> c_int {
    call(-1, || {
        // SAFETY: forwarded to the caller.
        let s = unsafe { obj(sub, "subscriber") }?;
        s.sub()?.set_nonblocking(!blocking);
        Ok(0)
    })
}

/// Copies the subscriber's counters into `*out`. 0, or -1 with `EINVAL`.
///
/// Thread safety: one thread at a time per subscriber.
///
/// # Safety
/// `sub` is NULL or live; `out` NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn shmlink_sub_get_stats(
    sub: *mut ShmlinkSubscriber,
    out: *mut ShmlinkSubscriberStats,
) -> c_int {
    call(-1, || {
        // SAFETY: forwarded to the caller.
        let s = unsafe { obj(sub, "subscriber") }?;
        // SAFETY: forwarded to the caller.
        let out = unsafe { obj(out, "stats") }?;
        let sub = s.sub()?;
        let st = sub.stats();
        *out = ShmlinkSubscriberStats {
            received: st.received,
            missed: st.missed,
            lag: st.lag,
            position: sub.position(),
        };
        Ok(0)
    })
}

/// Unsubscribes and frees the subscriber (NULL: nothing happens); a lent sample is
/// released. Always 0.
///
/// Thread safety: no other thread may use the subscriber during or after the call.
///
/// # Safety
/// `sub` is NULL or live, not used again afterwards.
#[no_mangle]
pub unsafe extern "C" fn shmlink_sub_close(sub: *mut ShmlinkSubscriber) -> c_int {
    if sub.is_null() {
        return 0;
    }
    call(-1, || {
        // SAFETY: made by Box::into_raw in shmlink_subscribe, freed once (the caller).
        drop(unsafe { Box::from_raw(sub) });
        Ok(0)
    })
}
