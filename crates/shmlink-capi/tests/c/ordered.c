/* 1,000,000 ordered, checksummed messages over shm: from one process to another. Each
 * message carries its sequence number, its length (8..=264 bytes, varying) and a
 * checksum of its payload; the receiver checks all three for every message, then the
 * counters on both ends. The sender alternates copy sends and zero-copy reservations. */
#define _GNU_SOURCE
#include "check.h"

#define COUNT 1000000ULL

struct head {
  uint64_t seq;
  uint64_t sum;
};

static size_t len_of(uint64_t seq) { return sizeof(struct head) + (seq * 7919) % 257; }

static void produce(const char *addr) {
  shmlink_socket *conn = connect_retry(addr, NULL);
  CHECK(conn, "connect %s", addr);
  unsigned char msg[sizeof(struct head) + 257];
  for (uint64_t seq = 0; seq < COUNT; seq++) {
    size_t n = len_of(seq);
    struct head h = {seq, 0};
    /* The payload after the head: bytes derived from seq, cheap to make and check. */
    for (size_t i = sizeof h; i < n; i++) msg[i] = (unsigned char)(seq + i);
    h.sum = fnv1a(msg + sizeof h, n - sizeof h);
    if (seq % 2) {
      memcpy(msg, &h, sizeof h);
      OK(shmlink_send(conn, msg, n));
    } else {
      unsigned char *room = shmlink_reserve(conn, n);
      CHECK(room, "reserve");
      memcpy(room, &h, sizeof h);
      memcpy(room + sizeof h, msg + sizeof h, n - sizeof h);
      OK(shmlink_commit(conn));
    }
  }
  OK(shmlink_close(conn));
}

int main(void) {
  watchdog(240);
  struct child_conn c = accept_from_child(addr_for("shm:", "ordered"), produce);
  double t0 = now_s();
  unsigned char buf[512];
  uint64_t bytes = 0;
  for (uint64_t seq = 0; seq < COUNT; seq++) {
    ssize_t n = shmlink_recv(c.conn, buf, sizeof buf);
    CHECK(n == (ssize_t)len_of(seq), "message %llu: length %zd, expected %zu",
          (unsigned long long)seq, n, len_of(seq));
    struct head h;
    memcpy(&h, buf, sizeof h);
    CHECK(h.seq == seq, "message %llu arrived as %llu", (unsigned long long)seq,
          (unsigned long long)h.seq);
    CHECK(h.sum == fnv1a(buf + sizeof h, (size_t)n - sizeof h), "message %llu: bad checksum",
          (unsigned long long)seq);
    for (size_t i = sizeof h; i < (size_t)n; i++)
      CHECK(buf[i] == (unsigned char)(seq + i), "message %llu byte %zu", (unsigned long long)seq, i);
    bytes += (uint64_t)n;
  }
  FAILS(shmlink_recv(c.conn, buf, sizeof buf), EPIPE); /* the end, after the last message */
  double secs = now_s() - t0;
  shmlink_counters counters;
  OK(shmlink_get_counters(c.conn, &counters));
  CHECK(counters.msgs_in == COUNT && counters.bytes_in == bytes, "counters %llu msgs %llu bytes",
        (unsigned long long)counters.msgs_in, (unsigned long long)counters.bytes_in);
  OK(shmlink_close(c.conn));
  OK(shmlink_close(c.listener));
  reap(c.pid, "sender");
  printf("%llu ordered checksummed messages in %.2f s (%.0f msgs/s, sanitized build)\n",
         COUNT, secs, (double)COUNT / secs);
  return 0;
}
