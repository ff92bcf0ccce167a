/* Every size from 0 B to 64 MiB (the default maximum): powers of two, one less and one
 * more, echoed over shm: (messages larger than the ring are fragmented) and checked byte
 * for byte; 64 MiB + 1 is refused with EMSGSIZE on both send and reserve. */
#define _GNU_SOURCE
#include "check.h"

#define MAX (64u << 20)

static void echo(const char *addr) {
  shmlink_socket *conn = connect_retry(addr, NULL);
  CHECK(conn, "connect");
  CHECK(shmlink_max_msg_size(conn) == MAX, "max %zd", shmlink_max_msg_size(conn));
  unsigned char *buf = malloc(MAX);
  for (;;) {
    ssize_t n = shmlink_recv(conn, buf, MAX);
    if (n < 0) {
      CHECK(errno == EPIPE, "echo recv");
      break;
    }
    OK(shmlink_send(conn, buf, (size_t)n));
  }
  free(buf);
  OK(shmlink_close(conn));
}

int main(void) {
  watchdog(240);
  struct child_conn c = accept_from_child(addr_for("shm:", "sizes"), echo);
  unsigned char *out = malloc(MAX + 1), *in = malloc(MAX);
  CHECK(out && in, "malloc");
  size_t sizes[3 * 27 + 1], count = 0;
  sizes[count++] = 0;
  for (size_t p = 1; p <= MAX; p *= 2) {
    if (p > 1 && p - 1 != sizes[count - 1]) sizes[count++] = p - 1;
    sizes[count++] = p;
    if (p < MAX) sizes[count++] = p + 1;
  }
  for (size_t i = 0; i < count; i++) {
    size_t n = sizes[i];
    fill(out, n, n);
    OK(shmlink_send(c.conn, out, n));
    ssize_t got = shmlink_recv(c.conn, in, MAX);
    CHECK(got == (ssize_t)n, "size %zu came back as %zd", n, got);
    CHECK(memcmp(in, out, n) == 0, "size %zu came back changed", n);
  }
  FAILS(shmlink_send(c.conn, out, MAX + 1), EMSGSIZE);
  FAILS_NULL(shmlink_reserve(c.conn, MAX + 1), EMSGSIZE);
  /* The connection is still fine afterwards. */
  OK(shmlink_send(c.conn, out, 3));
  CHECK(shmlink_recv(c.conn, in, MAX) == 3, "after EMSGSIZE");
  OK(shmlink_close(c.conn));
  OK(shmlink_close(c.listener));
  reap(c.pid, "echo");
  printf("%zu sizes from 0 to %u bytes echoed intact\n", count, MAX);
  free(out);
  free(in);
  return 0;
}
