/* What a parked thread's cache can hold: a worker allocates 400 blocks of every size from 16 B to
 * 64 KiB (16 B steps to 1 KiB, 512 B steps to 16 KiB, 4 KiB steps above), frees them all, and parks.
 * After 3 s (memshim's decay returns the arenas' free pages) the process prints its RSS and exits.
 * Run it with MEMSHIM_MALLOC_CONF=stats_print:true (or MALLOC_CONF for a stock jemalloc) and read
 * tcache_bytes: what the parked worker's cache keeps, which no purge can reach.
 *
 * usage: idlecache   -> {"event":"parked",...,"rss_kb":...} */
#include "common.h"
#include <pthread.h>

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t cv = PTHREAD_COND_INITIALIZER;
static int filled;

static void *worker(void *arg) {
    (void)arg;
    static void *p[400];
    for (size_t sz = 16; sz <= 65536; sz += (sz < 1024 ? 16 : sz < 16384 ? 512 : 4096)) {
        for (int i = 0; i < 400; i++) {
            p[i] = malloc(sz);
            memset(p[i], 1, sz);
        }
        for (int i = 0; i < 400; i++) free(p[i]);
    }
    pthread_mutex_lock(&mu);
    filled = 1;
    pthread_cond_signal(&cv);
    pthread_mutex_unlock(&mu);
    for (;;) pause();
    return NULL;
}

int main(void) {
    t0_global = now_s();
    pthread_t t;
    pthread_create(&t, NULL, worker, NULL);
    pthread_mutex_lock(&mu);
    while (!filled) pthread_cond_wait(&cv, &mu);
    pthread_mutex_unlock(&mu);
    sleep_s(3.0);
    emit("parked", NULL);
    fflush(stdout);
    exit(0);
}
