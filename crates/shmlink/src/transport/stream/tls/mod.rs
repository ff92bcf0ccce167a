//! TLS 1.3 for the stream layer (rustls with the *ring* provider): [`TlsOptions`] turned
//! into client and listener configurations, and [`TlsSession`], a rustls connection driven
//! over a socket. The `tls:` transport's entry (`transport::tls`) builds the
//! configurations; the stream layer's links hold the sessions.
//!
//! [`TlsOptions`]: crate::TlsOptions

mod config;
mod session;

pub(crate) use config::{ClientTls, ServerTls};
pub(crate) use session::TlsSession;
