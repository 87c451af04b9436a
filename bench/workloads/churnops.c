/* Fixed-work allocator churn, for instruction counts (callgrind) and CPU time on a noisy machine,
 * where scenario 4's fixed-duration ops/s cannot be trusted.
 *
 *   small   1000 live slots of 16..256 B      medium  200 live slots of 1..64 KiB
 * Each thread does OPS free+malloc pairs on its own slots (first 64 B written), then frees them.
 *
 * usage: churnops small|medium OPS [THREADS]   -> {"event":"done",...}; measure it from outside
 * CHURNOPS_WAIT=1: print {"event":"waiting"} and start the work only after a line on stdin
 * (bench/profcost.py switches the heap profiler on in between). */
#include "common.h"
#include <pthread.h>

static int small;
static long ops;

static void *run(void *arg) {
    rng_t r = {0xABCDEF12345ULL * (3 + (uintptr_t)arg)};
    int slots = small ? 1000 : 200;
    size_t lo = small ? 16 : 1024, hi = small ? 256 : 65536;
    void **slot = calloc((size_t)slots, sizeof(void *));
    for (long n = 0; n < ops; n++) {
        unsigned i = (unsigned)rng_below(&r, (uint64_t)slots);
        free(slot[i]);
        size_t sz = lo + rng_below(&r, hi - lo + 1);
        char *p = malloc(sz);
        memset(p, 1, sz < 64 ? sz : 64);
        slot[i] = p;
    }
    for (int i = 0; i < slots; i++) free(slot[i]);
    free(slot);
    return NULL;
}

int main(int argc, char **argv) {
    if (argc < 3 || argc > 4) {
        fprintf(stderr, "usage: churnops small|medium OPS [THREADS]\n");
        return 2;
    }
    t0_global = now_s();
    small = argv[1][0] == 's';
    ops = atol(argv[2]);
    int t = argc > 3 ? atoi(argv[3]) : 1;
    if (getenv("CHURNOPS_WAIT")) {
        char line[16];
        emit("waiting", NULL);
        if (!fgets(line, sizeof line, stdin)) return 2;
    }
    if (t <= 1) {
        run(NULL);
        emit("done", NULL);
        return 0;
    }
    pthread_t th[64];
    if (t > 64) t = 64;
    for (int i = 0; i < t; i++) pthread_create(&th[i], NULL, run, (void *)(uintptr_t)i);
    for (int i = 0; i < t; i++) pthread_join(th[i], NULL);
    emit("done", NULL);
    return 0;
}
