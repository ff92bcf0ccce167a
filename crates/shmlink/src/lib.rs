//! shmlink: fast, reliable messaging between processes that share a Linux kernel.
//!
//! A [`Connection`] carries messages — reliable, in order, with boundaries and flow
//! control — over one of several transports named by the address prefix:
//!
//! | address | transport |
//! |---|---|
//! | `shm:NAME`, `shm:/path.sock`, `shm:@name` | shared-memory rings (per connection one sealed memfd per side, read-only for the other) |
//! | `ux:NAME` (abstract), `ux:/path` | Unix `SOCK_SEQPACKET` |
//! | `tcp:HOST:PORT` | TCP, length-prefixed frames, `TCP_NODELAY` |
//! | `tls:HOST:PORT` | `tcp:` inside TLS 1.3 (rustls); certificates in [`TlsOptions`] |
//! | `auto:HOST:PORT` | `tcp:` (`tls:` when TLS options are set) that both ends upgrade to `shm:` when they share a kernel |
//! | `vm:NAME`, `vm:NAME@REGION` | rings in a memory region shared between virtual machines and their host (QEMU `ivshmem`; docs/vms.md) |
//!
//! Within one process a `shm:` connection skips the kernel: rings between the two ends'
//! threads, no memfd and no socket ([`Options::in_process`], on by default).
//!
//! [`Publisher`] and [`Subscriber`] add publish/subscribe over shared memory: one write
//! per message whatever the number of subscribers, a lossless ([`Policy::Block`]) or
//! lossy ([`Policy::Overwrite`]) policy, late joiners with history, options in
//! [`PubSubOptions`] (an example is on [`Publisher`]). A topic bound at `tcp:`, `tls:`
//! or `auto:` also serves remote subscribers, from the same ring.
//!
//! On `shm:` sending and receiving between awake peers touches only shared memory; system
//! calls happen only to sleep and to wake a sleeper. Every connection exposes one fd for
//! event loops, and a peer's death is reported as [`ErrorKind::ConnectionReset`].
//!
//! [`inspect`](inspect()) (module [`mod@inspect`]: its reports, and [`inspect::inspect_vm`]
//! for `vm:` regions) lists the listeners with a socket in a rendezvous directory and the
//! connections each one holds, with peers and counters (what `shmlink ls` shows); a
//! listener answers while its process accepts or polls it.
//!
//! ```
//! # std::env::set_var("SHMLINK_DIR", std::env::temp_dir().join(format!("shmlink-doc-{}", std::process::id())));
//! use shmlink::{Connection, ErrorKind, Listener, Options};
//!
//! let mut listener = Listener::bind("shm:hello", &Options::default())?;
//! let server = std::thread::spawn(move || -> shmlink::Result<()> {
//!     let mut conn = listener.accept()?;
//!     loop {
//!         match conn.recv_vec() {
//!             Ok(msg) => conn.send(&msg)?, // echo
//!             Err(e) if e.kind() == ErrorKind::EndOfStream => return Ok(()),
//!             Err(e) => return Err(e),
//!         }
//!     }
//! });
//!
//! let mut conn = Connection::connect("shm:hello", &Options::default())?;
//! conn.send(b"hello")?;
//! let mut buf = [0u8; 64];
//! let n = conn.recv(&mut buf)?;
//! assert_eq!(&buf[..n], b"hello");
//! conn.close()?;
//! server.join().unwrap()?;
//! # Ok::<(), shmlink::Error>(())
//! ```
//!
//! # Threads
//!
//! Every public type says whether it is `Send` and `Sync`, and a compile-time check in
//! this crate keeps it so. Connections, listeners, publishers and subscribers are `Send`
//! (move them to the thread or task that serves them) but not `Sync`: each call takes
//! `&mut self`. To send from one thread while another receives, [`Connection::split`]
//! gives a [`SendHalf`] and a [`RecvHalf`]. [`Subscriber::iter`] (or `for msg in &mut sub`)
//! iterates over a subscriber's messages.
//!
//! # Cargo features
//!
//! | feature | default | what it adds |
//! |---|---|---|
//! | `tls` | on | `tls:` addresses and TLS on `auto:` ([`TlsOptions`]), with rustls and its *ring* provider. A build without it (`default-features = false`) compiles no TLS, and every request for TLS fails with [`ErrorKind::InvalidInput`] naming the feature, so nothing meant for TLS is ever sent in the clear. |
//! | `tracing` | off | events through the [`tracing`](https://docs.rs/tracing) crate (target `shmlink`): a listener's accepts and refusals with the reason (a refused client is otherwise invisible on the listener's side), peer death, pub/sub subscribers joining, leaving, being detached, and lag. Off, the calls compile to nothing. |
//! | `tokio` | off | [`shmlink::tokio`](crate::tokio) (built only with the feature): async listeners, connections (and owned halves), publishers and subscribers on tokio's `AsyncFd` without a thread per connection, streams of connections and messages, and a byte-stream adapter (`AsyncRead + AsyncWrite`) for hyper and tonic. See `docs/async.md`. |
//! | `testing` | off | `shmlink::testing`: the hooks into the internals (handshake packets, raw segment layouts, fuzz entry points) for this workspace's test kit (`shmlink-testkit`), tests and fuzz targets. Not part of the API: it changes without notice. |
//!
//! # Platform
//!
//! Linux only (memfd seals, `SO_PEERCRED`, abstract Unix sockets, `eventfd`, `epoll`),
//! on 64-bit targets; other targets fail to compile with a message saying so.
#![deny(missing_docs)]

// Sizes announced by peers are u64 on the wire and in shared memory; the arithmetic that
// bounds them assumes they fit a usize.
#[cfg(not(target_pointer_width = "64"))]
compile_error!("shmlink supports 64-bit targets only (sizes from peers are checked as 64-bit)");

// memfd seals, SO_PEERCRED, abstract Unix sockets, eventfd and epoll: Linux only.
#[cfg(not(target_os = "linux"))]
compile_error!(
    "shmlink supports Linux only (it needs memfd seals, SO_PEERCRED, eventfd and epoll)"
);

mod addr;
mod conn;
mod error;
pub mod inspect;
mod notify;
pub mod options;
mod pubsub;
mod rendezvous;
pub mod shm;
mod split;
mod status;
pub mod terms;
mod threads;
// Async on tokio (cargo feature `tokio`).
#[cfg(feature = "tokio")]
pub mod tokio;
pub mod trace;
mod transport;
mod trust;
mod view;

// What the `vm:` doorbell server (`shmlink vm-host`, its own crate: crates/shmlink-vmhost)
// needs of the library's internals, and nothing more: the region file's trust policy
// (transport/vm/file.rs: who may own the file and connect, how a new one is created) and
// the doorbell protocol's constants the peers check (transport/vm/bell.rs). Not part of
// the API, hidden from the docs; the daemon itself is not in the library.
#[doc(hidden)]
pub mod vm_host_hooks {
    pub use crate::transport::vm::bell::{MAX_ID, MAX_VECTORS, PROTOCOL_VERSION};
    pub use crate::transport::vm::file::{
        create_or_open as create_or_open_region, Policy as RegionPolicy,
    };
    /// The smallest region `vm:` can use (a header and the smallest ring of every slot).
    pub const MIN_REGION: usize = crate::transport::vm::region::MIN_REGION;
}

// The lower layers, crates of their own, under the paths the modules have always used.
use shmlink_ring::spsc as ring;
use shmlink_ring::sync;
use shmlink_sys as sys;

// Test and benchmark helpers (cargo feature `testing`); not part of the API.
#[cfg(feature = "testing")]
#[doc(hidden)]
pub mod testing;

/// Pseudo-random numbers (xorshift64) for the unit tests' fuzzing loops: the same
/// sequence for the same seed.
#[cfg(test)]
pub(crate) fn xorshift(mut seed: u64) -> impl FnMut() -> u64 {
    move || {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        seed
    }
}

/// The README's examples, compiled and run as doctests.
#[cfg(doctest)]
#[doc = include_str!("../../../README.md")]
struct ReadmeDoctests;

pub use addr::{rendezvous_dir, Address, Transport, UnixName};
pub use conn::{Batch, Connection, Incoming, Listener, RecvBuf, SendBuf};
pub use error::{Error, ErrorKind, Result};
pub use inspect::inspect;
pub use options::{Options, Pem, TlsOptions, WaitPolicy};
pub use pubsub::{
    Loan, Messages, Policy, PubSubOptions, Publisher, PublisherStats, Sample, Subscriber,
    SubscriberStats, TopicSubscriber,
};
pub use split::{RecvHalf, ReuniteError, SendHalf};
pub use status::Counters;
pub use view::SharedBytes;
