//! Containers and separate hosts, emulated with Linux namespaces: the conformance suite
//! (`remote/`) between two processes that share only what the scenario grants them.
//!
//! - Containers: client and server each in PID, network, mount, IPC and UTS namespaces of
//!   their own (`unshare`), sharing nothing but a directory bind-mounted as their
//!   rendezvous directory (`SHMLINK_DIR`). `shm:` connects through it; `auto:` between two
//!   network namespaces joined by a veth pair upgrades to shared memory through it.
//! - Separate hosts: the same veth pair, but each side's rendezvous directory is an
//!   empty tmpfs of its own, so `auto:` stays on TCP (and it does too when the client's
//!   kernel looks like another one: a different boot id bind-mounted over
//!   `/proc/sys/kernel/random/boot_id`, with the directory shared).
//!
//! Root only (namespaces, mounts, `ip netns`): without root, without `unshare`, `mount` or
//! `ip`, or where they are not allowed, every test is skipped with the reason
//! (`shmlink_testkit::skip`, a failure where `SHMLINK_REQUIRE` names `netns`).
//!
//! The peers are this test binary run again as `--ignored --exact peer_main` with its
//! role in [`ROLE_VAR`], inside `unshare` (and `ip netns exec`): a shell there mounts the
//! side's rendezvous directory, then execs the peer. Peers print `SHMLINK-NS:` lines
//! (listening, each case served or passed), which the test reads with a deadline.
//!
//! Nothing outlives a test: every wait has a deadline, the guards (`ns/`) kill and reap
//! the peers (`unshare --kill-child` takes each PID namespace down with them), delete the
//! network namespaces and remove the directory, and a peer exits by itself when the test
//! process is gone (its stdin closes) or after [`PEER_DEADLINE`]. Names carry the process
//! id and a counter, so tests run in parallel and overlapping runs do not clash; what a
//! killed run left behind is removed by the next one.

mod common;
mod ns;
mod remote;

use std::io::Read;
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use ns::{unavailable, Network, Peer, TestRoot, SERVER_IP, UNSHARE};
use remote::{Addressing, Role, Transport};

/// Environment variable carrying a peer's role (`server` or `client`); absent in normal
/// test runs.
const ROLE_VAR: &str = "SHMLINK_NS_ROLE";
/// The transport's prefix (a row of [`remote::TRANSPORTS`]).
const TRANSPORT_VAR: &str = "SHMLINK_NS_TRANSPORT";
/// The transport both ends must report: `shm` or `tcp`.
const EXPECT_VAR: &str = "SHMLINK_NS_EXPECT";
/// Server: the host to bind. Client: the address to connect to.
const ADDR_VAR: &str = "SHMLINK_NS_ADDR";
/// Client: the cases to run (`all`, or names separated by commas).
const CASES_VAR: &str = "SHMLINK_NS_CASES";

/// Whole-test deadline: every wait of the test ends by then.
const TEST_DEADLINE: Duration = Duration::from_secs(150);
/// A peer gives up after this, whatever it is doing.
const PEER_DEADLINE: Duration = Duration::from_secs(140);

/// A handful of cases, for scenarios whose point is the path taken.
const QUICK: &str = "transport,echo,counters_and_addresses";

// ---------------------------------------------------------------------------------------
// The scenarios.

/// Containers sharing only a rendezvous directory: `shm:` connects through it, across
/// PID, network, mount, IPC and UTS namespaces, and passes the suite.
#[test]
fn containers_shm_passes_the_conformance_suite() {
    Scenario::containers("shm", "shm").run();
}

/// `auto:` between containers whose network namespaces are joined by a veth pair
/// upgrades to shared memory, and passes the suite on it. The directory is mounted at a
/// different path on each side: the client finds the upgrade socket in its own
/// rendezvous directory (the path the listener announced does not exist on its side).
#[test]
fn containers_auto_upgrades_to_shm_and_passes_the_conformance_suite() {
    Scenario {
        server: Side::shared("rdv-server"),
        client: Side::shared("rdv-client"),
        ..Scenario::containers("auto", "shm")
    }
    .run();
}

/// The same upgrade with the shared directory at the same path on both sides.
#[test]
fn containers_auto_upgrades_to_shm_with_the_directory_at_the_same_path() {
    Scenario {
        cases: QUICK,
        ..Scenario::containers("auto", "shm")
    }
    .run();
}

/// Separate hosts: veth, and no shared rendezvous directory (each side's is an empty
/// tmpfs of its own, at the same path, so the path the listener announces leads nowhere
/// on the client's side). `auto:` stays on TCP and passes the suite.
#[test]
fn hosts_auto_stays_on_tcp_and_passes_the_conformance_suite() {
    Scenario::hosts("auto", "tcp").run();
}

/// Plain `tcp:` between separate hosts. (Another transport is one row in
/// `remote::TRANSPORTS` and one test like this.)
#[test]
fn hosts_tcp_passes_the_conformance_suite() {
    Scenario::hosts("tcp", "tcp").run();
}

/// `tls:` between separate hosts, mutual TLS with the test certificates (made for
/// `localhost`: the client names the server so).
#[test]
fn hosts_tls_passes_the_conformance_suite() {
    Scenario::hosts("tls", "tls").run();
}

/// A client whose kernel has another boot id gets no offer: `auto:` stays on TCP even
/// though the rendezvous directory is shared.
#[test]
fn hosts_with_another_boot_id_auto_stays_on_tcp() {
    Scenario {
        server: Side::shared("rdv"),
        client: Side {
            other_boot_id: true,
            ..Side::shared("rdv")
        },
        cases: QUICK,
        ..Scenario::hosts("auto", "tcp")
    }
    .run();
}

// ---------------------------------------------------------------------------------------
// What a scenario is, and how it runs.

/// Where a side's rendezvous directory (`SHMLINK_DIR`) comes from; the name is a
/// directory under the test's root, empty on the host.
#[derive(Clone, Copy, Debug)]
enum Rendezvous {
    /// The test's shared directory, bind-mounted there in the side's mount namespace.
    Shared(&'static str),
    /// An empty tmpfs of the side's own, mounted there.
    Private(&'static str),
}

impl Rendezvous {
    fn at(self) -> &'static str {
        match self {
            Rendezvous::Shared(at) | Rendezvous::Private(at) => at,
        }
    }
}

/// How one side is set up inside its namespaces.
#[derive(Clone, Copy, Debug)]
struct Side {
    rendezvous: Rendezvous,
    /// Sees another boot id, as a process on another kernel would.
    other_boot_id: bool,
}

impl Side {
    fn shared(at: &'static str) -> Side {
        Side {
            rendezvous: Rendezvous::Shared(at),
            other_boot_id: false,
        }
    }

    fn private(at: &'static str) -> Side {
        Side {
            rendezvous: Rendezvous::Private(at),
            other_boot_id: false,
        }
    }
}

#[derive(Debug)]
struct Scenario {
    /// A row of [`remote::TRANSPORTS`].
    transport: &'static str,
    /// What both ends must report on every connection: `shm` or `tcp`.
    expect: &'static str,
    /// The sides' network namespaces are joined by a veth pair; otherwise each side has
    /// an empty network namespace of its own.
    veth: bool,
    server: Side,
    client: Side,
    /// `all`, or case names separated by commas.
    cases: &'static str,
}

impl Scenario {
    /// Containers sharing a directory, bind-mounted at the same path on both sides; a
    /// veth pair between them when the transport needs an IP network.
    fn containers(transport: &'static str, expect: &'static str) -> Scenario {
        Scenario {
            transport,
            expect,
            veth: Transport::named(transport).addressing == Addressing::Ip,
            server: Side::shared("rdv"),
            client: Side::shared("rdv"),
            cases: "all",
        }
    }

    /// Separate hosts: a veth pair, and each side's rendezvous directory its own.
    fn hosts(transport: &'static str, expect: &'static str) -> Scenario {
        Scenario {
            transport,
            expect,
            veth: true,
            server: Side::private("rdv"),
            client: Side::private("rdv"),
            cases: "all",
        }
    }

    fn run(self) {
        if let Some(why) = unavailable() {
            shmlink_testkit::skip("netns", why);
            return;
        }
        let deadline = Instant::now() + TEST_DEADLINE;
        let t = Transport::named(self.transport);
        // Dropped in reverse order: the peers first, then the network, then the files.
        let root = TestRoot::new();
        let net = self.veth.then(Network::new);
        let host = if self.veth { SERVER_IP } else { "127.0.0.1" };
        let listen = t.listen_addr(host);

        let mut server = Peer::spawn(
            Role::Server,
            self.command(Role::Server, &root, net.as_ref(), host),
        );
        let bound = server.expect_mark("listening ", deadline);
        eprintln!("{self:?}: server listening on {bound}");
        self.check_isolation(&root);

        let addr = t.client_addr(&listen, &bound);
        let mut client = Peer::spawn(
            Role::Client,
            self.command(Role::Client, &root, net.as_ref(), &addr),
        );
        let passed = client.finish(deadline);
        let served = server.finish(deadline);

        let want: Vec<String> = remote::cases(self.cases)
            .iter()
            .map(|c| c.name.to_string())
            .collect();
        let with = |verb: &str, marks: &[String]| -> Vec<String> {
            let prefix = format!("{verb} ");
            marks
                .iter()
                .filter_map(|m| m.strip_prefix(&prefix).map(str::to_string))
                .collect()
        };
        assert_eq!(with("passed", &passed), want, "cases the client passed");
        assert_eq!(with("served", &served), want, "cases the server served");
        root.check_nothing_left();
    }

    /// While the server listens, the host sees its rendezvous files only in the shared
    /// directory, and only if the server mounted it: the sides' mounts are their own.
    fn check_isolation(&self, root: &TestRoot) {
        let files = root.files();
        eprintln!("{:?}: on the host while serving: {files:?}", self.transport);
        assert!(
            files.iter().all(|f| f.starts_with("shared/")),
            "a rendezvous file outside the shared directory: {files:?}"
        );
        if let Rendezvous::Private(_) = self.server.rendezvous {
            assert!(files.is_empty(), "a private directory leaked: {files:?}");
        }
    }

    /// The command that runs `role` in its namespaces: `unshare` (inside `ip netns exec`
    /// on a veth pair) runs a shell that mounts the side's rendezvous directory and
    /// execs this test binary as the peer. `addr`: the host to bind, or the address to
    /// connect to.
    fn command(&self, role: Role, root: &TestRoot, net: Option<&Network>, addr: &str) -> Command {
        let side = match role {
            Role::Server => self.server,
            Role::Client => self.client,
        };
        let dir = root.mount_point(side.rendezvous.at());
        let mut script = String::from("set -e\n");
        match side.rendezvous {
            Rendezvous::Shared(_) => {
                script += &format!("mount --bind {} {}\n", quote(&root.shared()), quote(&dir))
            }
            Rendezvous::Private(_) => {
                script += &format!(
                    "mount -t tmpfs -o mode=0700,size=1m shmlink-ns {}\n",
                    quote(&dir)
                )
            }
        }
        if side.other_boot_id {
            script += &format!(
                "mount --bind {} /proc/sys/kernel/random/boot_id\n",
                quote(&root.boot_id())
            );
        }
        script += "exec \"$@\"\n";

        let mut cmd = match net {
            Some(net) => {
                let mut cmd = Command::new("ip");
                cmd.args(["netns", "exec", net.name(role), "unshare"]);
                cmd
            }
            None => {
                let mut cmd = Command::new("unshare");
                cmd.arg("--net");
                cmd
            }
        };
        cmd.args(UNSHARE)
            .args(["--", "sh", "-c", &script, "peer"])
            .arg(std::env::current_exe().unwrap())
            .args(["--ignored", "--exact", "peer_main", "--nocapture"])
            .args(["--test-threads=1"])
            .env(ROLE_VAR, role.name())
            .env(TRANSPORT_VAR, self.transport)
            .env(EXPECT_VAR, self.expect)
            .env(ADDR_VAR, addr)
            .env(CASES_VAR, self.cases)
            .env("SHMLINK_DIR", &dir);
        if self.transport == "tls" {
            // Both peers use this process's test certificates (each would make its own).
            let pki = common::pki();
            cmd.env(remote::TLS_CA_VAR, &pki.ca)
                .env(remote::TLS_CERT_VAR, &pki.server.cert)
                .env(remote::TLS_KEY_VAR, &pki.server.key);
        }
        cmd
    }
}

/// `s` as one single-quoted shell word.
fn quote(s: &Path) -> String {
    let s = s.to_str().expect("a UTF-8 path");
    format!("'{}'", s.replace('\'', r"'\''"))
}

// ---------------------------------------------------------------------------------------
// The peer side.

/// The peer's entry point: with [`ROLE_VAR`] set (by [`Scenario::command`]) it plays the
/// server or the client of `remote` and exits; otherwise it does nothing.
#[test]
#[ignore = "the peer of the namespace tests, which run it in their namespaces"]
fn peer_main() {
    let Ok(role) = std::env::var(ROLE_VAR) else {
        return;
    };
    exit_when_abandoned();
    let var = |name: &str| std::env::var(name).unwrap_or_else(|_| panic!("peer without {name}"));
    let t = Transport::named(&var(TRANSPORT_VAR));
    let expect = var(EXPECT_VAR);
    match role.as_str() {
        "server" => remote::serve(t, &var(ADDR_VAR), &expect),
        "client" => {
            let cases = remote::cases(&var(CASES_VAR));
            remote::run_client(t, &var(ADDR_VAR), &expect, &cases)
        }
        other => panic!("unknown peer role {other:?}"),
    }
    std::process::exit(0)
}

/// Ends this peer when the test process is gone (stdin, a pipe it holds, closes) or
/// after [`PEER_DEADLINE`].
fn exit_when_abandoned() {
    std::thread::spawn(|| {
        let _ = std::io::stdin().read_to_end(&mut Vec::new());
        eprintln!("namespace peer: the test is gone (stdin closed); exiting");
        std::process::exit(3)
    });
    std::thread::spawn(|| {
        std::thread::sleep(PEER_DEADLINE);
        eprintln!("namespace peer: not done within {PEER_DEADLINE:?}; exiting");
        std::process::exit(4)
    });
}
