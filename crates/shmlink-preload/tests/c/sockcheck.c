/* The syscall-semantics check of transparent mode: one TCP server and one client, each
 * running the same numbered scenarios, one connection per scenario, printing what they
 * observe (bytes, return values, errno names) on stdout. The Rust test runs the pair
 * plain, both preloaded, and mixed, and requires the same output every time.
 *
 *   sockcheck server PORTFILE     listens on 127.0.0.1:0, writes the port to PORTFILE
 *   sockcheck client PORT
 *
 * Every wait has a timeout (alarm(20) ends a stuck run), so nothing can hang the test.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/ioctl.h>
#include <sys/select.h>
#include <sys/sendfile.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <sys/wait.h>
#include <pthread.h>
#include <arpa/inet.h>
#include <unistd.h>

#define SCENARIOS 22

#include "common.h"

static const char *ename(int e) {
    switch (e) {
    case EAGAIN: return "EAGAIN";
    case EPIPE: return "EPIPE";
    case ECONNRESET: return "ECONNRESET";
    case EINPROGRESS: return "EINPROGRESS";
    case EBADF: return "EBADF";
    case ENOTCONN: return "ENOTCONN";
    case EINVAL: return "EINVAL";
    case EISCONN: return "EISCONN";
    case EEXIST: return "EEXIST";
    case ENOENT: return "ENOENT";
    default: return "other";
    }
}

/* Reads exactly n bytes (blocking fd), or dies. */
static void read_full(int fd, void *buf, size_t n) {
    size_t got = 0;
    while (got < n) {
        ssize_t r = read(fd, (char *)buf + got, n - got);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) die("read_full");
        got += (size_t)r;
    }
}

/* Reads until end of stream or an error, at most `cap` bytes into `buf`: how many came;
 * the last read's result (0, or -1 with errno) in `*last`. */
static size_t read_to_end(int fd, char *buf, size_t cap, ssize_t *last) {
    size_t got = 0;
    ssize_t r;
    while ((r = read(fd, buf + got, cap - got)) > 0) got += (size_t)r;
    *last = r;
    return got;
}

static void write_full(int fd, const void *buf, size_t n) {
    size_t done = 0;
    while (done < n) {
        ssize_t r = write(fd, (const char *)buf + done, n - done);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) die("write_full");
        done += (size_t)r;
    }
}

/* Waits for fd readable, up to 5 s; returns revents. */
static int wait_in(int fd) {
    struct pollfd p = {.fd = fd, .events = POLLIN};
    int r = poll(&p, 1, 5000);
    if (r < 0) die("poll");
    return r == 0 ? 0 : p.revents;
}

static uint32_t sum(const unsigned char *b, size_t n) {
    uint32_t h = 2166136261u;
    for (size_t i = 0; i < n; i++) h = (h ^ b[i]) * 16777619u;
    return h;
}

static unsigned char big[1 << 20];

static volatile sig_atomic_t sigpipes;
static void on_sigpipe(int sig) {
    (void)sig;
    sigpipes++;
}

/* Full duplex from two threads: one writes `n` patterned bytes while the other reads
 * as many and checks them (both blocking, on one fd). */
struct duplex {
    int fd;
    size_t n;
    int ok;
};

static void *duplex_writer(void *arg) {
    struct duplex *d = arg;
    static unsigned char chunk[10007];
    size_t done = 0;
    while (done < d->n) {
        size_t k = d->n - done < sizeof chunk ? d->n - done : sizeof chunk;
        for (size_t i = 0; i < k; i++) chunk[i] = (unsigned char)((done + i) * 13);
        write_full(d->fd, chunk, k);
        done += k;
    }
    return NULL;
}

static void duplex_run(int fd, size_t n, const char *what) {
    struct duplex d = {.fd = fd, .n = n, .ok = 1};
    pthread_t t;
    if (pthread_create(&t, NULL, duplex_writer, &d) != 0) die("pthread_create");
    unsigned char buf[8192];
    size_t got = 0;
    while (got < n) {
        ssize_t r = read(fd, buf, sizeof buf);
        if (r <= 0) die("duplex read");
        for (ssize_t i = 0; i < r; i++)
            if (buf[i] != (unsigned char)((got + (size_t)i) * 13)) d.ok = 0;
        got += (size_t)r;
    }
    pthread_join(t, NULL);
    say("%s: sent and received %zu bytes at once, intact %d", what, n, d.ok);
}

/* ---- the scenarios: server side gets the accepted fd, client side the connected one -- */

static void server_side(int i, int fd) {
    char buf[4096];
    switch (i) {
    case 0: { /* echo with odd read sizes */
        size_t total = 0;
        for (;;) {
            ssize_t r = read(fd, buf, 333);
            if (r == 0) break;
            if (r < 0) die("echo read");
            write_full(fd, buf, (size_t)r);
            total += (size_t)r;
        }
        say("echoed %zu bytes, then end of stream", total);
        break;
    }
    case 1: { /* MSG_PEEK, FIONREAD, MSG_WAITALL */
        wait_in(fd);
        ssize_t r = recv(fd, buf, 5, MSG_PEEK);
        say("peek %zd '%.*s'", r, (int)r, buf);
        int avail = -1;
        if (ioctl(fd, FIONREAD, &avail) < 0) die("FIONREAD");
        say("FIONREAD positive: %d", avail > 0);
        r = recv(fd, buf, 5, 0);
        say("recv %zd '%.*s'", r, (int)r, buf);
        r = recv(fd, buf, 6, MSG_WAITALL);
        say("waitall %zd '%.*s'", r, (int)r, buf);
        write_full(fd, "k", 1);
        break;
    }
    case 2: { /* non-blocking reads: EAGAIN, then poll, then data */
        int fl = fcntl(fd, F_GETFL);
        if (fcntl(fd, F_SETFL, fl | O_NONBLOCK) < 0) die("F_SETFL");
        say("O_NONBLOCK reads back: %d", (fcntl(fd, F_GETFL) & O_NONBLOCK) != 0);
        ssize_t r = read(fd, buf, sizeof buf);
        say("empty read %zd %s", r, r < 0 ? ename(errno) : "-");
        r = recv(fd, buf, sizeof buf, MSG_DONTWAIT);
        say("MSG_DONTWAIT %zd %s", r, r < 0 ? ename(errno) : "-");
        write_full(fd, "go", 2);
        int ev = wait_in(fd);
        say("poll POLLIN %d", (ev & POLLIN) != 0);
        r = read(fd, buf, sizeof buf);
        say("read %zd '%.*s'", r, (int)(r > 0 ? r : 0), buf);
        break;
    }
    case 3: { /* half close: the client shuts down writing, we still write */
        ssize_t r = read(fd, buf, sizeof buf);
        say("read %zd '%.*s'", r, (int)(r > 0 ? r : 0), buf);
        r = read(fd, buf, sizeof buf);
        say("after the peer's SHUT_WR read %zd", r);
        write_full(fd, "still here", 10);
        break;
    }
    case 4: { /* addresses and options */
        struct sockaddr_in a;
        socklen_t len = sizeof a;
        if (getsockname(fd, (struct sockaddr *)&a, &len) < 0) die("getsockname");
        char ip[32];
        inet_ntop(AF_INET, &a.sin_addr, ip, sizeof ip);
        say("getsockname family %d ip %s", a.sin_family, ip);
        len = sizeof a;
        if (getpeername(fd, (struct sockaddr *)&a, &len) < 0) die("getpeername");
        inet_ntop(AF_INET, &a.sin_addr, ip, sizeof ip);
        say("getpeername ip %s", ip);
        uint16_t port = ntohs(a.sin_port);
        uint16_t theirs;
        read_full(fd, &theirs, 2);
        say("peer port matches the client's own: %d", port == theirs);
        int one = 1, v = 0;
        len = sizeof v;
        if (setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one) < 0) die("TCP_NODELAY");
        getsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &v, &len);
        say("TCP_NODELAY %d", v != 0);
        len = sizeof v;
        getsockopt(fd, SOL_SOCKET, SO_ERROR, &v, &len);
        say("SO_ERROR %d", v);
        len = sizeof v;
        getsockopt(fd, SOL_SOCKET, SO_TYPE, &v, &len);
        say("SO_TYPE stream %d", v == SOCK_STREAM);
        write_full(fd, "k", 1);
        break;
    }
    case 5: { /* epoll, level-triggered, with a pipe in the same set */
        int ep = epoll_create1(EPOLL_CLOEXEC), pp[2];
        if (ep < 0 || pipe(pp) < 0) die("epoll/pipe");
        struct epoll_event ev = {.events = EPOLLIN, .data.u64 = 1000 + (unsigned)fd};
        if (epoll_ctl(ep, EPOLL_CTL_ADD, fd, &ev) < 0) die("epoll_ctl sock");
        ev.data.u64 = 7;
        if (epoll_ctl(ep, EPOLL_CTL_ADD, pp[0], &ev) < 0) die("epoll_ctl pipe");
        write_full(pp[1], "p", 1);
        struct epoll_event out[4];
        int n = epoll_wait(ep, out, 4, 5000);
        say("pipe ready: n=%d data=%llu", n, n > 0 ? (unsigned long long)out[0].data.u64 : 0ull);
        read_full(pp[0], buf, 1);
        write_full(fd, "go", 2);
        size_t total = 0;
        int rounds = 0;
        while (total < 3000 && rounds < 100) {
            n = epoll_wait(ep, out, 4, 5000);
            if (n <= 0) die("epoll_wait sock");
            if (out[0].data.u64 != 1000 + (unsigned)fd) die("epoll data");
            /* Level-triggered: read a little each time, epoll must keep reporting. */
            ssize_t r = read(fd, buf, 500);
            if (r <= 0) die("epoll read");
            total += (size_t)r;
            rounds++;
        }
        say("level-triggered got %zu bytes in small reads", total);
        n = epoll_wait(ep, out, 4, 100);
        say("nothing more: n=%d", n);
        close(ep);
        close(pp[0]);
        close(pp[1]);
        write_full(fd, "k", 1);
        break;
    }
    case 6: { /* epoll, edge-triggered, non-blocking: read until EAGAIN */
        int fl = fcntl(fd, F_GETFL);
        fcntl(fd, F_SETFL, fl | O_NONBLOCK);
        int ep = epoll_create1(0);
        struct epoll_event ev = {.events = EPOLLIN | EPOLLET | EPOLLRDHUP, .data.u64 = 42};
        if (epoll_ctl(ep, EPOLL_CTL_ADD, fd, &ev) < 0) die("epoll_ctl et");
        write_full(fd, "go", 2);
        size_t total = 0;
        int eof = 0;
        while (!eof) {
            struct epoll_event out[2];
            int n = epoll_wait(ep, out, 2, 5000);
            if (n <= 0) die("epoll_wait et");
            for (;;) {
                ssize_t r = read(fd, buf, sizeof buf);
                if (r > 0) { total += (size_t)r; continue; }
                if (r == 0) { eof = 1; break; }
                if (errno == EAGAIN) break;
                die("et read");
            }
        }
        say("edge-triggered got %zu bytes then end of stream", total);
        close(ep);
        break;
    }
    case 7: { /* select */
        fd_set r;
        FD_ZERO(&r);
        FD_SET(fd, &r);
        struct timeval tv = {.tv_sec = 0, .tv_usec = 50000};
        int n = select(fd + 1, &r, NULL, NULL, &tv);
        say("select before data: %d", n);
        write_full(fd, "go", 2);
        FD_ZERO(&r);
        FD_SET(fd, &r);
        tv.tv_sec = 5;
        n = select(fd + 1, &r, NULL, NULL, &tv);
        say("select after data: %d isset %d", n, FD_ISSET(fd, &r) != 0);
        ssize_t got = read(fd, buf, sizeof buf);
        say("read %zd '%.*s'", got, (int)(got > 0 ? got : 0), buf);
        break;
    }
    case 8: { /* readv / recvmsg / writev / sendmsg */
        char a[3], b[4];
        struct iovec iov[2] = {{a, 3}, {b, 4}};
        wait_in(fd);
        usleep(20000);
        ssize_t r = readv(fd, iov, 2);
        say("readv %zd '%.3s' '%.*s'", r, a, (int)(r > 3 ? r - 3 : 0), b);
        struct msghdr m = {0};
        m.msg_iov = iov;
        m.msg_iovlen = 2;
        read_full(fd, buf, 0);
        r = recvmsg(fd, &m, MSG_WAITALL);
        say("recvmsg %zd '%.3s' '%.4s' flags %d", r, a, b, m.msg_flags);
        struct iovec w[3] = {{"one ", 4}, {"two ", 4}, {"three", 5}};
        r = writev(fd, w, 3);
        say("writev %zd", r);
        m.msg_iov = w;
        m.msg_iovlen = 3;
        r = sendmsg(fd, &m, MSG_NOSIGNAL);
        say("sendmsg %zd", r);
        break;
    }
    case 9: { /* the peer closes: we read the end, then writing fails */
        size_t total = 0;
        ssize_t r;
        while ((r = read(fd, buf, sizeof buf)) > 0) total += (size_t)r;
        say("read %zu bytes, then after the peer's close %zd", total, r);
        int failed = 0;
        for (int k = 0; k < 50 && !failed; k++) {
            r = send(fd, "x", 1, MSG_NOSIGNAL);
            if (r < 0) {
                failed = 1;
                say("send to a closed peer fails: %s",
                    errno == EPIPE || errno == ECONNRESET ? "EPIPE/ECONNRESET" : ename(errno));
            }
            usleep(2000);
        }
        if (!failed) say("send to a closed peer never failed");
        struct sigaction sa = {0}, old;
        sa.sa_handler = on_sigpipe;
        sigaction(SIGPIPE, &sa, &old);
        r = write(fd, "x", 1);
        say("write without MSG_NOSIGNAL: %zd %s, SIGPIPE %d", r, r < 0 ? ename(errno) : "-", sigpipes);
        sigaction(SIGPIPE, &old, NULL);
        break;
    }
    case 10: { /* dup, close the original, use the dup; dup2 onto another number */
        int d = dup(fd);
        close(fd);
        ssize_t r = read(d, buf, 5);
        say("read on dup %zd '%.*s'", r, (int)(r > 0 ? r : 0), buf);
        int target = d + 10;
        if (dup2(d, target) != target) die("dup2");
        close(d);
        write_full(target, "via dup2", 8);
        close(target);
        return;
    }
    case 11: { /* a big transfer with sendfile from a file */
        char path[] = "/tmp/sockcheck-XXXXXX";
        int f = mkstemp(path);
        if (f < 0) die("mkstemp");
        unlink(path);
        for (size_t k = 0; k < sizeof big; k++) big[k] = (unsigned char)(k * 7 + k / 4096);
        write_full(f, big, sizeof big);
        off_t off = 0;
        size_t sent = 0;
        while (sent < sizeof big) {
            ssize_t r = sendfile(fd, f, &off, sizeof big - sent);
            if (r <= 0) die("sendfile");
            sent += (size_t)r;
        }
        say("sendfile sent %zu, offset %lld", sent, (long long)off);
        close(f);
        break;
    }
    case 12: { /* a blocking write larger than any buffer while the peer reads slowly */
        for (size_t k = 0; k < sizeof big; k++) big[k] = (unsigned char)(k ^ (k >> 8));
        write_full(fd, big, sizeof big);
        say("wrote %zu bytes, sum %08x", sizeof big, sum(big, sizeof big));
        break;
    }
    case 13: { /* non-blocking writes until EAGAIN, then POLLOUT when the peer drains */
        int fl = fcntl(fd, F_GETFL);
        fcntl(fd, F_SETFL, fl | O_NONBLOCK);
        size_t total = 0;
        int eagain = 0;
        memset(big, 'z', sizeof big);
        for (int k = 0; k < 100000 && !eagain; k++) {
            ssize_t r = write(fd, big, 65536);
            if (r > 0) total += (size_t)r;
            else if (errno == EAGAIN) eagain = 1;
            else die("nb write");
        }
        say("non-blocking writes end in EAGAIN: %d", eagain);
        /* Tell the peer how much to read, over a blocking write after POLLOUT. */
        struct pollfd p = {.fd = fd, .events = POLLOUT};
        int n = poll(&p, 1, 5000);
        say("POLLOUT after the peer drains: %d", n == 1 && (p.revents & POLLOUT));
        fcntl(fd, F_SETFL, fl);
        shutdown(fd, SHUT_WR);
        char c;
        ssize_t r = read(fd, &c, 1);
        say("peer's count matches: %d", r == 1 && c == 'y');
        (void)total;
        break;
    }
    case 20: { /* fork: the child serves the accepted connection */
        pid_t pid = fork();
        if (pid < 0) die("fork");
        if (pid == 0) {
            ssize_t r = read(fd, buf, sizeof buf);
            char reply[64];
            int k = snprintf(reply, sizeof reply, "child got %zd", r);
            write_full(fd, reply, (size_t)k);
            _exit(0);
        }
        close(fd);
        int st;
        waitpid(pid, &st, 0);
        say("child exited %d", WIFEXITED(st) ? WEXITSTATUS(st) : -1);
        return;
    }
    case 19: { /* edge-triggered, one read per edge (nginx): a short read means drained */
        int ep = epoll_create1(0);
        struct epoll_event ev = {.events = EPOLLIN | EPOLLET, .data.u64 = 9}, out[2];
        if (epoll_ctl(ep, EPOLL_CTL_ADD, fd, &ev) < 0) die("epoll_ctl");
        write_full(fd, "go", 2);
        int n = epoll_wait(ep, out, 2, 5000);
        usleep(30000);
        ssize_t r = read(fd, buf, sizeof buf);
        say("edge %d, one read got %zd '%.*s'", n, r, (int)(r > 0 ? r : 0), buf);
        n = epoll_wait(ep, out, 2, 100);
        say("no new edge: n=%d", n);
        write_full(fd, "k", 1);
        n = epoll_wait(ep, out, 2, 5000);
        r = read(fd, buf, sizeof buf);
        say("next edge %d, read %zd '%.*s'", n, r, (int)(r > 0 ? r : 0), buf);
        close(ep);
        break;
    }
    case 21: { /* nginx's registration (EPOLLIN|EPOLLOUT|EPOLLET|EPOLLRDHUP), one read per
                  edge, made after the first request came (and after a poll that found
                  nothing yet); the next requests while it waits */
        struct pollfd p = {.fd = fd, .events = POLLIN};
        say("poll before the request: %d", poll(&p, 1, 0));
        write_full(fd, "g", 1);
        usleep(100000);
        fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK);
        int ep = epoll_create1(0);
        struct epoll_event ev = {.events = EPOLLIN | EPOLLOUT | EPOLLET | EPOLLRDHUP,
                                 .data.u64 = 21}, out[2];
        if (epoll_ctl(ep, EPOLL_CTL_ADD, fd, &ev) < 0) die("epoll_ctl");
        for (int req = 0; req < 3; req++) {
            ssize_t got = 0;
            for (int waits = 0; got == 0; waits++) {
                if (waits > 1000) die("edge-triggered: only EPOLLOUT");
                int n = epoll_wait(ep, out, 2, 3000);
                if (n <= 0) die("edge-triggered: request not reported");
                if (!(out[0].events & EPOLLIN)) continue;
                got = read(fd, buf, sizeof buf);
                if (got < 0 && errno == EAGAIN) got = 0;
                else if (got <= 0) die("edge-triggered read");
            }
            say("request %d: '%.*s'", req, (int)got, buf);
            write_full(fd, "ok", 2);
        }
        close(ep);
        break;
    }
    case 18: { /* splice from a pipe, sendmmsg, recvmmsg */
        int pp[2];
        if (pipe(pp) < 0) die("pipe");
        write_full(pp[1], "spliced", 7);
        ssize_t r = splice(pp[0], NULL, fd, NULL, 7, 0);
        say("splice from a pipe %zd", r);
        struct iovec a = {"mm1", 3}, b = {"mm2", 3};
        struct mmsghdr mm[2];
        memset(mm, 0, sizeof mm);
        mm[0].msg_hdr.msg_iov = &a;
        mm[0].msg_hdr.msg_iovlen = 1;
        mm[1].msg_hdr.msg_iov = &b;
        mm[1].msg_hdr.msg_iovlen = 1;
        int k = sendmmsg(fd, mm, 2, 0);
        say("sendmmsg %d lens %u %u", k, mm[0].msg_len, mm[1].msg_len);
        char x[3], y[3];
        struct iovec ix = {x, 3}, iy = {y, 3};
        memset(mm, 0, sizeof mm);
        mm[0].msg_hdr.msg_iov = &ix;
        mm[0].msg_hdr.msg_iovlen = 1;
        mm[1].msg_hdr.msg_iov = &iy;
        mm[1].msg_hdr.msg_iovlen = 1;
        wait_in(fd);
        usleep(20000);
        k = recvmmsg(fd, mm, 2, MSG_WAITFORONE, NULL);
        say("recvmmsg %d '%.3s' '%.3s'", k, x, y);
        close(pp[0]);
        close(pp[1]);
        break;
    }
    case 17: /* threads: full duplex, larger than both rings */
        duplex_run(fd, 3 << 20, "server");
        break;
    case 16: { /* epoll: one-shot, re-arm by MOD, DEL/ADD cycles, EEXIST/ENOENT, EPOLLOUT */
        int ep = epoll_create1(0);
        struct epoll_event ev = {.events = EPOLLIN | EPOLLONESHOT, .data.u64 = 1}, out[4];
        say("ADD %d", epoll_ctl(ep, EPOLL_CTL_ADD, fd, &ev));
        int r = epoll_ctl(ep, EPOLL_CTL_ADD, fd, &ev);
        say("ADD again %d %s", r, r < 0 ? ename(errno) : "-");
        int n = epoll_wait(ep, out, 4, 5000);
        say("one-shot: n=%d data=%llu", n, n > 0 ? (unsigned long long)out[0].data.u64 : 0ull);
        read_full(fd, buf, 1);
        write_full(fd, "1", 1);
        usleep(50000);
        n = epoll_wait(ep, out, 4, 100);
        say("after it fired, data waiting: n=%d", n);
        ev.data.u64 = 2;
        say("MOD %d", epoll_ctl(ep, EPOLL_CTL_MOD, fd, &ev));
        n = epoll_wait(ep, out, 4, 5000);
        say("re-armed: n=%d data=%llu", n, n > 0 ? (unsigned long long)out[0].data.u64 : 0ull);
        read_full(fd, buf, 1);
        say("DEL %d", epoll_ctl(ep, EPOLL_CTL_DEL, fd, NULL));
        r = epoll_ctl(ep, EPOLL_CTL_DEL, fd, NULL);
        say("DEL again %d %s", r, r < 0 ? ename(errno) : "-");
        r = epoll_ctl(ep, EPOLL_CTL_MOD, fd, &ev);
        say("MOD after DEL %d %s", r, r < 0 ? ename(errno) : "-");
        write_full(fd, "2", 1);
        usleep(50000);
        n = epoll_wait(ep, out, 4, 100);
        say("out of the set, data waiting: n=%d", n);
        ev.events = EPOLLIN;
        ev.data.u64 = 3;
        say("ADD %d", epoll_ctl(ep, EPOLL_CTL_ADD, fd, &ev));
        n = epoll_wait(ep, out, 4, 5000);
        say("back: n=%d data=%llu", n, n > 0 ? (unsigned long long)out[0].data.u64 : 0ull);
        read_full(fd, buf, 1);
        ev.events = EPOLLOUT;
        ev.data.u64 = 4;
        say("MOD %d", epoll_ctl(ep, EPOLL_CTL_MOD, fd, &ev));
        n = epoll_wait(ep, out, 4, 5000);
        say("writable: n=%d data=%llu out=%d", n, n > 0 ? (unsigned long long)out[0].data.u64 : 0ull,
            n > 0 && (out[0].events & EPOLLOUT) != 0);
        close(ep);
        write_full(fd, "3", 1);
        break;
    }
    case 14: { /* the client closed every fd it did not open; the connection lives */
        /* A vfork child closing the connection's fd (as before an exec) leaves it to
         * the parent: its fd table is its own, only the memory is shared. */
        pid_t pid = vfork();
        if (pid == 0) {
            close(fd);
            _exit(0);
        }
        if (pid < 0) die("vfork");
        int st;
        waitpid(pid, &st, 0);
        read_full(fd, buf, 5);
        say("got '%.5s'", buf);
        write_full(fd, "ok", 2);
        break;
    }
    case 15: { /* accept4 flags: non-blocking from the start */
        say("accept4 SOCK_NONBLOCK reads back: %d", (fcntl(fd, F_GETFL) & O_NONBLOCK) != 0);
        ssize_t r = read(fd, buf, 1);
        say("read %zd %s", r, r < 0 ? ename(errno) : "-");
        write_full(fd, "go", 2);
        say("then POLLIN %d", (wait_in(fd) & POLLIN) != 0);
        r = read(fd, buf, 1);
        say("read %zd", r);
        break;
    }
    }
    close(fd);
}

static int connect_to(int port, int nonblocking) {
    int fd = socket(AF_INET, SOCK_STREAM | (nonblocking ? SOCK_NONBLOCK : 0), 0);
    if (fd < 0) die("socket");
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    int r = connect(fd, (struct sockaddr *)&a, sizeof a);
    if (r < 0 && !(nonblocking && errno == EINPROGRESS)) die("connect");
    return fd;
}

static void client_side(int i, int port) {
    char buf[4096];
    int fd = connect_to(port, i == 15);
    switch (i) {
    case 0: {
        static unsigned char out[300000], in[300000];
        for (size_t k = 0; k < sizeof out; k++) out[k] = (unsigned char)(k * 31 + 7);
        size_t sizes[] = {1, 1000, 100000, 198999};
        size_t off = 0, got = 0;
        for (int k = 0; k < 4; k++) {
            write_full(fd, out + off, sizes[k]);
            off += sizes[k];
            read_full(fd, in + got, sizes[k]);
            got += sizes[k];
        }
        shutdown(fd, SHUT_WR);
        ssize_t r = read(fd, buf, 1);
        say("echo intact: %d, then read %zd", memcmp(in, out, off) == 0, r);
        break;
    }
    case 1:
        write_full(fd, "hello world", 11);
        read_full(fd, buf, 1);
        say("done");
        break;
    case 2:
        read_full(fd, buf, 2);
        usleep(20000);
        write_full(fd, "late", 4);
        say("sent late");
        break;
    case 3: {
        write_full(fd, "half", 4);
        if (shutdown(fd, SHUT_WR) < 0) die("shutdown");
        ssize_t w = send(fd, "x", 1, MSG_NOSIGNAL);
        say("write after SHUT_WR %zd %s", w, w < 0 ? ename(errno) : "-");
        ssize_t r;
        size_t got = read_to_end(fd, buf, sizeof buf, &r);
        say("read back '%.*s' then %zd", (int)got, buf, r);
        break;
    }
    case 4: {
        struct sockaddr_in a;
        socklen_t len = sizeof a;
        getsockname(fd, (struct sockaddr *)&a, &len);
        uint16_t mine = ntohs(a.sin_port);
        write_full(fd, &mine, 2);
        len = sizeof a;
        getpeername(fd, (struct sockaddr *)&a, &len);
        say("peer is the server's port: %d", ntohs(a.sin_port) == port);
        read_full(fd, buf, 1);
        break;
    }
    case 5: {
        read_full(fd, buf, 2);
        memset(buf, 'e', 3000);
        write_full(fd, buf, 3000);
        read_full(fd, buf, 1);
        say("done");
        break;
    }
    case 6: {
        read_full(fd, buf, 2);
        for (int k = 0; k < 20; k++) {
            memset(buf, 'a' + k, 1000);
            write_full(fd, buf, 1000);
            if (k % 5 == 0) usleep(5000);
        }
        close(fd);
        say("sent 20000 and closed");
        return;
    }
    case 7:
        read_full(fd, buf, 2);
        write_full(fd, "seen", 4);
        say("done");
        break;
    case 8: {
        write_full(fd, "abcdefg", 7);
        usleep(50000);
        write_full(fd, "ABCDEFG", 7);
        size_t got = 0;
        while (got < 26) {
            ssize_t r = read(fd, buf + got, sizeof buf - got);
            if (r <= 0) break;
            got += (size_t)r;
        }
        say("got '%.*s'", (int)got, buf);
        break;
    }
    case 9:
        write_full(fd, "bye", 3);
        close(fd);
        say("closed");
        return;
    case 10: {
        write_full(fd, "hello", 5);
        ssize_t r;
        size_t got = read_to_end(fd, buf, sizeof buf, &r);
        say("read '%.*s' then %zd", (int)got, buf, r);
        break;
    }
    case 11: {
        size_t got = 0;
        static unsigned char in[1 << 20];
        ssize_t r;
        while ((r = read(fd, in + got, sizeof in - got)) > 0) got += (size_t)r;
        int ok = 1;
        for (size_t k = 0; k < got; k++)
            if (in[k] != (unsigned char)(k * 7 + k / 4096)) { ok = 0; break; }
        say("received %zu, intact %d", got, ok);
        break;
    }
    case 12: {
        static unsigned char in[1 << 20];
        size_t got = 0;
        ssize_t r;
        while (got < sizeof in) {
            size_t want = sizeof in - got < 7777 ? sizeof in - got : 7777;
            r = read(fd, in + got, want);
            if (r <= 0) break;
            got += (size_t)r;
            if (got % 100 == 0) usleep(100);
        }
        say("read %zu bytes, sum %08x", got, sum(in, got));
        break;
    }
    case 13: {
        usleep(100000);
        size_t got = 0;
        ssize_t r;
        while ((r = read(fd, buf, sizeof buf)) > 0) got += (size_t)r;
        write_full(fd, got > 0 ? "y" : "n", 1);
        say("drained until the end: %d", r == 0);
        break;
    }
    case 20: {
        write_full(fd, "fork", 4);
        ssize_t r;
        size_t got = read_to_end(fd, buf, sizeof buf, &r);
        say("reply '%.*s'", (int)got, buf);
        break;
    }
    case 19:
        read_full(fd, buf, 2);
        write_full(fd, "AAA", 3);
        write_full(fd, "BBB", 3);
        read_full(fd, buf, 1);
        write_full(fd, "CCC", 3);
        say("done");
        break;
    case 21:
        read_full(fd, buf, 1);
        write_full(fd, "r0", 2);
        read_full(fd, buf, 2);
        usleep(20000);
        write_full(fd, "r1", 2);
        read_full(fd, buf, 2);
        write_full(fd, "r2", 2);
        read_full(fd, buf, 2);
        say("done");
        break;
    case 18: {
        int pp[2];
        if (pipe(pp) < 0) die("pipe");
        size_t got = 0;
        while (got < 13) {
            ssize_t r = splice(fd, NULL, pp[1], NULL, 13 - got, 0);
            if (r <= 0) break;
            got += (size_t)r;
        }
        read_full(pp[0], buf, got);
        say("spliced into a pipe '%.*s'", (int)got, buf);
        write_full(fd, "xyzuvw", 6);
        ssize_t r = read(fd, buf, sizeof buf);
        say("then %zd", r);
        close(pp[0]);
        close(pp[1]);
        break;
    }
    case 17:
        duplex_run(fd, 3 << 20, "client");
        break;
    case 16:
        write_full(fd, "a", 1);
        read_full(fd, buf, 1);
        write_full(fd, "b", 1);
        read_full(fd, buf, 1);
        write_full(fd, "c", 1);
        read_full(fd, buf, 1);
        say("done");
        break;
    case 14: {
        int closed = 0;
        for (int k = 3; k < 1024; k++)
            if (k != fd && close(k) == 0) closed++;
        say("closed %d fds it did not open", closed);
        write_full(fd, "still", 5);
        read_full(fd, buf, 2);
        say("reply '%.2s'", buf);
        break;
    }
    case 15: {
        struct pollfd p = {.fd = fd, .events = POLLOUT};
        int n = poll(&p, 1, 5000);
        int err = -1;
        socklen_t len = sizeof err;
        getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len);
        say("non-blocking connect: writable %d SO_ERROR %d", n == 1 && (p.revents & POLLOUT), err);
        int fl = fcntl(fd, F_GETFL);
        fcntl(fd, F_SETFL, fl & ~O_NONBLOCK);
        read_full(fd, buf, 2);
        write_full(fd, "x", 1);
        say("round trip after a non-blocking connect");
        break;
    }
    }
    close(fd);
}

/* The peer-death pair: blast-server writes until writing fails; drain-client reads
 * until the end. The test kills one of them with SIGKILL mid-stream. */
static int blast_server(const char *path) {
    int ls = listen_and_publish(path);
    int fd = accept(ls, NULL, NULL);
    if (fd < 0) die("accept");
    memset(big, 'b', 1024);
    for (;;) {
        ssize_t r = send(fd, big, 1024, MSG_NOSIGNAL);
        if (r < 0) {
            say("write error: %s", errno == EPIPE || errno == ECONNRESET ? "EPIPE/ECONNRESET" : ename(errno));
            return 0;
        }
    }
}

static int drain_client(int port) {
    int fd = connect_to(port, 0);
    char buf[4096];
    int announced = 0;
    for (;;) {
        ssize_t r = read(fd, buf, sizeof buf);
        if (r > 0 && !announced) {
            say("reading");
            announced = 1;
        }
        if (r == 0) { say("end: 0"); return 0; }
        if (r < 0) { say("end: error %s", ename(errno)); return 0; }
    }
}

/* Peer death, exactly: the victim connects, writes "hello" if MODE & 1, and waits to be
 * killed; the survivor accepts, writes one byte the victim never reads if MODE & 2 (so
 * the victim's kernel answers its death with a reset, not a FIN), waits for the death,
 * then writes first if MODE & 4, reads three times, writes twice, printing each result
 * (the plain TCP run is the reference). */
static int victim(int port, int mode) {
    int fd = connect_to(port, 0);
    if (mode & 1) write_full(fd, "hello", 5);
    say("ready");
    for (;;) pause();
}

static void show(const char *what, ssize_t r) {
    if (r < 0) say("%s: error %s", what, ename(errno));
    else say("%s: %zd", what, r);
}

static int survivor(const char *path, int mode) {
    signal(SIGPIPE, SIG_IGN);
    int ls = listen_and_publish(path);
    int fd = accept(ls, NULL, NULL);
    if (fd < 0) die("accept");
    if (mode & 2) write_full(fd, "x", 1);
    say("ready");
    struct pollfd p = {.fd = fd, .events = POLLIN | POLLRDHUP};
    if (poll(&p, 1, 10000) != 1) die("no sign of the death");
    usleep(50000);
    char buf[64];
    if (mode & 4) {
        show("write", write(fd, "y", 1));
        usleep(20000);
        show("write", write(fd, "y", 1));
    }
    for (int i = 0; i < 3; i++) show("read", read(fd, buf, sizeof buf));
    show("write", write(fd, "z", 1));
    usleep(20000);
    show("write", write(fd, "z", 1));
    return 0;
}

/* exec with a connection open (FD_CLOEXEC cleared): the new image reads the fd. */
static int exec_server(const char *path, const char *self) {
    int ls = listen_and_publish(path);
    int fd = accept(ls, NULL, NULL);
    if (fd < 0) die("accept");
    if (fcntl(fd, F_SETFD, 0) < 0) die("F_SETFD");
    say("FD_CLOEXEC reads back: %d", (fcntl(fd, F_GETFD) & FD_CLOEXEC) != 0);
    char arg[16];
    snprintf(arg, sizeof arg, "%d", fd);
    execl(self, self, "exec-child", arg, (char *)NULL);
    die("execl");
    return 1;
}

static int exec_child(int fd) {
    char buf[64];
    struct pollfd p = {.fd = fd, .events = POLLIN};
    poll(&p, 1, 5000);
    ssize_t r = read(fd, buf, sizeof buf);
    say("read %zd %s", r, r < 0 ? ename(errno) : "-");
    if (r > 0) write_full(fd, "pong", 4);
    return 0;
}


/* exec scenarios (the new image gets the connection's fd; over shared memory the
 * connection continues over TCP, see docs/transparent.md):
 *   xserver 0: inetd style: accept, fork; the child dup2s the fd onto 0 and 1 and execs
 *              "xecho", which echoes stdin to stdout until the end of the stream;
 *   xserver 1: unread bytes both ways: read 10 of the client's first 3000 bytes, write
 *              50000 the client has not read, exec "xcount FD" (counts what is left,
 *              answers with the count);
 *   xserver 2: the same, exec'd with LD_PRELOAD removed from the environment (execle);
 *   xserver 3: the same, but the exec fails (ENOENT): this image goes on and counts;
 *   xserver 4: as 1, the client reads the 50000 bytes and closes without reading on;
 *   xserver 5: as 1, the client writes 400000 bytes (more than a ring) before reading;
 *   xserver 6: as 1, but "xcount FD" is started with posix_spawn (glibc clones and execs
 *              internally, past the exec hooks) and waited for;
 *   xserver 7: the same with system("SELF xcount FD");
 *   xserver 8: the same with popen("SELF xcount FD", "r"), its output read back. */
extern char **environ;

static int xcount(int fd) {
    static unsigned char buf[65536];
    size_t total = 0;
    uint32_t h = 2166136261u;
    for (;;) {
        ssize_t r = read(fd, buf, sizeof buf);
        if (r < 0 && errno == EINTR) continue;
        if (r < 0) die("xcount read");
        if (r == 0) break;
        for (ssize_t i = 0; i < r; i++) h = (h ^ buf[i]) * 16777619u;
        total += (size_t)r;
    }
    char line[96];
    int n = snprintf(line, sizeof line, "counted %zu sum %08x\n", total, h);
    say("counted %zu sum %08x", total, h);
    const char *pl = getenv("LD_PRELOAD");
    fprintf(stderr, "xcount: preload env: %s\n", pl && *pl ? "set" : "none");
    write_full(fd, line, (size_t)n);
    close(fd);
    return 0;
}

static int xecho(void) {
    static unsigned char buf[65536];
    for (;;) {
        ssize_t r = read(0, buf, sizeof buf);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) break;
        write_full(1, buf, (size_t)r);
    }
    return 0;
}

static void fill_pattern(unsigned char *b, size_t n, unsigned seed) {
    for (size_t i = 0; i < n; i++) b[i] = (unsigned char)((i * 131 + seed) ^ (i >> 9));
}

static int xserver(const char *path, const char *self, int mode) {
    int ls = listen_and_publish(path);
    int fd = accept(ls, NULL, NULL);
    if (fd < 0) die("accept");
    close(ls);
    char arg[16];
    snprintf(arg, sizeof arg, "%d", fd);
    if (mode == 0) {
        pid_t pid = fork();
        if (pid < 0) die("fork");
        if (pid == 0) {
            if (dup2(fd, 0) < 0 || dup2(fd, 1) < 0) die("dup2");
            close(fd);
            execl(self, self, "xecho", "0", (char *)NULL);
            die("execl");
        }
        close(fd);
        int st = 0;
        waitpid(pid, &st, 0);
        say("child exited %d", WIFEXITED(st) ? WEXITSTATUS(st) : -1);
        return 0;
    }
    if (fcntl(fd, F_SETFD, 0) < 0) die("F_SETFD");
    char head[10];
    read_full(fd, head, sizeof head);
    say("read %zu sum %08x", sizeof head, sum((unsigned char *)head, sizeof head));
    static unsigned char out[50000];
    fill_pattern(out, sizeof out, 7);
    write_full(fd, out, sizeof out);
    if (mode == 1 || mode == 4 || mode == 5) {
        execl(self, self, "xcount", arg, (char *)NULL);
        die("execl");
    }
    if (mode == 6 || mode == 7 || mode == 8) {
        char cmd[4200];
        snprintf(cmd, sizeof cmd, "%s xcount %d", self, fd);
        int st = 0;
        if (mode == 6) {
            char *argv[] = {(char *)self, "xcount", arg, NULL};
            pid_t pid;
            int e = posix_spawn(&pid, self, NULL, NULL, argv, environ);
            if (e != 0) die("posix_spawn");
            if (waitpid(pid, &st, 0) < 0) die("waitpid");
        } else if (mode == 7) {
            st = system(cmd);
        } else {
            FILE *f = popen(cmd, "r");
            if (!f) die("popen");
            char line[256];
            while (fgets(line, sizeof line, f)) say("popen read: %s", strtok(line, "\n"));
            st = pclose(f);
        }
        say("spawned child exited %d", WIFEXITED(st) ? WEXITSTATUS(st) : -1);
        close(fd);
        return 0;
    }
    if (mode == 2) {
        static char *env[256];
        int n = 0;
        for (char **e = environ; *e && n < 255; e++)
            if (strncmp(*e, "LD_PRELOAD=", 11) != 0) env[n++] = *e;
        env[n] = NULL;
        execle(self, self, "xcount", arg, (char *)NULL, env);
        die("execle");
    }
    int r = execl("/nonexistent/sockcheck", "sockcheck", "xcount", arg, (char *)NULL);
    say("exec %d %s", r, ename(errno));
    return xcount(fd);
}

static int xclient(int port, int mode) {
    int fd = connect_to(port, 0);
    static unsigned char msg[100000];
    static unsigned char in[1 << 20];
    size_t first = mode == 0 ? sizeof msg : 3000;
    fill_pattern(msg, sizeof msg, 3);
    write_full(fd, msg, first);
    if (mode == 5) {
        /* More than a ring's worth, while the server's 50000 bytes are still unread:
         * the write blocks on the full ring when the server execs. */
        usleep(200000);
        fill_pattern(big, 400000, 5);
        write_full(fd, big, 400000);
    } else if (mode != 0) {
        usleep(200000);
        write_full(fd, msg + first, 20000);
    }
    if (mode == 4) {
        /* Reads what the server wrote before its exec, then closes at once: the bytes
         * it had not consumed must still reach the exec'd image. */
        read_full(fd, in, 50000);
        say("read 50000 sum %08x, closing", sum(in, 50000));
        close(fd);
        return 0;
    }
    if (shutdown(fd, SHUT_WR) < 0) die("shutdown");
    size_t got = 0;
    ssize_t r;
    while ((r = read(fd, in + got, sizeof in - got)) > 0) got += (size_t)r;
    say("got %zu sum %08x then %zd %s", got, sum(in, got), r, r < 0 ? ename(errno) : "-");
    if (mode == 0) say("echo intact: %d", got == sizeof msg && memcmp(in, msg, got) == 0);
    else say("tail: %.*s", got > 50000 ? (int)(got - 50000 - 1) : 0, (char *)in + 50000);
    close(fd);
    return 0;
}


/* Prefork servers: pserver0 listens and forks 2 children that accept on the shared
 * socket concurrently; pserver1 forks 2 children that each listen on their own socket
 * of one SO_REUSEPORT group. Each connection: read a line, answer "pong LEN", close.
 * The parent stops the children when its stdin ends. pclient makes 4 connections at
 * once, then 4 one after the other. */
static void pserve(int ls) {
    for (;;) {
        int fd = accept(ls, NULL, NULL);
        if (fd < 0) {
            if (errno == EINTR) continue;
            die("accept");
        }
        char line[128];
        size_t got = 0;
        while (got < sizeof line - 1) {
            ssize_t r = read(fd, line + got, 1);
            if (r <= 0) break;
            got++;
            if (line[got - 1] == '\n') break;
        }
        char out[64];
        int n = snprintf(out, sizeof out, "pong %zu\n", got);
        write_full(fd, out, (size_t)n);
        close(fd);
    }
}

static int reuseport_socket(int port) {
    int s = socket(AF_INET, SOCK_STREAM, 0);
    int one = 1;
    if (setsockopt(s, SOL_SOCKET, SO_REUSEPORT, &one, sizeof one) < 0) die("SO_REUSEPORT");
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (bind(s, (struct sockaddr *)&a, sizeof a) < 0) die("bind");
    return s;
}

static int pserver(const char *path, int mode) {
    pid_t kids[2];
    int ls = -1, port = 0;
    int ready[2];
    if (pipe(ready) < 0) die("pipe");
    if (mode == 0) {
        ls = socket(AF_INET, SOCK_STREAM, 0);
        struct sockaddr_in a = {.sin_family = AF_INET};
        a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
        if (bind(ls, (struct sockaddr *)&a, sizeof a) < 0) die("bind");
        if (listen(ls, 64) < 0) die("listen");
        socklen_t len = sizeof a;
        getsockname(ls, (struct sockaddr *)&a, &len);
        port = ntohs(a.sin_port);
    } else {
        int s = reuseport_socket(0);
        struct sockaddr_in a;
        socklen_t len = sizeof a;
        getsockname(s, (struct sockaddr *)&a, &len);
        port = ntohs(a.sin_port);
        ls = s; /* held bound (not listening) until the children listen */
    }
    for (int i = 0; i < 2; i++) {
        kids[i] = fork();
        if (kids[i] < 0) die("fork");
        if (kids[i] == 0) {
            int s = ls;
            if (mode == 1) {
                close(ls);
                s = reuseport_socket(port);
                if (listen(s, 64) < 0) die("listen");
            }
            if (write(ready[1], "r", 1) != 1) die("ready");
            pserve(s);
        }
        char c;
        if (read(ready[0], &c, 1) != 1) die("child ready");
    }
    close(ls);
    char tmp[4096];
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    FILE *f = fopen(tmp, "w");
    if (!f) die("port file");
    fprintf(f, "%d\n", port);
    fclose(f);
    rename(tmp, path);
    char c;
    while (read(0, &c, 1) > 0) {}
    for (int i = 0; i < 2; i++) kill(kids[i], SIGTERM);
    for (int i = 0; i < 2; i++) {
        int st;
        waitpid(kids[i], &st, 0);
    }
    say("children done");
    return 0;
}

static void pfinish(int fd, int i) {
    char buf[128];
    ssize_t r;
    size_t got = read_to_end(fd, buf, sizeof buf - 1, &r);
    buf[got] = 0;
    say("conn %d: %s", i, buf);
    close(fd);
}

static int pclient(int port) {
    int fds[4];
    char req[64];
    for (int i = 0; i < 4; i++) {
        fds[i] = connect_to(port, 0);
        int n = snprintf(req, sizeof req, "hello %d%.*s\n", i, i, "xxxx");
        write_full(fds[i], req, (size_t)n);
    }
    for (int i = 0; i < 4; i++) pfinish(fds[i], i);
    for (int i = 4; i < 8; i++) {
        int fd = connect_to(port, 0);
        int n = snprintf(req, sizeof req, "hello %d\n", i);
        write_full(fd, req, (size_t)n);
        pfinish(fd, i);
    }
    return 0;
}

static int ping_client(int port) {
    int fd = connect_to(port, 0);
    write_full(fd, "ping", 4);
    char buf[64];
    ssize_t r;
    size_t got = read_to_end(fd, buf, sizeof buf, &r);
    say("got '%.*s' then %zd", (int)got, buf, r);
    return 0;
}

int main(int argc, char **argv) {
    if (argc != 3) {
        fprintf(stderr, "usage: sockcheck server|blast-server PORTFILE | client|drain-client PORT\n");
        return 2;
    }
    alarm(30);
    role = argv[1];
    if (strcmp(argv[1], "blast-server") == 0) return blast_server(argv[2]);
    if (strcmp(argv[1], "drain-client") == 0) return drain_client(atoi(argv[2]));
    if (strncmp(argv[1], "victim", 6) == 0) return victim(atoi(argv[2]), atoi(argv[1] + 6));
    if (strncmp(argv[1], "survivor", 8) == 0) return survivor(argv[2], atoi(argv[1] + 8));
    if (strcmp(argv[1], "exec-server") == 0) return exec_server(argv[2], argv[0]);
    if (strcmp(argv[1], "exec-child") == 0) return exec_child(atoi(argv[2]));
    if (strcmp(argv[1], "ping-client") == 0) return ping_client(atoi(argv[2]));
    if (strncmp(argv[1], "xserver", 7) == 0) return xserver(argv[2], argv[0], atoi(argv[1] + 7));
    if (strncmp(argv[1], "xclient", 7) == 0) return xclient(atoi(argv[2]), atoi(argv[1] + 7));
    if (strcmp(argv[1], "xcount") == 0) return xcount(atoi(argv[2]));
    if (strcmp(argv[1], "xecho") == 0) return xecho();
    if (strncmp(argv[1], "pserver", 7) == 0) return pserver(argv[2], atoi(argv[1] + 7));
    if (strcmp(argv[1], "pclient") == 0) return pclient(atoi(argv[2]));
    if (strcmp(argv[1], "server") == 0) {
        int ls = listen_and_publish(argv[2]);
        for (int i = 0; i < SCENARIOS; i++) {
            int fd = i == 15 ? accept4(ls, NULL, NULL, SOCK_NONBLOCK) : accept(ls, NULL, NULL);
            if (fd < 0 && i == 15 && errno == EAGAIN) {
                struct pollfd p = {.fd = ls, .events = POLLIN};
                poll(&p, 1, 5000);
                fd = accept4(ls, NULL, NULL, SOCK_NONBLOCK);
            }
            if (fd < 0) die("accept");
            say("scenario %d", i);
            server_side(i, fd);
        }
        close(ls);
        say("all done");
    } else {
        int port = atoi(argv[2]);
        for (int i = 0; i < SCENARIOS; i++) {
            say("scenario %d", i);
            client_side(i, port);
        }
        say("all done");
    }
    return 0;
}
