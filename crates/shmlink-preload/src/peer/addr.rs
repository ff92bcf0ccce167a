//! TCP endpoints as the claim protocol names them: decoding socket addresses, a
//! socket's own and its peer's address, whether an fd is a TCP socket, the destination
//! of a `connect`, and which uid owns a TCP socket (`/proc/net/tcp`).

use std::net::{Ipv4Addr, Ipv6Addr};
use std::os::fd::RawFd;

use libc::{c_int, sockaddr_storage, socklen_t};

use crate::real;

/// An IP endpoint: address as 16 bytes (IPv4 mapped into IPv6) and port.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
pub(crate) struct Endpoint {
    pub ip: [u8; 16],
    pub port: u16,
}

impl Endpoint {
    pub(crate) fn is_v4(&self) -> bool {
        self.ip[..12] == [0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff]
    }

    fn v6(&self) -> Ipv6Addr {
        Ipv6Addr::from(self.ip)
    }

    pub(crate) fn is_loopback(&self) -> bool {
        if self.is_v4() {
            self.ip[12] == 127
        } else {
            self.v6().is_loopback()
        }
    }

    pub(crate) fn is_unspecified(&self) -> bool {
        if self.is_v4() {
            self.ip[12..] == [0, 0, 0, 0]
        } else {
            self.v6().is_unspecified()
        }
    }
}

impl std::fmt::Display for Endpoint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.is_v4() {
            let b = &self.ip[12..];
            write!(f, "{}:{}", Ipv4Addr::new(b[0], b[1], b[2], b[3]), self.port)
        } else {
            write!(f, "[{}]:{}", self.v6(), self.port)
        }
    }
}

/// A connection's key: (server, client).
pub(crate) type Key = (Endpoint, Endpoint);

/// Decodes an AF_INET/AF_INET6 socket address.
fn endpoint(ss: &sockaddr_storage, len: socklen_t) -> Option<Endpoint> {
    match c_int::from(ss.ss_family) {
        libc::AF_INET if len as usize >= std::mem::size_of::<libc::sockaddr_in>() => {
            // SAFETY: the family says the storage holds a sockaddr_in.
            let sin = unsafe { &*(ss as *const sockaddr_storage).cast::<libc::sockaddr_in>() };
            let v4 = Ipv4Addr::from(u32::from_be(sin.sin_addr.s_addr));
            Some(Endpoint {
                ip: v4.to_ipv6_mapped().octets(),
                port: u16::from_be(sin.sin_port),
            })
        }
        libc::AF_INET6 if len as usize >= std::mem::size_of::<libc::sockaddr_in6>() => {
            // SAFETY: the family says the storage holds a sockaddr_in6.
            let sin6 = unsafe { &*(ss as *const sockaddr_storage).cast::<libc::sockaddr_in6>() };
            Some(Endpoint {
                ip: sin6.sin6_addr.s6_addr,
                port: u16::from_be(sin6.sin6_port),
            })
        }
        _ => None,
    }
}

/// `getsockname` (`peer` false) or `getpeername` of `fd` as an endpoint.
pub(crate) fn sock_endpoint(fd: RawFd, peer: bool) -> Option<Endpoint> {
    // SAFETY: sockaddr_storage is plain data; all zeroes is a valid value.
    let mut ss: sockaddr_storage = unsafe { std::mem::zeroed() };
    let mut len = std::mem::size_of::<sockaddr_storage>() as socklen_t;
    let p = (&mut ss as *mut sockaddr_storage).cast::<libc::sockaddr>();
    // SAFETY: `ss` and `len` are valid out-parameters of the right size.
    let r = unsafe {
        if peer {
            real::getpeername(fd, p, &mut len)
        } else {
            real::getsockname(fd, p, &mut len)
        }
    };
    if r != 0 {
        return None;
    }
    endpoint(&ss, len)
}

pub(crate) fn sockopt_int(fd: RawFd, level: c_int, name: c_int) -> Option<c_int> {
    let mut v: c_int = 0;
    let mut len = std::mem::size_of::<c_int>() as socklen_t;
    // SAFETY: `v` and `len` are valid out-parameters for an int option.
    let r = unsafe { real::getsockopt(fd, level, name, (&mut v as *mut c_int).cast(), &mut len) };
    (r == 0).then_some(v)
}

/// Whether `fd` is an AF_INET/AF_INET6 TCP socket (the only ones transparent mode takes).
pub(crate) fn is_tcp(fd: RawFd) -> bool {
    let domain = sockopt_int(fd, libc::SOL_SOCKET, libc::SO_DOMAIN);
    let ty = sockopt_int(fd, libc::SOL_SOCKET, libc::SO_TYPE);
    let proto = sockopt_int(fd, libc::SOL_SOCKET, libc::SO_PROTOCOL);
    matches!(domain, Some(libc::AF_INET | libc::AF_INET6))
        && ty == Some(libc::SOCK_STREAM)
        && proto == Some(libc::IPPROTO_TCP)
}

/// This process's network namespace (the inode of /proc/self/ns/net), 0 if unknown.
pub(crate) fn netns() -> u64 {
    use std::os::unix::fs::MetadataExt;
    static NS: std::sync::OnceLock<u64> = std::sync::OnceLock::new();
    *NS.get_or_init(|| {
        std::fs::metadata("/proc/self/ns/net")
            .map(|m| m.ino())
            .unwrap_or(0)
    })
}

/// The uid that owns the TCP socket from `local` to `remote` in this network namespace,
/// from `/proc/net/tcp` and `/proc/net/tcp6` (addresses as the kernel prints them: each
/// 32-bit word in host byte order, in hex).
pub(crate) fn tcp_socket_uid(local: &Endpoint, remote: &Endpoint) -> Option<u32> {
    let hex = |ep: &Endpoint, v6: bool| -> String {
        let words: &[u8] = if v6 { &ep.ip } else { &ep.ip[12..] };
        let mut s: String = words
            .chunks(4)
            .map(|w| format!("{:08X}", u32::from_ne_bytes([w[0], w[1], w[2], w[3]])))
            .collect();
        s.push_str(&format!(":{:04X}", ep.port));
        s
    };
    for (file, v6) in [("/proc/net/tcp", false), ("/proc/net/tcp6", true)] {
        let both_v4 = local.is_v4() && remote.is_v4();
        if !v6 && !both_v4 {
            continue; // an IPv6 connection is only in tcp6
        }
        let (l, r) = (hex(local, v6), hex(remote, v6));
        let Ok(table) = std::fs::read_to_string(file) else {
            continue;
        };
        for line in table.lines().skip(1) {
            let f: Vec<&str> = line.split_whitespace().collect();
            if f.len() > 7 && f[1] == l && f[2] == r {
                return f[7].parse().ok();
            }
        }
    }
    None
}

/// The destination of a `connect` call, if it is an IPv4/IPv6 address.
pub(crate) fn dest_of(addr: *const libc::sockaddr, len: socklen_t) -> Option<Endpoint> {
    if addr.is_null() {
        return None;
    }
    // SAFETY: sockaddr_storage is plain data; all zeroes is a valid value.
    let mut ss: sockaddr_storage = unsafe { std::mem::zeroed() };
    let n = (len as usize).min(std::mem::size_of::<sockaddr_storage>());
    // SAFETY: the caller's address holds `len` bytes; `ss` has room for `n`.
    unsafe {
        std::ptr::copy_nonoverlapping(
            addr.cast::<u8>(),
            (&mut ss as *mut sockaddr_storage).cast::<u8>(),
            n,
        )
    };
    endpoint(&ss, n as socklen_t)
}
