//! `tcp` and `udp` over loopback (127.0.0.1). The driver makes the connected pair and the
//! peer inherits one end, so no port has to be agreed on.

use std::io;
use std::net::{Ipv4Addr, TcpListener, TcpStream, UdpSocket};
use std::os::fd::{AsRawFd, OwnedFd};

use super::fdio::{MsgEnd, StreamEnd};
use crate::method::{arg, Ctx, Endpoint, Method, Prepared, SizeLimit};
use crate::sys::{ctx, getsockopt_int, inherited_fd, setsockopt_int};

/// Largest UDP payload over IPv4 (65535 - 20 IP - 8 UDP).
const UDP_MAX: usize = 65_507;
/// Receive buffer asked for on UDP sockets.
const UDP_RCVBUF: i32 = 4 << 20;

pub struct Tcp;

impl Method for Tcp {
    fn name(&self) -> &'static str {
        "tcp"
    }

    fn about(&self) -> &'static str {
        "TCP over 127.0.0.1 with TCP_NODELAY, read/write"
    }

    fn prepare(&self, _c: &Ctx) -> io::Result<Prepared> {
        let listener =
            TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).map_err(ctx("bind 127.0.0.1:0"))?;
        let addr = listener.local_addr()?;
        let a = TcpStream::connect(addr).map_err(ctx(format!("connect {addr}")))?;
        let (b, _) = listener
            .accept()
            .map_err(ctx(format!("accept on {addr}")))?;
        a.set_nodelay(true)?;
        b.set_nodelay(true)?;
        let theirs = OwnedFd::from(b);
        let args = vec![theirs.as_raw_fd().to_string()];
        Ok(Prepared::ready(
            args,
            vec![theirs],
            StreamEnd::socket(a.into())?,
        ))
    }

    fn connect(&self, _c: &Ctx, args: &[String]) -> io::Result<Box<dyn Endpoint>> {
        Ok(Box::new(StreamEnd::socket(inherited_fd(arg(
            args,
            0,
            "socket fd",
        )?)?)?))
    }
}

pub struct Udp;

fn udp_socket() -> io::Result<UdpSocket> {
    let s = UdpSocket::bind((Ipv4Addr::LOCALHOST, 0)).map_err(ctx("bind udp 127.0.0.1:0"))?;
    for opt in [libc::SO_RCVBUF, libc::SO_SNDBUF] {
        setsockopt_int(&s, libc::SOL_SOCKET, opt, UDP_RCVBUF)
            .map_err(ctx("setsockopt(SO_RCVBUF/SO_SNDBUF)"))?;
    }
    Ok(s)
}

impl Method for Udp {
    fn name(&self) -> &'static str {
        "udp"
    }

    fn about(&self) -> &'static str {
        "UDP over 127.0.0.1 (connected sockets), send/recv; window kept within SO_RCVBUF"
    }

    fn size_limit(&self) -> Option<SizeLimit> {
        Some(SizeLimit {
            max: UDP_MAX,
            why: "IPv4 datagram",
        })
    }

    /// UDP drops what the receive buffer cannot hold: keep the messages in flight within
    /// a quarter of it (each datagram costs its size plus some overhead, "truesize").
    fn max_window(&self, size: usize) -> Option<u64> {
        let rcvbuf = udp_socket()
            .and_then(|s| getsockopt_int(&s, libc::SOL_SOCKET, libc::SO_RCVBUF))
            .unwrap_or(212_992) as usize;
        Some(((rcvbuf / 4) / (size + 1024)).max(1) as u64)
    }

    fn prepare(&self, _c: &Ctx) -> io::Result<Prepared> {
        let a = udp_socket()?;
        let b = udp_socket()?;
        a.connect(b.local_addr()?)?;
        b.connect(a.local_addr()?)?;
        let theirs = OwnedFd::from(b);
        let args = vec![theirs.as_raw_fd().to_string()];
        Ok(Prepared::ready(args, vec![theirs], MsgEnd::new(a.into())))
    }

    fn connect(&self, _c: &Ctx, args: &[String]) -> io::Result<Box<dyn Endpoint>> {
        Ok(Box::new(MsgEnd::new(inherited_fd(arg(
            args,
            0,
            "socket fd",
        )?)?)))
    }
}
