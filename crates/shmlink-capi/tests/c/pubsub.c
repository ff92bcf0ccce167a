/* Publish/subscribe fan-out to 4 subscriber processes over shm: (block policy: lossless,
 * in order), with publish and zero-copy loans alternating; every subscriber checks every
 * message (sequence and checksum), half of them through shmlink_sub_recv_ref. Then an
 * overwrite topic: a subscriber that falls behind learns exactly how many messages it
 * lost (EOVERFLOW + shmlink_last_missed). */
#define _GNU_SOURCE
#include "check.h"

#define SUBS 4
#define COUNT 100000ULL

struct head {
  uint64_t seq;
  uint64_t sum;
};

static size_t len_of(uint64_t seq) { return sizeof(struct head) + seq % 200; }

static void subscriber(const char *addr, int zero_copy) {
  shmlink_subscriber *s = NULL;
  double deadline = now_s() + 20;
  while (!(s = shmlink_subscribe(addr, NULL)) && errno == ECONNREFUSED && now_s() < deadline)
    usleep(2000);
  CHECK(s, "subscribe %s", addr);
  unsigned char buf[512];
  for (uint64_t seq = 0; seq < COUNT; seq++) {
    const unsigned char *p = buf;
    size_t n;
    if (zero_copy) {
      const void *data;
      OK(shmlink_sub_recv_ref(s, &data, &n));
      CHECK(n <= sizeof buf, "size");
      memcpy(buf, data, n); /* copy once, then check the copy */
      CHECK(shmlink_sub_intact(s) == 1, "block policy: intact");
      OK(shmlink_sub_release(s));
    } else {
      ssize_t got = shmlink_sub_recv(s, buf, sizeof buf);
      CHECK(got >= 0, "sub_recv %llu", (unsigned long long)seq);
      n = (size_t)got;
    }
    CHECK(n == len_of(seq), "message %llu: %zu bytes", (unsigned long long)seq, n);
    struct head h;
    memcpy(&h, p, sizeof h);
    CHECK(h.seq == seq, "message %llu arrived as %llu", (unsigned long long)seq,
          (unsigned long long)h.seq);
    CHECK(h.sum == fnv1a(p + sizeof h, n - sizeof h), "checksum of %llu", (unsigned long long)seq);
  }
  FAILS(shmlink_sub_recv(s, buf, sizeof buf), EPIPE); /* the publisher closed */
  shmlink_subscriber_stats st;
  OK(shmlink_sub_get_stats(s, &st));
  CHECK(st.received == COUNT && st.missed == 0, "stats %llu %llu",
        (unsigned long long)st.received, (unsigned long long)st.missed);
  OK(shmlink_sub_close(s));
}

static void fan_out(void) {
  const char *addr = addr_for("shm:", "fanout");
  pid_t kids[SUBS];
  fflush(NULL);
  for (int i = 0; i < SUBS; i++) {
    kids[i] = fork();
    CHECK(kids[i] >= 0, "fork");
    if (kids[i] == 0) {
      subscriber(addr, i % 2);
      _exit(0);
    }
  }
  shmlink_pubsub_options *o = shmlink_pubsub_options_new();
  OK(shmlink_pubsub_options_set_slots(o, 256));
  OK(shmlink_pubsub_options_set_max_msg_size(o, 256));
  OK(shmlink_pubsub_options_set_stall_timeout_ms(o, 10000)); /* sanitized subscribers */
  shmlink_publisher *p = shmlink_publisher_bind(addr, o);
  shmlink_pubsub_options_free(o);
  CHECK(p, "bind");
  OK(shmlink_publisher_wait_subscribers(p, SUBS, 20000));
  unsigned char msg[512];
  double t0 = now_s();
  for (uint64_t seq = 0; seq < COUNT; seq++) {
    size_t n = len_of(seq);
    fill(msg + sizeof(struct head), n - sizeof(struct head), seq);
    struct head h = {seq, fnv1a(msg + sizeof h, n - sizeof h)};
    memcpy(msg, &h, sizeof h);
    if (seq % 2) {
      OK(shmlink_publish(p, msg, n));
    } else {
      unsigned char *slot = shmlink_loan(p, 256);
      CHECK(slot, "loan");
      FAILS(shmlink_publish(p, msg, n), EINVAL); /* one loan at a time */
      memcpy(slot, msg, n);
      FAILS(shmlink_loan_commit(p, 257), EINVAL); /* longer than the loan */
      OK(shmlink_loan_commit(p, n));
    }
  }
  double secs = now_s() - t0;
  shmlink_publisher_stats st;
  OK(shmlink_publisher_get_stats(p, &st));
  CHECK(st.published == COUNT && st.subscribers == SUBS && st.detached == 0, "publisher stats");
  OK(shmlink_publisher_close(p));
  for (int i = 0; i < SUBS; i++) reap(kids[i], "subscriber");
  printf("fan-out: %llu messages to %d subscriber processes in %.2f s, all in order\n", COUNT,
         SUBS, secs);
}

static void overwrite(void) {
  const char *addr = addr_for("shm:", "lossy");
  shmlink_pubsub_options *o = shmlink_pubsub_options_new();
  OK(shmlink_pubsub_options_set_slots(o, 8));
  OK(shmlink_pubsub_options_set_policy(o, SHMLINK_POLICY_OVERWRITE));
  shmlink_publisher *p = shmlink_publisher_bind(addr, o);
  shmlink_pubsub_options_free(o);
  CHECK(p, "bind");
  shmlink_subscriber *s = shmlink_subscribe(addr, NULL);
  CHECK(s, "subscribe");
  OK(shmlink_publisher_wait_subscribers(p, 1, 5000));
  for (uint64_t i = 0; i < 20; i++) OK(shmlink_publish(p, &i, sizeof i));
  uint64_t v;
  FAILS(shmlink_sub_recv(s, &v, sizeof v), EOVERFLOW);
  CHECK(shmlink_last_missed() == 12, "missed %llu", (unsigned long long)shmlink_last_missed());
  CHECK(shmlink_sub_recv(s, &v, sizeof v) == sizeof v && v == 12, "oldest kept: %llu",
        (unsigned long long)v);
  OK(shmlink_sub_set_blocking(s, false));
  for (uint64_t i = 13; i < 20; i++)
    CHECK(shmlink_sub_recv(s, &v, sizeof v) == sizeof v && v == i, "then %llu", (unsigned long long)i);
  FAILS(shmlink_sub_recv(s, &v, sizeof v), EAGAIN);
  OK(shmlink_sub_close(s));
  OK(shmlink_publisher_close(p));
  puts("overwrite: a lagging subscriber learns it lost exactly 12 messages");
}

int main(void) {
  watchdog(180);
  fan_out();
  overwrite();
  return 0;
}
