/* One non-blocking listener and 64 non-blocking connections served by one poll() loop:
 * a client process opens 64 connections and sends ROUNDS messages on each, each echoed;
 * the server sees EAGAIN whenever it would have to wait and never blocks (a watchdog
 * would fire). Checks every echo and counts the EAGAINs. */
#define _GNU_SOURCE
#include <poll.h>
#include "check.h"

#define CONNS 64
#define ROUNDS 200

static void clients(const char *addr) {
  shmlink_socket *c[CONNS];
  for (int i = 0; i < CONNS; i++) {
    c[i] = connect_retry(addr, NULL);
    CHECK(c[i], "connect %d", i);
  }
  for (int r = 0; r < ROUNDS; r++) {
    for (int i = 0; i < CONNS; i++) {
      uint64_t v = (uint64_t)i << 32 | (uint64_t)r;
      OK(shmlink_send(c[i], &v, sizeof v));
    }
    for (int i = 0; i < CONNS; i++) {
      uint64_t v = 0;
      CHECK(shmlink_recv(c[i], &v, sizeof v) == sizeof v, "echo on %d", i);
      CHECK(v == ((uint64_t)i << 32 | (uint64_t)r), "echo on %d round %d", i, r);
    }
  }
  for (int i = 0; i < CONNS; i++) OK(shmlink_close(c[i]));
}

int main(void) {
  watchdog(120);
  const char *addr = addr_for("shm:", "poll");
  shmlink_options *opts = shmlink_options_new();
  /* The listener hands out its accepts one poll turn at a time; a client that the
   * machine keeps waiting should still get through. */
  OK(shmlink_options_set_handshake_timeout_ms(opts, 30000));
  shmlink_socket *listener = shmlink_listen(addr, opts);
  shmlink_options_free(opts);
  CHECK(listener, "listen");
  OK(shmlink_set_blocking(listener, false));
  CHECK(shmlink_is_blocking(listener) == 0, "non-blocking");
  FAILS_NULL(shmlink_accept(listener), EAGAIN);
  fflush(NULL);
  pid_t pid = fork();
  CHECK(pid >= 0, "fork");
  if (pid == 0) {
    clients(addr);
    _exit(0);
  }
  shmlink_socket *conns[CONNS];
  int n_conns = 0, open_conns = 0;
  long eagain = 0, echoed = 0;
  struct pollfd fds[CONNS + 1];
  for (;;) {
    int nfds = 0;
    if (n_conns < CONNS) fds[nfds++] = (struct pollfd){.fd = shmlink_fd(listener), .events = POLLIN};
    for (int i = 0; i < n_conns; i++)
      fds[nfds++] = (struct pollfd){.fd = conns[i] ? shmlink_fd(conns[i]) : -1, .events = POLLIN};
    if (n_conns == CONNS && open_conns == 0) break;
    int ready = poll(fds, (nfds_t)nfds, 10000);
    CHECK(ready > 0, "poll timed out or failed");
    int k = 0;
    if (n_conns < CONNS) {
      if (fds[k++].revents) {
        for (;;) {
          shmlink_socket *c = shmlink_accept(listener);
          if (!c) {
            CHECK(errno == EAGAIN, "accept");
            eagain++;
            break;
          }
          OK(shmlink_set_blocking(c, false));
          conns[n_conns++] = c;
          open_conns++;
          if (n_conns == CONNS) break;
        }
      }
    }
    for (int i = 0; k < nfds; i++, k++) {
      if (!conns[i] || !fds[k].revents) continue;
      for (;;) { /* drain until EAGAIN: the fd is a level-triggered hint */
        uint64_t v;
        ssize_t n = shmlink_recv(conns[i], &v, sizeof v);
        if (n < 0) {
          if (errno == EAGAIN) {
            eagain++;
            break;
          }
          CHECK(errno == EPIPE, "recv on %d", i);
          OK(shmlink_close(conns[i]));
          conns[i] = NULL;
          open_conns--;
          break;
        }
        CHECK(n == sizeof v, "size");
        /* The client waits for each echo before sending again: send never waits here. */
        OK(shmlink_send(conns[i], &v, sizeof v));
        echoed++;
      }
    }
  }
  OK(shmlink_close(listener));
  reap(pid, "clients");
  CHECK(echoed == (long)CONNS * ROUNDS, "echoed %ld", echoed);
  CHECK(eagain > 0, "never saw EAGAIN");
  printf("poll loop over %d connections: %ld messages echoed, %ld EAGAIN\n", CONNS, echoed,
         eagain);
  return 0;
}
