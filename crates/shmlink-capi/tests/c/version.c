/* The version: the header's SHMLINK_VERSION_* macros (what this program was compiled
 * with) and shmlink_version() (the library it runs with) agree, as "MAJOR.MINOR.PATCH". */
#define _GNU_SOURCE
#include "check.h"

int main(void) {
  watchdog(30);
  const char *v = shmlink_version();
  CHECK(v != NULL, "shmlink_version() is NULL");
  char want[64];
  snprintf(want, sizeof want, "%d.%d.%d", SHMLINK_VERSION_MAJOR, SHMLINK_VERSION_MINOR,
           SHMLINK_VERSION_PATCH);
  CHECK(strcmp(v, want) == 0, "shmlink_version() is \"%s\", the macros say \"%s\"", v, want);
  CHECK(strcmp(v, "0.1.0") == 0, "shmlink_version() is \"%s\"", v);
  /* The same static string every time. */
  CHECK(shmlink_version() == v, "a new string per call");
  printf("shmlink %s\n", v);
  return 0;
}
