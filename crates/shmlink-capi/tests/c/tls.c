/* tls: from C, with the options' TLS file setters: a listener with a certificate and key,
 * a client that trusts the CA gets an echo; a client that trusts another CA, or expects
 * another server name, is refused with EACCES.
 *   tls CA.pem SERVER-CERT.pem SERVER-KEY.pem OTHER-CA.pem */
#define _GNU_SOURCE
#include "check.h"

static shmlink_options *client_opts(const char *ca, const char *server_name) {
  shmlink_options *o = shmlink_options_new();
  CHECK(o, "options");
  OK(shmlink_options_set_tls_ca_file(o, ca));
  if (server_name) OK(shmlink_options_set_tls_server_name(o, server_name));
  OK(shmlink_options_set_connect_timeout_ms(o, 10000));
  return o;
}

int main(int argc, char **argv) {
  watchdog(120);
  CHECK(argc == 5, "usage: tls CA CERT KEY OTHER-CA");
  shmlink_options *so = shmlink_options_new();
  OK(shmlink_options_set_tls_cert_file(so, argv[2]));
  OK(shmlink_options_set_tls_key_file(so, argv[3]));
  shmlink_socket *listener = shmlink_listen("tls:127.0.0.1:0", so);
  shmlink_options_free(so);
  CHECK(listener, "listen tls");
  char addr[128];
  /* Connect by name, so the certificate's name is checked: tls:localhost:PORT. */
  const char *port = strrchr(shmlink_local_addr(listener), ':');
  CHECK(port, "port in %s", shmlink_local_addr(listener));
  snprintf(addr, sizeof addr, "tls:localhost%s", port);
  fflush(NULL);
  pid_t pid = fork();
  CHECK(pid >= 0, "fork");
  if (pid == 0) {
    /* Refused: a CA that did not sign the listener's certificate, a name it is not for. */
    shmlink_options *bad = client_opts(argv[4], NULL);
    FAILS_NULL(shmlink_connect(addr, bad), EACCES);
    shmlink_options_free(bad);
    bad = client_opts(argv[1], "elsewhere.example");
    FAILS_NULL(shmlink_connect(addr, bad), EACCES);
    shmlink_options_free(bad);
    shmlink_options *good = client_opts(argv[1], NULL);
    shmlink_socket *c = shmlink_connect(addr, good);
    shmlink_options_free(good);
    CHECK(c, "connect %s", addr);
    CHECK(strcmp(shmlink_transport(c), "tls") == 0, "transport %s", shmlink_transport(c));
    OK(shmlink_send(c, "over tls", 8));
    char buf[16];
    CHECK(shmlink_recv(c, buf, sizeof buf) == 8 && memcmp(buf, "over tls", 8) == 0, "echo");
    OK(shmlink_close(c));
    _exit(0);
  }
  /* The refused clients never become connections; the good one does. */
  shmlink_socket *conn = shmlink_accept(listener);
  CHECK(conn, "accept");
  char buf[16];
  ssize_t n = shmlink_recv(conn, buf, sizeof buf);
  CHECK(n == 8, "recv");
  OK(shmlink_send(conn, buf, (size_t)n));
  FAILS(shmlink_recv(conn, buf, sizeof buf), EPIPE);
  OK(shmlink_close(conn));
  OK(shmlink_close(listener));
  reap(pid, "client");
  puts("tls: echo with a trusted CA; another CA or another name: EACCES");
  return 0;
}
