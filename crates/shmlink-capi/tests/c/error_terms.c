/* Errors name what a C caller can change in C terms: the shmlink_options_set_* setter
 * and shmlink_subscribe, never the Rust API's Options::… or Subscriber::connect. */
#define _GNU_SOURCE
#include <sys/stat.h>

#include "check.h"

int main(void) {
  watchdog(60);
  /* A rendezvous directory other users may write: refused, and the way out is the C
   * setter for a deliberately shared directory. */
  char dir[] = "/tmp/shmlink-c-terms-XXXXXX";
  CHECK(mkdtemp(dir) != NULL, "mkdtemp");
  CHECK(chmod(dir, 0777) == 0, "chmod");
  char *old = getenv("SHMLINK_DIR");
  char *saved = old ? strdup(old) : NULL;
  CHECK(setenv("SHMLINK_DIR", dir, 1) == 0, "setenv");
  FAILS_NULL(shmlink_listen("shm:terms", NULL), EACCES);
  const char *msg = shmlink_last_error();
  printf("listen in a mode 0777 directory: %s\n", msg);
  CHECK(strstr(msg, "shmlink_options_set_shared_rendezvous_dir(opts, true)") != NULL,
        "no C setter in: %s", msg);
  CHECK(strstr(msg, "Options::") == NULL, "a Rust name in: %s", msg);
  CHECK(rmdir(dir) == 0, "rmdir");
  if (saved) {
    setenv("SHMLINK_DIR", saved, 1);
    free(saved);
  } else {
    unsetenv("SHMLINK_DIR");
  }

  /* A plain connection to a topic: told to subscribe, with the C call's name. */
  const char *addr = addr_for("shm:", "terms-topic");
  shmlink_publisher *pub = shmlink_publisher_bind(addr, NULL);
  CHECK(pub != NULL, "shmlink_publisher_bind");
  shmlink_socket *s = shmlink_connect(addr, NULL);
  CHECK(s == NULL, "a plain connect to a topic succeeded");
  msg = shmlink_last_error();
  printf("connect to a topic: %s\n", msg);
  CHECK(strstr(msg, "shmlink_subscribe") != NULL, "no C call in: %s", msg);
  CHECK(strstr(msg, "::") == NULL, "a Rust name in: %s", msg);
  OK(shmlink_publisher_close(pub));
  return 0;
}
