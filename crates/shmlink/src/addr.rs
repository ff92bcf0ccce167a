//! Addresses: `shm:`, `ux:`, `tcp:`, `tls:` and `auto:`, parsed and validated before
//! anything touches the OS.

use std::fmt;
use std::path::{Path, PathBuf};
use std::str::FromStr;

use crate::error::{Error, ErrorKind, Result};

/// A transport, named by its address prefix (`shm:`, `ux:`, `tcp:`, `tls:`, `auto:`).
///
/// [`Display`](fmt::Display) and [`FromStr`] use the prefix without the colon:
///
/// ```
/// use shmlink::Transport;
/// assert_eq!("tls".parse::<Transport>()?, Transport::Tls);
/// assert_eq!(Transport::Shm.to_string(), "shm");
/// assert!(Transport::ALL.contains(&Transport::Auto));
/// # Ok::<(), shmlink::Error>(())
/// ```
///
/// `Send`, `Sync`, `Copy`.
#[non_exhaustive]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Transport {
    /// `shm:` — shared-memory rings.
    Shm,
    /// `ux:` — Unix `SOCK_SEQPACKET`.
    Ux,
    /// `tcp:` — TCP with length-prefixed frames.
    Tcp,
    /// `tls:` — `tcp:` inside TLS 1.3.
    Tls,
    /// `auto:` — TCP (or TLS), upgraded to `shm:` when both ends share a kernel. Only an
    /// address names it: a connection or subscriber made through `auto:` reports the
    /// transport its messages really travel over.
    Auto,
    /// `vm:` — rings in a region shared between virtual machines (QEMU `ivshmem`) and
    /// their host, with the rendezvous inside the region (docs/vms.md).
    Vm,
}

impl Transport {
    /// Every transport, in the order of the crate docs' table. Parsing and error
    /// messages follow this list; the library's dispatch table is an exhaustive `match`
    /// on the enum, so the enum is the one registry of transports.
    pub const ALL: &'static [Transport] = &[
        Transport::Shm,
        Transport::Ux,
        Transport::Tcp,
        Transport::Tls,
        Transport::Auto,
        Transport::Vm,
    ];

    /// The address prefix, without the colon: `"shm"`, `"ux"`, `"tcp"`, `"tls"`, `"auto"`.
    pub const fn as_str(self) -> &'static str {
        match self {
            Transport::Shm => "shm",
            Transport::Ux => "ux",
            Transport::Tcp => "tcp",
            Transport::Tls => "tls",
            Transport::Auto => "auto",
            Transport::Vm => "vm",
        }
    }
}

impl fmt::Display for Transport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for Transport {
    type Err = Error;

    /// Parses a prefix without the colon (`"shm"`); fails with
    /// [`ErrorKind::InvalidAddress`] naming the known ones.
    fn from_str(s: &str) -> Result<Transport> {
        Transport::ALL
            .iter()
            .copied()
            .find(|t| t.as_str() == s)
            .ok_or_else(|| {
                Error::new(
                    ErrorKind::InvalidAddress,
                    format!("unknown transport {s:?} (expected one of {})", prefixes()),
                )
            })
    }
}

/// Longest path that fits `sockaddr_un.sun_path` with its terminating NUL.
const SUN_PATH_MAX: usize = 107;
/// Longest name accepted for `shm:NAME` and abstract `ux:NAME` (leaves room for the
/// rendezvous directory and the `.sock` suffix).
const NAME_MAX: usize = 64;

/// Where a Unix socket lives (defined with the socket calls, in `shmlink-sys`).
pub use crate::sys::socket::UnixName;

/// A parsed address.
///
/// `Send`, `Sync`, `Clone`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Address {
    /// `shm:NAME` (in the rendezvous directory), `shm:/path.sock` or `shm:@name`.
    Shm {
        /// The rendezvous socket.
        socket: UnixName,
        /// The text the user gave after `shm:`.
        text: String,
    },
    /// `ux:name` (abstract) or `ux:/path`: Unix `SOCK_SEQPACKET`.
    Ux(UnixName),
    /// `tcp:HOST:PORT`.
    Tcp {
        /// Host name or IP literal (IPv6 without brackets).
        host: String,
        /// Port number; 0 lets the OS choose when binding.
        port: u16,
    },
    /// `tls:HOST:PORT`: TCP with TLS. A client verifies that the listener's certificate
    /// is valid for `host` unless told another name (see
    /// [`TlsOptions`](crate::TlsOptions)).
    Tls {
        /// Host name or IP literal (IPv6 without brackets).
        host: String,
        /// Port number; 0 lets the OS choose when binding.
        port: u16,
    },
    /// `auto:HOST:PORT`: TCP (TLS when TLS options are set), upgraded to `shm:` when
    /// both ends share a kernel.
    Auto {
        /// Host name or IP literal (IPv6 without brackets).
        host: String,
        /// Port number; 0 lets the OS choose when binding.
        port: u16,
    },
    /// `vm:NAME` or `vm:NAME@REGION`: a listener named NAME in a region shared between
    /// virtual machines. REGION is the region's file: the `ivshmem` backing file on the
    /// host, the PCI BAR's sysfs `resource2` in a guest; without it, `$SHMLINK_VM_REGION`,
    /// else the one `ivshmem` device a guest has.
    Vm {
        /// The listener's name in the region's table.
        name: String,
        /// The region file, if the address names one.
        region: Option<PathBuf>,
    },
}

impl Address {
    /// Parses `text`; `shm:NAME` is resolved against the rendezvous directory
    /// ([`rendezvous_dir`]).
    pub fn parse(text: &str) -> Result<Address> {
        let bad = |why: &str| {
            Error::new(
                ErrorKind::InvalidAddress,
                format!("invalid address {text:?}: {why}"),
            )
        };
        let Some((prefix, rest)) = text.split_once(':') else {
            return Err(bad(&format!(
                "missing transport prefix (expected one of {})",
                prefixes()
            )));
        };
        let Ok(transport) = prefix.parse::<Transport>() else {
            return Err(bad(&format!(
                "unknown transport {prefix:?} (expected one of {})",
                prefixes()
            )));
        };
        match transport {
            Transport::Shm => {
                let socket = if let Some(name) = rest.strip_prefix('@') {
                    UnixName::Abstract(check_name(name).map_err(|w| bad(&w))?)
                } else if rest.starts_with('/') {
                    UnixName::Path(check_path(rest).map_err(|w| bad(&w))?)
                } else {
                    let name = check_name(rest).map_err(|w| bad(&w))?;
                    let path = rendezvous_dir().join(format!("{name}.sock"));
                    let path = check_path(path.to_str().ok_or_else(|| bad("non-UTF-8 path"))?)
                        .map_err(|w| bad(&w))?;
                    UnixName::Path(path)
                };
                Ok(Address::Shm {
                    socket,
                    text: rest.to_string(),
                })
            }
            Transport::Ux => {
                if rest.starts_with('/') {
                    Ok(Address::Ux(UnixName::Path(
                        check_path(rest).map_err(|w| bad(&w))?,
                    )))
                } else {
                    Ok(Address::Ux(UnixName::Abstract(
                        check_name(rest).map_err(|w| bad(&w))?,
                    )))
                }
            }
            Transport::Vm => {
                let (name, region) = match rest.split_once('@') {
                    Some((n, r)) => {
                        if !r.starts_with('/') || r.contains('\0') {
                            return Err(bad("the region after '@' must be an absolute path"));
                        }
                        (n, Some(PathBuf::from(r)))
                    }
                    None => (rest, None),
                };
                let name = check_name(name).map_err(|w| bad(&w))?;
                if name.contains('@') {
                    return Err(bad("name contains '@'"));
                }
                Ok(Address::Vm { name, region })
            }
            Transport::Tcp | Transport::Tls | Transport::Auto => {
                let (host, port) = host_port(rest)
                    .map_err(|w| bad(&format!("{w} (expected {prefix}:HOST:PORT)")))?;
                Ok(match transport {
                    Transport::Tcp => Address::Tcp { host, port },
                    Transport::Tls => Address::Tls { host, port },
                    _ => Address::Auto { host, port },
                })
            }
        }
    }

    /// The transport the address names (its prefix).
    pub fn transport(&self) -> Transport {
        match self {
            Address::Shm { .. } => Transport::Shm,
            Address::Ux(_) => Transport::Ux,
            Address::Tcp { .. } => Transport::Tcp,
            Address::Tls { .. } => Transport::Tls,
            Address::Auto { .. } => Transport::Auto,
            Address::Vm { .. } => Transport::Vm,
        }
    }

    /// Whether this is a `shm:NAME` address: a socket in the rendezvous directory (not a
    /// path or an abstract name the user gave).
    pub(crate) fn in_rendezvous_dir(&self) -> bool {
        matches!(self, Address::Shm { socket: UnixName::Path(_), text } if !text.starts_with('/'))
    }
}

impl fmt::Display for Address {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Address::Shm { text, .. } => write!(f, "shm:{text}"),
            Address::Ux(UnixName::Path(p)) => write!(f, "ux:{}", p.display()),
            Address::Ux(UnixName::Abstract(n)) => write!(f, "ux:{n}"),
            Address::Vm { name, region: None } => write!(f, "vm:{name}"),
            Address::Vm {
                name,
                region: Some(r),
            } => write!(f, "vm:{name}@{}", r.display()),
            Address::Tcp { host, port }
            | Address::Tls { host, port }
            | Address::Auto { host, port } => {
                let prefix = self.transport();
                if host.contains(':') {
                    write!(f, "{prefix}:[{host}]:{port}")
                } else {
                    write!(f, "{prefix}:{host}:{port}")
                }
            }
        }
    }
}

fn prefixes() -> String {
    Transport::ALL
        .iter()
        .map(|t| format!("{t}:"))
        .collect::<Vec<_>>()
        .join(", ")
}

/// `HOST:PORT` of `tcp:` and `auto:` (an IPv6 host in brackets).
fn host_port(rest: &str) -> std::result::Result<(String, u16), String> {
    let (host, port) = rest
        .rsplit_once(':')
        .ok_or_else(|| "expected HOST:PORT".to_string())?;
    let host = host
        .strip_prefix('[')
        .and_then(|h| h.strip_suffix(']'))
        .unwrap_or(host);
    if host.is_empty() {
        return Err("empty host".into());
    }
    if host.contains(['/', '\0', ' ']) {
        return Err("host contains '/', NUL or space".into());
    }
    let port = port
        .parse::<u16>()
        .map_err(|_| format!("port {port:?} is not a number in 0..=65535"))?;
    Ok((host.to_string(), port))
}

fn check_name(name: &str) -> std::result::Result<String, String> {
    if name.is_empty() {
        return Err("empty name".into());
    }
    if name.len() > NAME_MAX {
        return Err(format!("name longer than {NAME_MAX} bytes"));
    }
    if name == "." || name == ".." {
        return Err("name may not be '.' or '..'".into());
    }
    if let Some(c) = name
        .chars()
        .find(|c| !(c.is_ascii_alphanumeric() || "-_.+@=,".contains(*c)))
    {
        return Err(format!(
            "name contains {c:?} (allowed: letters, digits and -_.+@=,)"
        ));
    }
    Ok(name.to_string())
}

fn check_path(path: &str) -> std::result::Result<PathBuf, String> {
    if path.len() > SUN_PATH_MAX {
        return Err(format!(
            "socket path longer than {SUN_PATH_MAX} bytes (the Unix socket limit)"
        ));
    }
    if path.contains('\0') {
        return Err("path contains NUL".into());
    }
    if path.ends_with('/') {
        return Err("path names a directory".into());
    }
    Ok(PathBuf::from(path))
}

/// The rendezvous directory for `shm:NAME`: `$SHMLINK_DIR`, else
/// `$XDG_RUNTIME_DIR/shmlink`, else `/tmp/shmlink-<uid>`.
pub fn rendezvous_dir() -> PathBuf {
    if let Some(d) = std::env::var_os("SHMLINK_DIR").filter(|d| !d.is_empty()) {
        return PathBuf::from(d);
    }
    if let Some(d) = std::env::var_os("XDG_RUNTIME_DIR").filter(|d| !d.is_empty()) {
        return Path::new(&d).join("shmlink");
    }
    let uid = crate::sys::uid();
    PathBuf::from(format!("/tmp/shmlink-{uid}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn kind(text: &str) -> ErrorKind {
        Address::parse(text).unwrap_err().kind()
    }

    #[test]
    fn parses_every_form() {
        assert_eq!(
            Address::parse("ux:/tmp/a.sock").unwrap(),
            Address::Ux(UnixName::Path("/tmp/a.sock".into()))
        );
        assert_eq!(
            Address::parse("ux:abc").unwrap(),
            Address::Ux(UnixName::Abstract("abc".into()))
        );
        assert_eq!(
            Address::parse("tcp:[::1]:80").unwrap(),
            Address::Tcp {
                host: "::1".into(),
                port: 80
            }
        );
        assert_eq!(
            Address::parse("tcp:[::1]:80").unwrap().to_string(),
            "tcp:[::1]:80"
        );
        assert_eq!(
            Address::parse("tls:localhost:443").unwrap(),
            Address::Tls {
                host: "localhost".into(),
                port: 443
            }
        );
        assert_eq!(
            Address::parse("tls:[::1]:443").unwrap().to_string(),
            "tls:[::1]:443"
        );
        let a = Address::parse("shm:@x").unwrap();
        assert_eq!(a.to_string(), "shm:@x");
        let Address::Shm {
            socket: UnixName::Path(p),
            ..
        } = Address::parse("shm:chan").unwrap()
        else {
            panic!("shm:NAME must resolve to a path");
        };
        assert!(p.ends_with("chan.sock"));
    }

    #[test]
    fn transport_names_round_trip_and_match_addresses() {
        for &t in Transport::ALL {
            assert_eq!(t.as_str().parse::<Transport>().unwrap(), t);
            assert_eq!(t.to_string(), t.as_str());
        }
        for (text, t) in [
            ("shm:x", Transport::Shm),
            ("ux:x", Transport::Ux),
            ("tcp:h:1", Transport::Tcp),
            ("tls:h:1", Transport::Tls),
            ("auto:h:1", Transport::Auto),
        ] {
            assert_eq!(Address::parse(text).unwrap().transport(), t, "{text}");
        }
        let e = "udp".parse::<Transport>().unwrap_err();
        assert_eq!(e.kind(), ErrorKind::InvalidAddress);
        assert!(
            e.to_string().contains("shm:, ux:, tcp:, tls:, auto:"),
            "{e}"
        );
    }

    #[test]
    fn rejects_bad_addresses_with_the_address_in_the_message() {
        for bad in [
            "foo:bar",
            "nocolon",
            "shm:",
            "ux:",
            "shm:a/b",
            "shm:..",
            "tcp:host",
            "tcp::80",
            "tcp:h:99999",
            "tls:host",
            "tls::443",
            "shm:@",
        ] {
            let e = Address::parse(bad).unwrap_err();
            assert_eq!(e.kind(), ErrorKind::InvalidAddress, "{bad}");
            assert!(e.to_string().contains(&format!("{bad:?}")), "{e}");
        }
        assert!(Address::parse("foo:bar")
            .unwrap_err()
            .to_string()
            .contains("shm:, ux:, tcp:, tls:"));
        assert_eq!(
            kind(&format!("ux:/{}", "x".repeat(200))),
            ErrorKind::InvalidAddress
        );
        assert_eq!(
            kind(&format!("shm:{}", "x".repeat(65))),
            ErrorKind::InvalidAddress
        );
    }
}
