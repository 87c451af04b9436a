/* Scenario 7 target: makes 1 GiB of dirty pages on request.
 * Each line "fill" on stdin allocates 1024 blocks of 1 MiB, writes every page,
 * frees them all (with decay off they stay dirty in the allocator) and answers
 * "ready". EOF ends the process. A second thread exists so that memshim's
 * control thread starts under MEMSHIM_CONTROL=auto as well. */
#include "common.h"
#include <pthread.h>

static void *idle_thread(void *arg) {
    (void)arg;
    for (;;) pause();
    return NULL;
}

int main(void) {
    t0_global = now_s();
    pthread_t t;
    pthread_create(&t, NULL, idle_thread, NULL);
    static void *blk[1024];
    char line[64];
    emit("start", NULL);
    while (fgets(line, sizeof line, stdin)) {
        if (strncmp(line, "fill", 4) != 0) continue;
        for (int i = 0; i < 1024; i++) {
            blk[i] = malloc(1 << 20);
            touch_pages(blk[i], 1 << 20);
        }
        for (int i = 0; i < 1024; i++) free(blk[i]);
        emit("ready", NULL);
    }
    return 0;
}
