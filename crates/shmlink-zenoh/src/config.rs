//! The bridge's configuration: which topics go out and come in (allow-lists of names
//! with `*` wildcards; nothing by default), the Zenoh key prefix, and the Zenoh session
//! (mode, endpoints, scouting, TLS/mTLS), turned into a [`zenoh::Config`].

use std::path::PathBuf;
use std::time::Duration;

use shmlink::Policy;

/// The key prefix unless told otherwise: topic `NAME` is key `shmlink/NAME`.
pub const DEFAULT_PREFIX: &str = "shmlink/";

/// How the bridge's Zenoh session joins the network.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum Mode {
    /// Peer-to-peer: connects to the endpoints given (and, with scouting, to peers it
    /// finds), and listens.
    #[default]
    Peer,
    /// Client of a router (`zenohd`) or a peer: everything goes through it.
    Client,
    /// A router itself (routes for others).
    Router,
}

impl Mode {
    /// The name Zenoh's configuration uses.
    pub fn as_str(self) -> &'static str {
        match self {
            Mode::Peer => "peer",
            Mode::Client => "client",
            Mode::Router => "router",
        }
    }
}

impl std::str::FromStr for Mode {
    type Err = String;
    fn from_str(s: &str) -> Result<Mode, String> {
        match s {
            "peer" => Ok(Mode::Peer),
            "client" => Ok(Mode::Client),
            "router" => Ok(Mode::Router),
            _ => Err(format!("unknown mode {s:?} (peer, client or router)")),
        }
    }
}

/// A topic name pattern of an allow-list: a topic name (letters, digits and `-_.+@=,`)
/// in which `*` stands for any run of characters (`*` alone: every topic).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Pattern(String);

impl Pattern {
    /// Checks the characters (those of a topic name, plus `*`); runs of `*` count as one.
    pub fn new(p: &str) -> Result<Pattern, String> {
        if p.is_empty() {
            return Err("empty topic pattern".into());
        }
        if let Some(c) = p
            .chars()
            .find(|c| !(c.is_ascii_alphanumeric() || "-_.+@=,*".contains(*c)))
        {
            return Err(format!(
                "topic pattern {p:?} contains {c:?} (allowed: letters, digits, -_.+@=, and *)"
            ));
        }
        let mut s = String::with_capacity(p.len());
        for c in p.chars() {
            if !(c == '*' && s.ends_with('*')) {
                s.push(c);
            }
        }
        Ok(Pattern(s))
    }

    /// The pattern as given (runs of `*` collapsed).
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// Whether topic `name` matches.
    pub fn matches(&self, name: &str) -> bool {
        glob(self.0.as_bytes(), name.as_bytes())
    }

    /// The Zenoh key expression of the topics this pattern matches, under `prefix`:
    /// `*` alone is Zenoh's chunk wildcard `*`, a `*` inside a name is `$*`.
    pub fn key_expr(&self, prefix: &str) -> String {
        if self.0 == "*" {
            format!("{prefix}*")
        } else {
            format!("{prefix}{}", self.0.replace('*', "$*"))
        }
    }
}

/// `*` matches any run of bytes; iterative, with one backtrack point (linear-ish, no
/// recursion on hostile input).
fn glob(p: &[u8], s: &[u8]) -> bool {
    let (mut pi, mut si) = (0, 0);
    let mut star: Option<(usize, usize)> = None;
    while si < s.len() {
        if pi < p.len() && p[pi] == b'*' {
            star = Some((pi, si));
            pi += 1;
        } else if pi < p.len() && p[pi] == s[si] {
            pi += 1;
            si += 1;
        } else if let Some((sp, ss)) = star {
            pi = sp + 1;
            si = ss + 1;
            star = Some((sp, ss + 1));
        } else {
            return false;
        }
    }
    p[pi..].iter().all(|&c| c == b'*')
}

/// TLS files of the Zenoh session (PEM). With a CA and the bridge's own certificate and
/// key, `mtls` makes both sides present a certificate the CA signed.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Tls {
    /// The CA that signs the peers' certificates.
    pub ca: Option<PathBuf>,
    /// This bridge's certificate (used to listen and, with mTLS, to connect).
    pub cert: Option<PathBuf>,
    /// This bridge's private key.
    pub key: Option<PathBuf>,
    /// Require a certificate from every peer (mutual TLS).
    pub mtls: bool,
}

/// Everything a [`Bridge`](crate::Bridge) needs. `Default`: nothing exported, nothing
/// imported, prefix `shmlink/`, peer mode with scouting off and no endpoints.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BridgeConfig {
    /// Local topics sent to Zenoh (nothing by default).
    pub export: Vec<Pattern>,
    /// Zenoh keys (under the prefix) published into local topics (nothing by default).
    pub import: Vec<Pattern>,
    /// The key prefix (default `shmlink/`); must end with `/`.
    pub prefix: String,
    /// The Zenoh session's mode.
    pub mode: Mode,
    /// Endpoints to listen on (`tcp/ADDR:PORT`, `tls/ADDR:PORT`).
    pub listen: Vec<String>,
    /// Endpoints to connect to.
    pub connect: Vec<String>,
    /// Multicast scouting (finding peers on the local network); off by default.
    pub scouting: bool,
    /// TLS files for `tls/` endpoints.
    pub tls: Tls,
    /// How often the bridge looks for new local topics to export.
    pub scan_interval: Duration,
    /// For imported messages without a bridge's attachment (other Zenoh applications):
    /// the local topic's largest message, slots and policy.
    pub foreign_max_msg: usize,
    /// See [`foreign_max_msg`](Self::foreign_max_msg).
    pub foreign_slots: usize,
    /// See [`foreign_max_msg`](Self::foreign_max_msg).
    pub foreign_policy: Policy,
    /// The largest message of a topic the bridge imports (default 16 MiB): a topic whose
    /// origin allows larger ones is not imported.
    pub max_import_msg: usize,
    /// The stall timeout of the local topics the bridge publishes (imported `Block`
    /// topics): how long a slow local subscriber may hold the bridge up before it is
    /// detached (see `PubSubOptions::stall_timeout`).
    pub stall_timeout: Duration,
    /// Messages queued between Zenoh and one imported topic's local publisher (when
    /// full, Zenoh's receive path waits: back-pressure for `Block` topics).
    pub import_queue: usize,
}

impl Default for BridgeConfig {
    fn default() -> Self {
        BridgeConfig {
            export: Vec::new(),
            import: Vec::new(),
            prefix: DEFAULT_PREFIX.into(),
            mode: Mode::Peer,
            listen: Vec::new(),
            connect: Vec::new(),
            scouting: false,
            tls: Tls::default(),
            scan_interval: Duration::from_millis(500),
            foreign_max_msg: 64 * 1024,
            foreign_slots: 256,
            foreign_policy: Policy::Overwrite,
            max_import_msg: 16 << 20,
            stall_timeout: Duration::from_secs(1),
            import_queue: 64,
        }
    }
}

fn json_str(s: &str) -> String {
    let mut out = String::from("\"");
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            c if (c as u32) < 0x20 => out.push_str(&format!("\\u{:04x}", c as u32)),
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

fn json_list(v: &[String]) -> String {
    format!(
        "[{}]",
        v.iter().map(|s| json_str(s)).collect::<Vec<_>>().join(",")
    )
}

impl BridgeConfig {
    /// Checks the prefix (non-empty, ends with `/`, no wildcard) and the queue size.
    pub fn validate(&self) -> Result<(), String> {
        let p = &self.prefix;
        if p.len() < 2 || !p.ends_with('/') || p.starts_with('/') || p.contains("//") {
            return Err(format!(
                "key prefix {p:?} must be non-empty, end with '/' and have no empty chunk"
            ));
        }
        if p.contains(['*', '$', '?', '#', ' ']) {
            return Err(format!(
                "key prefix {p:?} contains a wildcard or special character"
            ));
        }
        if self.import_queue == 0 {
            return Err("import queue must hold at least one message".into());
        }
        if self.tls.mtls
            && (self.tls.ca.is_none() || self.tls.cert.is_none() || self.tls.key.is_none())
        {
            return Err("mTLS needs a CA, a certificate and a key".into());
        }
        Ok(())
    }

    /// The Zenoh session's configuration.
    pub fn zenoh_config(&self) -> Result<zenoh::Config, String> {
        self.validate()?;
        let mut c = zenoh::Config::default();
        let set = |c: &mut zenoh::Config, k: &str, v: String| {
            c.insert_json5(k, &v)
                .map_err(|e| format!("zenoh configuration {k} = {v}: {e}"))
        };
        set(&mut c, "mode", json_str(self.mode.as_str()))?;
        set(&mut c, "listen/endpoints", json_list(&self.listen))?;
        set(&mut c, "connect/endpoints", json_list(&self.connect))?;
        set(
            &mut c,
            "scouting/multicast/enabled",
            self.scouting.to_string(),
        )?;
        // Gossip spreads what one peer knows of others over the links it has: with
        // scouting off, the bridge talks to the endpoints it was given and no others.
        set(&mut c, "scouting/gossip/enabled", self.scouting.to_string())?;
        let path = |p: &PathBuf| json_str(&p.to_string_lossy());
        let t = &self.tls;
        if let Some(ca) = &t.ca {
            set(&mut c, "transport/link/tls/root_ca_certificate", path(ca))?;
        }
        if let Some(cert) = &t.cert {
            set(&mut c, "transport/link/tls/listen_certificate", path(cert))?;
            set(&mut c, "transport/link/tls/connect_certificate", path(cert))?;
        }
        if let Some(key) = &t.key {
            set(&mut c, "transport/link/tls/listen_private_key", path(key))?;
            set(&mut c, "transport/link/tls/connect_private_key", path(key))?;
        }
        set(&mut c, "transport/link/tls/enable_mtls", t.mtls.to_string())?;
        Ok(c)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn patterns_match_and_map_to_keys() {
        let p = Pattern::new("sensors.*").unwrap();
        assert!(p.matches("sensors.imu"));
        assert!(p.matches("sensors."));
        assert!(!p.matches("sensor.imu"));
        assert_eq!(p.key_expr("shmlink/"), "shmlink/sensors.$*");
        let all = Pattern::new("**").unwrap();
        assert_eq!(all.as_str(), "*");
        assert!(all.matches("anything"));
        assert_eq!(all.key_expr("shmlink/"), "shmlink/*");
        let mid = Pattern::new("a*b*c").unwrap();
        assert!(mid.matches("abc") && mid.matches("aXXbYYc") && !mid.matches("aXXbYY"));
        assert!(Pattern::new("a/b").is_err());
        assert!(Pattern::new("").is_err());
        assert!(Pattern::new("a$b").is_err());
        // Hostile input: long runs finish quickly.
        let p = Pattern::new(&"a*".repeat(200)).unwrap();
        assert!(!p.matches(&"a".repeat(150)));
    }

    #[test]
    fn config_validates_and_builds() {
        let mut c = BridgeConfig::default();
        assert!(c.zenoh_config().is_ok());
        c.prefix = "shmlink".into();
        assert!(c.validate().is_err());
        c.prefix = "a/*/".into();
        assert!(c.validate().is_err());
        c.prefix = "site/shm/".into();
        c.listen = vec!["tcp/127.0.0.1:0".into()];
        assert!(c.zenoh_config().is_ok());
        c.tls.mtls = true;
        assert!(c.validate().is_err());
    }
}
