/* Shared helpers for the C benchmark workloads: clocks, a small PRNG,
 * reading our own RSS, and one-line JSON events on stdout that the harness
 * parses. Written for memshim's benchmarks; no code from other suites. */
#ifndef BENCH_COMMON_H
#define BENCH_COMMON_H
#define _GNU_SOURCE
#include <malloc.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static inline double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static inline void sleep_s(double s) {
    struct timespec ts = {(time_t)s, (long)((s - (double)(time_t)s) * 1e9)};
    while (nanosleep(&ts, &ts) != 0) {
    }
}

/* xorshift64*: fast, per-thread, deterministic from its seed. */
typedef struct { uint64_t s; } rng_t;
static inline uint64_t rng_next(rng_t *r) {
    uint64_t x = r->s;
    x ^= x >> 12;
    x ^= x << 25;
    x ^= x >> 27;
    r->s = x;
    return x * 0x2545F4914F6CDD1DULL;
}
static inline uint64_t rng_below(rng_t *r, uint64_t n) { return rng_next(r) % n; }
static inline double rng_unit(rng_t *r) { return (double)(rng_next(r) >> 11) * (1.0 / 9007199254740992.0); }
/* Log-uniform size in [lo, hi]: many small, few large, like real heaps. */
static inline size_t rng_logsize(rng_t *r, size_t lo, size_t hi) {
    double l = __builtin_log((double)lo), h = __builtin_log((double)hi);
    return (size_t)__builtin_exp(l + (h - l) * rng_unit(r));
}

/* VmRSS / VmHWM of this process in KiB (read without stdio buffering). */
static long status_kb(const char *key) {
    char buf[4096];
    FILE *f = fopen("/proc/self/status", "r");
    long v = -1;
    size_t klen = strlen(key);
    if (!f) return -1;
    while (fgets(buf, sizeof buf, f)) {
        if (strncmp(buf, key, klen) == 0 && buf[klen] == ':') {
            v = strtol(buf + klen + 1, NULL, 10);
            break;
        }
    }
    fclose(f);
    return v;
}

static double t0_global;

/* {"event":"<name>","t":<s since start>,"rss_kb":<VmRSS>,"hwm_kb":<VmHWM>,<extra>} */
static void emit(const char *event, const char *extra) {
    printf("{\"event\":\"%s\",\"t\":%.3f,\"rss_kb\":%ld,\"hwm_kb\":%ld%s%s}\n", event, now_s() - t0_global,
           status_kb("VmRSS"), status_kb("VmHWM"), extra && *extra ? "," : "", extra ? extra : "");
    fflush(stdout);
}

/* BENCH_MALLOC_TRIM=1: the "glibc + malloc_trim(0) after every unload" configuration. */
static inline void maybe_trim(void) {
    const char *v = getenv("BENCH_MALLOC_TRIM");
    if (v && *v == '1') malloc_trim(0);
}

static inline void touch_pages(char *p, size_t n) {
    for (size_t i = 0; i < n; i += 4096) p[i] = (char)i;
    if (n) p[n - 1] = 1;
}
#endif
