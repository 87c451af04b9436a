/* Scenario 4: allocator throughput kernels (ops/s, fixed duration).
 *
 *   prodcons  THREADS producers fill batches of 1024 objects (16..256 B),
 *             THREADS consumers free them: every free is a remote free.
 *             ops = objects freed.
 *   larson    THREADS owners of a 4000-slot slice replace random slots with
 *             8..1000 B blocks; every 50k ops a thread hands its slice to a
 *             fresh successor thread and exits, so blocks are freed by a
 *             different thread than the one that allocated them (the
 *             "server bleeding" pattern). ops = replacements.
 *   small     same-thread churn, 1000 live slots of 16..256 B. ops = free+malloc pairs.
 *   medium    same-thread churn, 200 live slots of 1..64 KiB (first 64 B written).
 *   large     tensor-like buffers: 8 live slots per thread of 1..64 MiB; every op
 *             frees one, allocates a new one and writes all of it (a tensor being
 *             filled). ops = buffers.
 *
 * usage: tput KERNEL THREADS SECONDS   -> one JSON line with ops_per_s */
#include "common.h"
#include <pthread.h>
#include <stdatomic.h>

static atomic_int stop;
static atomic_long ops_total;
static double seconds;
static int nthreads;

/* ---- producer / consumer ---- */
#define BATCH 1024
#define QMAX 64
typedef struct { void *p[BATCH]; } batch_t;
static batch_t *queue[QMAX];
static int qn;
static pthread_mutex_t qmu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t qnotfull = PTHREAD_COND_INITIALIZER, qnotempty = PTHREAD_COND_INITIALIZER;

static void *producer(void *arg) {
    rng_t r = {0x1234567ULL + (uintptr_t)arg * 7919};
    while (!atomic_load_explicit(&stop, memory_order_relaxed)) {
        batch_t *b = malloc(sizeof *b);
        for (int i = 0; i < BATCH; i++) {
            size_t sz = 16 + rng_below(&r, 241);
            char *p = malloc(sz);
            p[0] = 1;
            p[sz - 1] = 2;
            b->p[i] = p;
        }
        pthread_mutex_lock(&qmu);
        while (qn == QMAX && !atomic_load(&stop)) pthread_cond_wait(&qnotfull, &qmu);
        if (qn == QMAX) { /* stopping */
            pthread_mutex_unlock(&qmu);
            for (int i = 0; i < BATCH; i++) free(b->p[i]);
            free(b);
            break;
        }
        queue[qn++] = b;
        pthread_cond_signal(&qnotempty);
        pthread_mutex_unlock(&qmu);
    }
    return NULL;
}

static void *consumer(void *arg) {
    (void)arg;
    long n = 0;
    for (;;) {
        pthread_mutex_lock(&qmu);
        while (qn == 0 && !atomic_load(&stop)) pthread_cond_wait(&qnotempty, &qmu);
        if (qn == 0) {
            pthread_mutex_unlock(&qmu);
            break;
        }
        batch_t *b = queue[--qn];
        pthread_cond_signal(&qnotfull);
        pthread_mutex_unlock(&qmu);
        for (int i = 0; i < BATCH; i++) free(b->p[i]);
        free(b);
        if (!atomic_load_explicit(&stop, memory_order_relaxed)) n += BATCH;
    }
    atomic_fetch_add(&ops_total, n);
    return NULL;
}

/* ---- larson-like ---- */
#define LSLOTS 4000
#define LROUND 50000
typedef struct { void *slot[LSLOTS]; uint64_t seed; } slice_t;

static void *larson_thread(void *arg) {
    slice_t *s = arg;
    rng_t r = {s->seed};
    long n = 0;
    while (n < LROUND && !atomic_load_explicit(&stop, memory_order_relaxed)) {
        for (int j = 0; j < 64; j++, n++) {
            unsigned i = (unsigned)rng_below(&r, LSLOTS);
            free(s->slot[i]);
            size_t sz = 8 + rng_below(&r, 992);
            char *p = malloc(sz);
            p[0] = 1;
            p[sz - 1] = 1;
            s->slot[i] = p;
        }
    }
    atomic_fetch_add(&ops_total, n);
    s->seed = rng_next(&r) | 1;
    if (!atomic_load(&stop)) { /* hand the slice to a successor and exit */
        pthread_t t;
        pthread_create(&t, NULL, larson_thread, s);
        pthread_detach(t);
    } else {
        atomic_fetch_sub(&ops_total, 0);
    }
    return NULL;
}

/* ---- same-thread churn ---- */
typedef struct { size_t lo, hi; int slots; int full_touch; uintptr_t id; } churn_arg_t;

static void *churn_thread(void *arg) {
    churn_arg_t *a = arg;
    rng_t r = {0xABCDEF12345ULL * (a->id + 3)};
    void **slot = calloc((size_t)a->slots, sizeof(void *));
    long n = 0;
    while (!atomic_load_explicit(&stop, memory_order_relaxed)) {
        int batch = a->full_touch ? 1 : 256;
        for (int j = 0; j < batch; j++, n++) {
            unsigned i = (unsigned)rng_below(&r, (uint64_t)a->slots);
            free(slot[i]);
            size_t sz = a->full_touch ? rng_logsize(&r, a->lo, a->hi) : a->lo + rng_below(&r, a->hi - a->lo + 1);
            char *p = malloc(sz);
            if (a->full_touch)
                memset(p, (int)n, sz);
            else
                memset(p, 1, sz < 64 ? sz : 64);
            slot[i] = p;
        }
    }
    for (int i = 0; i < a->slots; i++) free(slot[i]);
    free(slot);
    atomic_fetch_add(&ops_total, n);
    return NULL;
}

int main(int argc, char **argv) {
    if (argc != 4) {
        fprintf(stderr, "usage: tput prodcons|larson|small|medium|large THREADS SECONDS\n");
        return 2;
    }
    t0_global = now_s();
    const char *k = argv[1];
    nthreads = atoi(argv[2]);
    seconds = atof(argv[3]);
    pthread_t th[128];
    int nth = 0;
    churn_arg_t ca[64];
    slice_t *slices = NULL;
    double t1 = now_s();
    if (!strcmp(k, "prodcons")) {
        for (int i = 0; i < nthreads; i++) {
            pthread_create(&th[nth++], NULL, producer, (void *)(uintptr_t)i);
            pthread_create(&th[nth++], NULL, consumer, NULL);
        }
    } else if (!strcmp(k, "larson")) {
        slices = calloc((size_t)nthreads, sizeof(slice_t));
        rng_t r = {4141};
        for (int i = 0; i < nthreads; i++) {
            slices[i].seed = rng_next(&r) | 1;
            for (int j = 0; j < LSLOTS; j++) slices[i].slot[j] = malloc(8 + rng_below(&r, 992));
        }
        t1 = now_s();
        for (int i = 0; i < nthreads; i++) {
            pthread_t t;
            pthread_create(&t, NULL, larson_thread, &slices[i]);
            pthread_detach(t);
        }
    } else {
        for (int i = 0; i < nthreads; i++) {
            if (!strcmp(k, "small"))
                ca[i] = (churn_arg_t){16, 256, 1000, 0, (uintptr_t)i};
            else if (!strcmp(k, "medium"))
                ca[i] = (churn_arg_t){1024, 65536, 200, 0, (uintptr_t)i};
            else if (!strcmp(k, "large"))
                ca[i] = (churn_arg_t){1 << 20, 64 << 20, 8, 1, (uintptr_t)i};
            else {
                fprintf(stderr, "tput: unknown kernel %s\n", k);
                return 2;
            }
            pthread_create(&th[nth++], NULL, churn_thread, &ca[i]);
        }
    }
    sleep_s(seconds);
    atomic_store(&stop, 1);
    double el = now_s() - t1;
    if (!strcmp(k, "prodcons")) {
        pthread_mutex_lock(&qmu);
        pthread_cond_broadcast(&qnotfull);
        pthread_cond_broadcast(&qnotempty);
        pthread_mutex_unlock(&qmu);
    }
    for (int i = 0; i < nth; i++) pthread_join(th[i], NULL);
    if (slices) sleep_s(0.05); /* detached larson threads finish their current 64 ops */
    char extra[160];
    snprintf(extra, sizeof extra, "\"kernel\":\"%s\",\"threads\":%d,\"ops\":%ld,\"ops_per_s\":%.1f", k, nthreads,
             atomic_load(&ops_total), (double)atomic_load(&ops_total) / el);
    emit("result", extra);
    return 0;
}
