/* Scenario 3: long-running request-like churn, then idle.
 *
 * THREADS worker threads each handle RATE requests per second (paced with
 * sleeps, like a server that is busy but not saturated) for SECONDS. A
 * request allocates ~40 small objects (32..512 B), 4 buffers (4..64 KB) and
 * now and then a big one (256 KB..4 MB), touches them, and frees them when
 * it ends; one request in five also replaces a random entry of a shared
 * response cache (4096 entries, 256 B..16 KB), so cache entries are freed by
 * whichever thread evicts them. After the churn the process idles with its
 * cache alive and reports its RSS every IDLE_STEP seconds.
 *
 * usage: churn THREADS RATE SECONDS IDLE_SECONDS IDLE_STEP
 * events: start, churn_done (requests, requests_per_s), idle_start, idle ..., end */
#include "common.h"
#include <pthread.h>

#define CACHE 4096
static void *cache[CACHE];
static pthread_mutex_t cache_mu = PTHREAD_MUTEX_INITIALIZER;
static double rate, seconds;
static long requests_total;
static pthread_mutex_t count_mu = PTHREAD_MUTEX_INITIALIZER;

static void *worker(void *arg) {
    rng_t r = {0xD1B54A32D192ED03ULL * ((uint64_t)(uintptr_t)arg + 1)};
    void *objs[48];
    double start = now_s(), next = start;
    long n = 0;
    while (now_s() - start < seconds) {
        int k = 0;
        for (int i = 0; i < 40; i++) {
            size_t sz = rng_logsize(&r, 32, 512);
            char *p = malloc(sz);
            memset(p, 1, sz);
            objs[k++] = p;
        }
        for (int i = 0; i < 4; i++) {
            size_t sz = rng_logsize(&r, 4096, 65536);
            char *p = malloc(sz);
            touch_pages(p, sz);
            objs[k++] = p;
        }
        if (rng_below(&r, 20) == 0) {
            size_t sz = rng_logsize(&r, 256 * 1024, 4 << 20);
            char *p = malloc(sz);
            touch_pages(p, sz);
            objs[k++] = p;
        }
        if (rng_below(&r, 5) == 0) {
            size_t sz = rng_logsize(&r, 256, 16384);
            char *p = malloc(sz);
            memset(p, 2, sz);
            unsigned slot = (unsigned)rng_below(&r, CACHE);
            pthread_mutex_lock(&cache_mu);
            void *old = cache[slot];
            cache[slot] = p;
            pthread_mutex_unlock(&cache_mu);
            free(old);
        }
        while (k) free(objs[--k]);
        n++;
        next += 1.0 / rate;
        double w = next - now_s();
        if (w > 0) sleep_s(w);
    }
    pthread_mutex_lock(&count_mu);
    requests_total += n;
    pthread_mutex_unlock(&count_mu);
    return NULL;
}

int main(int argc, char **argv) {
    if (argc != 6) {
        fprintf(stderr, "usage: churn THREADS RATE SECONDS IDLE_SECONDS IDLE_STEP\n");
        return 2;
    }
    t0_global = now_s();
    int nt = atoi(argv[1]);
    rate = atof(argv[2]);
    seconds = atof(argv[3]);
    double idle = atof(argv[4]), step = atof(argv[5]);
    emit("start", NULL);
    pthread_t th[64];
    for (int i = 0; i < nt; i++) pthread_create(&th[i], NULL, worker, (void *)(uintptr_t)i);
    for (int i = 0; i < nt; i++) pthread_join(th[i], NULL);
    char extra[128];
    snprintf(extra, sizeof extra, "\"requests\":%ld,\"requests_per_s\":%.1f", requests_total,
             (double)requests_total / seconds);
    emit("churn_done", extra);
    maybe_trim();
    double idle0 = now_s();
    emit("idle_start", NULL);
    for (double at = step; at <= idle + 1e-9; at += step) {
        double w = idle0 + at - now_s();
        if (w > 0) sleep_s(w);
        snprintf(extra, sizeof extra, "\"idle_s\":%g", at);
        emit("idle", extra);
    }
    emit("end", NULL);
    return 0;
}
