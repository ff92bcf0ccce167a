//! TLS 1.3 for the stream layer (rustls with the *ring* provider): [`TlsOptions`] turned
//! into client and listener configurations, and [`TlsSession`], a rustls connection driven
//! over a socket. The `tls:` transport's entry (`transport::tls`) builds the
//! configurations; the stream layer's links hold the sessions.
//!
//! Without the `tls` cargo feature, `absent.rs` stands in with the same names: building a
//! configuration fails with an error that names the feature, and a session cannot exist,
//! so every `tls:` address and every `auto:` end with TLS settings is refused, never
//! served in the clear.
//!
//! [`TlsOptions`]: crate::TlsOptions

#[cfg(feature = "tls")]
mod config;
#[cfg(feature = "tls")]
mod session;

#[cfg(feature = "tls")]
pub(crate) use config::{ClientTls, ServerTls};
#[cfg(feature = "tls")]
pub(crate) use session::TlsSession;

#[cfg(not(feature = "tls"))]
mod absent;
#[cfg(not(feature = "tls"))]
pub(crate) use absent::{ClientTls, ServerTls, TlsSession};
