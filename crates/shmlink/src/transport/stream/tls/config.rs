//! [`TlsOptions`] turned into rustls configurations: certificates and keys read from files
//! or PEM text, the trusted CAs, and the check of the listener's certificate with or
//! without its name. Every error names the option at fault.

use std::io;
use std::sync::{Arc, OnceLock};

use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::client::{Resumption, WebPkiServerVerifier};
use rustls::crypto::CryptoProvider;
use rustls::server::WebPkiClientVerifier;
use rustls::{
    CertificateError, ClientConfig, ClientConnection, DigitallySignedStruct, RootCertStore,
    ServerConfig, ServerConnection, SignatureScheme,
};
use rustls_pki_types::pem::{self, PemObject};
use rustls_pki_types::{CertificateDer, PrivateKeyDer, ServerName, UnixTime};

use super::session::TlsSession;
use crate::error::{Error, ErrorKind, Result};
use crate::options::{Pem, TlsOptions};

/// The only protocol version spoken.
static VERSIONS: &[&rustls::SupportedProtocolVersion] = &[&rustls::version::TLS13];

/// The crypto provider: *ring*, named explicitly so that another provider compiled into
/// the same program cannot make the choice ambiguous.
fn provider() -> Arc<CryptoProvider> {
    static PROVIDER: OnceLock<Arc<CryptoProvider>> = OnceLock::new();
    PROVIDER
        .get_or_init(|| Arc::new(rustls::crypto::ring::default_provider()))
        .clone()
}

fn invalid(msg: String) -> Error {
    Error::new(ErrorKind::InvalidInput, msg)
}

/// The bytes of a PEM source.
fn read(option: &str, pem: &Pem) -> Result<Vec<u8>> {
    match pem {
        Pem::File(path) => std::fs::read(path).map_err(|e| {
            invalid(format!(
                "option {option}: cannot read {}: {e}",
                path.display()
            ))
        }),
        Pem::Text(text) => Ok(text.as_bytes().to_vec()),
    }
}

/// Every certificate in a PEM source (at least one).
fn certs(option: &str, pem: &Pem) -> Result<Vec<CertificateDer<'static>>> {
    let bytes = read(option, pem)?;
    let certs = CertificateDer::pem_slice_iter(&bytes)
        .collect::<std::result::Result<Vec<_>, _>>()
        .map_err(|e| invalid(format!("option {option}: {pem}: {e}")))?;
    if certs.is_empty() {
        return Err(invalid(format!(
            "option {option}: no CERTIFICATE block in {pem}"
        )));
    }
    Ok(certs)
}

/// The private key in a PEM source.
fn key(pem: &Pem) -> Result<PrivateKeyDer<'static>> {
    let bytes = read("tls.key", pem)?;
    PrivateKeyDer::from_pem_slice(&bytes).map_err(|e| match e {
        pem::Error::NoItemsFound => {
            invalid(format!("option tls.key: no PRIVATE KEY block in {pem}"))
        }
        e => invalid(format!("option tls.key: {pem}: {e}")),
    })
}

/// The CAs in a PEM source, as a trust store.
fn roots(pem: &Pem) -> Result<Arc<RootCertStore>> {
    let mut store = RootCertStore::empty();
    for cert in certs("tls.ca", pem)? {
        store
            .add(cert)
            .map_err(|e| invalid(format!("option tls.ca: {pem}: {e}")))?;
    }
    Ok(Arc::new(store))
}

/// What a `tls:` client needs for each connection: its configuration and the name the
/// listener's certificate must be valid for.
pub(crate) struct ClientTls {
    config: Arc<ClientConfig>,
    name: ServerName<'static>,
}

impl ClientTls {
    /// The client side of `tls`, connecting to `host` (the address's host, which
    /// [`TlsOptions::server_name`] overrides).
    pub(crate) fn new(tls: &TlsOptions, host: &str) -> Result<ClientTls> {
        let name = match &tls.server_name {
            Some(name) => ServerName::try_from(name.clone()).map_err(|_| {
                invalid(format!(
                    "option tls.server_name: {name:?} is not a DNS name or an IP address"
                ))
            })?,
            None => ServerName::try_from(host.to_string()).map_err(|_| {
                invalid(format!(
                    "host {host:?} is not a DNS name or an IP address; set option \
                     tls.server_name to the name in the listener's certificate"
                ))
            })?,
        };
        let Some(ca) = &tls.ca else {
            return Err(invalid(
                "option tls.ca is required on a tls: client: it names the CA that signed the \
                 listener's certificate (no system roots are used)"
                    .into(),
            ));
        };
        let verifier = WebPkiServerVerifier::builder_with_provider(roots(ca)?, provider())
            .build()
            .map_err(|e| invalid(format!("option tls.ca: {e}")))?;
        let builder = ClientConfig::builder_with_provider(provider())
            .with_protocol_versions(VERSIONS)
            .map_err(|e| invalid(format!("TLS configuration: {e}")))?;
        let builder = if tls.verify_hostname {
            builder.with_webpki_verifier(verifier)
        } else {
            builder
                .dangerous()
                .with_custom_certificate_verifier(Arc::new(AnyName(verifier)))
        };
        let mut config = match (&tls.cert, &tls.key) {
            (Some(cert), Some(k)) => builder
                .with_client_auth_cert(certs("tls.cert", cert)?, key(k)?)
                .map_err(|e| invalid(format!("options tls.cert and tls.key: {e}")))?,
            _ => builder.with_no_client_auth(),
        };
        // Every connect builds its own configuration, so a session cache would never
        // be used again.
        config.resumption = Resumption::disabled();
        Ok(ClientTls {
            config: Arc::new(config),
            name,
        })
    }

    /// A new session, its handshake not started.
    pub(crate) fn session(&self) -> io::Result<TlsSession> {
        let conn = ClientConnection::new(self.config.clone(), self.name.clone())
            .map_err(io::Error::other)?;
        Ok(TlsSession::new(conn.into()))
    }
}

/// What a `tls:` listener needs for each client: its configuration.
#[derive(Clone)]
pub(crate) struct ServerTls {
    config: Arc<ServerConfig>,
}

impl ServerTls {
    /// The listener side of `tls`: its certificate and key, and with a CA, the
    /// requirement that clients present a certificate it signed (mutual TLS).
    pub(crate) fn new(tls: &TlsOptions) -> Result<ServerTls> {
        let (Some(cert), Some(k)) = (&tls.cert, &tls.key) else {
            return Err(invalid(
                "options tls.cert and tls.key are required on a tls: listener".into(),
            ));
        };
        let builder = ServerConfig::builder_with_provider(provider())
            .with_protocol_versions(VERSIONS)
            .map_err(|e| invalid(format!("TLS configuration: {e}")))?;
        let builder = match &tls.ca {
            Some(ca) => builder.with_client_cert_verifier(
                WebPkiClientVerifier::builder_with_provider(roots(ca)?, provider())
                    .build()
                    .map_err(|e| invalid(format!("option tls.ca: {e}")))?,
            ),
            None => builder.with_no_client_auth(),
        };
        let mut config = builder
            .with_single_cert(certs("tls.cert", cert)?, key(k)?)
            .map_err(|e| invalid(format!("options tls.cert and tls.key: {e}")))?;
        // Clients never resume (see `ClientTls`); tickets would be written for nothing.
        config.send_tls13_tickets = 0;
        Ok(ServerTls {
            config: Arc::new(config),
        })
    }

    /// A new session for an accepted client.
    pub(crate) fn session(&self) -> io::Result<TlsSession> {
        let conn = ServerConnection::new(self.config.clone()).map_err(io::Error::other)?;
        Ok(TlsSession::new(conn.into()))
    }
}

/// Checks the listener's certificate like the WebPKI verifier it wraps, but accepts it
/// whatever name it is for ([`TlsOptions::verify_hostname`] off). The wrapped verifier
/// checks the chain, validity and signatures before the name, so a name error means
/// that everything else passed.
#[derive(Debug)]
struct AnyName(Arc<WebPkiServerVerifier>);

impl ServerCertVerifier for AnyName {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        server_name: &ServerName<'_>,
        ocsp_response: &[u8],
        now: UnixTime,
    ) -> std::result::Result<ServerCertVerified, rustls::Error> {
        match self
            .0
            .verify_server_cert(end_entity, intermediates, server_name, ocsp_response, now)
        {
            Err(rustls::Error::InvalidCertificate(
                CertificateError::NotValidForName | CertificateError::NotValidForNameContext { .. },
            )) => Ok(ServerCertVerified::assertion()),
            other => other,
        }
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> std::result::Result<HandshakeSignatureValid, rustls::Error> {
        self.0.verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> std::result::Result<HandshakeSignatureValid, rustls::Error> {
        self.0.verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.supported_verify_schemes()
    }
}
