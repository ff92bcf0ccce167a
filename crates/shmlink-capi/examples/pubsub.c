/* pubsub: a publisher and its subscribers.
 *
 *   pubsub pub ADDR SUBSCRIBERS COUNT   binds the topic, waits for SUBSCRIBERS, publishes
 *                                       COUNT messages ("tick N"), closes
 *   pubsub sub ADDR                     subscribes and prints every message until the
 *                                       publisher closes
 *
 *   cc -std=c11 pubsub.c $(pkg-config --cflags --libs shmlink) -o pubsub
 *   ./pubsub sub shm:ticks & ./pubsub sub shm:ticks & ./pubsub pub shm:ticks 2 5
 */
#define _GNU_SOURCE
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <shmlink.h>

static int publish(const char *addr, size_t subscribers, long count) {
  shmlink_pubsub_options *opts = shmlink_pubsub_options_new();
  shmlink_pubsub_options_set_slots(opts, 64);
  shmlink_pubsub_options_set_max_msg_size(opts, 64);
  shmlink_publisher *pub = shmlink_publisher_bind(addr, opts);
  shmlink_pubsub_options_free(opts);
  if (!pub || shmlink_publisher_wait_subscribers(pub, subscribers, 10000) < 0) {
    fprintf(stderr, "publisher %s: %s\n", addr, shmlink_last_error());
    return 1;
  }
  for (long i = 0; i < count; i++) {
    /* Zero-copy: write the message straight into the topic's slot. */
    char *slot = shmlink_loan(pub, 64);
    if (!slot) {
      fprintf(stderr, "loan: %s\n", shmlink_last_error());
      return 1;
    }
    int len = snprintf(slot, 64, "tick %ld", i);
    if (shmlink_loan_commit(pub, (size_t)len) < 0) {
      fprintf(stderr, "publish: %s\n", shmlink_last_error());
      return 1;
    }
  }
  return shmlink_publisher_close(pub) < 0 ? 1 : 0; /* subscribers get everything, then EPIPE */
}

static int subscribe(const char *addr) {
  shmlink_subscriber *sub;
  /* The publisher may not be up yet: retry for a while. */
  for (int tries = 0; !(sub = shmlink_subscribe(addr, NULL)); tries++) {
    if (errno != ECONNREFUSED || tries == 1000) {
      fprintf(stderr, "subscribe %s: %s\n", addr, shmlink_last_error());
      return 1;
    }
    usleep(10000);
  }
  char buf[64];
  for (;;) {
    ssize_t n = shmlink_sub_recv(sub, buf, sizeof buf);
    if (n < 0) {
      if (errno == EPIPE) break; /* the publisher closed: every message was received */
      if (errno == EOVERFLOW) {  /* overwrite policy only: we fell behind */
        printf("lost %llu messages\n", (unsigned long long)shmlink_last_missed());
        continue;
      }
      fprintf(stderr, "recv: %s\n", shmlink_last_error());
      return 1;
    }
    printf("%.*s\n", (int)n, buf);
    fflush(stdout);
  }
  shmlink_sub_close(sub);
  return 0;
}

int main(int argc, char **argv) {
  if (argc == 5 && strcmp(argv[1], "pub") == 0)
    return publish(argv[2], (size_t)atol(argv[3]), atol(argv[4]));
  if (argc == 3 && strcmp(argv[1], "sub") == 0) return subscribe(argv[2]);
  fprintf(stderr, "usage: %s pub ADDR SUBSCRIBERS COUNT | %s sub ADDR\n", argv[0], argv[0]);
  return 2;
}
