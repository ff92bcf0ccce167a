//! Compile-time checks of what the crate docs ("Threads") and each type's docs promise
//! about `Send` and `Sync`: a change that makes a public type lose (or gain) one of them
//! fails to build here instead of surprising a user.

use crate::inspect::*;
use crate::shm::*;
use crate::*;

/// Compiles only if `T: Send`.
#[allow(dead_code)] // used only inside `const _` items, which rustc 1.80 does not count
const fn send<T: Send + ?Sized>() {}
/// Compiles only if `T: Sync`.
#[allow(dead_code)] // as `send`
const fn sync<T: Sync + ?Sized>() {}

/// Compiles only if `$t` does NOT implement `$trait`: with the trait implemented, both
/// blanket impls apply and the call is ambiguous.
macro_rules! assert_not {
    ($t:ty: $trait:path) => {
        const _: fn() = || {
            trait Ambiguous<A> {
                fn check() {}
            }
            impl<T: ?Sized> Ambiguous<()> for T {}
            impl<T: ?Sized + $trait> Ambiguous<u8> for T {}
            <$t as Ambiguous<_>>::check();
        };
    };
}

// Moved to the thread that serves them; every call takes `&mut self`, so not `Sync`.
const _: () = {
    send::<Connection>();
    send::<Listener>();
    send::<Incoming<'static>>();
    send::<SendBuf<'static>>();
    send::<RecvBuf<'static>>();
    send::<Publisher>();
    send::<Subscriber>();
    send::<Messages<'static>>();
};
assert_not!(Connection: Sync);
assert_not!(Listener: Sync);
assert_not!(Publisher: Sync);
assert_not!(Subscriber: Sync);

// A connection's `shm:` controls borrow it mutably, like any of its calls; the wake
// group is shared between the connections (and threads) of one peer process.
const _: () = {
    send::<ShmControl<'static>>();
    send::<WakeGroup>();
    sync::<WakeGroup>();
};
assert_not!(ShmControl<'static>: Sync);

// Slots lent in place in shared memory: they stay on the thread that borrowed them.
assert_not!(Loan<'static>: Send);
assert_not!(Loan<'static>: Sync);
assert_not!(Sample<'static>: Send);
assert_not!(Sample<'static>: Sync);

// The halves of a split connection: one per thread, the connection behind a lock.
const _: () = {
    send::<SendHalf>();
    sync::<SendHalf>();
    send::<RecvHalf>();
    sync::<RecvHalf>();
    send::<ReuniteError>();
    sync::<ReuniteError>();
};

// Plain values: options, errors, addresses, counters, status reports, lent bytes.
const _: () = {
    send::<Options>();
    sync::<Options>();
    send::<TlsOptions>();
    sync::<TlsOptions>();
    send::<Pem>();
    sync::<Pem>();
    send::<WaitPolicy>();
    sync::<WaitPolicy>();
    send::<PubSubOptions>();
    sync::<PubSubOptions>();
    send::<Policy>();
    sync::<Policy>();
    send::<Error>();
    sync::<Error>();
    send::<ErrorKind>();
    sync::<ErrorKind>();
    send::<Transport>();
    sync::<Transport>();
    send::<Address>();
    sync::<Address>();
    send::<UnixName>();
    sync::<UnixName>();
    send::<Counters>();
    sync::<Counters>();
    send::<PublisherStats>();
    sync::<PublisherStats>();
    send::<SubscriberStats>();
    sync::<SubscriberStats>();
    send::<SubscriberInfo>();
    sync::<SubscriberInfo>();
    send::<SocketReport>();
    sync::<SocketReport>();
    send::<SocketState>();
    sync::<SocketState>();
    send::<TopicStatus>();
    sync::<TopicStatus>();
    send::<TopicSubscriber>();
    sync::<TopicSubscriber>();
    send::<ListenerStatus>();
    sync::<ListenerStatus>();
    send::<ConnectionStatus>();
    sync::<ConnectionStatus>();
    send::<ProcessCred>();
    sync::<ProcessCred>();
    send::<SharedBytes<'static>>();
    sync::<SharedBytes<'static>>();
};
