/* Ways a program can take a connection's fd out of transparent mode's sight, each run
 * by a TCP server and client (both preloaded by the Rust test, tests/escapes.rs):
 *
 *   escapes server MODE PORTFILE    listens on 127.0.0.1:0, writes the port to PORTFILE
 *   escapes client MODE PORT
 *
 * MODE:
 *   rights      the client passes its connected fd with SCM_RIGHTS to a child process
 *               (forked before the connection existed), which writes 21 bytes and reads
 *               the server's answer
 *   rights-gone the same after the server wrote 4 bytes and closed (the client has not
 *               read them: they cannot be passed), then after the server closed at once
 *               (the client read the end: the fd can be passed)
 *   rawN        the client writes N bytes with syscall(SYS_write), past the C library
 *   stdio       the client writes with fdopen + fprintf + fflush (glibc's stdio writes
 *               with its internal write, past the C library's exported one)
 *   closerange  the client calls close_range(fd + 1, ~0U, 0) (RAW: the system call
 *               itself), opens socket pairs that may take the freed numbers, talks,
 *               closes its connection, and checks that no new file got a byte or was
 *               closed
 *   closerange-own  the client calls close_range(fd, ~0U, 0), its connection's fd
 *               included, then opens a socket pair (which takes that number) and
 *               writes on it: the bytes must reach the pair, not the old connection
 *   dup2onto    the client dup2()s a socket pair's end onto the first fd number above
 *               its connection's (one of the library's), talks, closes its connection,
 *               and checks that the pair got no byte
 *
 * Each side prints what it observes on stdout. Every wait has a timeout (alarm(30) ends
 * a stuck run), so nothing can hang the test.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <arpa/inet.h>
#include <dirent.h>
#include <unistd.h>

#include "common.h"

static const char *ename(int e) {
    switch (e) {
    case EAGAIN: return "EAGAIN";
    case EPIPE: return "EPIPE";
    case ECONNRESET: return "ECONNRESET";
    case EBADF: return "EBADF";
    case ENOBUFS: return "ENOBUFS";
    case EBUSY: return "EBUSY";
    case EINVAL: return "EINVAL";
    default: return "other";
    }
}

/* One read with a 5 s timeout: >0 bytes, 0 at EOF, -1 with errno, -2 on timeout. */
static ssize_t read_within(int fd, char *buf, size_t n) {
    struct pollfd p = {.fd = fd, .events = POLLIN};
    int r = poll(&p, 1, 5000);
    if (r == 0) return -2;
    if (r < 0) return -1;
    return read(fd, buf, n);
}

/* Reads until `want` bytes, EOF, an error or a timeout; says how it ended. Returns the
 * count. `raw` counts the bytes equal to 'R' (the raw writes' filler). */
static size_t read_until(int fd, char *buf, size_t want, const char *what) {
    size_t got = 0;
    for (;;) {
        if (got == want) {
            say("%s: %zu bytes", what, got);
            return got;
        }
        ssize_t r = read_within(fd, buf + got, want - got);
        if (r > 0) {
            got += (size_t)r;
            continue;
        }
        if (r == 0) say("%s: %zu bytes, then EOF", what, got);
        else if (r == -2) say("%s: %zu bytes, then timeout", what, got);
        else say("%s: %zu bytes, then %s", what, got, ename(errno));
        return got;
    }
}

/* How a connection ends from here: EOF, an error or a timeout. */
static void read_end(int fd, const char *what) {
    char buf[4096];
    size_t got = 0;
    for (;;) {
        ssize_t r = read_within(fd, buf, sizeof buf);
        if (r > 0) {
            got += (size_t)r;
            continue;
        }
        if (r == 0) say("%s: %zu more bytes, then EOF", what, got);
        else if (r == -2) say("%s: %zu more bytes, then timeout", what, got);
        else say("%s: %zu more bytes, then %s", what, got, ename(errno));
        return;
    }
}

static int connect_to(int port) {
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    if (fd < 0) die("socket");
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons(port),
                            .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    if (connect(fd, (struct sockaddr *)&a, sizeof a) < 0) die("connect");
    return fd;
}

static const char PARENT_MSG[] = "parent:hello\n";      /* 13 bytes */
static const char CHILD_MSG[] = "child: 21 bytes here\n"; /* 21 bytes */

static int server(const char *mode, const char *port_file) {
    int ls = listen_and_publish(port_file);
    int fd = accept(ls, NULL, NULL);
    if (fd < 0) die("accept");
    char buf[128 * 1024];
    if (strcmp(mode, "rights") == 0) {
        size_t want = strlen(PARENT_MSG) + strlen(CHILD_MSG);
        size_t got = read_until(fd, buf, want, "read");
        buf[got] = 0;
        say("stream intact: %s", got == want && memcmp(buf, PARENT_MSG, 13) == 0 &&
                                         memcmp(buf + 13, CHILD_MSG, 21) == 0 ? "yes" : "no");
        char reply[32];
        int n = snprintf(reply, sizeof reply, "ok %zu\n", got);
        if (write(fd, reply, n) != n) say("reply: %s", ename(errno));
        read_end(fd, "end");
    } else if (strcmp(mode, "rights-gone") == 0) {
        if (write(fd, "bye\n", 4) != 4) die("write bye");
        close(fd);
        fd = accept(ls, NULL, NULL);
        if (fd < 0) die("accept 2");
        say("closed both");
    } else if (strncmp(mode, "raw", 3) == 0 || strcmp(mode, "stdio") == 0) {
        /* Expected without the library: "before\n", N bytes 'R', "after\n". */
        size_t n = mode[0] == 's' ? 100 : (size_t)atol(mode + 3);
        size_t got = read_until(fd, buf, 13 + n, "read");
        size_t raw = 0;
        for (size_t i = 0; i < got; i++) raw += buf[i] == 'R';
        say("raw bytes seen: %zu", raw);
        say("hole: %s", raw < n && got > 7 ? "yes (bytes after the raw write arrived without it)" : "no");
    } else if (strcmp(mode, "closerange-own") == 0) {
        size_t got = read_until(fd, buf, 5, "ping");
        if (got == 5) {
            buf[1] = 'o';
            if (write(fd, buf, 5) != 5) say("pong: %s", ename(errno));
        }
        read_end(fd, "end");
    } else if (strcmp(mode, "closerange") == 0 || strcmp(mode, "closerange-raw") == 0 ||
               strcmp(mode, "dup2onto") == 0) {
        for (int i = 1; i <= 2; i++) {
            size_t got = read_until(fd, buf, 5, "ping");
            if (got != 5) break;
            buf[1] = 'o'; /* ping -> pong */
            if (write(fd, buf, 5) != 5) say("pong: %s", ename(errno));
        }
        read_end(fd, "end");
    } else {
        fprintf(stderr, "unknown mode %s\n", mode);
        return 2;
    }
    close(fd);
    close(ls);
    return 0;
}

/* Forks a child that runs `body` on its end of a fresh socketpair and exits with what it
 * returns; the parent's end is put in `*unix_out`. */
static pid_t spawn_child(int (*body)(int unix_sock), int *unix_out) {
    int sv[2];
    if (socketpair(AF_UNIX, SOCK_STREAM, 0, sv) < 0) die("socketpair");
    pid_t child = fork();
    if (child < 0) die("fork");
    if (child == 0) {
        close(sv[0]);
        role = "child";
        exit(body(sv[1]));
    }
    close(sv[1]);
    *unix_out = sv[0];
    return child;
}

/* Waits for one fd over `unix_sock` (SCM_RIGHTS) and returns it; -1 if the byte that
 * came carried none (the byte is put in `*said`). */
static int receive_fd(int unix_sock, char *said) {
    struct pollfd p = {.fd = unix_sock, .events = POLLIN};
    if (poll(&p, 1, 10000) <= 0) die("no fd came");
    struct iovec iov = {.iov_base = said, .iov_len = 1};
    union {
        char buf[CMSG_SPACE(sizeof(int))];
        struct cmsghdr align;
    } u;
    struct msghdr m = {.msg_iov = &iov, .msg_iovlen = 1, .msg_control = u.buf,
                       .msg_controllen = sizeof u.buf};
    if (recvmsg(unix_sock, &m, 0) != 1) die("recvmsg");
    struct cmsghdr *c = CMSG_FIRSTHDR(&m);
    if (!c || c->cmsg_type != SCM_RIGHTS) return -1;
    int fd;
    memcpy(&fd, CMSG_DATA(c), sizeof fd);
    return fd;
}

/* Sends `fd` over `unix` with SCM_RIGHTS; says how it went. Returns 1 if passed. */
static int pass_fd(int unix_sock, int fd) {
    char byte = 'F';
    struct iovec iov = {.iov_base = &byte, .iov_len = 1};
    union {
        char buf[CMSG_SPACE(sizeof(int))];
        struct cmsghdr align;
    } u;
    memset(&u, 0, sizeof u);
    struct msghdr m = {.msg_iov = &iov, .msg_iovlen = 1, .msg_control = u.buf,
                       .msg_controllen = sizeof u.buf};
    struct cmsghdr *c = CMSG_FIRSTHDR(&m);
    c->cmsg_level = SOL_SOCKET;
    c->cmsg_type = SCM_RIGHTS;
    c->cmsg_len = CMSG_LEN(sizeof(int));
    memcpy(CMSG_DATA(c), &fd, sizeof fd);
    if (sendmsg(unix_sock, &m, 0) == 1) {
        say("passed the fd");
        return 1;
    }
    say("sendmsg: %s", ename(errno));
    byte = 'N';
    struct msghdr plain = {.msg_iov = &iov, .msg_iovlen = 1};
    sendmsg(unix_sock, &plain, 0);
    return 0;
}

/* The child of `rights`: gets an fd over `unix`, writes CHILD_MSG on it, reads the
 * answer. */
static int rights_child(int unix_sock) {
    char said;
    int fd = receive_fd(unix_sock, &said);
    if (fd < 0) {
        say("no fd received (the sender said: %c)", said);
        return 0;
    }
    ssize_t w = write(fd, CHILD_MSG, strlen(CHILD_MSG));
    if (w < 0) say("write: %s", ename(errno));
    else say("wrote %zd bytes", w);
    char buf[64];
    size_t got = read_until(fd, buf, 6, "reply");
    buf[got] = 0;
    say("reply: %s", got == 6 && memcmp(buf, "ok 34\n", 6) == 0 ? "ok 34" : "wrong");
    close(fd);
    return 0;
}

static void client_rights(int port) {
    int unix_sock;
    pid_t child = spawn_child(rights_child, &unix_sock);
    int fd = connect_to(port);
    if (write(fd, PARENT_MSG, strlen(PARENT_MSG)) != (ssize_t)strlen(PARENT_MSG)) die("write");
    pass_fd(unix_sock, fd);
    close(fd);
    int st;
    waitpid(child, &st, 0);
    say("child exited %d", WIFEXITED(st) ? WEXITSTATUS(st) : -1);
}

/* A child's body that receives one fd (or a 'N') and reads it to its end. */
static int read_passed_fd(int unix_sock) {
    char said;
    int fd = receive_fd(unix_sock, &said);
    if (fd < 0) {
        say("no fd received");
        return 0;
    }
    char buf[64];
    read_until(fd, buf, sizeof buf, "read");
    return 0;
}

static void client_rights_gone(int port) {
    int st, unix_sock;
    /* 1: the server wrote 4 bytes and closed; none read here. */
    pid_t child = spawn_child(read_passed_fd, &unix_sock);
    int fd = connect_to(port);
    usleep(300 * 1000);
    if (!pass_fd(unix_sock, fd)) {
        char buf[64];
        read_until(fd, buf, sizeof buf, "own read");
    }
    close(fd);
    close(unix_sock);
    waitpid(child, &st, 0);
    /* 2: the server closed at once; the end read here. */
    child = spawn_child(read_passed_fd, &unix_sock);
    fd = connect_to(port);
    char b;
    ssize_t r = read_within(fd, &b, 1);
    say("end read first: %s", r == 0 ? "EOF" : "not EOF");
    pass_fd(unix_sock, fd);
    close(fd);
    close(unix_sock);
    waitpid(child, &st, 0);
}

/* After a write the library refused: says what a next write, a read and a later write on
 * `fd` get (the connection must not be usable either). */
static void say_what_follows(int fd) {
    ssize_t w = write(fd, "after\n", 6);
    say("write after: %s", w == 6 ? "taken" : w < 0 ? ename(errno) : "partly taken");
    char rb[64];
    ssize_t rr = read_within(fd, rb, sizeof rb);
    if (rr == -2) say("read: timeout");
    else if (rr < 0) say("read: %s", ename(errno));
    else say("read: %zd", rr);
    w = send(fd, "x", 1, MSG_NOSIGNAL);
    say("write later: %s", w == 1 ? "taken" : ename(errno));
}

static void client_raw(int port, size_t n) {
    int fd = connect_to(port);
    if (write(fd, "before\n", 7) != 7) die("write before");
    char *buf = malloc(n);
    memset(buf, 'R', n);
    long r = syscall(SYS_write, fd, buf, n);
    say("raw write: %s", r == (long)n ? "all taken" : r < 0 ? ename(errno) : "partly taken");
    free(buf);
    say_what_follows(fd);
    close(fd);
}

static void client_stdio(int port) {
    int fd = connect_to(port);
    if (write(fd, "before\n", 7) != 7) die("write before");
    FILE *f = fdopen(dup(fd), "w");
    if (!f) die("fdopen");
    for (int i = 0; i < 100; i++) fputc('R', f);
    int r = fflush(f);
    say("fflush: %s", r == 0 ? "ok" : ename(errno));
    say_what_follows(fd);
    fclose(f);
    close(fd);
}

static int open_fds(int *out, int max) {
    int n = 0;
    DIR *d = opendir("/proc/self/fd");
    if (!d) die("opendir");
    int dfd = dirfd(d);
    struct dirent *e;
    while ((e = readdir(d)) && n < max) {
        if (e->d_name[0] == '.') continue;
        int fd = atoi(e->d_name);
        if (fd != dfd) out[n++] = fd;
    }
    closedir(d);
    return n;
}

static void client_closerange(int port, int raw) {
    int fd = connect_to(port);
    char buf[16];
    if (write(fd, "ping1", 5) != 5) die("write ping1");
    if (read_until(fd, buf, 5, "pong1") != 5) return;
    int before[256];
    int nb = open_fds(before, 256);
    int above = 0;
    for (int i = 0; i < nb; i++) above += before[i] > fd;
    say("fds above the connection's before close_range: %s", above > 0 ? "some" : "none");
    int r = raw ? (int)syscall(SYS_close_range, fd + 1, ~0U, 0) : close_range(fd + 1, ~0U, 0);
    if (r != 0) die("close_range");
    /* New files, as a program would open them: they take the lowest free numbers. */
    enum { PAIRS = 32 };
    int mine[PAIRS], other[PAIRS];
    for (int i = 0; i < PAIRS; i++) {
        int sv[2];
        if (socketpair(AF_UNIX, SOCK_SEQPACKET, 0, sv) < 0) die("socketpair");
        mine[i] = sv[0];
        other[i] = sv[1];
    }
    if (write(fd, "ping2", 5) != 5) die("write ping2");
    if (read_until(fd, buf, 5, "pong2") != 5) return;
    close(fd);
    usleep(100 * 1000);
    int written = 0, closed = 0;
    for (int i = 0; i < PAIRS; i++) {
        char b[64];
        while (recv(other[i], b, sizeof b, MSG_DONTWAIT) > 0) written++;
        if (fcntl(mine[i], F_GETFD) < 0 && errno == EBADF) closed++;
    }
    say("new files the library wrote to: %d", written);
    say("new files the library closed: %d", closed);
}

static void client_closerange_own(int port) {
    int fd = connect_to(port);
    char buf[16];
    if (write(fd, "ping1", 5) != 5) die("write ping1");
    if (read_until(fd, buf, 5, "pong1") != 5) return;
    if (close_range(fd, ~0U, 0) != 0) die("close_range");
    int sv[2];
    if (socketpair(AF_UNIX, SOCK_STREAM, 0, sv) < 0) die("socketpair");
    say("the pair took the connection's number: %s", sv[0] == fd || sv[1] == fd ? "yes" : "no");
    int mine = sv[0] == fd ? sv[0] : sv[1], other = mine == sv[0] ? sv[1] : sv[0];
    ssize_t w = write(mine, "hello", 5);
    say("write on the new file: %s", w == 5 ? "taken" : ename(errno));
    size_t got = read_until(other, buf, 5, "the pair's other end");
    say("the pair got it: %s", got == 5 && memcmp(buf, "hello", 5) == 0 ? "yes" : "no");
    close(sv[0]);
    close(sv[1]);
}

static void client_dup2onto(int port) {
    int fd = connect_to(port);
    char buf[16];
    if (write(fd, "ping1", 5) != 5) die("write ping1");
    if (read_until(fd, buf, 5, "pong1") != 5) return;
    int fds[256];
    int n = open_fds(fds, 256), target = -1;
    for (int i = 0; i < n; i++)
        if (fds[i] > fd && (target < 0 || fds[i] < target)) target = fds[i];
    if (target < 0) {
        say("no fd above the connection's");
        return;
    }
    int sv[2];
    if (socketpair(AF_UNIX, SOCK_SEQPACKET, 0, sv) < 0) die("socketpair");
    int r = dup2(sv[0], target);
    say("dup2 onto the library's fd: %s", r == target ? "replaced it" : ename(errno));
    if (write(fd, "ping2", 5) != 5) die("write ping2");
    if (read_until(fd, buf, 5, "pong2") != 5) return;
    close(fd);
    usleep(100 * 1000);
    int written = 0;
    char b[64];
    while (recv(sv[1], b, sizeof b, MSG_DONTWAIT) > 0) written++;
    say("new files the library wrote to: %d", written);
}

int main(int argc, char **argv) {
    if (argc != 4) {
        fprintf(stderr, "usage: escapes server|client MODE PORTFILE|PORT\n");
        return 2;
    }
    alarm(30);
    signal(SIGPIPE, SIG_IGN);
    role = argv[1];
    const char *mode = argv[2];
    if (strcmp(argv[1], "server") == 0) return server(mode, argv[3]);
    int port = atoi(argv[3]);
    if (strcmp(mode, "rights") == 0) client_rights(port);
    else if (strcmp(mode, "rights-gone") == 0) client_rights_gone(port);
    else if (strncmp(mode, "raw", 3) == 0) client_raw(port, (size_t)atol(mode + 3));
    else if (strcmp(mode, "stdio") == 0) client_stdio(port);
    else if (strcmp(mode, "closerange") == 0) client_closerange(port, 0);
    else if (strcmp(mode, "closerange-raw") == 0) client_closerange(port, 1);
    else if (strcmp(mode, "dup2onto") == 0) client_dup2onto(port);
    else if (strcmp(mode, "closerange-own") == 0) client_closerange_own(port);
    else return 2;
    say("done");
    return 0;
}
