/* What the preload's C test programs print: each line prefixed with the program's role
 * (`role`, set by main), and a failure as "ROLE: FAILED WHAT: strerror(errno)" and
 * exit 1. Included by escapes.c and sockcheck.c. */
#ifndef ROLE_H
#define ROLE_H

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

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

#endif
