//! `shmlink-shm`, `shmlink-shm-blocking`, `shmlink-ux`, `shmlink-tcp`: this library's
//! transports, through its public API (`send` and `recv`, which copy like every other
//! method), and `shmlink-shm-zc`, the zero-copy row (`reserve`/`commit` and `recv_ref`:
//! messages are generated and checked inside the ring). The driver binds a listener and
//! accepts; the peer connects by address. The `shm:` rows run on the options a user of
//! messages of that size would pass, `Options::large_messages(size)`: rings of 16
//! messages or 1 MiB, whichever is less (the default 256 KiB up to 8 KiB, 1 MiB at
//! 64 KiB), and rings whose largest record holds the message whole above (4 MiB per
//! direction for 1 MiB messages), as iceoryx2 sizes its pool for them; the other
//! rows on `Options::default()`; `max_msg_size` is raised where the size exceeds the
//! default.

use std::io;

use shmlink::{Connection, Listener, Options, WaitPolicy};

use shmlink_measure::link::{Access, ShmlinkEndpoint};

use crate::method::{arg, Ctx, Endpoint, Method, Prepared};

pub struct Shmlink {
    name: &'static str,
    transport: &'static str,
    wait: WaitPolicy,
    zero_copy: bool,
    /// The driver's sends go out in batches ([`Connection::batch`]): published once per
    /// window, or before the connection waits, instead of once per message.
    batch: bool,
}

const DEFAULT_WAIT: WaitPolicy = WaitPolicy {
    spin: std::time::Duration::from_micros(20),
    yield_: std::time::Duration::from_micros(30),
};

pub const SHM: Shmlink = Shmlink {
    name: "shmlink-shm",
    transport: "shm",
    wait: DEFAULT_WAIT,
    zero_copy: false,
    batch: false,
};
pub const SHM_ZC: Shmlink = Shmlink {
    name: "shmlink-shm-zc",
    transport: "shm",
    wait: DEFAULT_WAIT,
    zero_copy: true,
    batch: false,
};
pub const SHM_BATCH: Shmlink = Shmlink {
    name: "shmlink-shm-batch",
    transport: "shm",
    wait: DEFAULT_WAIT,
    zero_copy: false,
    batch: true,
};
pub const SHM_BLOCKING: Shmlink = Shmlink {
    name: "shmlink-shm-blocking",
    transport: "shm",
    wait: WaitPolicy::BLOCKING,
    zero_copy: false,
    batch: false,
};
pub const UX: Shmlink = Shmlink {
    name: "shmlink-ux",
    transport: "ux",
    wait: WaitPolicy::BLOCKING,
    zero_copy: false,
    batch: false,
};
pub const TCP: Shmlink = Shmlink {
    name: "shmlink-tcp",
    transport: "tcp",
    wait: WaitPolicy::BLOCKING,
    zero_copy: false,
    batch: false,
};

fn io_err(e: shmlink::Error) -> io::Error {
    io::Error::other(e.to_string())
}

/// The measurement core's endpoint over `conn`: copying, or (the zero-copy row) in
/// place, reading the peer's records where they lie.
fn endpoint(conn: Connection, zero_copy: bool, batch: bool) -> Box<dyn Endpoint> {
    if batch {
        Box::new(ShmlinkEndpoint::new(conn, Access::Copy).batched())
    } else if zero_copy {
        // SAFETY: the bench trusts its peer, the other half of this same program, to
        // leave a record alone until it is released (docs/benchmarks.md); the
        // zero-copy row measures that in-place read. A library user facing an
        // untrusted peer copies out with the safe methods instead.
        Box::new(unsafe { ShmlinkEndpoint::trusting(conn) })
    } else {
        Box::new(ShmlinkEndpoint::new(conn, Access::Copy))
    }
}

impl Shmlink {
    fn options(&self, c: &Ctx) -> Options {
        let default_max = Options::default().configured_max_msg_size();
        let mut opts = Options::default().max_msg_size(c.size.max(default_max));
        if self.transport == "shm" {
            // The documented preset for messages of this size (the default ring up to
            // 8 KiB), as iceoryx2 sizes its pool for them: in place means in one ring
            // record, and copying through it measured faster (docs/benchmarks.md).
            opts = opts.large_messages(c.size).wait_policy(self.wait);
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
            ("shm", false) if self.zero_copy => {
                "shmlink shm: zero-copy (reserve/commit, recv_ref: generated and checked in the ring)"
            }
            ("shm", false) if self.batch => {
                "shmlink shm: the driver's sends in batches (Connection::batch: one publication per window)"
            }
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
        let (zero_copy, batch) = (self.zero_copy, self.batch);
        Ok(Prepared {
            args,
            inherit: Vec::new(),
            finish: Box::new(move || {
                let conn = listener.accept().map_err(io_err)?;
                Ok(endpoint(conn, zero_copy, batch))
            }),
        })
    }

    fn connect(&self, c: &Ctx, args: &[String]) -> io::Result<Box<dyn Endpoint>> {
        let addr = arg(args, 0, "address")?;
        let conn = Connection::connect(addr, &self.options(c)).map_err(io_err)?;
        // The peer's answers and acknowledgements go one by one (the driver sends the
        // data: in a batch row, in batches).
        Ok(endpoint(conn, self.zero_copy, false))
    }
}
