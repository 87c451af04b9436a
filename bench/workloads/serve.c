/* Scenario 2: a fragmenting serving workload.
 *
 * N worker threads (default 8) each serve "requests": every operation frees
 * a random slot of the thread's working set and puts a new buffer of a mixed
 * size (100 B .. 300 KB, skewed small) there, touching its pages, so
 * lifetimes are random (geometric). One allocation in LONG_EVERY survives
 * forever in a small long-lived set (caches, interned state) that pins
 * pages between the short-lived buffers. Then the requests end: workers free
 * their working sets and park (a thread pool waiting for work), and the
 * process idles while the RSS is read at the idle checkpoints.
 *
 * usage: serve THREADS OPS_PER_THREAD SLOTS IDLE_CHECKPOINTS_S (e.g. 1,6,30)
 * events: start, work_done (ops_per_s, live_kb), idle_start, idle (at each checkpoint), end */
#include "common.h"
#include <pthread.h>

#define LONG_EVERY 997
#define LONG_MAX_PER_THREAD 400

static long n_ops, n_slots;
static pthread_mutex_t park_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t park_cv = PTHREAD_COND_INITIALIZER;
static int quit;
static pthread_barrier_t done_barrier;

typedef struct {
    int id;
    void *long_lived[LONG_MAX_PER_THREAD];
    long n_long;
    size_t long_bytes;
} worker_t;

static size_t request_size(rng_t *r) {
    uint64_t k = rng_below(r, 100);
    if (k < 85) return rng_logsize(r, 100, 4096);
    if (k < 97) return rng_logsize(r, 4096, 65536);
    return rng_logsize(r, 65536, 300 * 1024);
}

static void *worker(void *arg) {
    worker_t *w = arg;
    rng_t r = {0x9E3779B97F4A7C15ULL * (uint64_t)(w->id + 1)};
    void **slots = calloc((size_t)n_slots, sizeof(void *));
    for (long i = 0; i < n_ops; i++) {
        long s = (long)rng_below(&r, (uint64_t)n_slots);
        free(slots[s]);
        size_t sz = request_size(&r);
        char *p = malloc(sz);
        touch_pages(p, sz);
        slots[s] = p;
        if (rng_below(&r, LONG_EVERY) == 0 && w->n_long < LONG_MAX_PER_THREAD) {
            size_t lsz = rng_logsize(&r, 32, 2048);
            char *q = malloc(lsz);
            memset(q, 7, lsz);
            w->long_lived[w->n_long++] = q;
            w->long_bytes += lsz;
        }
    }
    for (long s = 0; s < n_slots; s++) free(slots[s]);
    free(slots);
    pthread_barrier_wait(&done_barrier);
    pthread_mutex_lock(&park_mu);
    while (!quit) pthread_cond_wait(&park_cv, &park_mu);
    pthread_mutex_unlock(&park_mu);
    return NULL;
}

int main(int argc, char **argv) {
    if (argc != 5) {
        fprintf(stderr, "usage: serve THREADS OPS_PER_THREAD SLOTS IDLE_CHECKPOINTS_S\n");
        return 2;
    }
    t0_global = now_s();
    int nt = atoi(argv[1]);
    n_ops = atol(argv[2]);
    n_slots = atol(argv[3]);
    emit("start", NULL);
    pthread_t th[64];
    worker_t *ws = calloc((size_t)nt, sizeof(worker_t));
    pthread_barrier_init(&done_barrier, NULL, (unsigned)nt + 1);
    double t1 = now_s();
    for (int i = 0; i < nt; i++) {
        ws[i].id = i;
        pthread_create(&th[i], NULL, worker, &ws[i]);
    }
    pthread_barrier_wait(&done_barrier);
    double el = now_s() - t1;
    size_t live = 0;
    for (int i = 0; i < nt; i++) live += ws[i].long_bytes;
    char extra[160];
    snprintf(extra, sizeof extra, "\"ops_per_s\":%.1f,\"live_kb\":%zu,\"elapsed_s\":%.3f",
             (double)n_ops * nt / el, live / 1024, el);
    emit("work_done", extra);
    maybe_trim();
    double idle0 = now_s();
    emit("idle_start", NULL);
    char *cp = argv[4];
    while (*cp) {
        double at = strtod(cp, &cp);
        if (*cp == ',') cp++;
        double wait = idle0 + at - now_s();
        if (wait > 0) sleep_s(wait);
        snprintf(extra, sizeof extra, "\"idle_s\":%g", at);
        emit("idle", extra);
    }
    pthread_mutex_lock(&park_mu);
    quit = 1;
    pthread_cond_broadcast(&park_cv);
    pthread_mutex_unlock(&park_mu);
    for (int i = 0; i < nt; i++) pthread_join(th[i], NULL);
    emit("end", NULL);
    return 0;
}
