/* Echo over shm:, ux: and tcp: between two processes, with every way to send and
 * receive: copy (send/recv), zero-copy (reserve/commit, recv_ref/release), a too-small
 * buffer that keeps the message (EMSGSIZE + pending_size), counters and addresses. */
#define _GNU_SOURCE
#include "check.h"

static void serve(shmlink_socket *listener) {
  shmlink_socket *conn = shmlink_accept(listener);
  CHECK(conn, "accept");
  for (;;) {
    const void *data;
    size_t len;
    if (shmlink_recv_ref(conn, &data, &len) < 0) {
      CHECK(errno == EPIPE, "server recv_ref ended without EPIPE");
      break;
    }
    /* Copy out, release, then echo with the zero-copy send. */
    unsigned char *copy = malloc(len ? len : 1);
    memcpy(copy, data, len);
    OK(shmlink_release(conn));
    void *room = shmlink_reserve(conn, len);
    CHECK(room, "reserve %zu", len);
    memcpy(room, copy, len);
    OK(shmlink_commit(conn));
    free(copy);
  }
  shmlink_counters c;
  OK(shmlink_get_counters(conn, &c));
  CHECK(c.msgs_in == c.msgs_out && c.bytes_in == c.bytes_out, "server counters %llu/%llu",
        (unsigned long long)c.msgs_in, (unsigned long long)c.msgs_out);
  OK(shmlink_close(conn));
}

static void client(const char *addr, const char *transport) {
  shmlink_socket *conn = connect_retry(addr, NULL);
  CHECK(conn, "connect %s", addr);
  CHECK(strcmp(shmlink_transport(conn), transport) == 0, "transport %s",
        shmlink_transport(conn));
  CHECK(shmlink_local_addr(conn) && shmlink_remote_addr(conn), "addresses");
  CHECK(strncmp(shmlink_local_addr(conn), transport, strlen(transport)) == 0,
        "local address %s", shmlink_local_addr(conn));
  CHECK(shmlink_is_blocking(conn) == 1, "blocking by default");

  static const size_t sizes[] = {0, 1, 5, 64, 1000, 4096, 70000, 300000};
  unsigned char out[300000], in[300000];
  for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) {
    size_t n = sizes[i];
    fill(out, n, i);
    OK(shmlink_send(conn, out, n));
    ssize_t got = shmlink_recv(conn, in, sizeof in);
    CHECK(got == (ssize_t)n && memcmp(in, out, n) == 0, "echo of %zu bytes: got %zd", n, got);
  }

  /* A too-small buffer keeps the message and says how big it is. */
  fill(out, 100, 99);
  OK(shmlink_send(conn, out, 100));
  FAILS(shmlink_recv(conn, in, 10), EMSGSIZE);
  CHECK(strstr(shmlink_last_error(), "100 bytes"), "message names the size");
  CHECK(shmlink_pending_size(conn) == 100, "pending size %zd", shmlink_pending_size(conn));
  /* Sending goes on meanwhile. */
  OK(shmlink_send(conn, "x", 1));
  CHECK(shmlink_recv(conn, in, sizeof in) == 100 && memcmp(in, out, 100) == 0, "kept message");
  CHECK(shmlink_pending_size(conn) == 0, "nothing pending");
  CHECK(shmlink_recv(conn, in, sizeof in) == 1 && in[0] == 'x', "next message");

  /* Zero-copy receive on the client side too; other calls wait for the release. */
  OK(shmlink_send(conn, "zero-copy", 9));
  const void *data;
  size_t len;
  OK(shmlink_recv_ref(conn, &data, &len));
  CHECK(len == 9 && memcmp(data, "zero-copy", 9) == 0, "recv_ref");
  FAILS(shmlink_send(conn, "y", 1), EINVAL);
  FAILS(shmlink_recv(conn, in, sizeof in), EINVAL);
  OK(shmlink_release(conn));
  FAILS(shmlink_release(conn), EINVAL);

  /* A cancelled reservation sends nothing. */
  CHECK(shmlink_reserve(conn, 16), "reserve");
  FAILS(shmlink_recv(conn, in, sizeof in), EINVAL);
  OK(shmlink_cancel(conn));
  OK(shmlink_send(conn, "after", 5));
  CHECK(shmlink_recv(conn, in, sizeof in) == 5 && memcmp(in, "after", 5) == 0, "after cancel");

  shmlink_counters c;
  OK(shmlink_get_counters(conn, &c));
  CHECK(c.msgs_out == 8 + 1 + 1 + 1 + 1 && c.msgs_in == c.msgs_out, "client counters %llu %llu",
        (unsigned long long)c.msgs_out, (unsigned long long)c.msgs_in);
  OK(shmlink_close(conn));
}

int main(void) {
  watchdog(120);
  const char *addrs[][2] = {
      {addr_for("shm:", "echo"), "shm"},
      {addr_for("ux:", "echo"), "ux"},
      {"tcp:127.0.0.1:0", "tcp"},
  };
  for (size_t i = 0; i < 3; i++) {
    shmlink_socket *listener = shmlink_listen(addrs[i][0], NULL);
    CHECK(listener, "listen %s", addrs[i][0]);
    char addr[256];
    snprintf(addr, sizeof addr, "%s", shmlink_local_addr(listener));
    fflush(NULL);
    pid_t pid = fork();
    CHECK(pid >= 0, "fork");
    if (pid == 0) {
      client(addr, addrs[i][1]);
      _exit(0);
    }
    serve(listener);
    reap(pid, "client");
    OK(shmlink_close(listener));
    printf("echo over %s: ok\n", addrs[i][1]);
  }
  return 0;
}
