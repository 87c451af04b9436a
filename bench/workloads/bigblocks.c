/* Fixed-work big-block churn in one thread: free a block of 5..25 MiB and allocate another of a
 * similar size, the pattern of a program that handles tensor- or image-sized buffers in its main
 * thread (issue 48, item 4). Written for memshim; no code from other suites.
 *
 *   SLOTS live blocks (default 4), each of 5..25 MiB (uniform); OPS free+malloc pairs, each new
 *   block written once per page (every page faults in unless the allocator kept it).
 *   After the loop every block is freed and the process waits WAIT seconds (default 0) without
 *   allocating: the "idle" event's rss_kb is what it keeps with no further call into malloc.
 *
 * usage: bigblocks OPS [SLOTS [WAIT]]   -> {"event":"done",...}, {"event":"idle",...} */
#include "common.h"

int main(int argc, char **argv) {
    if (argc < 2 || argc > 4) {
        fprintf(stderr, "usage: bigblocks OPS [SLOTS [WAIT]]\n");
        return 2;
    }
    t0_global = now_s();
    long ops = atol(argv[1]);
    int slots = argc > 2 ? atoi(argv[2]) : 4;
    double wait = argc > 3 ? atof(argv[3]) : 0.0;
    if (ops < 0 || slots < 1 || slots > 1024) return 2;
    rng_t r = {0x5EED5EED1234ULL};
    const size_t lo = 5u << 20, hi = 25u << 20;
    void **slot = calloc((size_t)slots, sizeof(void *));
    unsigned long sum = 0;
    for (long n = 0; n < ops; n++) {
        unsigned i = (unsigned)rng_below(&r, (uint64_t)slots);
        free(slot[i]);
        size_t sz = lo + rng_below(&r, hi - lo + 1);
        char *p = malloc(sz);
        if (!p) return 1;
        touch_pages(p, sz);
        sum += (unsigned char)p[sz / 2];
        slot[i] = p;
    }
    char extra[64];
    snprintf(extra, sizeof extra, "\"ops\":%ld,\"sum\":%lu", ops, sum);
    emit("done", extra);
    for (int i = 0; i < slots; i++) free(slot[i]);
    free(slot);
    if (wait > 0) sleep_s(wait);
    emit("idle", NULL);
    return 0;
}
