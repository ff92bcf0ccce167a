/* What a C programmer would otherwise pick, measured the same way as shmlink: round
 * trips (p50, p99) and one-way throughput of 64 B and 64 KiB messages between two
 * processes pinned to the given CPUs, over
 *   shm   shmlink shm: (shmlink_send / shmlink_recv, the default wait policy)
 *   unix  an AF_UNIX SOCK_SEQPACKET socket pair (message boundaries, like shmlink)
 *   pipe  two pipes (a byte stream: the reader loops until it has the whole message)
 * Prints one markdown table row per method (scripts/bench-c.sh makes the table).
 *
 *   bench [--cpus A,B] [--quick] [METHOD...]
 *   bench --cpus A,B --p50-64 COUNT    only shm: 64 B round trips: prints the p50 in ns
 */
#define _GNU_SOURCE
#include <errno.h>
#include <sched.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <shmlink.h>

#define BIG (64 * 1024)

static void die(const char *what) {
  fprintf(stderr, "bench: %s: %s (shmlink: %s)\n", what, strerror(errno), shmlink_last_error());
  exit(1);
}

static uint64_t now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

static void pin(int cpu) {
  cpu_set_t set;
  CPU_ZERO(&set);
  CPU_SET(cpu, &set);
  if (sched_setaffinity(0, sizeof set, &set) != 0) die("sched_setaffinity");
}

/* One end of a channel: send or receive exactly n bytes as one message. */
struct end {
  shmlink_socket *conn;
  int rfd, wfd;
  void (*send)(struct end *, const void *, size_t);
  void (*recv)(struct end *, void *, size_t);
};

static void shm_send(struct end *e, const void *p, size_t n) {
  if (shmlink_send(e->conn, p, n) < 0) die("shmlink_send");
}
static void shm_recv(struct end *e, void *p, size_t n) {
  if (shmlink_recv(e->conn, p, n) != (ssize_t)n) die("shmlink_recv");
}
static void seq_send(struct end *e, const void *p, size_t n) {
  if (send(e->wfd, p, n, 0) != (ssize_t)n) die("send");
}
static void seq_recv(struct end *e, void *p, size_t n) {
  if (recv(e->rfd, p, n, 0) != (ssize_t)n) die("recv");
}
static void pipe_send(struct end *e, const void *p, size_t n) {
  for (size_t done = 0; done < n;) {
    ssize_t w = write(e->wfd, (const char *)p + done, n - done);
    if (w <= 0) die("write");
    done += (size_t)w;
  }
}
static void pipe_recv(struct end *e, void *p, size_t n) {
  for (size_t done = 0; done < n;) {
    ssize_t r = read(e->rfd, (char *)p + done, n - done);
    if (r <= 0) die("read");
    done += (size_t)r;
  }
}

struct plan {
  size_t size;
  long warmup, count;
  int stream; /* 0: round trips; 1: one-way stream, then a 1-byte ack */
};

static int cmp_u64(const void *a, const void *b) {
  uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
  return x < y ? -1 : x > y;
}

/* The child's side of every plan, in the same order as the parent's. */
static void serve(struct end *e, const struct plan *plans, int n) {
  static char buf[BIG];
  for (int i = 0; i < n; i++) {
    const struct plan *p = &plans[i];
    long total = p->warmup + p->count;
    for (long k = 0; k < total; k++) {
      e->recv(e, buf, p->size);
      if (!p->stream) e->send(e, buf, p->size);
    }
    if (p->stream) e->send(e, buf, 1);
  }
}

/* The parent's side: p50 and p99 in ns for round trips, messages/s for streams. */
static void drive(struct end *e, const struct plan *p, double out[2]) {
  static char buf[BIG], back[BIG];
  memset(buf, 7, sizeof buf);
  for (long k = 0; k < p->warmup; k++) {
    e->send(e, buf, p->size);
    if (!p->stream) e->recv(e, back, p->size);
  }
  if (p->stream) {
    uint64_t t0 = now_ns();
    for (long k = 0; k < p->count; k++) e->send(e, buf, p->size);
    e->recv(e, back, 1);
    out[0] = (double)p->count / ((double)(now_ns() - t0) / 1e9);
    out[1] = 0;
    return;
  }
  uint64_t *rtt = malloc((size_t)p->count * sizeof *rtt);
  for (long k = 0; k < p->count; k++) {
    uint64_t t = now_ns();
    e->send(e, buf, p->size);
    e->recv(e, back, p->size);
    rtt[k] = now_ns() - t;
  }
  qsort(rtt, (size_t)p->count, sizeof *rtt, cmp_u64);
  out[0] = (double)rtt[(size_t)((double)(p->count - 1) * 0.5)];
  out[1] = (double)rtt[(size_t)((double)(p->count - 1) * 0.99)];
  free(rtt);
}

static int p50_only; /* --p50-64: print only the first plan's p50 */

static void run(const char *method, int cpu_a, int cpu_b, const struct plan *plans, int n) {
  struct end parent = {0}, child = {0};
  shmlink_socket *listener = NULL;
  char addr[128];
  if (strcmp(method, "shm") == 0) {
    snprintf(addr, sizeof addr, "shm:bench-c-%ld", (long)getpid());
    listener = shmlink_listen(addr, NULL);
    if (!listener) die("shmlink_listen");
    parent.send = child.send = shm_send;
    parent.recv = child.recv = shm_recv;
  } else if (strcmp(method, "unix") == 0) {
    int sv[2];
    if (socketpair(AF_UNIX, SOCK_SEQPACKET, 0, sv) != 0) die("socketpair");
    int sz = 4 * BIG;
    for (int i = 0; i < 2; i++) {
      setsockopt(sv[i], SOL_SOCKET, SO_SNDBUF, &sz, sizeof sz);
      setsockopt(sv[i], SOL_SOCKET, SO_RCVBUF, &sz, sizeof sz);
    }
    parent.rfd = parent.wfd = sv[0];
    child.rfd = child.wfd = sv[1];
    parent.send = child.send = seq_send;
    parent.recv = child.recv = seq_recv;
  } else if (strcmp(method, "pipe") == 0) {
    int down[2], up[2];
    if (pipe(down) != 0 || pipe(up) != 0) die("pipe");
    parent.wfd = down[1];
    child.rfd = down[0];
    child.wfd = up[1];
    parent.rfd = up[0];
    parent.send = child.send = pipe_send;
    parent.recv = child.recv = pipe_recv;
  } else {
    fprintf(stderr, "bench: unknown method %s (shm, unix, pipe)\n", method);
    exit(2);
  }
  fflush(NULL);
  pid_t pid = fork();
  if (pid < 0) die("fork");
  if (pid == 0) {
    pin(cpu_b);
    if (listener) {
      child.conn = shmlink_connect(addr, NULL);
      if (!child.conn) die("shmlink_connect");
    }
    serve(&child, plans, n);
    if (child.conn) shmlink_close(child.conn);
    _exit(0);
  }
  pin(cpu_a);
  if (listener) {
    parent.conn = shmlink_accept(listener);
    if (!parent.conn) die("shmlink_accept");
  }
  double r[4][2];
  for (int i = 0; i < n; i++) drive(&parent, &plans[i], r[i]);
  int status;
  if (waitpid(pid, &status, 0) != pid || !WIFEXITED(status) || WEXITSTATUS(status) != 0) {
    fprintf(stderr, "bench: the %s child failed\n", method);
    exit(1);
  }
  if (parent.conn) shmlink_close(parent.conn);
  if (listener) shmlink_close(listener);
  if (p50_only) {
    printf("%.0f\n", r[0][0]);
    return;
  }
  const char *name = strcmp(method, "shm") == 0    ? "shmlink shm: from C"
                     : strcmp(method, "unix") == 0 ? "AF_UNIX SOCK_SEQPACKET from C"
                                                   : "pipe from C";
  printf("| %s | %d,%d | %.0f | %.0f | %.0f | %.0f | %.2f | %.2f |\n", name, cpu_a, cpu_b,
         r[0][0], r[0][1], r[1][0], r[1][1], r[2][0] / 1e6, r[3][0] * BIG / 1e9);
  fflush(stdout);
}

int main(int argc, char **argv) {
  int cpu_a = 0, cpu_b = 1, quick = 0, first = 1;
  for (; first < argc && argv[first][0] == '-'; first++) {
    if (strcmp(argv[first], "--cpus") == 0 && first + 1 < argc) {
      if (sscanf(argv[++first], "%d,%d", &cpu_a, &cpu_b) != 2) {
        fprintf(stderr, "bench: --cpus A,B\n");
        return 2;
      }
    } else if (strcmp(argv[first], "--p50-64") == 0 && first + 1 < argc) {
      long count = atol(argv[++first]);
      if (count < 1) return 2;
      const struct plan one = {64, 10000, count, 0};
      p50_only = 1;
      run("shm", cpu_a, cpu_b, &one, 1);
      return 0;
    } else if (strcmp(argv[first], "--quick") == 0) {
      quick = 1;
    } else {
      fprintf(stderr, "usage: bench [--cpus A,B] [--quick] [shm|unix|pipe]...\n");
      return 2;
    }
  }
  long scale = quick ? 20 : 1;
  const struct plan plans[4] = {
      {64, 10000 / scale, 200000 / scale, 0},
      {BIG, 1000 / scale, 20000 / scale, 0},
      {64, 100000 / scale, 2000000 / scale, 1},
      {BIG, 1000 / scale, 50000 / scale, 1},
  };
  static const char *all[] = {"shm", "unix", "pipe"};
  const char **methods = first < argc ? (const char **)argv + first : all;
  int n = first < argc ? argc - first : 3;
  for (int i = 0; i < n; i++) run(methods[i], cpu_a, cpu_b, plans, 4);
  return 0;
}
