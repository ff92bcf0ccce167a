/* A TCP echo server that drops root privileges after listen (as many daemons do), and
 * its client. Used by tests/cross_uid.rs.
 *
 *   dropper server UID CONNS            bind 127.0.0.1:0, listen, setgroups/setgid/
 *                                       setuid(UID), then print the port on stdout;
 *                                       echo CONNS connections one after the other,
 *                                       each until EOF.
 *   dropper server-early UID CONNS      the same, dropping to UID before it makes its
 *                                       socket (as `memcached -u nobody` does).
 *   dropper memc PORT ROUNDS            a memcached client: `set`, then ROUNDS `get`s,
 *                                       every answer checked; "ok 1 ROUNDS NS".
 *   dropper client PORT CONNS ROUNDS SIZE
 *                                       CONNS connections one after the other, each
 *                                       ROUNDS round trips of SIZE bytes (a pattern that
 *                                       changes every round), every echoed byte checked;
 *                                       prints "ok CONNS ROUNDS NS_PER_ROUND_TRIP".
 * Exit status 0 on success; a message on stderr otherwise. */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <grp.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

static int die(const char *what) {
    perror(what);
    exit(1);
}

static void full_write(int fd, const unsigned char *p, size_t n) {
    while (n > 0) {
        ssize_t w = write(fd, p, n);
        if (w <= 0) die("write");
        p += w;
        n -= (size_t)w;
    }
}

static void drop_to(long uid) {
    if (setgroups(0, NULL) != 0) die("setgroups");
    if (setgid((gid_t)uid) != 0) die("setgid");
    if (setuid((uid_t)uid) != 0) die("setuid");
    fprintf(stderr, "dropper: serving as uid %d\n", (int)geteuid());
}

static int server(long uid, int early, int conns) {
    if (early) drop_to(uid);
    int l = socket(AF_INET, SOCK_STREAM, 0);
    if (l < 0) die("socket");
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = 0};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (bind(l, (struct sockaddr *)&a, sizeof a) != 0) die("bind");
    if (listen(l, 16) != 0) die("listen");
    socklen_t len = sizeof a;
    if (getsockname(l, (struct sockaddr *)&a, &len) != 0) die("getsockname");
    if (!early) drop_to(uid);
    /* The port last, on stdout: the test starts the client when it appears. */
    printf("%d\n", ntohs(a.sin_port));
    fflush(stdout);
    static unsigned char buf[1 << 16];
    for (int i = 0; i < conns; i++) {
        int c = accept(l, NULL, NULL);
        if (c < 0) die("accept");
        int one = 1;
        setsockopt(c, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
        for (;;) {
            ssize_t n = read(c, buf, sizeof buf);
            if (n < 0) die("read");
            if (n == 0) break;
            full_write(c, buf, (size_t)n);
        }
        close(c);
    }
    return 0;
}

/* A TCP connection to 127.0.0.1:`port` with TCP_NODELAY, or death. */
static int connect_local(int port) {
    int s = socket(AF_INET, SOCK_STREAM, 0);
    if (s < 0) die("socket");
    int one = 1;
    setsockopt(s, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (connect(s, (struct sockaddr *)&a, sizeof a) != 0) die("connect");
    return s;
}

static int client(int port, int conns, long rounds, size_t size) {
    unsigned char *out = malloc(size), *in = malloc(size);
    if (!out || !in) die("malloc");
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    for (int k = 0; k < conns; k++) {
        int s = connect_local(port);
        for (long r = 0; r < rounds; r++) {
            for (size_t i = 0; i < size; i++) out[i] = (unsigned char)(i * 7 + r * 13 + k);
            full_write(s, out, size);
            size_t got = 0;
            while (got < size) {
                ssize_t n = read(s, in + got, size - got);
                if (n <= 0) die("read echo");
                got += (size_t)n;
            }
            if (memcmp(in, out, size) != 0) {
                fprintf(stderr, "dropper: connection %d round %ld: echo differs\n", k, r);
                return 1;
            }
        }
        close(s);
    }
    clock_gettime(CLOCK_MONOTONIC, &t1);
    double ns = (t1.tv_sec - t0.tv_sec) * 1e9 + (t1.tv_nsec - t0.tv_nsec);
    printf("ok %d %ld %.0f\n", conns, rounds, ns / ((double)conns * (double)rounds));
    return 0;
}

/* A memcached text-protocol client: one connection, `set` a value, then ROUNDS `get`s,
 * each answer checked byte for byte; prints "ok 1 ROUNDS NS_PER_ROUND_TRIP". */
static int memc(int port, long rounds) {
    int s = connect_local(port);
    const char *set = "set k 0 0 5\r\nhello\r\n", *stored = "STORED\r\n";
    const char *get = "get k\r\n", *value = "VALUE k 0 5\r\nhello\r\nEND\r\n";
    char in[64];
    struct timespec t0, t1;
    for (long r = -1; r < rounds; r++) {
        if (r == 0) clock_gettime(CLOCK_MONOTONIC, &t0);
        const char *q = r < 0 ? set : get, *want = r < 0 ? stored : value;
        full_write(s, (const unsigned char *)q, strlen(q));
        size_t n = strlen(want), got = 0;
        while (got < n) {
            ssize_t k = read(s, in + got, n - got);
            if (k <= 0) die("read answer");
            got += (size_t)k;
        }
        if (memcmp(in, want, n) != 0) {
            fprintf(stderr, "dropper: round %ld: unexpected answer %.*s\n", r, (int)n, in);
            return 1;
        }
    }
    clock_gettime(CLOCK_MONOTONIC, &t1);
    double ns = (t1.tv_sec - t0.tv_sec) * 1e9 + (t1.tv_nsec - t0.tv_nsec);
    printf("ok 1 %ld %.0f\n", rounds, ns / (double)rounds);
    close(s);
    return 0;
}

int main(int argc, char **argv) {
    if (argc == 4 && strcmp(argv[1], "memc") == 0) return memc(atoi(argv[2]), atol(argv[3]));
    if (argc == 4 && strcmp(argv[1], "server") == 0) return server(atol(argv[2]), 0, atoi(argv[3]));
    if (argc == 4 && strcmp(argv[1], "server-early") == 0)
        return server(atol(argv[2]), 1, atoi(argv[3]));
    if (argc == 6 && strcmp(argv[1], "client") == 0)
        return client(atoi(argv[2]), atoi(argv[3]), atol(argv[4]), (size_t)atol(argv[5]));
    fprintf(stderr, "usage: dropper server|server-early UID CONNS | client PORT CONNS ROUNDS SIZE\n");
    return 2;
}
