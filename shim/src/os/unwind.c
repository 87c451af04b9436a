/* std's unwinder imports, forwarded to the libgcc_s.so.1 that glibc uses.
 *
 * Rust's std asks for `-lgcc_s` and imports ten `_Unwind_*` functions from
 * it. With `panic = "abort"` the shim never raises an exception of its own:
 * these only serve std's backtraces and a forced unwind (`pthread_exit`,
 * `pthread_cancel`) that crosses std's frames. Depending on the library
 * would load it into every process, and its constructor runs `cpuid`
 * repeatedly, which traps to the hypervisor in a VM: about 100 us of every
 * exec (bench/FINDINGS-issue15.md, P2).
 *
 * So the ten are defined here, hidden (nothing is exported, and the
 * application's own `_Unwind_*` lookups never see these), and each jumps to
 * the function of the same name in libgcc_s.so.1, loaded on first use
 * (but `_Unwind_Backtrace`, below, only once the shim has loaded it). That
 * is the library glibc itself loads for `pthread_exit` and cancellation, so
 * a process with the shim still has exactly one unwinder, as without it.
 * os/unwind.rs says when the shim loads it ahead of need.
 *
 * Compiled by shim/build.rs and linked whole into libmemshim.so. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <sched.h>
#include <stdint.h>
#include <stdlib.h>

#define HIDDEN __attribute__((visibility("hidden")))

struct _Unwind_Context;
struct _Unwind_Exception;
typedef int reason_t; /* _Unwind_Reason_Code */
typedef reason_t (*trace_fn)(struct _Unwind_Context *, void *);

/* The name glibc loads for its own unwinding (LIBGCC_S_SO). */
#define LIBGCC_S "libgcc_s.so.1"
#define URC_END_OF_STACK 5

enum {
    BACKTRACE,
    GET_DATA_REL_BASE,
    GET_IP,
    GET_IP_INFO,
    GET_LSDA,
    GET_REGION_START,
    GET_TEXT_REL_BASE,
    RESUME,
    SET_GR,
    SET_IP,
    GET_CFA,
    COUNT
};

static const char *const NAMES[COUNT] = {
    [BACKTRACE] = "_Unwind_Backtrace",
    [GET_DATA_REL_BASE] = "_Unwind_GetDataRelBase",
    [GET_IP] = "_Unwind_GetIP",
    [GET_IP_INFO] = "_Unwind_GetIPInfo",
    [GET_LSDA] = "_Unwind_GetLanguageSpecificData",
    [GET_REGION_START] = "_Unwind_GetRegionStart",
    [GET_TEXT_REL_BASE] = "_Unwind_GetTextRelBase",
    [RESUME] = "_Unwind_Resume",
    [SET_GR] = "_Unwind_SetGR",
    [SET_IP] = "_Unwind_SetIP",
    [GET_CFA] = "_Unwind_GetCFA",
};

static void *slots[COUNT];

/* Whether every slot is filled: the last one is stored last. */
HIDDEN int memshim_unwind_ready(void) {
    return __atomic_load_n(&slots[COUNT - 1], __ATOMIC_ACQUIRE) != NULL;
}

/* Loads libgcc_s.so.1 (or finds it loaded) and fills every slot; 1 when
 * all were found (the ten std imports, and `_Unwind_GetCFA` for the profiler). Takes the loader's lock and may allocate: not for the
 * allocation path or a fork handler. `dlmopen` into the base namespace is
 * `dlopen` without the shim's exported `dlopen` in between. Racing callers
 * store the same addresses. */
HIDDEN int memshim_unwind_load(void) {
    if (memshim_unwind_ready()) return 1;
    void *lib = dlmopen(LM_ID_BASE, LIBGCC_S, RTLD_NOW | RTLD_LOCAL);
    if (!lib) return 0;
    void *found[COUNT];
    for (int i = 0; i < COUNT; i++) {
        found[i] = dlsym(lib, NAMES[i]);
        if (!found[i]) return 0;
    }
    /* In order: the last slot marks them all filled. */
    for (int i = 0; i < COUNT; i++) __atomic_store_n(&slots[i], found[i], __ATOMIC_RELEASE);
    return 1;
}

static void *target(int i) {
    void *f = __atomic_load_n(&slots[i], __ATOMIC_ACQUIRE);
    if (!f && memshim_unwind_load()) f = __atomic_load_n(&slots[i], __ATOMIC_ACQUIRE);
    return f;
}

/* Everything but `_Unwind_Backtrace` is called only by an unwinder that is
 * already running, with its context or exception: libgcc_s is loaded then,
 * and not finding it cannot happen. */
static void *required(int i) {
    void *f = target(i);
    if (!f) abort();
    return f;
}

/* The one forwarder that never loads the library itself: jemalloc's heap
 * profiler calls it from inside allocations, and once at its own
 * initialisation holding its init lock (prof_unwind_init), where loading a
 * library, which allocates, would deadlock. Until the shim has loaded
 * libgcc_s on its own thread (`memshim_unwind_load`, which the profiler's
 * switch and the Python bridge call first), a backtrace comes back empty. */
/* Backtraces under way, and a fork under way. Before glibc 2.35 (or with a
 * libgcc before 12) the unwinder finds unwind tables with dl_iterate_phdr,
 * which holds the loader's write lock, and fork does not reset that lock in
 * the child: a fork while another thread took a sampled backtrace would
 * leave the child's loader locked for good. So a fork waits (bounded) for
 * the backtraces under way, and none starts until it is done
 * (`memshim_unwind_fork_*`, from the shim's fork handlers while profiling
 * is ready). */
static unsigned in_flight;
static int forking;

HIDDEN reason_t _Unwind_Backtrace(trace_fn trace, void *arg) {
    void *f = __atomic_load_n(&slots[BACKTRACE], __ATOMIC_ACQUIRE);
    /* Not loaded (or no unwinder): an empty backtrace. */
    if (!f || !memshim_unwind_ready()) return URC_END_OF_STACK;
    if (__atomic_load_n(&forking, __ATOMIC_ACQUIRE)) return URC_END_OF_STACK;
    __atomic_add_fetch(&in_flight, 1, __ATOMIC_SEQ_CST);
    reason_t r = URC_END_OF_STACK;
    if (!__atomic_load_n(&forking, __ATOMIC_SEQ_CST))
        r = ((reason_t (*)(trace_fn, void *))f)(trace, arg);
    __atomic_sub_fetch(&in_flight, 1, __ATOMIC_SEQ_CST);
    return r;
}

/* Fork prepare: no new backtrace, and those under way end (a backtrace is
 * microseconds; after `max_spins` yields the fork goes on, as it would
 * without the shim). */
HIDDEN void memshim_unwind_fork_prepare(unsigned max_spins) {
    __atomic_store_n(&forking, 1, __ATOMIC_SEQ_CST);
    for (unsigned i = 0; i < max_spins && __atomic_load_n(&in_flight, __ATOMIC_SEQ_CST) != 0; i++)
        sched_yield();
}

/* Fork parent and child: backtraces again (none is under way in a child). */
HIDDEN void memshim_unwind_fork_done(int child) {
    if (child) __atomic_store_n(&in_flight, 0, __ATOMIC_RELAXED);
    __atomic_store_n(&forking, 0, __ATOMIC_RELEASE);
}

static reason_t warm_up_step(struct _Unwind_Context *c, void *arg) {
    (void)c;
    (void)arg;
    return 0; /* _URC_NO_REASON: walk on */
}

/* One backtrace of the calling thread through libgcc (once loaded), so that
 * libgcc sets up what it keeps for unwinding here rather than inside the
 * first allocation jemalloc's profiler samples; jemalloc's own
 * prof_unwind_init does the same. */
HIDDEN void memshim_unwind_warm_up(void) {
    _Unwind_Backtrace(warm_up_step, NULL);
}

/* A backtrace with the canonical frame address each frame's context gives:
 * libgcc's is the CFA of the frame that frame called, so frame i's own
 * stack lies between cfa[i] and cfa[i + 1]. profile/python_stack.rs finds
 * by it the native frame that runs each group of Python frames (the
 * interpreter keeps a marker of each call of its eval loop on the C
 * stack). Same walk as jemalloc's own (prof_backtrace_impl, libgcc). */
struct frames {
    uintptr_t *ip, *cfa;
    unsigned len, max;
};

static uintptr_t get_cfa(struct _Unwind_Context *c) {
    return ((uintptr_t (*)(struct _Unwind_Context *))required(GET_CFA))(c);
}

static reason_t frames_step(struct _Unwind_Context *c, void *arg) {
    struct frames *d = arg;
    uintptr_t ip = ((uintptr_t (*)(struct _Unwind_Context *))required(GET_IP))(c);
    if (!ip) return URC_END_OF_STACK;
    d->ip[d->len] = ip;
    d->cfa[d->len] = get_cfa(c);
    d->len++;
    return d->len >= d->max ? URC_END_OF_STACK : 0;
}

HIDDEN unsigned memshim_unwind_frames(uintptr_t *ip, uintptr_t *cfa, unsigned max) {
    struct frames d = {ip, cfa, 0, max};
    if (max) _Unwind_Backtrace(frames_step, &d);
    return d.len;
}

HIDDEN uintptr_t _Unwind_GetDataRelBase(struct _Unwind_Context *c) {
    return ((uintptr_t (*)(struct _Unwind_Context *))required(GET_DATA_REL_BASE))(c);
}

HIDDEN uintptr_t _Unwind_GetIP(struct _Unwind_Context *c) {
    return ((uintptr_t (*)(struct _Unwind_Context *))required(GET_IP))(c);
}

HIDDEN uintptr_t _Unwind_GetIPInfo(struct _Unwind_Context *c, int *before) {
    return ((uintptr_t (*)(struct _Unwind_Context *, int *))required(GET_IP_INFO))(c, before);
}

HIDDEN void *_Unwind_GetLanguageSpecificData(struct _Unwind_Context *c) {
    return ((void *(*)(struct _Unwind_Context *))required(GET_LSDA))(c);
}

HIDDEN uintptr_t _Unwind_GetRegionStart(struct _Unwind_Context *c) {
    return ((uintptr_t (*)(struct _Unwind_Context *))required(GET_REGION_START))(c);
}

HIDDEN uintptr_t _Unwind_GetTextRelBase(struct _Unwind_Context *c) {
    return ((uintptr_t (*)(struct _Unwind_Context *))required(GET_TEXT_REL_BASE))(c);
}

/* Called by a landing pad at the end of its cleanup. This frame has unwind
 * information of its own (no personality), so the unwinder passes through
 * it whether or not the compiler made the call a jump. */
HIDDEN void _Unwind_Resume(struct _Unwind_Exception *e) {
    ((void (*)(struct _Unwind_Exception *))required(RESUME))(e);
    abort();
}

HIDDEN void _Unwind_SetGR(struct _Unwind_Context *c, int index, uintptr_t value) {
    ((void (*)(struct _Unwind_Context *, int, uintptr_t))required(SET_GR))(c, index, value);
}

HIDDEN void _Unwind_SetIP(struct _Unwind_Context *c, uintptr_t ip) {
    ((void (*)(struct _Unwind_Context *, uintptr_t))required(SET_IP))(c, ip);
}
