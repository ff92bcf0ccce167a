//! What the commands' arguments share: the value parsers (sizes, counts, addresses) and
//! the connection and user flags. The command tree itself is in `cli`.

use clap::Args;

/// Largest message size `-m` accepts (the library's hard limit).
pub const MAX_SIZE: usize = shmlink::options::MAX_MSG_SIZE_LIMIT;

/// Sizes as the measurement core parses and prints them (`64`, `1k`, `1MiB`).
pub use shmlink_measure::size::{exact as format_size, parse as parse_size};

/// A message size: [`parse_size`], at most [`MAX_SIZE`].
pub fn parse_msg_size(text: &str) -> Result<usize, String> {
    let s = parse_size(text)?;
    if s > MAX_SIZE {
        return Err(format!(
            "{text}: at most {} bytes per message",
            format_size(MAX_SIZE)
        ));
    }
    Ok(s)
}

/// A count of at least 1.
pub fn parse_positive(text: &str) -> Result<u64, String> {
    match text.parse::<u64>() {
        Ok(0) => Err("must be at least 1".into()),
        Ok(n) => Ok(n),
        Err(_) => Err(format!("{text:?} is not a positive integer")),
    }
}

/// An address any transport parses, as every command takes it: a bare NAME (no `:`)
/// means `shm:NAME`, the same for send, recv, pong, pub and sub.
pub fn parse_addr(text: &str) -> Result<String, String> {
    let addr = if text.contains(':') {
        text.to_string()
    } else {
        format!("shm:{text}")
    };
    shmlink::Address::parse(&addr)
        .map(|_| addr)
        .map_err(|e| e.to_string())
}

/// The connection flags of the commands that connect or listen: TLS files and the
/// shared rendezvous directory.
#[derive(Args, Debug, Clone, Default, PartialEq, Eq)]
pub struct ConnFlags {
    /// This end's certificate chain (PEM), with --key: a server needs them; a client
    /// presents them to a server that asks (mutual TLS)
    #[arg(
        long,
        value_name = "FILE",
        requires = "key",
        help_heading = "TLS (tls: and auto: addresses)"
    )]
    pub cert: Option<String>,
    /// The private key of --cert (PEM)
    #[arg(
        long,
        value_name = "FILE",
        requires = "cert",
        help_heading = "TLS (tls: and auto: addresses)"
    )]
    pub key: Option<String>,
    /// The CA certificates trusted to sign the peer's certificate (PEM): a client needs
    /// it; a server with it requires client certificates
    #[arg(
        long,
        value_name = "FILE",
        help_heading = "TLS (tls: and auto: addresses)"
    )]
    pub ca: Option<String>,
    /// The rendezvous directory is shared on purpose (a volume several containers or uids
    /// mount): accept any owner and mode. The peer's uid is still checked
    #[arg(long)]
    pub shared_dir: bool,
    #[command(flatten)]
    pub users: UserFlags,
}

/// Which other users a command deals with over `shm:` (and `ux:`), besides its own uid
/// and root: the clients a listener admits, the servers a client trusts. Shared by the
/// commands that listen or connect and by `shmlink run` (which hands them to the
/// preload library in its environment).
#[derive(Args, Debug, Clone, Default, PartialEq, Eq)]
pub struct UserFlags {
    /// Serving (recv, pub, pong --server, a program under `run`): also admit clients of
    /// this uid (repeatable, or a comma list). Their SO_PEERCRED uid is checked; the
    /// rendezvous socket becomes connectable by every user
    #[arg(
        long = "allow-uid",
        value_name = "UID",
        value_delimiter = ',',
        help_heading = "Across users"
    )]
    pub allow_uids: Vec<u32>,
    /// Serving: also admit clients whose primary gid is this one (repeatable, or a comma
    /// list)
    #[arg(
        long = "allow-gid",
        value_name = "GID",
        value_delimiter = ',',
        help_heading = "Across users"
    )]
    pub allow_gids: Vec<u32>,
    /// Connecting (send, sub, pong, a program under `run`): also trust a server (and a
    /// rendezvous directory) of this uid (repeatable, or a comma list)
    #[arg(
        long = "expect-uid",
        value_name = "UID",
        value_delimiter = ',',
        help_heading = "Across users"
    )]
    pub expect_uids: Vec<u32>,
}

impl UserFlags {
    /// `opts` with these users allowed and expected.
    /// A rendezvous directory a listener makes lets the allowed users reach the sockets
    /// they know the names of (0711).
    pub fn apply(&self, opts: shmlink::Options) -> shmlink::Options {
        let others = !self.allow_uids.is_empty() || !self.allow_gids.is_empty();
        let opts = opts
            .allow_uids(self.allow_uids.iter().copied())
            .allow_gids(self.allow_gids.iter().copied())
            .expect_uids(self.expect_uids.iter().copied());
        if others {
            opts.rendezvous_dir_mode(0o711)
        } else {
            opts
        }
    }
}

impl ConnFlags {
    /// The library options these flags ask for.
    pub fn options(&self) -> shmlink::Options {
        self.users.apply(conn_options(
            self.shared_dir,
            self.cert.as_deref(),
            self.key.as_deref(),
            self.ca.as_deref(),
        ))
    }
}

/// The connection options every command's flags ask for: the shared rendezvous directory
/// and the TLS files (PEM) of `tls:` and `auto:` addresses.
pub fn conn_options(
    shared_dir: bool,
    cert: Option<&str>,
    key: Option<&str>,
    ca: Option<&str>,
) -> shmlink::Options {
    let mut tls = shmlink::TlsOptions::new();
    if let Some(cert) = cert {
        tls = tls.cert(shmlink::Pem::file(cert));
    }
    if let Some(key) = key {
        tls = tls.key(shmlink::Pem::file(key));
    }
    if let Some(ca) = ca {
        tls = tls.ca(shmlink::Pem::file(ca));
    }
    shmlink::Options::default()
        .shared_rendezvous_dir(shared_dir)
        .tls(tls)
}
