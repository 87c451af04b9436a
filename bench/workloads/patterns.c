/* The allocation patterns where mimalloc-bench found memshim trailing
 * (issue 48, item 5), as fixed amounts of work, so that time and peak RSS
 * can both be compared. Written for memshim from the patterns' published
 * descriptions; no code from the suite.
 *
 *   simple  ROUNDS rounds, one thread: for each size of 16, 32, 64, 128,
 *           256 and 512 B, allocate 1000 blocks, touch each, free them in
 *           the order they came (the fast path of one thread, as glibc's
 *           bench-malloc-simple measures it). ops = malloc+free pairs.
 *   stress  ROUNDS rounds of THREADS fresh threads; each replaces a random
 *           one of its 1000 kept blocks 200k times (sizes log-uniform:
 *           85 % 8 B-256 B, 14 % 256 B-16 KiB, 1 % 16 KiB-1 MiB; first and
 *           last byte written) and, every 16th time, swaps a kept block
 *           with a random slot of a shared 4096-slot array, so that blocks
 *           are freed by other threads, later, in other rounds. A thread
 *           frees what it keeps when its round ends (mstress's shape:
 *           mixed lifetimes, blocks that migrate, threads that come and go).
 *           ops = replacements.
 *   xmalloc THREADS producer threads that only allocate (16 B-2 KiB,
 *           log-uniform) and as many consumer threads that only free what
 *           their producer hands them through a ring of 8192 slots;
 *           ROUNDS x 1M blocks per producer (the asymmetric pattern of
 *           xmalloc-test, which thread caches handle badly: every free
 *           is remote, and the freeing thread never allocates).
 *           ops = blocks.
 *
 * usage: patterns KERNEL THREADS ROUNDS
 *   -> one JSON line: event "done" with kernel, ops, seconds (common.h) */
#include "common.h"
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>

static int nthreads, rounds;

/* ---- simple ---- */
static long run_simple(void) {
    enum { N = 1000 };
    static void *p[N];
    static const size_t sizes[] = {16, 32, 64, 128, 256, 512};
    long ops = 0;
    for (int r = 0; r < rounds; r++) {
        for (unsigned s = 0; s < sizeof sizes / sizeof *sizes; s++) {
            for (int i = 0; i < N; i++) {
                p[i] = malloc(sizes[s]);
                *(volatile char *)p[i] = (char)i;
            }
            for (int i = 0; i < N; i++) free(p[i]);
            ops += N;
        }
    }
    return ops;
}

/* ---- stress ---- */
#define KEEP 1000
#define SHARED 4096
#define STEPS 200000
static _Atomic(void *) shared[SHARED];

static size_t stress_size(rng_t *r) {
    uint64_t d = rng_below(r, 100);
    if (d < 85) return rng_logsize(r, 8, 256);
    if (d < 99) return rng_logsize(r, 256, 16 << 10);
    return rng_logsize(r, 16 << 10, 1 << 20);
}

static void *new_block(size_t sz) {
    char *p = malloc(sz);
    p[0] = 1;
    p[sz - 1] = 2;
    return p;
}

static void *stress_thread(void *arg) {
    rng_t r = {0x9E3779B97F4A7C15ULL ^ (uintptr_t)arg * 0x100000001B3ULL};
    void **keep = calloc(KEEP, sizeof *keep);
    for (int i = 0; i < KEEP; i++) keep[i] = new_block(stress_size(&r));
    for (int s = 1; s <= STEPS; s++) {
        int i = (int)rng_below(&r, KEEP);
        free(keep[i]);
        keep[i] = new_block(stress_size(&r));
        if (s % 16 == 0) {
            int j = (int)rng_below(&r, KEEP);
            keep[j] = atomic_exchange(&shared[rng_below(&r, SHARED)], keep[j]);
            if (!keep[j]) keep[j] = new_block(stress_size(&r));
        }
    }
    for (int i = 0; i < KEEP; i++) free(keep[i]);
    free(keep);
    return NULL;
}

static long run_stress(void) {
    pthread_t *t = calloc((size_t)nthreads, sizeof *t);
    for (int r = 0; r < rounds; r++) {
        for (int i = 0; i < nthreads; i++)
            pthread_create(&t[i], NULL, stress_thread, (void *)(uintptr_t)(r * nthreads + i + 1));
        for (int i = 0; i < nthreads; i++) pthread_join(t[i], NULL);
    }
    for (int i = 0; i < SHARED; i++) free(atomic_exchange(&shared[i], NULL));
    free(t);
    return (long)rounds * nthreads * STEPS;
}

/* ---- xmalloc ---- */
#define RING 8192
#define PER_ROUND 1000000L
typedef struct {
    _Atomic(void *) slot[RING];
    _Alignas(64) atomic_long head; /* next slot the producer fills */
    _Alignas(64) atomic_long tail; /* next slot the consumer empties */
    long total;
    int id;
} ring_t;

static void *producer(void *arg) {
    ring_t *q = arg;
    rng_t r = {0xD1B54A32D192ED03ULL * (uint64_t)(q->id + 1)};
    for (long n = 0; n < q->total; n++) {
        void *p = new_block(rng_logsize(&r, 16, 2048));
        long h = atomic_load_explicit(&q->head, memory_order_relaxed);
        while (h - atomic_load_explicit(&q->tail, memory_order_acquire) >= RING) sched_yield();
        atomic_store_explicit(&q->slot[h % RING], p, memory_order_relaxed);
        atomic_store_explicit(&q->head, h + 1, memory_order_release);
    }
    return NULL;
}

static void *consumer(void *arg) {
    ring_t *q = arg;
    for (long n = 0; n < q->total; n++) {
        while (atomic_load_explicit(&q->head, memory_order_acquire) <= n) sched_yield();
        free(atomic_load_explicit(&q->slot[n % RING], memory_order_relaxed));
        atomic_store_explicit(&q->tail, n + 1, memory_order_release);
    }
    return NULL;
}

static long run_xmalloc(void) {
    ring_t *q = calloc((size_t)nthreads, sizeof *q);
    pthread_t *t = calloc((size_t)nthreads * 2, sizeof *t);
    for (int i = 0; i < nthreads; i++) {
        q[i].total = rounds * PER_ROUND;
        q[i].id = i;
        pthread_create(&t[2 * i], NULL, producer, &q[i]);
        pthread_create(&t[2 * i + 1], NULL, consumer, &q[i]);
    }
    for (int i = 0; i < 2 * nthreads; i++) pthread_join(t[i], NULL);
    free(q);
    free(t);
    return (long)nthreads * rounds * PER_ROUND;
}

int main(int argc, char **argv) {
    if (argc != 4) {
        fprintf(stderr, "usage: patterns simple|stress|xmalloc THREADS ROUNDS\n");
        return 2;
    }
    const char *k = argv[1];
    nthreads = atoi(argv[2]);
    rounds = atoi(argv[3]);
    if (nthreads < 1 || rounds < 1) {
        fprintf(stderr, "patterns: THREADS and ROUNDS must be at least 1\n");
        return 2;
    }
    t0_global = now_s();
    long ops;
    if (!strcmp(k, "simple"))
        ops = run_simple();
    else if (!strcmp(k, "stress"))
        ops = run_stress();
    else if (!strcmp(k, "xmalloc"))
        ops = run_xmalloc();
    else {
        fprintf(stderr, "patterns: unknown kernel %s\n", k);
        return 2;
    }
    char extra[160];
    snprintf(extra, sizeof extra, "\"kernel\":\"%s\",\"ops\":%ld,\"seconds\":%.4f", k, ops, now_s() - t0_global);
    emit("done", extra);
    return 0;
}
