//! `shmlink-shm`, `shmlink-shm-blocking`, `shmlink-ux`, `shmlink-tcp`: this library's
//! transports, through its public API (`send` and `recv`, which copy like every other
//! method). The driver binds a listener and accepts; the peer connects by address. The
//! shm rings are 1 MiB per direction, like the `shm-*` methods'.

use std::io;

use shmlink::{Connection, Listener, Options, WaitPolicy};

use crate::method::{arg, Ctx, Endpoint, Method, Prepared};
use crate::sys::err;

/// Ring bytes per direction for `shm:` (the same as the `shm-*` methods).
const RING: usize = 1 << 20;

pub struct Shmlink {
    name: &'static str,
    transport: &'static str,
    wait: WaitPolicy,
}

pub const SHM: Shmlink = Shmlink {
    name: "shmlink-shm",
    transport: "shm",
    wait: WaitPolicy {
        spin: std::time::Duration::from_micros(20),
        yield_: std::time::Duration::from_micros(30),
    },
};
pub const SHM_BLOCKING: Shmlink = Shmlink {
    name: "shmlink-shm-blocking",
    transport: "shm",
    wait: WaitPolicy::BLOCKING,
};
pub const UX: Shmlink = Shmlink {
    name: "shmlink-ux",
    transport: "ux",
    wait: WaitPolicy::BLOCKING,
};
pub const TCP: Shmlink = Shmlink {
    name: "shmlink-tcp",
    transport: "tcp",
    wait: WaitPolicy::BLOCKING,
};

fn io_err(e: shmlink::Error) -> io::Error {
    io::Error::other(e.to_string())
}

struct ShmlinkEnd(Connection);

impl Endpoint for ShmlinkEnd {
    fn send(&mut self, msg: &[u8]) -> io::Result<()> {
        self.0.send(msg).map_err(io_err)
    }

    fn recv(&mut self, buf: &mut [u8]) -> io::Result<()> {
        let n = self.0.recv(buf).map_err(io_err)?;
        if n != buf.len() {
            return Err(err(format!(
                "received a {n}-byte message, expected {} bytes",
                buf.len()
            )));
        }
        Ok(())
    }
}

impl Shmlink {
    fn options(&self, c: &Ctx) -> Options {
        let default_max = Options::default().get_max_msg_size();
        let mut opts = Options::default().max_msg_size(c.size.max(default_max));
        if self.transport == "shm" {
            opts = opts.ring_size(RING).wait_policy(self.wait);
        }
        opts
    }
}

impl Method for Shmlink {
    fn name(&self) -> &'static str {
        self.name
    }

    fn about(&self) -> &'static str {
        match (self.transport, self.wait == WaitPolicy::BLOCKING) {
            ("shm", false) => "shmlink shm: transport, default wait policy (spin, yield, sleep)",
            ("shm", true) => "shmlink shm: transport, WaitPolicy::BLOCKING (always sleep)",
            ("ux", _) => "shmlink ux: transport (SOCK_SEQPACKET)",
            _ => "shmlink tcp: transport over 127.0.0.1",
        }
    }

    fn busy_polls(&self) -> bool {
        self.transport == "shm" && self.wait != WaitPolicy::BLOCKING
    }

    fn prepare(&self, c: &Ctx) -> io::Result<Prepared> {
        let addr = match self.transport {
            "tcp" => "tcp:127.0.0.1:0".to_string(),
            t => format!("{t}:{}", c.tag),
        };
        let mut listener = Listener::bind(&addr, &self.options(c)).map_err(io_err)?;
        let args = vec![listener.local_addr()];
        Ok(Prepared {
            args,
            inherit: Vec::new(),
            finish: Box::new(move || {
                let conn = listener.accept().map_err(io_err)?;
                Ok(Box::new(ShmlinkEnd(conn)) as Box<dyn Endpoint>)
            }),
        })
    }

    fn connect(&self, c: &Ctx, args: &[String]) -> io::Result<Box<dyn Endpoint>> {
        let addr = arg(args, 0, "address")?;
        let conn = Connection::connect(addr, &self.options(c)).map_err(io_err)?;
        Ok(Box::new(ShmlinkEnd(conn)))
    }
}
