/* echo_server: listens at the address given as argv[1] (any shmlink address:
 * shm:NAME, ux:NAME, tcp:HOST:PORT ...), prints the bound address on a line of its own,
 * accepts one connection and echoes every message until the peer closes; exits 0 then,
 * 1 on any error.
 *
 *   cc -std=c11 echo_server.c $(pkg-config --cflags --libs shmlink) -o echo_server
 *   ./echo_server shm:echo
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>

#include <shmlink.h>

int main(int argc, char **argv) {
  if (argc != 2) {
    fprintf(stderr, "usage: %s ADDR\n", argv[0]);
    return 2;
  }
  shmlink_socket *listener = shmlink_listen(argv[1], NULL);
  if (!listener) {
    fprintf(stderr, "listen %s: %s\n", argv[1], shmlink_last_error());
    return 1;
  }
  printf("%s\n", shmlink_local_addr(listener));
  fflush(stdout);

  shmlink_socket *conn = shmlink_accept(listener);
  if (!conn) {
    fprintf(stderr, "accept: %s\n", shmlink_last_error());
    return 1;
  }
  /* Room for the largest message the connection carries; shmlink_recv never truncates. */
  size_t cap = (size_t)shmlink_max_msg_size(conn);
  char *buf = malloc(cap ? cap : 1);
  int status = 0;
  for (;;) {
    ssize_t n = shmlink_recv(conn, buf, cap);
    if (n < 0) {
      if (errno != EPIPE) { /* EPIPE: the peer closed after its last message */
        fprintf(stderr, "recv: %s\n", shmlink_last_error());
        status = 1;
      }
      break;
    }
    if (shmlink_send(conn, buf, (size_t)n) < 0) {
      fprintf(stderr, "send: %s\n", shmlink_last_error());
      status = 1;
      break;
    }
  }
  free(buf);
  if (shmlink_close(conn) < 0) status = 1;
  shmlink_close(listener);
  return status;
}
