//! The text below the options in `shmlink-bench --help`: the patterns, the output, how
//! the runs are made fair, the exit status.

/// What `--help` shows after the options.
pub const PATTERNS_HELP: &str = "\
Patterns (--pattern P):
  p2p      two processes (this program re-executed for each end; the peer dies with its
           driver), the selection, placement and output options above [default]. Runs
           are interleaved: each round runs every method once per size and mode (A B C A
           B C ...), each run with its own warm-up, and the table shows each figure's
           median over the rounds and the spread (max - min) / median of the headline.
  pubsub   one publisher process and N subscriber processes. Each message carries the
           publisher's CLOCK_MONOTONIC from just before the publish call; every
           subscriber verifies it in full and acknowledges it on a side channel, and the
           next message goes out after all acknowledged it and a 50 us pause (no
           queueing). Reported per method, size and N: latency p50..max over all
           subscribers (per subscriber in the JSON), us inside the publish call(s) per
           message, publisher CPU per message, speed vs shmlink. Methods: shmlink,
           shmlink-zc, iceoryx2, iceoryx2-zc, zmq-ipc, uds, redis, rabbitmq. --sizes
           [default: 64,64k]; --iterations: measured messages per run [default: 1000;
           --quick: 100]; --rounds [default: 3; --quick: 1]; --subscribers; --mode,
           --duration, --warmup and --window do not apply.
  async    async Rust on tokio, each end its own process on a current-thread runtime,
           pinned cross-core. Round trip: shmlink-async (spin budget 20 us),
           shmlink-async-nospin, shmlink-async-stream (ByteStream), tokio-uds and
           tokio-tcp (LengthDelimitedCodec); tonic unary echo: tonic-shm, tonic-uds,
           tonic-tcp with 1 and 16 concurrent callers (req/s, p50, p99). Options:
           --methods, --sizes [default: 64], --callers LIST [default: 1,16], --iterations
           N (round trips [default: 20000] and calls per caller [default: 4000]), --rounds
           [default: 3], --quick, --json FILE.
  inproc   both ends in one process (threads): shmlink's in-process connection against
           std mpsc, crossbeam-channel, flume and tokio mpsc. Options: --methods, --sizes,
           --iterations, --rounds, --quick, --json FILE.
  connect  connect + one 64 B round trip + close, per second (shm, auto, in-process, uds,
           tcp). Options: --methods, --seconds, --rounds, --quick, --json FILE.
  apps     real programs (redis, nginx + wrk, iperf3, sockperf) plain against preloaded
           (`shmlink run`). Options: --apps LIST, --rounds, --duration, --requests,
           --quick, --json FILE, --preload-lib PATH (docs/transparent.md, Performance).

Output (p2p, pubsub):
  a table per mode and size, fastest first, with the speed relative to tcp and to
  shm-spin (>1 = faster); methods that could not run are listed with the reason.
  --plot draws a panel per mode, round-trip p50 (us) and throughput (MiB/s) against
  message size on log-log axes, one series per method. With none of --json, --csv and
  --plot: results.json, results.csv, plot.svg and plot.png in bench-results/<timestamp>/
  (UTC, e.g. 20261122-023000) under the current directory; the paths are printed at the
  end. The schemas are documented in docs/benchmarks.md.

Fairness: the sender writes every byte of every message (sequence number, generated
payload, checksum) and the receiver copies it out and checks its length and sequence
number; the first 32 messages of every run are checksummed in full. CPU per message is
user + system time (getrusage) of each process over the measured part.

Exit status: 0 if every run succeeded, 1 if a run failed (the others still run and are
reported), 2 on bad arguments.";
