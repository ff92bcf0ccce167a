/* What the kernel itself charges for waking a sleeping receiver: one process writes an
 * 8-byte timestamp into a Unix socket every 500 us (the pacing of `shmlink-bench
 * --pattern remote`'s latency rows), the other blocks in read() (or poll() then read())
 * and records now - timestamp. Between messages both sleep, so every message wakes an
 * idle CPU. This is the floor under every hop of the Zenoh bridge's path that wakes a
 * process (publisher -> bridge, bridge -> subscriber; docs/zenoh.md, "Limits and
 * status").
 *
 *   gcc -O2 -o /tmp/wake-cost scripts/wake-cost.c
 *   /tmp/wake-cost 0 0; /tmp/wake-cost 0 1; /tmp/wake-cost 0 1 poll
 *
 * Arguments: the writer's CPU, the reader's CPU, and `poll` to wait in poll() first.
 * Prints the one-way p50 and p99 of 2000 messages in microseconds. */
#define _GNU_SOURCE
#include <poll.h>
#include <sched.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

enum { COUNT = 2000, GAP_US = 500 };

static uint64_t now_ns(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (uint64_t)t.tv_sec * 1000000000u + (uint64_t)t.tv_nsec;
}

static void pin(int cpu) {
    cpu_set_t s;
    CPU_ZERO(&s);
    CPU_SET(cpu, &s);
    if (sched_setaffinity(0, sizeof s, &s) != 0) {
        perror("sched_setaffinity");
        exit(2);
    }
}

static int by_value(const void *a, const void *b) {
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return (x > y) - (x < y);
}

int main(int argc, char **argv) {
    if (argc < 3) {
        fprintf(stderr, "usage: %s WRITER_CPU READER_CPU [poll]\n", argv[0]);
        return 2;
    }
    int writer = atoi(argv[1]), reader = atoi(argv[2]);
    int use_poll = argc > 3 && strcmp(argv[3], "poll") == 0;
    int sv[2];
    if (socketpair(AF_UNIX, SOCK_SEQPACKET, 0, sv) != 0) {
        perror("socketpair");
        return 2;
    }
    pid_t child = fork();
    if (child < 0) {
        perror("fork");
        return 2;
    }
    if (child == 0) {
        pin(reader);
        static uint64_t lat[COUNT];
        for (int i = 0; i < COUNT; i++) {
            uint64_t sent;
            if (use_poll) {
                struct pollfd p = {.fd = sv[1], .events = POLLIN};
                if (poll(&p, 1, -1) != 1) {
                    perror("poll");
                    return 1;
                }
            }
            if (read(sv[1], &sent, sizeof sent) != (ssize_t)sizeof sent) {
                perror("read");
                return 1;
            }
            lat[i] = now_ns() - sent;
        }
        qsort(lat, COUNT, sizeof lat[0], by_value);
        printf("writer on CPU %d, reader on CPU %d, %s: one-way p50 %.1f us, p99 %.1f us\n",
               writer, reader, use_poll ? "poll + read" : "read", lat[COUNT / 2] / 1e3,
               lat[COUNT * 99 / 100] / 1e3);
        return 0;
    }
    pin(writer);
    usleep(10000);
    for (int i = 0; i < COUNT; i++) {
        uint64_t t = now_ns();
        if (write(sv[0], &t, sizeof t) != (ssize_t)sizeof t) {
            perror("write");
            return 1;
        }
        usleep(GAP_US);
    }
    int status;
    waitpid(child, &status, 0);
    return WIFEXITED(status) ? WEXITSTATUS(status) : 1;
}
