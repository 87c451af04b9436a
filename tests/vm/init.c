/*
 * PID 1 of the test VMs (tests/vm/README.md, tests/src/vm.rs): sets up a
 * system whose root is the host's own root file system, runs one command,
 * reports how it ended and powers off. Built static by scripts/vm-image.sh
 * and stored in the initramfs with the modules it loads.
 *
 *   1. devtmpfs, proc and sysfs; the modules listed in /modules/order.
 *   2. The 9p share "share" (read-write) at /share; its file `job` says
 *      what to do: NUL-terminated `key=value` records (below).
 *   3. The 9p share "hostroot" (the host's /, read-only) as the lower
 *      layer of an overlay whose upper layer is a tmpfs: every path of the
 *      host is there, and writable, and nothing is written back. Where the
 *      overlay cannot be mounted, the root stays read-only.
 *   4. The job's mounts: the share at its host path, the ext4 disk
 *      /dev/vda, tmpfs directories, cgroup2 at /sys/fs/cgroup with the
 *      job's controllers enabled, the transparent huge page mode.
 *   5. The new root moved over / (as switch_root does); the command runs
 *      in it, in a session of its own, with exactly the job's environment,
 *      stdout and stderr into the share's `stdout` and `stderr`.
 *   6. When it ends: every process left is killed, `status` is written
 *      ("exit N" or "signal N"), the disks are synced, the power goes off.
 *
 * Job records: arg= (each argument, in order), env= (NAME=value), cwd=,
 * share= (the share's path on the host: mounted there too), disk= (where
 * the ext4 disk goes), tmpfs= (a fresh tmpfs, mode 1777), root= (overlay,
 * the default, or ro: the 9p root alone), rootopts= (the 9p root's mount
 * options), cgroup2= (its mount options), controllers= ("+memory +cpu"),
 * thp= (always, madvise, never), hostname=.
 *
 * Every step is logged, with the time since boot, on the console (the
 * kernel's ttyS0, which QEMU writes to a file) and in the share's
 * `init.log`; a failed step writes `error` there and powers off.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <net/if.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mount.h>
#include <sys/reboot.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define MAX_REC 4096

static int logfd = -1;

static double uptime(void) {
    struct timespec ts;
    clock_gettime(CLOCK_BOOTTIME, &ts);
    return ts.tv_sec + ts.tv_nsec / 1e9;
}

static void say(const char *fmt, ...) {
    char buf[4096];
    int n = snprintf(buf, sizeof buf, "[%8.3f] memshim-init: ", uptime());
    va_list ap;
    va_start(ap, fmt);
    n += vsnprintf(buf + n, sizeof buf - n, fmt, ap);
    va_end(ap);
    if (n > (int)sizeof buf - 2)
        n = sizeof buf - 2;
    buf[n++] = '\n';
    if (write(2, buf, n) < 0) { /* no console: nothing to do */ }
    if (logfd >= 0 && write(logfd, buf, n) < 0) { /* share gone */ }
}

static void poweroff(void) {
    sync();
    reboot(RB_POWER_OFF);
    for (;;)
        pause();
}

/* Writes `text` to the file `path` (created or truncated). */
static int put(const char *path, const char *text) {
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0)
        return -1;
    size_t len = strlen(text);
    ssize_t w = write(fd, text, len);
    int e = errno;
    close(fd);
    errno = e;
    return w == (ssize_t)len ? 0 : -1;
}

static const char *share_dir = "/share";

static void fail(const char *fmt, ...) {
    char buf[2048];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    say("FAILED: %s", buf);
    char path[4096];
    snprintf(path, sizeof path, "%s/error", share_dir);
    strncat(buf, "\n", sizeof buf - strlen(buf) - 1);
    put(path, buf);
    poweroff();
}

static void mkdirs(const char *path) {
    char p[4096];
    snprintf(p, sizeof p, "%s", path);
    for (char *s = p + 1; *s; s++) {
        if (*s == '/') {
            *s = 0;
            mkdir(p, 0755);
            *s = '/';
        }
    }
    mkdir(p, 0755);
}

static void do_mount(const char *src, const char *dst, const char *type,
                     unsigned long flags, const char *opts) {
    mkdirs(dst);
    if (mount(src, dst, type, flags, opts) != 0)
        fail("mount %s on %s (%s, %s): %s", src, dst, type ? type : "-",
             opts ? opts : "", strerror(errno));
}

static void load_modules(void) {
    FILE *f = fopen("/modules/order", "re");
    if (!f)
        return;
    char line[512];
    while (fgets(line, sizeof line, f)) {
        line[strcspn(line, "\n")] = 0;
        if (!*line)
            continue;
        int optional = line[0] == '?';
        const char *path = line + optional;
        int fd = open(path, O_RDONLY | O_CLOEXEC);
        if (fd < 0)
            fail("open %s: %s", path, strerror(errno));
        if (syscall(SYS_finit_module, fd, "", 0) != 0 && errno != EEXIST) {
            if (optional)
                say("module %s not loaded (optional): %s", path, strerror(errno));
            else
                fail("load module %s: %s", path, strerror(errno));
        }
        close(fd);
    }
    fclose(f);
}

/* The job: its records, in order. */
static char *rec[MAX_REC];
static int nrec;

static void read_job(const char *path) {
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        fail("open %s: %s", path, strerror(errno));
    size_t cap = 1 << 16, len = 0;
    char *buf = malloc(cap);
    for (;;) {
        if (len == cap)
            buf = realloc(buf, cap *= 2);
        ssize_t r = read(fd, buf + len, cap - len);
        if (r < 0)
            fail("read %s: %s", path, strerror(errno));
        if (r == 0)
            break;
        len += r;
    }
    close(fd);
    for (size_t i = 0; i < len && nrec < MAX_REC;) {
        size_t n = strnlen(buf + i, len - i);
        if (i + n == len)
            fail("%s: the last record has no terminating NUL", path);
        rec[nrec++] = buf + i;
        i += n + 1;
    }
}

/* The value of the first record `key`, or `def`. */
static const char *get(const char *key, const char *def) {
    size_t k = strlen(key);
    for (int i = 0; i < nrec; i++)
        if (!strncmp(rec[i], key, k) && rec[i][k] == '=')
            return rec[i] + k + 1;
    return def;
}

/* Every value of `key`, NULL-terminated (the array is malloc'd). */
static char **all(const char *key) {
    size_t k = strlen(key);
    char **v = calloc(nrec + 1, sizeof *v);
    int n = 0;
    for (int i = 0; i < nrec; i++)
        if (!strncmp(rec[i], key, k) && rec[i][k] == '=')
            v[n++] = rec[i] + k + 1;
    return v;
}

static void lo_up(void) {
    int s = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    struct ifreq ifr = {0};
    strcpy(ifr.ifr_name, "lo");
    if (s < 0 || ioctl(s, SIOCGIFFLAGS, &ifr) != 0)
        say("lo: %s", strerror(errno));
    else {
        ifr.ifr_flags |= IFF_UP | IFF_RUNNING;
        if (ioctl(s, SIOCSIFFLAGS, &ifr) != 0)
            say("lo up: %s", strerror(errno));
    }
    if (s >= 0)
        close(s);
}

static void join(char *out, size_t cap, const char *a, const char *b) {
    snprintf(out, cap, "%s%s", a, b);
}

int main(void) {
    if (getpid() != 1) {
        fprintf(stderr, "memshim-init: not PID 1; this program is the init of the test VMs\n");
        return 1;
    }
    mkdir("/dev", 0755);
    mount("devtmpfs", "/dev", "devtmpfs", 0, NULL);
    int con = open("/dev/console", O_RDWR | O_NOCTTY);
    if (con >= 0) {
        dup2(con, 0), dup2(con, 1), dup2(con, 2);
        if (con > 2)
            close(con);
    }
    say("started");
    do_mount("proc", "/proc", "proc", 0, NULL);
    do_mount("sysfs", "/sys", "sysfs", 0, NULL);
    load_modules();
    say("modules loaded");

    /* The share: virtio devices are probed while their modules load, but
     * give the 9p channel a moment all the same. */
    const char *p9 = "trans=virtio,version=9p2000.L,msize=512000,cache=none";
    int tries = 0;
    mkdirs("/share");
    while (mount("share", "/share", "9p", 0, p9) != 0) {
        if (++tries == 100)
            fail("mount the 9p share: %s", strerror(errno));
        usleep(20000);
    }
    char path[4096], path2[4096];
    join(path, sizeof path, "/share", "/init.log");
    logfd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | O_APPEND, 0644);
    read_job("/share/job");
    say("job read: %d records", nrec);

    /* The root: the host's, read-only, under a tmpfs overlay. */
    const char *rootopts = get("rootopts", "trans=virtio,version=9p2000.L,msize=512000,cache=loose");
    do_mount("hostroot", "/lower", "9p", MS_RDONLY, rootopts);
    do_mount("tmpfs", "/rw", "tmpfs", 0, "mode=0755");
    mkdirs("/rw/upper");
    mkdirs("/rw/work");
    mkdirs("/newroot");
    if (!strcmp(get("root", "overlay"), "ro"))
        do_mount("/lower", "/newroot", NULL, MS_BIND | MS_REC, NULL);
    else if (mount("overlay", "/newroot", "overlay", 0,
                   "lowerdir=/lower,upperdir=/rw/upper,workdir=/rw/work") != 0) {
        say("overlay root: %s; the root stays read-only", strerror(errno));
        do_mount("/lower", "/newroot", NULL, MS_BIND | MS_REC, NULL);
    }
    say("root mounted");

    /* tmpfs first: the share and the disk may lie below one of them. */
    for (char **t = all("tmpfs"); *t; t++) {
        if (!strncmp(*t, "/dev/", 5))
            continue; /* once /dev is there */
        join(path, sizeof path, "/newroot", *t);
        do_mount("tmpfs", path, "tmpfs", MS_NOSUID | MS_NODEV, "mode=1777");
    }
    const char *share = get("share", NULL);
    if (share) {
        join(path, sizeof path, "/newroot", share);
        do_mount("/share", path, NULL, MS_MOVE, NULL);
        static char moved[4096];
        snprintf(moved, sizeof moved, "%s", path);
        share_dir = moved;
    }
    do_mount("/dev", "/newroot/dev", NULL, MS_MOVE, NULL);
    do_mount("/proc", "/newroot/proc", NULL, MS_MOVE, NULL);
    do_mount("/sys", "/newroot/sys", NULL, MS_MOVE, NULL);
    do_mount("devpts", "/newroot/dev/pts", "devpts", 0, "mode=0620,ptmxmode=0666");
    symlink("/proc/self/fd", "/newroot/dev/fd");
    symlink("/proc/self/fd/0", "/newroot/dev/stdin");
    symlink("/proc/self/fd/1", "/newroot/dev/stdout");
    symlink("/proc/self/fd/2", "/newroot/dev/stderr");
    for (char **t = all("tmpfs"); *t; t++) {
        if (strncmp(*t, "/dev/", 5))
            continue;
        join(path, sizeof path, "/newroot", *t);
        do_mount("tmpfs", path, "tmpfs", MS_NOSUID | MS_NODEV, "mode=1777");
    }

    const char *disk = get("disk", NULL);
    if (disk) {
        for (tries = 0; access("/newroot/dev/vda", F_OK) != 0; tries++) {
            if (tries == 250)
                fail("no /dev/vda after 5 s");
            usleep(20000);
        }
        join(path, sizeof path, "/newroot", disk);
        do_mount("/newroot/dev/vda", path, "ext4", 0, NULL);
    }

    const char *cg = get("cgroup2", NULL);
    if (cg) {
        do_mount("cgroup2", "/newroot/sys/fs/cgroup", "cgroup2",
                 MS_NOSUID | MS_NODEV | MS_NOEXEC, cg);
        char ctl[256];
        snprintf(ctl, sizeof ctl, "%s", get("controllers", ""));
        for (char *save = NULL, *c = strtok_r(ctl, " ", &save); c;
             c = strtok_r(NULL, " ", &save))
            if (put("/newroot/sys/fs/cgroup/cgroup.subtree_control", c) != 0)
                fail("cgroup.subtree_control: %s: %s", c, strerror(errno));
    }
    const char *thp = get("thp", NULL);
    if (thp && put("/newroot/sys/kernel/mm/transparent_hugepage/enabled", thp) != 0)
        fail("transparent_hugepage/enabled = %s: %s", thp, strerror(errno));
    const char *host = get("hostname", "memshim-vm");
    sethostname(host, strlen(host));
    lo_up();

    /* The new root over / (switch_root's way; / itself is the initramfs,
     * which cannot be unmounted or pivoted). */
    if (chdir("/newroot") != 0 || mount(".", "/", NULL, MS_MOVE, NULL) != 0 ||
        chroot(".") != 0 || chdir("/") != 0)
        fail("switch to the new root: %s", strerror(errno));
    if (share)
        share_dir = share;
    say("system ready");

    char **argv = all("arg");
    char **envp = all("env");
    if (!argv[0])
        fail("the job has no command (arg=)");
    const char *cwd = get("cwd", "/");
    join(path, sizeof path, share_dir, "/stdout");
    join(path2, sizeof path2, share_dir, "/stderr");
    int out = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    int err = open(path2, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (out < 0 || err < 0)
        fail("open the share's stdout and stderr: %s", strerror(errno));
    char stamp[64];
    snprintf(stamp, sizeof stamp, "%.3f\n", uptime());
    join(path, sizeof path, share_dir, "/started");
    put(path, stamp);
    say("running %s", argv[0]);
    double t0 = uptime();
    pid_t child = fork();
    if (child < 0)
        fail("fork: %s", strerror(errno));
    if (child == 0) {
        setsid();
        int null = open("/dev/null", O_RDONLY);
        dup2(null, 0), dup2(out, 1), dup2(err, 2);
        if (chdir(cwd) != 0) {
            dprintf(2, "memshim-init: chdir %s: %s\n", cwd, strerror(errno));
            _exit(127);
        }
        execvpe(argv[0], argv, envp);
        dprintf(2, "memshim-init: exec %s: %s\n", argv[0], strerror(errno));
        _exit(127);
    }
    int status = 0;
    for (;;) {
        int st;
        pid_t p = waitpid(-1, &st, 0);
        if (p == child) {
            status = st;
            break;
        }
        if (p < 0 && errno != EINTR)
            fail("waitpid: %s", strerror(errno));
    }
    double t1 = uptime();
    kill(-1, SIGKILL);
    while (waitpid(-1, NULL, 0) > 0 || errno == EINTR)
        ;
    char res[128];
    if (WIFEXITED(status))
        snprintf(res, sizeof res, "exit %d\nrun_s %.3f\nboot_s %.3f\n", WEXITSTATUS(status),
                 t1 - t0, t0);
    else
        snprintf(res, sizeof res, "signal %d\nrun_s %.3f\nboot_s %.3f\n", WTERMSIG(status),
                 t1 - t0, t0);
    say("command ended: %s", strtok(strdup(res), "\n"));
    close(out);
    close(err);
    sync();
    join(path, sizeof path, share_dir, "/status");
    if (put(path, res) != 0)
        say("write %s: %s", path, strerror(errno));
    poweroff();
}
