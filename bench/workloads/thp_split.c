/* What a purge of part of each huge page gives the memory cgroup back
 * (docs/design.md, "RSS is not the charge"; bench/thp_split_study.py).
 *
 *   thp_split <usage file> <split 0|1> <range KiB> [hugepage]
 *
 * Touches 200 MiB (2 MiB-aligned; with "hugepage", MADV_HUGEPAGE first, as
 * jemalloc's thp:always does), then gives back every other <range KiB>
 * with MADV_DONTNEED, as jemalloc's purge does; with split 1, each range's
 * parts that are not whole huge pages get MADV_FREE first, as the shim's
 * madvise wrapper does (shim/src/os/thp.rs). Prints one JSON line: the
 * cgroup's usage (<usage file>: memory.current or memory.usage_in_bytes)
 * before and after, RSS and AnonHugePages after, and the purge's time. */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>

#define MIB (1ul << 20)
#define HUGE (2 * MIB)

static long read_long(const char *path) {
    long v = -1;
    FILE *f = fopen(path, "r");
    if (f) {
        if (fscanf(f, "%ld", &v) != 1) v = -1;
        fclose(f);
    }
    return v;
}

static long smaps_kib(const char *key) {
    char line[256];
    long v = -1;
    FILE *f = fopen("/proc/self/smaps_rollup", "r");
    if (!f) return -1;
    while (fgets(line, sizeof line, f))
        if (!strncmp(line, key, strlen(key))) v = atol(line + strlen(key));
    fclose(f);
    return v;
}

static double now_ms(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1e3 + t.tv_nsec / 1e6;
}

int main(int argc, char **argv) {
    if (argc < 4) {
        fprintf(stderr, "usage: thp_split <usage file> <split 0|1> <range KiB> [hugepage]\n");
        return 2;
    }
    const char *usage = argv[1];
    int split = atoi(argv[2]);
    size_t range = (size_t)atol(argv[3]) << 10, size = 200 * MIB;
    if (range == 0 || range > size / 2) return 2;
    char *m = mmap(NULL, size + HUGE, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (m == MAP_FAILED) return 1;
    char *p = (char *)(((unsigned long)m + HUGE - 1) & ~(HUGE - 1));
    if (argc > 4 && !strcmp(argv[4], "hugepage")) madvise(p, size, MADV_HUGEPAGE);
    memset(p, 1, size);
    long before = read_long(usage), huge_before = smaps_kib("AnonHugePages:");
    double t0 = now_ms();
    for (size_t o = range; o + range <= size; o += 2 * range) {
        unsigned long s = (unsigned long)p + o, e = s + range;
        if (split) {
            unsigned long head = (s + HUGE - 1) & ~(HUGE - 1), tail = e & ~(HUGE - 1);
            if (head > e) head = e;
            if (tail < head) tail = head;
            if (s < head) madvise((void *)s, head - s, MADV_FREE);
            if (tail < e) madvise((void *)tail, e - tail, MADV_FREE);
        }
        madvise((void *)s, range, MADV_DONTNEED);
    }
    double ms = now_ms() - t0;
    printf("{\"split\":%d,\"range_kib\":%zu,\"usage_before_mib\":%.1f,\"usage_after_mib\":%.1f,"
           "\"rss_after_mib\":%.1f,\"huge_before_mib\":%.1f,\"huge_after_mib\":%.1f,\"purge_ms\":%.2f}\n",
           split, range >> 10, before / (double)MIB, read_long(usage) / (double)MIB,
           smaps_kib("Rss:") / 1024.0, huge_before / 1024.0, smaps_kib("AnonHugePages:") / 1024.0, ms);
    return 0;
}
