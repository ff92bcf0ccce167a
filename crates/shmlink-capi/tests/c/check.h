/* Helpers shared by the C tests: failing checks that say where and why, unique
 * addresses, a watchdog, child processes. Each test is one program; exit 0 = pass. */
#ifndef CHECK_H
#define CHECK_H

#include <errno.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <shmlink.h>

/* Fails the test (exit 1) with the place, the condition, errno and shmlink's message. */
#define CHECK(cond, ...)                                                                  \
  do {                                                                                    \
    if (!(cond)) {                                                                        \
      int e_ = errno;                                                                     \
      fprintf(stderr, "%s:%d: check failed: %s: ", __FILE__, __LINE__, #cond);           \
      fprintf(stderr, __VA_ARGS__);                                                       \
      fprintf(stderr, " (errno %d %s; last error: %s)\n", e_, strerror(e_),               \
              shmlink_last_error());                                                      \
      exit(1);                                                                            \
    }                                                                                     \
  } while (0)

/* A call that must succeed (0 or a non-negative result). */
#define OK(call) CHECK((call) >= 0, "%s", #call)
/* A call that must fail with errno `err`. */
#define FAILS(call, err)                                                                  \
  do {                                                                                    \
    errno = 0;                                                                            \
    long r_ = (long)(call);                                                               \
    CHECK(r_ == -1 && errno == (err), "%s returned %ld, expected -1 with %s", #call, r_,  \
          #err);                                                                          \
  } while (0)
#define FAILS_NULL(call, err)                                                             \
  do {                                                                                    \
    errno = 0;                                                                            \
    const void *p_ = (const void *)(call);                                                \
    CHECK(p_ == NULL && errno == (err), "%s returned %p, expected NULL with %s", #call,   \
          p_, #err);                                                                      \
  } while (0)

/* `shm:NAME-PID-N`-style address unique to this run. */
static inline const char *addr_for(const char *prefix, const char *name) {
  static char buf[8][128];
  static int next;
  char *b = buf[next++ % 8];
  snprintf(b, 128, "%s%s-%ld-%d", prefix, name, (long)getpid(), next);
  return b;
}

/* The test dies with a message instead of hanging. */
static inline void watchdog(unsigned seconds) {
  signal(SIGALRM, SIG_DFL);
  alarm(seconds);
}

static inline double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

/* Waits for a child; fails the test unless it exited 0. */
static inline void reap(pid_t pid, const char *what) {
  int status = 0;
  CHECK(waitpid(pid, &status, 0) == pid, "waitpid %s", what);
  CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0, "%s ended with status %#x", what,
        status);
}

/* Connects, retrying while nobody listens yet (the listener may be another process
 * that is still starting). */
static inline shmlink_socket *connect_retry(const char *addr, const shmlink_options *opts) {
  double deadline = now_s() + 20;
  for (;;) {
    shmlink_socket *s = shmlink_connect(addr, opts);
    if (s || errno != ECONNREFUSED || now_s() > deadline) return s;
    usleep(2000);
  }
}

/* FNV-1a over a buffer: the checksum the tests put in their messages. */
/* A connection from a child process: the listener, the accepted connection, the child. */
struct child_conn {
  shmlink_socket *listener, *conn;
  pid_t pid;
};

/* Listens on `addr`, forks a child that runs `child(addr)` and exits, and accepts its
 * connection. */
static inline struct child_conn accept_from_child(const char *addr,
                                                  void (*child)(const char *)) {
  struct child_conn c;
  c.listener = shmlink_listen(addr, NULL);
  CHECK(c.listener, "listen");
  fflush(NULL);
  c.pid = fork();
  CHECK(c.pid >= 0, "fork");
  if (c.pid == 0) {
    child(addr);
    _exit(0);
  }
  c.conn = shmlink_accept(c.listener);
  CHECK(c.conn, "accept");
  return c;
}

static inline uint64_t fnv1a(const void *p, size_t n) {
  const unsigned char *b = p;
  uint64_t h = 1469598103934665603ULL;
  for (size_t i = 0; i < n; i++) h = (h ^ b[i]) * 1099511628211ULL;
  return h;
}

/* Deterministic bytes for message `seq` (xorshift), so a receiver can check them. */
static inline void fill(unsigned char *p, size_t n, uint64_t seq) {
  uint64_t x = seq * 0x9E3779B97F4A7C15ULL + 1;
  for (size_t i = 0; i < n; i++) {
    x ^= x << 13; x ^= x >> 7; x ^= x << 17;
    p[i] = (unsigned char)x;
  }
}

#endif
