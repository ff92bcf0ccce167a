/* Bad arguments give EINVAL (or the errno that names the problem) and a message, never
 * a crash: NULL handles, strings and buffers, malformed addresses, zero and other
 * out-of-range options, calls in the wrong state or on the wrong kind of socket. */
#define _GNU_SOURCE
#include "check.h"

#define MSG_NONEMPTY() CHECK(shmlink_last_error()[0] != '\0', "no message")

int main(void) {
  watchdog(60);
  char buf[16];
  const void *data;
  size_t len;

  /* NULL everywhere. */
  FAILS_NULL(shmlink_connect(NULL, NULL), EINVAL);
  MSG_NONEMPTY();
  FAILS_NULL(shmlink_listen(NULL, NULL), EINVAL);
  FAILS_NULL(shmlink_accept(NULL), EINVAL);
  FAILS(shmlink_send(NULL, "x", 1), EINVAL);
  FAILS(shmlink_recv(NULL, buf, sizeof buf), EINVAL);
  FAILS_NULL(shmlink_reserve(NULL, 1), EINVAL);
  FAILS(shmlink_commit(NULL), EINVAL);
  FAILS(shmlink_cancel(NULL), EINVAL);
  FAILS(shmlink_recv_ref(NULL, &data, &len), EINVAL);
  FAILS(shmlink_release(NULL), EINVAL);
  FAILS(shmlink_fd(NULL), EINVAL);
  FAILS(shmlink_set_blocking(NULL, false), EINVAL);
  FAILS(shmlink_is_blocking(NULL), EINVAL);
  FAILS_NULL(shmlink_local_addr(NULL), EINVAL);
  FAILS_NULL(shmlink_remote_addr(NULL), EINVAL);
  FAILS_NULL(shmlink_transport(NULL), EINVAL);
  FAILS(shmlink_max_msg_size(NULL), EINVAL);
  FAILS(shmlink_pending_size(NULL), EINVAL);
  FAILS(shmlink_get_counters(NULL, NULL), EINVAL);
  CHECK(shmlink_close(NULL) == 0, "close(NULL) is a no-op");
  shmlink_options_free(NULL);
  shmlink_pubsub_options_free(NULL);
  FAILS(shmlink_options_set_ring_size(NULL, 4096), EINVAL);
  FAILS_NULL(shmlink_publisher_bind(NULL, NULL), EINVAL);
  FAILS_NULL(shmlink_subscribe(NULL, NULL), EINVAL);
  FAILS(shmlink_publish(NULL, "x", 1), EINVAL);
  FAILS_NULL(shmlink_loan(NULL, 1), EINVAL);
  FAILS(shmlink_loan_commit(NULL, 1), EINVAL);
  FAILS(shmlink_sub_recv(NULL, buf, sizeof buf), EINVAL);
  FAILS(shmlink_sub_recv_ref(NULL, &data, &len), EINVAL);
  FAILS(shmlink_sub_release(NULL), EINVAL);
  FAILS(shmlink_sub_intact(NULL), EINVAL);
  FAILS(shmlink_publisher_fd(NULL), EINVAL);
  FAILS(shmlink_sub_fd(NULL), EINVAL);
  CHECK(shmlink_publisher_close(NULL) == 0 && shmlink_sub_close(NULL) == 0, "close NULL");

  /* Bad addresses. */
  static const char *bad[] = {"", "nope:x", "shm:", "tcp:", "tcp:127.0.0.1", "tcp:host:99999",
                              "ux:", "shm:a/../../b", "no-prefix"};
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    FAILS_NULL(shmlink_connect(bad[i], NULL), EINVAL);
    FAILS_NULL(shmlink_listen(bad[i], NULL), EINVAL);
  }
  FAILS_NULL(shmlink_connect("shm:\xff\xfe", NULL), EINVAL); /* not UTF-8 */
  CHECK(strstr(shmlink_last_error(), "UTF-8"), "names the problem: %s", shmlink_last_error());
  FAILS_NULL(shmlink_subscribe("ux:topic", NULL), EINVAL); /* pub/sub does not serve ux: */
  /* A well-formed address nobody listens at. */
  FAILS_NULL(shmlink_connect(addr_for("shm:", "nobody"), NULL), ECONNREFUSED);
  /* A directory to bind in that does not exist, and a host name that does not resolve
   * (`.invalid` never does, RFC 6761): ENOENT, as XCM says for DNS failures. */
  FAILS_NULL(shmlink_listen("shm:/nonexistent/dir/x.sock", NULL), ENOENT);
  FAILS_NULL(shmlink_listen("ux:/proc/nope/x", NULL), ENOENT);
  FAILS_NULL(shmlink_connect("tcp:nohost.invalid:1", NULL), ENOENT);
  CHECK(strstr(shmlink_last_error(), "nohost.invalid"), "names the host: %s",
        shmlink_last_error());

  /* Zero and out-of-range options: refused at once, the options unchanged. */
  shmlink_options *o = shmlink_options_new();
  CHECK(o, "options");
  FAILS(shmlink_options_set_ring_size(o, 0), EINVAL);
  CHECK(strstr(shmlink_last_error(), "ring_size"), "names the option");
  FAILS(shmlink_options_set_ring_size(o, 5000), EINVAL); /* not a power of two */
  FAILS(shmlink_options_set_max_msg_size(o, 0), EINVAL);
  FAILS(shmlink_options_set_max_msg_size(o, (size_t)2 << 30), EINVAL);
  FAILS(shmlink_options_set_connect_timeout_ms(o, 0), EINVAL);
  FAILS(shmlink_options_set_handshake_timeout_ms(o, 0), EINVAL);
  FAILS(shmlink_options_set_allow_uids(o, NULL, 3), EINVAL);
  FAILS(shmlink_options_set_tls_cert_file(o, NULL), EINVAL);
  OK(shmlink_options_set_allow_uids(o, NULL, 0));
  OK(shmlink_options_set_ring_size(o, 8192));
  /* A certificate without its key: each setter takes it, the use refuses it. */
  OK(shmlink_options_set_tls_cert_file(o, "/nonexistent/cert.pem"));
  FAILS_NULL(shmlink_listen("tls:127.0.0.1:0", o), EINVAL);
  shmlink_options_free(o);

  shmlink_pubsub_options *p = shmlink_pubsub_options_new();
  CHECK(p, "pubsub options");
  FAILS(shmlink_pubsub_options_set_slots(p, 0), EINVAL);
  FAILS(shmlink_pubsub_options_set_slots(p, 3), EINVAL);
  FAILS(shmlink_pubsub_options_set_capacity(p, 0), EINVAL);
  FAILS(shmlink_pubsub_options_set_max_msg_size(p, 0), EINVAL);
  FAILS(shmlink_pubsub_options_set_policy(p, 7), EINVAL);
  FAILS(shmlink_pubsub_options_set_max_subscribers(p, 0), EINVAL);
  FAILS(shmlink_pubsub_options_set_stall_timeout_ms(p, 0), EINVAL);
  OK(shmlink_pubsub_options_set_history(p, 5000)); /* above the 1024 slots: ... */
  FAILS_NULL(shmlink_publisher_bind(addr_for("shm:", "topic"), p), EINVAL); /* ... refused */
  shmlink_pubsub_options_free(p);

  /* Wrong kind of socket, wrong state, bad buffers. */
  const char *addr = addr_for("shm:", "args");
  shmlink_socket *l = shmlink_listen(addr, NULL);
  CHECK(l, "listen");
  FAILS(shmlink_send(l, "x", 1), EINVAL);
  FAILS(shmlink_recv(l, buf, sizeof buf), EINVAL);
  FAILS_NULL(shmlink_remote_addr(l), EINVAL);
  FAILS_NULL(shmlink_listen(addr, NULL), EADDRINUSE);
  fflush(NULL);
  pid_t pid = fork();
  CHECK(pid >= 0, "fork");
  if (pid == 0) {
    shmlink_socket *c = connect_retry(addr, NULL);
    CHECK(c, "connect");
    char b[8];
    CHECK(shmlink_recv(c, b, sizeof b) == 0, "the empty message");
    CHECK(shmlink_recv(c, b, sizeof b) == 2, "then hi");
    OK(shmlink_send(c, "toolong", 7));
    OK(shmlink_close(c));
    _exit(0);
  }
  shmlink_socket *c = shmlink_accept(l);
  CHECK(c, "accept");
  FAILS_NULL(shmlink_accept(c), EINVAL); /* a connection is not a listener */
  FAILS(shmlink_send(c, NULL, 5), EINVAL);
  FAILS(shmlink_recv(c, NULL, 5), EINVAL);
  FAILS(shmlink_recv_ref(c, NULL, &len), EINVAL);
  FAILS(shmlink_recv_ref(c, &data, NULL), EINVAL);
  FAILS(shmlink_commit(c), EINVAL);
  FAILS(shmlink_cancel(c), EINVAL);
  FAILS(shmlink_release(c), EINVAL);
  FAILS(shmlink_get_counters(c, NULL), EINVAL);
  OK(shmlink_send(c, NULL, 0)); /* an empty message needs no buffer */
  CHECK(shmlink_reserve(c, 2), "reserve");
  FAILS_NULL(shmlink_reserve(c, 2), EINVAL); /* one at a time */
  FAILS(shmlink_set_blocking(c, false), EINVAL);
  OK(shmlink_cancel(c));
  OK(shmlink_send(c, "hi", 2));
  /* A message kept by a too-small recv and lent by recv_ref: nothing else sends or
   * receives until it is released. */
  FAILS(shmlink_recv(c, buf, 2), EMSGSIZE);
  OK(shmlink_recv_ref(c, &data, &len));
  CHECK(len == 7 && memcmp(data, "toolong", 7) == 0, "the kept message");
  FAILS(shmlink_send(c, "x", 1), EINVAL);
  FAILS_NULL(shmlink_reserve(c, 1), EINVAL);
  FAILS(shmlink_recv(c, buf, sizeof buf), EINVAL);
  OK(shmlink_release(c));
  reap(pid, "client");
  OK(shmlink_close(c));
  OK(shmlink_close(l));
  puts("bad arguments: EINVAL (or the errno naming the problem), never a crash");
  return 0;
}
