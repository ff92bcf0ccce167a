/* What the preload's C test programs (escapes.c, sockcheck.c) share: each line they
 * print is prefixed with the program's role (`role`, set by main), a failure is
 * "ROLE: FAILED WHAT: strerror(errno)" and exit 1; and the listener whose port the other
 * side reads from a file. */
#ifndef COMMON_H
#define COMMON_H

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

static const char *role;

static void say(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void say(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    printf("%s: ", role);
    vprintf(fmt, ap);
    printf("\n");
    fflush(stdout);
    va_end(ap);
}

static void die(const char *what) {
    printf("%s: FAILED %s: %s\n", role, what, strerror(errno));
    fflush(stdout);
    exit(1);
}

/* Listens on 127.0.0.1:0 and writes the port to `port_file` (atomically). */
static int listen_and_publish(const char *port_file) {
    int ls = socket(AF_INET, SOCK_STREAM, 0);
    if (ls < 0) die("socket");
    int one = 1;
    setsockopt(ls, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    if (bind(ls, (struct sockaddr *)&a, sizeof a) < 0) die("bind");
    if (listen(ls, 16) < 0) die("listen");
    socklen_t len = sizeof a;
    getsockname(ls, (struct sockaddr *)&a, &len);
    char tmp[4096];
    snprintf(tmp, sizeof tmp, "%s.tmp", port_file);
    FILE *f = fopen(tmp, "w");
    if (!f) die("port file");
    fprintf(f, "%d\n", ntohs(a.sin_port));
    fclose(f);
    rename(tmp, port_file);
    return ls;
}

#endif
