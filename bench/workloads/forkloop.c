/* Page faults a fork costs under an allocator: a process with a small heap (like a shell's) forks N
 * times; each child _exits at once; the parent allocates between forks. Prints the parent's and the
 * children's minor faults per fork (the allocator's fork handlers write to its metadata, and every
 * page written while parent and child share it is a copy-on-write fault).
 *
 * usage: forkloop N   -> {"event":"result",...,"parent_faults_per_fork":...,"child_faults_per_fork":...} */
#include "common.h"
#include <sys/resource.h>
#include <sys/wait.h>

int main(int argc, char **argv) {
    if (argc != 2) {
        fprintf(stderr, "usage: forkloop N\n");
        return 2;
    }
    t0_global = now_s();
    int n = atoi(argv[1]);
    static void *keep[200];
    for (int i = 0; i < 200; i++) {
        keep[i] = malloc(32 + (size_t)(i * 37) % 2000);
        memset(keep[i], 1, 16);
    }
    struct rusage s0, s1, c0, c1;
    getrusage(RUSAGE_SELF, &s0);
    getrusage(RUSAGE_CHILDREN, &c0);
    for (int i = 0; i < n; i++) {
        pid_t p = fork();
        if (p == 0) _exit(0);
        int st;
        waitpid(p, &st, 0);
        free(malloc(100));
    }
    getrusage(RUSAGE_SELF, &s1);
    getrusage(RUSAGE_CHILDREN, &c1);
    char extra[128];
    snprintf(extra, sizeof extra, "\"parent_faults_per_fork\":%.1f,\"child_faults_per_fork\":%.1f",
             (double)(s1.ru_minflt - s0.ru_minflt) / n, (double)(c1.ru_minflt - c0.ru_minflt) / n);
    emit("result", extra);
    for (int i = 0; i < 200; i++) free(keep[i]);
    return 0;
}
