//! The bridge's configuration: which topics go out and come in (allow-lists of names
//! with `*` wildcards; nothing by default), the Zenoh key prefix, the Zenoh session
//! (mode, endpoints, scouting, TLS/mTLS) and which remote peers may receive or send
//! which topics (Zenoh access control, [`Grant`]), turned into a [`zenoh::Config`].

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

/// The longest certificate common name a [`Grant`] accepts (X.509's upper bound).
pub const MAX_COMMON_NAME: usize = 64;

/// A grant of Zenoh access control: the remote peer whose TLS certificate has common name
/// `peer` may receive (`--allow-out`) or send (`--allow-in`) the topics matching
/// `topics`. Written `CN:PATTERN` (split at the last `:`; topic names have none).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Grant {
    /// The common name (CN) of the peer's certificate, exactly.
    pub peer: String,
    /// The topics granted.
    pub topics: Pattern,
}

impl Grant {
    /// Parses `CN:PATTERN`.
    pub fn parse(s: &str) -> Result<Grant, String> {
        let Some((peer, topics)) = s.rsplit_once(':') else {
            return Err(format!(
                "grant {s:?} is not CN:PATTERN (a certificate's common name, a colon, a topic pattern)"
            ));
        };
        if peer.trim().is_empty() || peer.len() > MAX_COMMON_NAME {
            return Err(format!(
                "grant {s:?}: the common name must have 1 to {MAX_COMMON_NAME} bytes"
            ));
        }
        if peer.chars().any(char::is_control) {
            return Err(format!(
                "grant {s:?}: the common name has a control character"
            ));
        }
        Ok(Grant {
            peer: peer.to_owned(),
            topics: Pattern::new(topics).map_err(|e| format!("grant {s:?}: {e}"))?,
        })
    }
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
    /// Endpoints to listen on (`tcp/ADDR:PORT`, `quic/ADDR:PORT`, `tls/ADDR:PORT`).
    pub listen: Vec<String>,
    /// Endpoints to connect to.
    pub connect: Vec<String>,
    /// Multicast scouting (finding peers on the local network); off by default.
    pub scouting: bool,
    /// TLS files for `quic/` and `tls/` endpoints.
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
    /// Access control, outgoing: which peers (by certificate common name) may receive
    /// which exported topics. With any grant (here or in `allow_in`), Zenoh's access
    /// control is on and denies everything not granted; needs mTLS.
    pub allow_out: Vec<Grant>,
    /// Access control, incoming: which peers may publish into which imported topics.
    pub allow_in: Vec<Grant>,
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
            allow_out: Vec::new(),
            allow_in: Vec::new(),
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
        if self.tls.mtls
            && (self.tls.ca.is_none() || self.tls.cert.is_none() || self.tls.key.is_none())
        {
            return Err("mTLS needs a CA, a certificate and a key".into());
        }
        if self.acl_enabled() && !self.tls.mtls {
            return Err(
                "--allow-out/--allow-in name peers by the common name of their certificate: \
                 they need --mtls (and quic/ or tls/ endpoints)"
                    .into(),
            );
        }
        Ok(())
    }

    /// The warning for `tls/` endpoints, if there are any: Zenoh 1.10.2's TLS link reads
    /// and writes one TLS stream from two tasks at once (upstream
    /// eclipse-zenoh/zenoh#2557); docs/zenoh.md, "Limits".
    pub fn tls_endpoint_warning(&self) -> Option<&'static str> {
        let mut endpoints = self.listen.iter().chain(&self.connect);
        endpoints.any(|e| e.starts_with("tls/")).then_some(
            "tls/ endpoints are not safe with messages going both ways on a link in Zenoh 1.10.2 \
             (eclipse-zenoh/zenoh#2557: a direction can stop, a message be lost); use quic/, \
             which takes the same --tls-* and --mtls options",
        )
    }

    /// Whether any access-control grant is given (then Zenoh's access control is on).
    pub fn acl_enabled(&self) -> bool {
        !self.allow_out.is_empty() || !self.allow_in.is_empty()
    }

    /// Zenoh's `access_control` section for the grants (JSON5), or `None` without grants.
    ///
    /// Default deny. For each peer (a subject matched by its certificate's common name):
    /// - `--allow-out`: its subscriptions may come in (any key under the prefix: what it
    ///   receives is decided by the next rule) and puts on the granted keys may go out to
    ///   it;
    /// - `--allow-in`: this bridge's subscriptions may go out to it (so it learns what to
    ///   send) and its puts on the granted keys may come in.
    ///
    /// Everything else to or from any peer is denied: puts, deletes, queries, replies,
    /// declarations, liveliness. Zenoh matches a rule when the rule's key expression
    /// includes the message's key, so a put on `shmlink/sensors.imu` matches the grant
    /// `sensors.*` (`shmlink/sensors.$*`).
    pub fn acl_json(&self) -> Option<String> {
        if !self.acl_enabled() {
            return None;
        }
        let mut peers: Vec<&str> = Vec::new();
        for g in self.allow_out.iter().chain(&self.allow_in) {
            if !peers.contains(&g.peer.as_str()) {
                peers.push(&g.peer);
            }
        }
        let any_key = json_str(&format!("{}**", self.prefix));
        let mut rules = vec![
            format!(
                r#"{{"id":"subscriptions-in","messages":["declare_subscriber"],"flows":["ingress"],"permission":"allow","key_exprs":[{any_key}]}}"#
            ),
            format!(
                r#"{{"id":"subscriptions-out","messages":["declare_subscriber"],"flows":["egress"],"permission":"allow","key_exprs":[{any_key}]}}"#
            ),
        ];
        let (mut subjects, mut policies) = (Vec::new(), Vec::new());
        for (i, peer) in peers.iter().enumerate() {
            subjects.push(format!(
                r#"{{"id":"peer-{i}","cert_common_names":[{}]}}"#,
                json_str(peer)
            ));
            let mut granted = Vec::new();
            for (grants, flow, sub_rule) in [
                (&self.allow_out, "egress", "subscriptions-in"),
                (&self.allow_in, "ingress", "subscriptions-out"),
            ] {
                let keys: Vec<String> = grants
                    .iter()
                    .filter(|g| g.peer == *peer)
                    .map(|g| g.topics.key_expr(&self.prefix))
                    .collect();
                if keys.is_empty() {
                    continue;
                }
                let id = format!("put-{flow}-{i}");
                rules.push(format!(
                    r#"{{"id":"{id}","messages":["put"],"flows":["{flow}"],"permission":"allow","key_exprs":{}}}"#,
                    json_list(&keys)
                ));
                granted.push(json_str(&id));
                granted.push(json_str(sub_rule));
            }
            policies.push(format!(
                r#"{{"rules":[{}],"subjects":["peer-{i}"]}}"#,
                granted.join(",")
            ));
        }
        Some(format!(
            r#"{{"enabled":true,"default_permission":"deny","rules":[{}],"subjects":[{}],"policies":[{}]}}"#,
            rules.join(","),
            subjects.join(","),
            policies.join(",")
        ))
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
        if let Some(acl) = self.acl_json() {
            set(&mut c, "access_control", acl)?;
        }
        Ok(c)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use zenoh::Wait;

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

    #[test]
    fn tls_endpoints_are_warned_about() {
        let mut c = BridgeConfig {
            listen: vec!["tcp/10.0.0.1:7447".into(), "quic/10.0.0.1:7448".into()],
            ..BridgeConfig::default()
        };
        assert_eq!(c.tls_endpoint_warning(), None);
        c.connect = vec!["tls/10.0.0.2:7447".into()];
        assert!(c.tls_endpoint_warning().unwrap().contains("quic/"));
    }

    #[test]
    fn grants_parse() {
        let g = Grant::parse("bridge-b.example:sensors.*").unwrap();
        assert_eq!(g.peer, "bridge-b.example");
        assert_eq!(g.topics.as_str(), "sensors.*");
        // The last colon splits: a common name may hold one, a topic name may not.
        assert_eq!(Grant::parse("a:b:t").unwrap().peer, "a:b");
        for bad in ["", "t", ":t", " :t", "b:", "b:a/b", "b:t t", "\u{1}:t"] {
            assert!(Grant::parse(bad).is_err(), "{bad:?}");
        }
        assert!(Grant::parse(&format!("{}:t", "c".repeat(MAX_COMMON_NAME))).is_ok());
        assert!(Grant::parse(&format!("{}:t", "c".repeat(MAX_COMMON_NAME + 1))).is_err());
    }

    #[test]
    fn grants_make_zenoh_access_control() {
        let mut c = BridgeConfig::default();
        assert!(c.acl_json().is_none());
        c.allow_out = vec![
            Grant::parse("b:zt").unwrap(),
            Grant::parse("b:sensors.*").unwrap(),
        ];
        c.allow_in = vec![Grant::parse("d\"q:*").unwrap()];
        // Grants name peers by certificate: without mTLS they are refused.
        assert!(c.validate().unwrap_err().contains("--mtls"));
        c.tls = Tls {
            ca: Some("ca.pem".into()),
            cert: Some("a.pem".into()),
            key: Some("a.key".into()),
            mtls: true,
        };
        let acl = c.acl_json().unwrap();
        assert!(acl.contains(r#""default_permission":"deny""#), "{acl}");
        assert!(
            acl.contains(r#""key_exprs":["shmlink/zt","shmlink/sensors.$*"]"#),
            "{acl}"
        );
        assert!(acl.contains(r#""cert_common_names":["d\"q"]"#), "{acl}");
        // Zenoh parses it (its own types, unknown fields denied) and reads it back.
        let z = c.zenoh_config().unwrap();
        let back = z.get_json("access_control").unwrap();
        assert!(
            back.contains("put-egress-0") && back.contains("put-ingress-1"),
            "{back}"
        );
        // Zenoh's own checks of the rules run when a session opens with them.
        let mut z = zenoh::Config::default();
        z.insert_json5("listen/endpoints", "[]").unwrap();
        z.insert_json5("scouting/multicast/enabled", "false")
            .unwrap();
        let mut with_acl = BridgeConfig {
            allow_out: vec![Grant::parse("b:zt").unwrap()],
            ..BridgeConfig::default()
        };
        with_acl.tls.mtls = true;
        z.insert_json5("access_control", &with_acl.acl_json().unwrap())
            .unwrap();
        let s = zenoh::open(z)
            .wait()
            .expect("a session with the access control");
        s.close().wait().unwrap();
    }
}
