//! `shmlink-bench --help`.

/// The text of `shmlink-bench --help`.
pub const BENCH_HELP: &str = "\
Compare IPC methods side by side: latency and throughput between two processes, with
the CPU each end spends per message.

Usage: shmlink-bench [--methods LIST] [--sizes LIST] [--mode latency|throughput|both]
                     [--duration TIME | --iterations N] [--warmup TIME] [--rounds N]
                     [--window N] [--cpus A,B | --same-core | --cpus none] [--quick]
                     [--json FILE] [--csv FILE] [--plot FILE] [--list]
       shmlink-bench --pattern pubsub [--subscribers LIST] [--methods LIST] [--sizes LIST]
                     [--iterations N] [--rounds N] [--cpus A,B | --same-core | --cpus none]
                     [--quick] [--json FILE] [--csv FILE] [--plot FILE] [--list]

Every run uses two separate processes (this program re-executed for each end; the peer
dies with its driver). Runs are interleaved: each round runs every method once per size
and mode (A B C A B C ...), each run with its own warm-up, and the table shows each
figure's median over the rounds and the spread (max - min) / median of the headline.

Selection:
  --methods LIST   comma-separated method names, or all [default: all]; --list shows them
  --sizes LIST     message sizes, 8 B to 16 MiB, binary suffixes (64,1k,64k,1M), or
                   all (64,128,1k,4k,16k,64k,1M) [default: 64,1k,64k,1M; --quick:
                   64,64k]. A size a method cannot carry is shown as n/a with the
                   method's maximum.
  --mode M         latency (ping-pong, one message in flight: round-trip p50, p90, p99,
                   p99.9, max), throughput (a window of messages in flight: messages/s,
                   bytes/s), or both [default: both]
  --duration TIME  measured time per run: 300ms, 1s, 0.5 (seconds)
                   [default: 300ms; --quick: 100ms]
  --iterations N   measured messages per run instead of a duration
  --warmup TIME    warm-up per run [default: 100ms; --quick: 30ms]
  --rounds N       runs per method, size and mode [default: 3; --quick: 2]
  --window N       messages in flight in throughput mode [default: 64 KiB worth, at
                   least 64]; UDP uses fewer (what its receive buffer holds)
  --quick          a run of under a minute: the defaults marked --quick above
  --list           list the methods, what each measures, and which cannot run here
  -h, --help       print this help
  -V, --version    print the version

Pattern:
  --pattern P      p2p (or point-to-point): two processes, the options above [default];
                   async: see below;
                   pubsub: one publisher process and N subscriber processes. Each message
                   carries the publisher's CLOCK_MONOTONIC from just before the publish
                   call; every subscriber verifies it in full and acknowledges it on a side
                   channel, and the next message goes out after all acknowledged it and a
                   50 us pause (no queueing). Reported per method, size and N: latency
                   p50..max over all subscribers (per subscriber in the JSON), us inside
                   the publish call(s) per message, publisher CPU per message, speed vs
                   shmlink. Methods: shmlink, shmlink-zc, iceoryx2, iceoryx2-zc, zmq-ipc,
                   uds, redis, rabbitmq. --sizes [default: 64,64k]; --iterations: measured
                   messages per run [default: 1000; --quick: 100]; --rounds [default: 3;
                   --quick: 1]; --mode, --duration, --warmup and --window do not apply.
                   async: async Rust on tokio, each end its own process on a
                   current-thread runtime, pinned cross-core. Round trip: shmlink-async
                   (spin budget 20 us), shmlink-async-nospin, shmlink-async-stream
                   (ByteStream), tokio-uds and tokio-tcp (LengthDelimitedCodec); tonic
                   unary echo: tonic-shm, tonic-uds, tonic-tcp with 1 and 16
                   concurrent callers (req/s, p50, p99). Options: --methods, --sizes
                   [default: 64], --callers LIST [default: 1,16], --iterations N (round
                   trips [default: 20000] and calls per caller [default: 4000]),
                   --rounds [default: 3], --quick, --json FILE.
                   inproc: both ends in one process (threads): shmlink's in-process
                   connection against std mpsc, crossbeam-channel, flume and tokio mpsc.
                   connect: connect + one 64 B round trip + close, per second (shm,
                   auto, in-process, uds, tcp). apps: real programs (redis, nginx + wrk,
                   iperf3, sockperf) plain against preloaded (`shmlink run`); options
                   --apps LIST, --rounds, --duration, --requests, --quick, --json FILE
                   (docs/transparent.md, Performance).
  --subscribers LIST
                   subscriber counts, 1 to 64 [default: 1,2,4,8,16]

Placement:
  --cpus A,B       pin the driver to CPU A and the peer to CPU B; A = B is the same-core
                   mode [default: two CPUs on different physical cores]. pubsub: the
                   publisher on A, every subscriber on B
  --same-core      both ends on the first CPU (busy-polling methods then yield); pubsub:
                   every process
  --cpus none      do not pin

Output:
  a table per mode and size, fastest first, with the speed relative to tcp and to
  shm-spin (>1 = faster); methods that could not run are listed with the reason.
  --json FILE      the full report: configuration, machine, every run, summaries
  --csv FILE       one line per method, mode and size
  --plot FILE      charts as SVG or PNG (by FILE's extension, .svg or .png), in one
                   file: a panel per mode, round-trip p50 (us) and throughput (MiB/s)
                   against message size on log-log axes, one series per method
  (none of these)  write results.json, results.csv, plot.svg and plot.png into
                   bench-results/<timestamp>/ (UTC, e.g. 20261122-023000) under the
                   current directory; the paths are printed at the end
  The schemas are documented in docs/benchmarks.md.

Fairness: the sender writes every byte of every message (sequence number, generated
payload, checksum) and the receiver copies it out and checks its length and sequence
number; the first 32 messages of every run are checksummed in full. CPU per message is
user + system time (getrusage) of each process over the measured part.

Exit status: 0 if every run succeeded, 1 if a run failed (the others still run and are
reported), 2 on bad arguments.
";
