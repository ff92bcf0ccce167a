/* The cost of `rep movsb` (and of glibc's memcpy, which uses it between its thresholds)
 * by the distance of the destination after the source modulo 4 KiB: the measurement
 * behind shmlink-sys's copy_shared, which avoids `rep movsb` at distances 1-63
 * (docs/design.md §3.2, docs/benchmarks.md "Large copies and 4K aliasing").
 *
 *   gcc -O2 -o /tmp/copy-alias scripts/copy-alias.c && taskset -c 0 /tmp/copy-alias
 *
 * Prints, for a 128 KiB copy in cache, the best of 20 runs in microseconds. */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1e9 + t.tv_nsec;
}

static void rep_movsb(void *d, const void *s, size_t n) {
    __asm__ volatile("rep movsb" : "+D"(d), "+S"(s), "+c"(n) : : "memory");
}

static double best(void (*f)(void *, const void *, size_t), char *d, const char *s, size_t n) {
    double b = 1e18;
    for (int r = 0; r < 20; r++) {
        double t0 = now();
        f(d, s, n);
        double t = now() - t0;
        if (t < b) b = t;
    }
    return b / 1e3;
}

static void libc_memcpy(void *d, const void *s, size_t n) { memcpy(d, s, n); }

int main(void) {
    size_t n = 128 << 10;
    char *src = aligned_alloc(4096, 8 << 20), *dst = aligned_alloc(4096, 8 << 20);
    memset(src, 1, 8 << 20);
    memset(dst, 2, 8 << 20);
    int ds[] = {-64, -8, 0, 1, 8, 16, 31, 32, 48, 63, 64, 128, 4096 + 8, 65536 + 8};
    for (unsigned i = 0; i < sizeof ds / sizeof *ds; i++) {
        int d = ds[i];
        char *to = dst + (d > 0 ? d : 0);
        const char *from = src + (d < 0 ? -d : 0);
        printf("dst - src = %6d: rep movsb %7.1f us, memcpy %7.1f us\n", d,
               best(rep_movsb, to, from, n), best(libc_memcpy, to, from, n));
    }
    return 0;
}
