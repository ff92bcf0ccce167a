/* A peer that dies (SIGKILL, no chance to close) is reported as ECONNRESET within
 * 100 ms to a process blocked in recv, on shm: and ux:, and stays so. A peer that closes gracefully is reported as EPIPE after its last
 * message. */
#define _GNU_SOURCE
#include "check.h"

static void victim(const char *addr, int graceful) {
  shmlink_socket *c = connect_retry(addr, NULL);
  CHECK(c, "connect");
  OK(shmlink_send(c, "last words", 10));
  if (graceful) {
    OK(shmlink_close(c));
    _exit(0);
  }
  pause(); /* killed here */
  _exit(1);
}

/* The victims as children of accept_from_child. */
static void dies(const char *addr) { victim(addr, 0); }
static void closes(const char *addr) { victim(addr, 1); }

static void death(const char *prefix) {
  struct child_conn c = accept_from_child(addr_for(prefix, "death"), dies);
  char buf[32];
  CHECK(shmlink_recv(c.conn, buf, sizeof buf) == 10, "last words");
  /* A killer process: waits 200 ms (we are in recv by then), kills, notes the time. */
  int pipefd[2];
  CHECK(pipe(pipefd) == 0, "pipe");
  pid_t killer = fork();
  CHECK(killer >= 0, "fork");
  if (killer == 0) {
    usleep(200000);
    double t = now_s();
    kill(c.pid, SIGKILL);
    if (write(pipefd[1], &t, sizeof t) != sizeof t) _exit(1);
    _exit(0);
  }
  FAILS(shmlink_recv(c.conn, buf, sizeof buf), ECONNRESET);
  double noticed = now_s(), killed = 0;
  CHECK(read(pipefd[0], &killed, sizeof killed) == sizeof killed, "killer's time");
  double ms = (noticed - killed) * 1000;
  CHECK(ms < 100, "%s: death noticed after %.1f ms", prefix, ms);
  /* It stays so: the connection is over. */
  FAILS(shmlink_recv(c.conn, buf, sizeof buf), ECONNRESET);
  reap(killer, "killer");
  int status;
  waitpid(c.pid, &status, 0);
  close(pipefd[0]);
  close(pipefd[1]);
  shmlink_close(c.conn); /* the error, if any, is the reset already reported */
  OK(shmlink_close(c.listener));
  printf("%s peer killed: ECONNRESET after %.2f ms\n", prefix, ms);
}

static void graceful(const char *prefix) {
  struct child_conn c = accept_from_child(addr_for(prefix, "close"), closes);
  char buf[32];
  CHECK(shmlink_recv(c.conn, buf, sizeof buf) == 10, "last words before the end");
  FAILS(shmlink_recv(c.conn, buf, sizeof buf), EPIPE);
  FAILS(shmlink_recv(c.conn, buf, sizeof buf), EPIPE); /* and it stays so */
  reap(c.pid, "closer");
  OK(shmlink_close(c.conn));
  OK(shmlink_close(c.listener));
  printf("%s peer closed: EPIPE after its last message\n", prefix);
}

int main(void) {
  watchdog(60);
  death("shm:");
  death("ux:");
  graceful("shm:");
  graceful("ux:");
  return 0;
}
