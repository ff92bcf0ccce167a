/* poll_server: one thread, one poll() loop, many connections. Listens at argv[1],
 * echoes every message of every client in non-blocking mode, and exits 0 after argv[2]
 * clients have come and gone (0: serve forever).
 *
 *   cc -std=c11 poll_server.c $(pkg-config --cflags --libs shmlink) -o poll_server
 *   ./poll_server shm:many 0
 */
#define _GNU_SOURCE
#include <errno.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>

#include <shmlink.h>

#define MAX_CONNS 256

int main(int argc, char **argv) {
  if (argc != 3) {
    fprintf(stderr, "usage: %s ADDR CLIENTS\n", argv[0]);
    return 2;
  }
  long quit_after = atol(argv[2]), served = 0;
  shmlink_socket *listener = shmlink_listen(argv[1], NULL);
  if (!listener || shmlink_set_blocking(listener, false) < 0) {
    fprintf(stderr, "listen %s: %s\n", argv[1], shmlink_last_error());
    return 1;
  }
  printf("%s\n", shmlink_local_addr(listener));
  fflush(stdout);

  shmlink_socket *conns[MAX_CONNS];
  struct pollfd fds[MAX_CONNS + 1];
  int n = 0;
  size_t cap = 1 << 16;
  char *buf = malloc(cap);
  while (quit_after == 0 || served < quit_after) {
    fds[0] = (struct pollfd){.fd = shmlink_fd(listener), .events = POLLIN};
    for (int i = 0; i < n; i++) fds[i + 1] = (struct pollfd){.fd = shmlink_fd(conns[i]), .events = POLLIN};
    if (poll(fds, (nfds_t)n + 1, -1) < 0) {
      if (errno == EINTR) continue;
      perror("poll");
      return 1;
    }
    int polled = n; /* connections accepted below wait for the next turn */
    /* New clients: accept until EAGAIN. Each connection is made non-blocking. */
    while (fds[0].revents && n < MAX_CONNS) {
      shmlink_socket *c = shmlink_accept(listener);
      if (!c) {
        if (errno != EAGAIN) fprintf(stderr, "accept: %s\n", shmlink_last_error());
        break;
      }
      shmlink_set_blocking(c, false);
      conns[n++] = c;
    }
    /* Ready connections: receive until EAGAIN (the fd is a level-triggered hint). */
    for (int i = 0; i < polled; i++) {
      if (!fds[i + 1].revents) continue;
      for (;;) {
        ssize_t len = shmlink_recv(conns[i], buf, cap);
        if (len >= 0) {
          /* A client that reads its echoes never lets our send window fill; a real
           * server would keep the message and retry on EAGAIN. */
          if (shmlink_send(conns[i], buf, (size_t)len) == 0) continue;
        }
        if (errno == EAGAIN) break;
        if (errno == EMSGSIZE) { /* kept for us: grow the buffer and receive it again */
          cap = (size_t)shmlink_pending_size(conns[i]);
          buf = realloc(buf, cap);
          continue;
        }
        /* EPIPE: the client closed; anything else: it failed. Either way it is gone. */
        if (errno != EPIPE) fprintf(stderr, "client %d: %s\n", i, shmlink_last_error());
        shmlink_close(conns[i]);
        conns[i] = NULL;
        served++;
        break;
      }
    }
    /* Compact the table (the fds array is rebuilt each turn). */
    int k = 0;
    for (int i = 0; i < n; i++)
      if (conns[i]) conns[k++] = conns[i];
    n = k;
  }
  free(buf);
  shmlink_close(listener);
  return 0;
}
