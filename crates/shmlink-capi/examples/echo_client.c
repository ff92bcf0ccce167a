/* echo_client: connects to the echo server at argv[1], sends each further argument as
 * one message and prints what comes back.
 *
 *   cc -std=c11 echo_client.c $(pkg-config --cflags --libs shmlink) -o echo_client
 *   ./echo_client shm:echo hello world
 */
#include <stdio.h>
#include <string.h>

#include <shmlink.h>

int main(int argc, char **argv) {
  if (argc < 2) {
    fprintf(stderr, "usage: %s ADDR [MESSAGE...]\n", argv[0]);
    return 2;
  }
  shmlink_socket *conn = shmlink_connect(argv[1], NULL);
  if (!conn) {
    fprintf(stderr, "connect %s: %s\n", argv[1], shmlink_last_error());
    return 1;
  }
  printf("connected over %s: %s -> %s\n", shmlink_transport(conn), shmlink_local_addr(conn),
         shmlink_remote_addr(conn));
  for (int i = 2; i < argc; i++) {
    char reply[4096];
    if (shmlink_send(conn, argv[i], strlen(argv[i])) < 0) {
      fprintf(stderr, "send: %s\n", shmlink_last_error());
      return 1;
    }
    ssize_t n = shmlink_recv(conn, reply, sizeof reply);
    if (n < 0) {
      fprintf(stderr, "recv: %s\n", shmlink_last_error());
      return 1;
    }
    printf("%.*s\n", (int)n, reply);
  }
  return shmlink_close(conn) < 0 ? 1 : 0;
}
