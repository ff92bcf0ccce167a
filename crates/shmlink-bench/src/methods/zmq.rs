//! `zmq-ipc`, `zmq-tcp`: ZeroMQ `ZMQ_PAIR` sockets (libzmq, through the `zmq` crate) over
//! `ipc://` (a Unix socket file in the temp directory, named after the run's tag) and
//! `tcp://127.0.0.1` (a port the kernel picks, read back with `ZMQ_LAST_ENDPOINT`).
//!
//! A PAIR socket carries whole messages both ways, one peer, no routing. The driver binds
//! and the peer connects; the peer then sends one empty hello, which the driver's
//! [`Prepared::finish`] waits for, so connecting is not part of the run and the `ipc://`
//! socket file is removed as soon as the peer is in. Both high-water marks are off: the
//! drivers' window is the only flow control, so neither the ping-pong nor a window of
//! messages in flight ever waits on, or loses a message in, ZeroMQ's queues.
//!
//! libzmq's I/O thread is not pinned with the process: it runs on every CPU the process
//! had before the run pinned it ([`crate::sys::unpinned_cpus`]), as in libzmq's own perf
//! tools, which pin nothing (it used to inherit the one CPU of the thread it serves).
//!
//! Built with the `zmq` cargo feature, on by default (the `zmq` crate compiles libzmq
//! from the sources it ships). Without it both methods are listed and skipped, with the
//! reason.

use std::io;

use crate::method::{Ctx, Endpoint, Method, Prepared};

/// The two transports, named by the parent and by the implementation below it.
mod transport {
    #[derive(Clone, Copy, Debug, PartialEq, Eq)]
    pub(super) enum Transport {
        Ipc,
        Tcp,
    }
}
use transport::Transport;

pub struct Zmq {
    name: &'static str,
    transport: Transport,
}

pub const IPC: Zmq = Zmq {
    name: "zmq-ipc",
    transport: Transport::Ipc,
};
pub const TCP: Zmq = Zmq {
    name: "zmq-tcp",
    transport: Transport::Tcp,
};

impl Method for Zmq {
    fn name(&self) -> &'static str {
        self.name
    }

    fn about(&self) -> &'static str {
        match self.transport {
            Transport::Ipc => "ZeroMQ 4.x PAIR sockets over ipc:// (libzmq)",
            Transport::Tcp => "ZeroMQ 4.x PAIR sockets over tcp://127.0.0.1 (libzmq)",
        }
    }

    fn unavailable(&self) -> Option<String> {
        imp::unavailable(self.transport)
    }

    fn prepare(&self, c: &Ctx) -> io::Result<Prepared> {
        imp::prepare(self.transport, c)
    }

    fn connect(&self, _c: &Ctx, args: &[String]) -> io::Result<Box<dyn Endpoint>> {
        imp::connect(args)
    }
}

#[cfg(feature = "zmq")]
pub(crate) mod imp {
    use std::io;
    use std::path::PathBuf;

    use super::transport::Transport;
    use crate::method::{arg, Ctx, Endpoint, Prepared};
    use crate::sys::{ctx, err, unpinned_cpus, with_cpus};

    /// How long the driver waits for the peer's hello, in ms.
    const HELLO_TIMEOUT_MS: i32 = 10_000;
    /// `ZMQ_LINGER`: how long closing a socket may wait for messages still queued, in ms.
    /// Nothing the run needs is queued then (the driver reads the peer's report, sent after
    /// STOP arrived, before it closes), and the default (-1, forever) would let a peer
    /// that died with messages queued for it hang the exit.
    const LINGER_MS: i32 = 1_000;

    pub(super) fn unavailable(transport: Transport) -> Option<String> {
        if transport == Transport::Ipc && zmq::has("ipc") == Some(false) {
            let (major, minor, patch) = zmq::version();
            return Some(format!(
                "libzmq {major}.{minor}.{patch} was built without the ipc:// transport \
                 (zmq_has(\"ipc\") is false)"
            ));
        }
        None
    }

    /// Maps a libzmq error to an `io::Error` with what was being done in front.
    pub(crate) fn zerr(what: impl std::fmt::Display) -> impl FnOnce(zmq::Error) -> io::Error {
        move |e| ctx(what)(e.into())
    }

    /// A PAIR socket with no high-water marks and a bounded linger.
    fn pair() -> io::Result<zmq::Socket> {
        socket(zmq::PAIR, "ZMQ_PAIR")
    }

    /// A socket of `kind` (named `what` in errors) with no high-water marks and a
    /// bounded linger.
    pub(crate) fn socket(kind: zmq::SocketType, what: &str) -> io::Result<zmq::Socket> {
        // The socket keeps its context alive; one context (one I/O thread) per socket.
        // libzmq starts the context's I/O thread (and its reaper) in the first
        // zmq_socket, with the calling thread's CPU mask: the CPUs the process had before
        // the run pinned it, not the one CPU of the calling thread (the I/O thread would
        // otherwise share it with the thread it serves). libzmq's own perf tools pin
        // nothing; docs/benchmarks.md.
        let s = with_cpus(&unpinned_cpus(), || zmq::Context::new().socket(kind))
            .map_err(ctx(format!("start the I/O thread of {what}")))?
            .map_err(zerr(format!("zmq_socket({what})")))?;
        s.set_sndhwm(0).map_err(zerr("set ZMQ_SNDHWM"))?;
        s.set_rcvhwm(0).map_err(zerr("set ZMQ_RCVHWM"))?;
        s.set_linger(LINGER_MS).map_err(zerr("set ZMQ_LINGER"))?;
        Ok(s)
    }

    /// The `ipc://` socket file of a bound socket, removed on drop (libzmq leaves it).
    pub(crate) struct SocketFile(pub(crate) PathBuf);

    impl Drop for SocketFile {
        fn drop(&mut self) {
            let _ = std::fs::remove_file(&self.0);
        }
    }

    pub(super) fn prepare(transport: Transport, c: &Ctx) -> io::Result<Prepared> {
        let socket = pair()?;
        let (endpoint, path) = match transport {
            Transport::Ipc => {
                let path = std::env::temp_dir().join(format!("{}.zmq", c.tag));
                (format!("ipc://{}", path.display()), Some(path))
            }
            // `*`: libzmq binds port 0, the kernel picks a free port.
            Transport::Tcp => ("tcp://127.0.0.1:*".to_string(), None),
        };
        socket
            .bind(&endpoint)
            .map_err(zerr(format!("bind {endpoint}")))?;
        let file = path.map(SocketFile);
        let bound = socket
            .get_last_endpoint()
            .map_err(zerr(format!("ZMQ_LAST_ENDPOINT of {endpoint}")))?
            .map_err(|_| err(format!("ZMQ_LAST_ENDPOINT of {endpoint} is not UTF-8")))?;
        let args = vec![bound.clone()];
        let finish = move || -> io::Result<Box<dyn Endpoint>> {
            let hello = hello(&socket, &bound);
            // The peer is connected (or will not be): nobody needs the file any more.
            drop(file);
            hello?;
            Ok(Box::new(ZmqEnd(socket)))
        };
        Ok(Prepared {
            args,
            inherit: Vec::new(),
            finish: Box::new(finish),
        })
    }

    /// Waits for the peer's empty hello on `endpoint`, for at most [`HELLO_TIMEOUT_MS`].
    fn hello(socket: &zmq::Socket, endpoint: &str) -> io::Result<()> {
        socket
            .set_rcvtimeo(HELLO_TIMEOUT_MS)
            .map_err(zerr("set ZMQ_RCVTIMEO"))?;
        match retry(|| socket.recv_into(&mut [], 0)) {
            Ok(0) => {}
            Ok(n) => {
                return Err(err(format!(
                    "the peer's hello on {endpoint} has {n} bytes, expected none"
                )))
            }
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                return Err(err(format!(
                    "no hello from the peer on {endpoint} within {} s",
                    HELLO_TIMEOUT_MS / 1000
                )))
            }
            Err(e) => return Err(ctx(format!("receive the peer's hello on {endpoint}"))(e)),
        }
        socket.set_rcvtimeo(-1).map_err(zerr("set ZMQ_RCVTIMEO"))
    }

    pub(super) fn connect(args: &[String]) -> io::Result<Box<dyn Endpoint>> {
        let endpoint = arg(args, 0, "endpoint")?;
        let socket = pair()?;
        socket
            .connect(endpoint)
            .map_err(zerr(format!("connect {endpoint}")))?;
        // Queued at once (a connecting PAIR socket has its pipe before the connection is
        // up); the driver waits for it.
        retry(|| socket.send(&[][..], 0)).map_err(ctx(format!("send hello to {endpoint}")))?;
        Ok(Box::new(ZmqEnd(socket)))
    }

    /// Repeats a call that a signal interrupted (`EINTR`).
    fn retry<T>(mut call: impl FnMut() -> zmq::Result<T>) -> io::Result<T> {
        loop {
            match call() {
                Err(zmq::Error::EINTR) => continue,
                res => return res.map_err(io::Error::from),
            }
        }
    }

    struct ZmqEnd(zmq::Socket);

    impl Endpoint for ZmqEnd {
        fn send(&mut self, msg: &[u8]) -> io::Result<()> {
            // One ZeroMQ message: all of `msg` or an error.
            retry(|| self.0.send(msg, 0))
        }

        fn recv(&mut self, buf: &mut [u8]) -> io::Result<()> {
            // zmq_recv returns the message's full length, also when it truncated it.
            let n = retry(|| self.0.recv_into(buf, 0))?;
            if n != buf.len() {
                return Err(err(format!(
                    "received a {n}-byte message, expected {} bytes",
                    buf.len()
                )));
            }
            Ok(())
        }
    }
}

#[cfg(not(feature = "zmq"))]
mod imp {
    use std::io;

    use super::transport::Transport;
    use crate::method::{Ctx, Endpoint, Prepared};
    use crate::sys::err;

    const REASON: &str = "built without the `zmq` feature (it is on by default; this \
                          build used --no-default-features)";

    pub fn unavailable(_transport: Transport) -> Option<String> {
        Some(REASON.to_string())
    }

    pub fn prepare(_transport: Transport, _c: &Ctx) -> io::Result<Prepared> {
        Err(err(REASON))
    }

    pub fn connect(_args: &[String]) -> io::Result<Box<dyn Endpoint>> {
        Err(err(REASON))
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};

    use super::*;
    use crate::method::Mode;

    /// A run's parameters with a tag of its own (tests run in parallel).
    fn ctx(name: &str) -> Ctx {
        static SERIAL: AtomicUsize = AtomicUsize::new(0);
        let serial = SERIAL.fetch_add(1, Ordering::Relaxed);
        Ctx {
            size: 64,
            mode: Mode::Throughput,
            window: 64,
            same_core: false,
            tag: format!("shmlink-bench-unit-{name}-{}-{serial}", std::process::id()),
        }
    }

    #[cfg(not(feature = "zmq"))]
    #[test]
    fn without_the_feature_both_methods_say_how_to_get_them() {
        for m in [&IPC, &TCP] {
            let reason = m.unavailable().expect("unavailable without the feature");
            assert!(reason.contains("--no-default-features"), "{reason}");
            let e = m.prepare(&ctx(m.name())).err().expect("prepare fails");
            assert_eq!(e.to_string(), reason);
        }
    }

    /// Both ends in this process: connect, then finish (the peer's hello is queued).
    #[cfg(feature = "zmq")]
    fn connected(m: &Zmq) -> (Box<dyn Endpoint>, Box<dyn Endpoint>, String) {
        assert_eq!(m.unavailable(), None);
        let c = ctx(m.name());
        let prepared = m.prepare(&c).unwrap();
        let endpoint = prepared.args[0].clone();
        let peer = m.connect(&c, &prepared.args).unwrap();
        let driver = (prepared.finish)().unwrap();
        (driver, peer, endpoint)
    }

    #[cfg(feature = "zmq")]
    #[test]
    fn messages_keep_their_boundaries_both_ways() {
        for m in [&IPC, &TCP] {
            let (mut a, mut b, _) = connected(m);
            // Ping-pong at several sizes, then a window of 200 in flight.
            for size in [8, 1000, 1 << 20] {
                let msg: Vec<u8> = (0..size).map(|i| i as u8).collect();
                let mut buf = vec![0u8; size];
                a.send(&msg).unwrap();
                b.recv(&mut buf).unwrap();
                assert_eq!(buf, msg, "{} {size} B", m.name());
                b.send(&buf).unwrap();
                buf.fill(0);
                a.recv(&mut buf).unwrap();
                assert_eq!(buf, msg, "{} {size} B back", m.name());
            }
            for seq in 0u64..200 {
                a.send(&seq.to_le_bytes()).unwrap();
            }
            let mut buf = [0u8; 8];
            for seq in 0u64..200 {
                b.recv(&mut buf).unwrap();
                assert_eq!(u64::from_le_bytes(buf), seq, "{}", m.name());
            }
        }
    }

    #[cfg(feature = "zmq")]
    #[test]
    fn a_message_of_another_length_is_an_error() {
        for m in [&IPC, &TCP] {
            let (mut a, mut b, _) = connected(m);
            a.send(&[7u8; 12]).unwrap();
            let e = b.recv(&mut [0u8; 8]).unwrap_err();
            assert!(e.to_string().contains("12-byte message, expected 8"), "{e}");
            a.send(&[7u8; 4]).unwrap();
            let e = b.recv(&mut [0u8; 8]).unwrap_err();
            assert!(e.to_string().contains("4-byte message, expected 8"), "{e}");
        }
    }

    /// The tids of this process's threads named `name` (`comm`), but the caller's.
    #[cfg(feature = "zmq")]
    fn threads_named(name: &str) -> Vec<String> {
        let own = std::fs::read_link("/proc/thread-self").unwrap();
        let own = own.file_name().unwrap().to_string_lossy().into_owned();
        std::fs::read_dir("/proc/self/task")
            .unwrap()
            .filter_map(|e| {
                let tid = e.ok()?.file_name().into_string().ok()?;
                let comm = std::fs::read_to_string(format!("/proc/self/task/{tid}/comm")).ok()?;
                (comm.trim_end() == name && tid != own).then_some(tid)
            })
            .collect()
    }

    /// The CPUs thread `tid` of this process may run on.
    #[cfg(feature = "zmq")]
    fn cpus_of(tid: &str) -> Option<Vec<usize>> {
        cpus_in(&format!("/proc/self/task/{tid}/status"))
    }

    /// The CPUs a thread may run on, from its `status` file.
    #[cfg(feature = "zmq")]
    fn cpus_in(status_file: &str) -> Option<Vec<usize>> {
        let status = std::fs::read_to_string(status_file).ok()?;
        let list = status
            .lines()
            .find_map(|l| l.strip_prefix("Cpus_allowed_list:"))?;
        shmlink_measure::cpus::parse_cpu_list(list.trim())
    }

    /// libzmq's threads (its I/O thread and reaper), started by a context's first socket,
    /// are not pinned with the pinned thread that creates it: they get the CPUs the
    /// process had. (They inherit the creating thread's name, here `zmq-affinity`.)
    #[cfg(feature = "zmq")]
    #[test]
    fn the_io_thread_is_not_pinned_with_its_caller() {
        let all = crate::sys::unpinned_cpus();
        if all.len() < 2 {
            shmlink_testkit::skip("cpus", "one CPU allowed: nothing to pin apart");
            return;
        }
        const NAME: &str = "zmq-affinity";
        std::thread::Builder::new()
            .name(NAME.into())
            .spawn(move || {
                crate::sys::pin(Some(all[0])).unwrap();
                assert!(threads_named(NAME).is_empty());
                let socket = imp::socket(zmq::PAIR, "ZMQ_PAIR").unwrap();
                let started = threads_named(NAME);
                assert!(!started.is_empty(), "libzmq started no thread");
                for tid in started {
                    assert_eq!(cpus_of(&tid).as_ref(), Some(&all), "libzmq's thread {tid}");
                }
                // The caller itself stays pinned.
                assert_eq!(cpus_of_self(), Some(vec![all[0]]));
                drop(socket);
            })
            .unwrap()
            .join()
            .unwrap();
    }

    /// The CPUs the calling thread may run on.
    #[cfg(feature = "zmq")]
    fn cpus_of_self() -> Option<Vec<usize>> {
        cpus_in("/proc/thread-self/status")
    }

    #[cfg(feature = "zmq")]
    #[test]
    fn endpoints_are_the_bound_ones_and_the_ipc_file_goes_away() {
        let (_a, _b, endpoint) = connected(&IPC);
        let path = endpoint.strip_prefix("ipc://").expect(&endpoint);
        assert!(path.ends_with(".zmq"), "{endpoint}");
        assert!(!std::path::Path::new(path).exists(), "{path} left behind");
        let (_a, _b, endpoint) = connected(&TCP);
        let port = endpoint.strip_prefix("tcp://127.0.0.1:").expect(&endpoint);
        assert_ne!(port.parse::<u16>().unwrap(), 0);
    }
}
