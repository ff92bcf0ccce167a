//! `libshmlink_preload.so`: transparent mode. Loaded with `LD_PRELOAD` (or by
//! `shmlink run -- CMD`), it takes over the socket calls of an unmodified program and
//! moves each TCP connection whose two ends are preloaded processes on one kernel onto a
//! shmlink shared-memory connection; everything else goes to the kernel untouched.
//!
//! How (docs/transparent.md says it for users):
//! - A listening TCP socket of a preloaded process is registered as a shmlink listener in
//!   the rendezvous directory, named after its network namespace, address and port
//!   (`peer`). A helper thread answers claims on it.
//! - A preloaded client connects over TCP as usual. If the destination is local and a
//!   registration exists, it connects to that listener and claims the TCP connection by
//!   its four addresses; the server side answers yes only if its program has not accepted
//!   that TCP connection yet (else it already treats it as plain TCP). Nothing is ever
//!   written into the TCP stream, so a plain peer on either side sees plain TCP.
//! - Once both sides agree, the application's fd number is re-pointed (`dup3`) at the
//!   shmlink connection's control socket, which the kernel makes readable on doorbells and
//!   on the peer's death, so `epoll`, `poll` and `select` keep working on it; the real TCP
//!   socket stays open underneath (for `getsockname`, `getpeername`, socket options).
//! - Calls on such an fd go through `stream` (the blocking calls) to `sock::Sock`: bytes
//!   travel as messages in the rings, a partly read message waits in a buffer, a
//!   zero-length message is the FIN of `shutdown(SHUT_WR)`.
//!
//! Calls this library makes itself reach the C library directly (`real`, guarded per
//! thread by `Guard`), so it never recurses into its own hooks.

mod exec;
mod guard;
mod hooks;
mod log;
mod peer;
mod real;
mod refusals;
mod settings;
mod sock;
mod state;
mod stats;
mod stream;
mod switch;
mod table;
mod tcp;
mod wait;
mod wake;

// The names every module uses, at the root for short paths (each lives in its module).
pub(crate) use guard::{inside, Guard};
pub(crate) use real::{errno, fail, set_errno};
pub(crate) use settings::{config, debug};
