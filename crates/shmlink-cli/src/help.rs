//! The help texts.

pub const TOP_HELP: &str = "\
shmlink: fast, reliable messaging between processes that share a Linux kernel.

Usage: shmlink <COMMAND> [ARGS]

Commands:
  pong     measure latency and throughput between two processes
  ls       list the listeners under a rendezvous directory and their connections
  help     print this help, or a command's help (shmlink help pong)

Options:
  -h, --help     print help
  -V, --version  print the version
";

pub const PONG_HELP: &str = "\
Measure round-trip latency or streaming throughput between two processes.

Usage: shmlink pong [--server | --client] [--latency] [-m SIZE] [-n COUNT] [-w WINDOW]
                    [--cpus A,B|none] [--ring-size SIZE] [--spin-us N] [--json]
                    [--cert FILE --key FILE] [--ca FILE] [--shared-dir] [ADDR...]

Roles:
  (neither)        run both ends: for each ADDR, start a server as a separate process
                   (this program re-executed with --server; it dies with this one), run
                   the client against it, and print one row per ADDR
  --server         serve ADDR (exactly one) until stopped, one client after another; the
                   run's parameters come from each client. SIGTERM or SIGINT (Ctrl-C)
                   removes the socket file and exits 0
  --client         run against servers already listening on each ADDR (connecting is
                   retried for 10 s while nobody listens yet)

Addresses: shm:NAME, shm:/path.sock, shm:@name, ux:NAME, ux:/path, tcp:HOST:PORT,
  tls:HOST:PORT, auto:HOST:PORT (TCP, or TLS with --cert/--key/--ca, upgraded to shm
  when both ends share a kernel and the rendezvous directory; the transport column says
  which). Without ADDR both ends run on shm:pong-PID ux:pong-PID tcp:127.0.0.1:0 (port 0,
  also on tls: and auto:: the server picks a free port and tells the client).

Rendezvous directory (shm:NAME: $SHMLINK_DIR, else $XDG_RUNTIME_DIR/shmlink, else
  /tmp/shmlink-UID): refused when it is a symbolic link, belongs to another uid than
  this one or root, or other users may write it, because they could replace its sockets.
  --shared-dir     the directory is shared on purpose (a volume several containers or
                   uids mount, e.g. a Kubernetes emptyDir, mode 0777): accept any owner
                   and mode. The peer's uid is still checked on both sides

TLS (tls: addresses; PEM files; when pong runs both ends, both use the same files):
  --cert FILE      this end's certificate chain; with --key. A server needs them; a
                   client presents them to a server that asks (mutual TLS)
  --key FILE       the private key of --cert
  --ca FILE        the CA certificates trusted to sign the peer's certificate: a client
                   needs it (the server's certificate must also be valid for HOST); a
                   server with it requires client certificates

Measurement:
  --latency        one message in flight: the client sends, the server answers with a
                   message of the same size; prints round-trip percentiles (p50, p90,
                   p99, p99.9, max) over COUNT messages after a warm-up
  (default)        throughput: the client streams COUNT messages keeping at most WINDOW
                   unacknowledged (the server acknowledges cumulatively every WINDOW/2
                   messages); prints messages/s and bytes/s from the first measured
                   message to the acknowledgement of the last
  -m, --size SIZE  bytes per message [default: 64]; suffixes are binary: 1k = 1K = 1KiB
                   = 1024, 1M = 1MiB, 1G = 1GiB; at most 1GiB
  -n, --count N    measured messages [default: latency min(20000, max(50, 1GiB/SIZE)),
                   throughput min(500000, max(100, 4GiB/SIZE))]; a warm-up of
                   min(1000, COUNT/10) messages goes before them and is not measured
  -w, --window N   messages in flight in throughput mode [default: 64]
  --cpus A,B       pin the client to CPU A and the server to CPU B; A = B measures
                   same-core; `none` does not pin [default: 0,1 when there are at least
                   2 CPUs, else none]
  --ring-size SIZE ring bytes per direction for shm: (power of two, 4KiB..1GiB)
                   [default: the library's, 256KiB]
  --spin-us N      how long a waiting end busy-polls, and then yields, before it sleeps
                   (both budgets N microseconds); 0 = always sleep (blocking policy)
                   [default: the library's, 20 us spin + 30 us yield]
  --json           print one JSON object per run, one per line, with the fields
                   transport, size, count, window, rtt_ns {p50,p90,p99,p999,max},
                   msgs_per_s, bytes_per_s, cpu_us_per_msg {client,server}
                   (latency fields null in throughput mode and the other way round;
                   window is 1 in latency mode)
  -h, --help       print this help

Every message is verified: it carries its sequence number and a 64-bit checksum over the
whole payload, which the receiver recomputes; messages under 16 bytes are compared byte
for byte (a 1-byte message carries the low byte of the sequence number). A mismatch
aborts the run. Round-trip times include writing and verifying every byte on both ends.
CPU per message is user + system time (getrusage) of each process over the measured
part, divided by COUNT (per round trip in latency mode); the server reports its own.

Exit status: 0 on success, 1 if a run failed, 2 on bad arguments.
";

pub const LS_HELP: &str = "\
List the listeners under a rendezvous directory and their live connections, with
message and byte counters (like XCM's xcmctl).

Usage: shmlink ls [DIR] [--json] [--timeout MS]

  DIR            the directory to scan [default: the rendezvous directory: $SHMLINK_DIR,
                 else $XDG_RUNTIME_DIR/shmlink, else /tmp/shmlink-<uid>]
  --json         print one JSON object: {\"dir\", \"listeners\": [...]}, each listener
                 with path, state (answered, not_answering, stale, permission_denied,
                 error), reason, pid, uid, gid, address, transport, over, started_unix_ms,
                 age_ms, truncated and connections [{transport, peer_pid, peer_uid,
                 peer_gid, peer_addr, accepted_unix_ms, age_ms, msgs_in, msgs_out,
                 bytes_in, bytes_out}] (null where unknown)
  --timeout MS   how long to wait for the listeners' answers, all asked at once
                 [default: 500]
  -h, --help     print this help

Every socket (*.sock) in DIR is asked over the socket itself; nothing else of a
connection can be found by name. The kernel tells the listening process's PID and UID
(SO_PEERCRED) even when it does not answer. The table has a line per listener: its
address, transport (shm, or auto/tcp and auto/tls for auto: listeners, found through
their upgrade sockets), PID, UID, age and number of connections, or its state:

  not answering  a process listens but did not answer within the timeout: a listener
                 answers only while its process is in accept() or polls the listener
                 (an event loop); a process busy with one client does not
  stale          nobody listens: the socket file of a listener that died
  permission denied
                 the socket or the listener does not admit this user (a query passes
                 the same credential check as a connection)

Under each listener, a line per connection it accepted that its process still holds:
the peer's PID (shm:, in the listener's PID namespace) or address (auto: connections
that stayed on TCP), UID, age, and the listener side's counters: MSGS IN are the
messages the peer sent. ux:, tcp: and tls: listeners have no socket in DIR and are not
listed.

Exit status: 0 when DIR could be read (even if some listeners do not answer), 1 if it
cannot be read, 2 on bad arguments.
";
