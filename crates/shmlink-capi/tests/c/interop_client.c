/* A C client against a Rust server (examples/rust_peer.rs, `server ADDR`), address in
 * argv[1]: messages of 0 B to 1 MiB, each echoed back intact, sent alternately with
 * send and reserve/commit and received alternately with recv and recv_ref. */
#define _GNU_SOURCE
#include "check.h"

int main(int argc, char **argv) {
  watchdog(120);
  CHECK(argc == 2, "usage: interop_client ADDR");
  shmlink_socket *c = connect_retry(argv[1], NULL);
  CHECK(c, "connect %s", argv[1]);
  size_t max = 1 << 20;
  unsigned char *out = malloc(max), *in = malloc(max);
  for (uint64_t i = 0; i < 2000; i++) {
    size_t n = i % 100 == 99 ? max : (i * 7919) % 70000;
    if (i % 10 == 0) n = 0;
    fill(out, n, i);
    if (i % 2) {
      OK(shmlink_send(c, out, n));
    } else {
      void *room = shmlink_reserve(c, n);
      CHECK(room, "reserve %zu", n);
      memcpy(room, out, n);
      OK(shmlink_commit(c));
    }
    if (i % 3) {
      CHECK(shmlink_recv(c, in, max) == (ssize_t)n && memcmp(in, out, n) == 0, "echo %llu",
            (unsigned long long)i);
    } else {
      const void *data;
      size_t len;
      OK(shmlink_recv_ref(c, &data, &len));
      CHECK(len == n && memcmp(data, out, n) == 0, "echo %llu by reference", (unsigned long long)i);
      OK(shmlink_release(c));
    }
  }
  OK(shmlink_close(c));
  free(out);
  free(in);
  printf("C client: 2000 messages echoed intact by the Rust server at %s\n", argv[1]);
  return 0;
}
