//! Out-of-band peer detection: listeners register, clients claim their TCP connection.
//!
//! A preloaded process that calls `listen` on a TCP socket binds a shmlink listener at
//! `<rendezvous dir>/tcp-<netns>-<address>-<port>.sock` and serves it from a helper
//! thread. A preloaded client whose TCP `connect` reached a local address looks for such
//! a registration (exact address, then the wildcard ones) and, if there is one, connects
//! to it (the listener's access rules apply: a client it refuses stays on TCP) and sends
//! a claim naming the TCP connection's four addresses. The helper answers yes unless the
//! server program already accepted that TCP connection (then it is plain TCP there), and
//! keeps the shmlink connection until `accept` returns the TCP connection it names. The
//! answer and the accept take one lock, so both ends always agree; no byte ever goes
//! into the TCP stream. Between network namespaces (containers sharing the directory) the
//! client claims at every registration of the port in other namespaces, and only the one
//! whose namespace holds a TCP connection with those four addresses says yes
//! (`client::claim_foreign`; docs/containers.md, "Transparent mode between containers").
//!
//! - `addr`: TCP endpoints (decoding socket addresses, `getsockname`/`getpeername`,
//!   whether an fd is a TCP socket, who owns a TCP socket in `/proc/net/tcp`);
//! - `wire`: the claim protocol's messages and timeouts, and the names, paths and
//!   shmlink options of registrations;
//! - `client`: the connecting side (find the registration, open, claim);
//! - `registration`: the listening side (register, the helper thread answering claims,
//!   `accept`'s take, and the worker side of a shared listening socket).

mod addr;
mod client;
mod registration;
mod wire;

pub(crate) use addr::{dest_of, is_tcp, sock_endpoint};
pub(crate) use client::{claim, open};
pub(crate) use registration::{register, Registration};
