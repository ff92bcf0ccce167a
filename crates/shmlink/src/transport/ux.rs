//! The `ux:` transport: Unix `SOCK_SEQPACKET` sockets, named in the abstract namespace
//! (`ux:name`) or by a socket file (`ux:/path`).
//!
//! A packet is limited by the socket's send buffer (about 200 KiB), so messages travel as
//! fragments of at most [`FRAGMENT`] bytes, one packet each, behind a one-byte kind:
//! [`KIND_MORE`] (more fragments follow), [`KIND_LAST`] (the message is complete; a
//! zero-length message is one such packet with no payload) or [`KIND_FIN`] (graceful
//! close, no payload). The receiver reassembles fragments straight into the message's
//! buffer. Handshake, flow control and end-of-stream rules are those of
//! [`framed`](super::framed).

use std::fs;
use std::io;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use super::framed::{
    bad_data, client_handshake, recycle, take_vec, Acceptor, Frame, FramedConn, FramedListener,
    Incoming, Wire, HELLO_LEN,
};
use crate::addr::{Address, UnixName};
use crate::error::{Error, ErrorKind, Result};
use crate::options::Options;
use crate::sys::socket;
use crate::sys::stream;
use crate::transport::{ConnOps, ListenerOps, Transport};
use crate::trust;

/// The `ux:` entry in the transport registry.
pub(crate) const TRANSPORT: Transport = Transport {
    name: "ux",
    connect,
    bind,
};

/// Largest payload of one packet.
const FRAGMENT: usize = 64 << 10;
/// A fragment that completes a message.
const KIND_LAST: u8 = 1;
/// A fragment that more fragments of the same message follow.
const KIND_MORE: u8 = 2;
/// Graceful close.
const KIND_FIN: u8 = 3;

/// Listen backlog.
const BACKLOG: i32 = 128;
/// How long `bind` waits for an existing socket file's listener to answer.
const PROBE_TIMEOUT: Duration = Duration::from_millis(200);

/// Packets on a `SOCK_SEQPACKET` socket, reassembled into one vector.
struct UxWire {
    max_recv: usize,
    /// The message being reassembled, or the current one.
    msg: Vec<u8>,
    complete: bool,
}

impl Wire for UxWire {
    type Link = OwnedFd;

    fn new(max_recv: usize) -> UxWire {
        UxWire {
            max_recv,
            msg: Vec::new(),
            complete: false,
        }
    }

    fn write(
        sock: &mut OwnedFd,
        frame: Frame,
        payload: &[u8],
        sent: &mut usize,
        blocking: bool,
    ) -> io::Result<bool> {
        loop {
            // Every packet but the last carries a full fragment, so `sent` (header plus
            // payload bytes written) names the next packet.
            let start = *sent / (FRAGMENT + 1) * FRAGMENT;
            let end = (start + FRAGMENT).min(payload.len());
            let kind = match frame {
                Frame::Fin => KIND_FIN,
                Frame::Data if end == payload.len() => KIND_LAST,
                Frame::Data => KIND_MORE,
            };
            match stream::send_parts(sock.as_fd(), &[kind], &payload[start..end], blocking) {
                Ok(_) => *sent += 1 + end - start,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(false),
                Err(e) => return Err(e),
            }
            if end == payload.len() {
                return Ok(true);
            }
        }
    }

    fn read(&mut self, sock: &mut OwnedFd, blocking: bool) -> io::Result<Incoming> {
        loop {
            // Grows with the data that arrives, one fragment at a time.
            self.msg.reserve(FRAGMENT);
            let mut kind = [0u8];
            let n = match stream::recv_packet(
                sock.as_fd(),
                &mut kind,
                &mut self.msg,
                FRAGMENT,
                blocking,
            ) {
                Ok(n) => n,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(Incoming::Empty),
                // A peer that closes with unread input makes the kernel report ECONNRESET
                // once, ahead of the packets the peer sent before; read on; the FIN or the
                // end of stream behind them tells how the peer left.
                Err(e) if e.kind() == io::ErrorKind::ConnectionReset => continue,
                Err(e) => return Err(e),
            };
            if n == 0 {
                return Ok(Incoming::Eof);
            }
            if n > 1 + FRAGMENT {
                return Err(bad_data(format!(
                    "packet of {n} bytes exceeds the {}-byte fragment limit",
                    1 + FRAGMENT
                )));
            }
            if self.msg.len() > self.max_recv {
                return Err(bad_data(format!(
                    "message exceeds the maximum message size of {} bytes",
                    self.max_recv
                )));
            }
            match kind[0] {
                KIND_LAST => {
                    self.complete = true;
                    return Ok(Incoming::Message(self.msg.len()));
                }
                KIND_MORE => {}
                KIND_FIN if n == 1 && self.msg.is_empty() => return Ok(Incoming::Fin),
                KIND_FIN => {
                    return Err(bad_data(
                        "FIN packet with a payload or inside a fragmented message".into(),
                    ))
                }
                k => return Err(bad_data(format!("unknown packet kind {k:#04x}"))),
            }
        }
    }

    fn current(&self) -> &[u8] {
        if self.complete {
            &self.msg
        } else {
            &[]
        }
    }

    fn release(&mut self) {
        self.complete = false;
        recycle(&mut self.msg);
    }

    fn take_current(&mut self) -> Vec<u8> {
        self.complete = false;
        take_vec(&mut self.msg)
    }

    fn recv_hello(sock: &mut OwnedFd, got: &mut Vec<u8>) -> io::Result<usize> {
        let mut buf = [0u8; HELLO_LEN];
        let n = socket::recv(sock.as_fd(), &mut buf)?;
        if n != 0 && n != HELLO_LEN {
            return Err(bad_data(format!(
                "hello packet of {n} bytes, expected {HELLO_LEN}"
            )));
        }
        got.extend_from_slice(&buf[..n]);
        Ok(n)
    }
}

/// How an unnamed socket's end is shown: by the process behind it.
fn unnamed(pid: u32) -> String {
    format!("ux:[pid {pid}]")
}

fn connect(addr: &Address, opts: &Options) -> Result<Box<dyn ConnOps>> {
    let Address::Ux(name) = addr else {
        return Err(Error::new(
            ErrorKind::InvalidAddress,
            format!("{addr} is not a ux: address"),
        ));
    };
    let deadline = Instant::now() + opts.connect_timeout;
    let mut sock = socket::connect(name, deadline).map_err(|e| match e.kind() {
        // No socket file (or no directory for it): nobody listens there.
        io::ErrorKind::NotFound => Error::new(
            ErrorKind::ConnectionRefused,
            format!("no listener at {addr} ({e})"),
        ),
        _ => Error::io("socket connect", e),
    })?;
    trust::check_server(sock.as_fd(), opts, &format!("the listener at {addr}"))?;
    let peer_max = client_handshake::<UxWire>(&mut sock, opts, None, deadline)?;
    let conn = FramedConn::<UxWire>::new(
        sock,
        opts.max_msg_size,
        peer_max,
        unnamed(std::process::id()),
        addr.to_string(),
    )
    .map_err(|e| Error::io("set up the connection", e))?;
    Ok(Box::new(conn))
}

fn bind(addr: &Address, opts: &Options) -> Result<Box<dyn ListenerOps>> {
    let Address::Ux(name) = addr else {
        return Err(Error::new(
            ErrorKind::InvalidAddress,
            format!("{addr} is not a ux: address"),
        ));
    };
    let (sock, file) = match name {
        UnixName::Abstract(_) => (listen_abstract(name)?, None),
        UnixName::Path(path) => {
            let sock = listen_path(name, path)?;
            (sock, Some(SocketFile::of(path)?))
        }
    };
    let acceptor = UxAcceptor {
        sock,
        addr: addr.to_string(),
        _file: file,
    };
    Ok(Box::new(FramedListener::new(acceptor, opts)?))
}

fn listen_abstract(name: &UnixName) -> Result<OwnedFd> {
    socket::listen(name, BACKLOG).map_err(|e| {
        if e.kind() == io::ErrorKind::AddrInUse {
            Error::new(
                ErrorKind::AddrInUse,
                "another socket holds this abstract name",
            )
        } else {
            Error::io("socket bind", e)
        }
    })
}

/// Binds a socket file. A file left behind by a listener that died is replaced; a live
/// listener (one that accepts a connection) is left alone.
fn listen_path(name: &UnixName, path: &Path) -> Result<OwnedFd> {
    match socket::listen(name, BACKLOG) {
        Err(e) if e.kind() == io::ErrorKind::AddrInUse => {}
        res => return res.map_err(|e| Error::io("socket bind", e)),
    }
    let in_use = |why: &str| Error::new(ErrorKind::AddrInUse, why.to_string());
    let meta = fs::symlink_metadata(path).map_err(|e| Error::io("inspect the existing file", e))?;
    if !meta.file_type().is_socket() {
        return Err(in_use("the path exists and is not a socket"));
    }
    match socket::connect(name, Instant::now() + PROBE_TIMEOUT) {
        Ok(_) => return Err(in_use("a live listener already serves this path")),
        // Its listen backlog stays full: alive, just busy.
        Err(e) if e.kind() == io::ErrorKind::TimedOut => {
            return Err(in_use("a live listener already serves this path"))
        }
        Err(e) if e.kind() == io::ErrorKind::ConnectionRefused => {}
        Err(e) => return Err(Error::io("probe the existing socket file", e)),
    }
    match fs::remove_file(path) {
        Ok(()) => {}
        Err(e) if e.kind() == io::ErrorKind::NotFound => {}
        Err(e) => return Err(Error::io("remove the stale socket file", e)),
    }
    socket::listen(name, BACKLOG).map_err(|e| Error::io("socket bind", e))
}

/// The socket file a listener created; removed when the listener goes, unless another
/// listener has replaced it meanwhile.
struct SocketFile {
    path: PathBuf,
    dev: u64,
    ino: u64,
}

impl SocketFile {
    fn of(path: &Path) -> Result<SocketFile> {
        let meta =
            fs::symlink_metadata(path).map_err(|e| Error::io("inspect the socket file", e))?;
        Ok(SocketFile {
            path: path.to_path_buf(),
            dev: meta.dev(),
            ino: meta.ino(),
        })
    }
}

impl Drop for SocketFile {
    fn drop(&mut self) {
        if let Ok(meta) = fs::symlink_metadata(&self.path) {
            if meta.dev() == self.dev && meta.ino() == self.ino {
                let _ = fs::remove_file(&self.path);
            }
        }
    }
}

/// A listening `SOCK_SEQPACKET` socket.
struct UxAcceptor {
    sock: OwnedFd,
    addr: String,
    /// Removes the socket file on drop (path listeners only).
    _file: Option<SocketFile>,
}

impl Acceptor for UxAcceptor {
    type Wire = UxWire;

    fn listen_fd(&self) -> BorrowedFd<'_> {
        self.sock.as_fd()
    }

    fn accept(&mut self) -> io::Result<Option<(OwnedFd, String)>> {
        let Some(sock) = socket::accept(self.sock.as_fd())? else {
            return Ok(None);
        };
        let peer = match socket::peer_cred(sock.as_fd()) {
            Ok(cred) => unnamed(cred.pid as u32),
            Err(_) => "ux:[unnamed]".to_string(),
        };
        Ok(Some((sock, peer)))
    }

    fn local_addr(&self) -> String {
        self.addr.clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sync::{AtomicUsize, Ordering};
    use crate::sys::stream::Ready;
    use crate::transport::framed::conformance::{self, soon, RawPeer, PATIENCE};
    use crate::Listener;
    use std::thread;

    fn unique() -> String {
        static NEXT: AtomicUsize = AtomicUsize::new(0);
        format!(
            "shmlink-test-{}-{}",
            std::process::id(),
            NEXT.fetch_add(1, Ordering::Relaxed)
        )
    }

    /// Peers that never read cannot pile up the threads that finish dropped connections:
    /// at most MAX_CLOSE_THREADS at once, and they end when the peers go away.
    #[test]
    fn dropped_connections_to_silent_peers_use_a_bounded_number_of_threads() {
        let addr = abstract_addr();
        let mut l = Listener::bind(&addr, &Options::default()).unwrap();
        let mut clients = Vec::new();
        let mut most = 0;
        for _ in 0..300 {
            let a = addr.clone();
            let c = thread::spawn(move || crate::Connection::connect(&a, &Options::default()));
            let mut server = l.accept().unwrap();
            clients.push(c.join().unwrap().unwrap());
            server.set_nonblocking(true);
            let chunk = vec![0u8; 64 << 10];
            // Fill the socket, and the connection's own queue behind it.
            while server.send(&chunk).is_ok() {}
            drop(server);
            most = most.max(crate::transport::framed::close_threads());
        }
        assert!(most > 0, "no dropped connection needed a closing thread");
        eprintln!("at most {most} closing threads for 300 dropped connections");
        assert!(most <= 256, "{most} closing threads at once");
        drop(clients);
        let deadline = Instant::now() + PATIENCE;
        while crate::transport::framed::close_threads() != 0 {
            assert!(
                Instant::now() < deadline,
                "closing threads outlived their peers"
            );
            thread::sleep(std::time::Duration::from_millis(5));
        }
    }

    fn abstract_addr() -> String {
        format!("ux:{}", unique())
    }

    fn path_addr() -> String {
        format!("ux:{}", std::env::temp_dir().join(unique()).display())
    }

    /// Runs a conformance test on an abstract name and on a socket file.
    fn on_both(test: impl Fn(&str)) {
        test(&abstract_addr());
        test(&path_addr());
    }

    fn name_of(addr: &str) -> UnixName {
        match Address::parse(addr).unwrap() {
            Address::Ux(name) => name,
            other => panic!("{other} is not a ux: address"),
        }
    }

    /// A raw `SOCK_SEQPACKET` client.
    struct RawUx(OwnedFd);

    impl RawPeer for RawUx {
        fn connect(addr: &str) -> RawUx {
            RawUx(socket::connect(&name_of(addr), Instant::now() + PATIENCE).unwrap())
        }

        fn write(&mut self, bytes: &[u8]) {
            assert_eq!(socket::send(self.0.as_fd(), bytes).unwrap(), bytes.len());
        }

        fn read_hello(&mut self) -> Option<[u8; HELLO_LEN]> {
            assert!(stream::wait(self.0.as_fd(), Ready::Read, soon()).unwrap());
            let mut h = [0u8; HELLO_LEN];
            match socket::recv(self.0.as_fd(), &mut h).unwrap() {
                0 => None,
                HELLO_LEN => Some(h),
                n => panic!("hello of {n} bytes"),
            }
        }

        fn closed_by_peer(&mut self) -> bool {
            let deadline = soon();
            let mut buf = [0u8; 64];
            while stream::wait(self.0.as_fd(), Ready::Read, deadline).unwrap() {
                match socket::recv(self.0.as_fd(), &mut buf) {
                    Ok(0) => return true,
                    Ok(_) => {}
                    Err(e) if e.kind() == io::ErrorKind::ConnectionReset => return true,
                    Err(e) => panic!("{e}"),
                }
            }
            false
        }

        fn frame(kind: Frame, payload: &[u8]) -> Vec<u8> {
            let kind = match kind {
                Frame::Data => KIND_LAST,
                Frame::Fin => KIND_FIN,
            };
            [&[kind][..], payload].concat()
        }
    }

    #[test]
    fn bad_clients_are_dropped() {
        on_both(conformance::bad_clients_are_dropped::<RawUx>);
    }

    #[test]
    fn garbage_is_dropped_at_once() {
        conformance::garbage_is_dropped_at_once::<RawUx>(&abstract_addr());
    }

    #[test]
    fn other_version_is_told_and_dropped() {
        conformance::other_version_is_told_and_dropped::<RawUx>(&abstract_addr());
    }

    #[test]
    fn fin_versus_crash() {
        on_both(conformance::fin_versus_crash::<RawUx>);
    }

    #[test]
    fn messages_behind_the_hello_are_delivered() {
        on_both(conformance::messages_behind_the_hello_are_delivered::<RawUx>);
    }

    #[test]
    fn hostile_packets() {
        let big = [[KIND_LAST].as_slice(), &[0; 1001]].concat();
        let half = [[KIND_MORE].as_slice(), &[0; 600]].concat();
        let half_last = [[KIND_LAST].as_slice(), &[0; 600]].concat();
        let oversized = [[KIND_MORE].as_slice(), &[0; FRAGMENT + 1]].concat();
        conformance::hostile_frames::<RawUx>(
            &abstract_addr(),
            &[
                &[&big],
                &[&half, &half_last],
                &[&oversized],
                &[&[0x7f, 1, 2]],
                &[&[KIND_FIN, 1]],
                &[&[KIND_MORE, 1], &[KIND_FIN]],
            ],
        );
    }

    #[test]
    fn client_checks_listener_hello() {
        conformance::client_checks_listener_hello(|reply| {
            let addr = abstract_addr();
            let listener = socket::listen(&name_of(&addr), 1).unwrap();
            let server = thread::spawn(move || {
                assert!(stream::wait(listener.as_fd(), Ready::Read, soon()).unwrap());
                let mut raw = RawUx(socket::accept(listener.as_fd()).unwrap().unwrap());
                raw.read_hello().expect("client hello");
                if !reply.is_empty() {
                    raw.write(&reply);
                    assert!(raw.closed_by_peer());
                }
            });
            (addr, server)
        });
    }

    #[test]
    fn addresses_name_both_ends() {
        let addr = path_addr();
        let (listener, client, server) = conformance::pair(&addr, &Options::default());
        assert_eq!(listener.local_addr(), addr);
        assert_eq!(client.peer_addr(), addr);
        assert_eq!(server.local_addr(), addr);
        let me = format!("ux:[pid {}]", std::process::id());
        assert_eq!(client.local_addr(), me);
        assert_eq!(server.peer_addr(), me);
        assert_eq!(client.transport(), crate::Transport::Ux);
    }

    #[test]
    fn a_name_serves_one_listener() {
        let addr = abstract_addr();
        let _first = Listener::bind(&addr, &Options::default()).unwrap();
        let e = Listener::bind(&addr, &Options::default()).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::AddrInUse, "{e}");
        assert!(e.to_string().contains(&addr), "{e}");

        let addr = path_addr();
        let first = Listener::bind(&addr, &Options::default()).unwrap();
        let e = Listener::bind(&addr, &Options::default()).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::AddrInUse, "{e}");
        drop(first);
        // Probing the live listener did not disturb it, and its file went with it.
        assert!(!Path::new(&addr["ux:".len()..]).exists());
    }

    #[test]
    fn stale_socket_files_are_replaced() {
        let addr = path_addr();
        drop(socket::listen(&name_of(&addr), 1).unwrap());
        let path = PathBuf::from(&addr["ux:".len()..]);
        assert!(path.exists(), "the dead listener's file stays behind");
        let (listener, mut client, mut server) = conformance::pair(&addr, &Options::default());
        client.send(b"ok").unwrap();
        assert_eq!(server.recv_vec().unwrap(), b"ok");
        drop(listener);
        assert!(!path.exists());
    }

    #[test]
    fn other_files_are_never_removed() {
        let addr = path_addr();
        let path = PathBuf::from(&addr["ux:".len()..]);
        fs::write(&path, b"precious").unwrap();
        let e = Listener::bind(&addr, &Options::default()).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::AddrInUse, "{e}");
        assert_eq!(fs::read(&path).unwrap(), b"precious");
        fs::remove_file(&path).unwrap();

        // A listener whose file was replaced leaves the new one alone.
        let first = Listener::bind(&addr, &Options::default()).unwrap();
        fs::remove_file(&path).unwrap();
        let second = Listener::bind(&addr, &Options::default()).unwrap();
        drop(first);
        assert!(path.exists());
        drop(second);
        assert!(!path.exists());
    }
}
