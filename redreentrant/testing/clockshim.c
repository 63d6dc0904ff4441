/*
 * clockshim: a fast, slow or jumping clock for one server process (LD_PRELOAD).
 *
 * Part of redreentrant.testing.clocks, which compiles it at test time and writes its
 * parameters; see that module. Hand-written rather than libfaketime, which aborts a
 * jemalloc build of redis-server at start: it finds the real functions with dlsym(),
 * which may allocate, while the allocator's own initialisation is asking for the time.
 * This shim reads the real clocks with raw system calls and never allocates, so it can
 * run before, inside and after the allocator's start-up.
 *
 * With `gained` the nanoseconds a faked clock has run ahead of its real one:
 *     gained(now) = gained0 + (rate - 1) * (real CLOCK_MONOTONIC(now) - anchor)
 *     monotonic clocks: real + gained
 *     wall clocks:      real + gained + offset
 * so a clock that runs fast runs fast everywhere, and only the wall clock steps.
 *
 * The parameters live in the file named by $REDREENTRANT_CLOCK_FILE, mapped shared and
 * rewritten by one Python process while the server runs (a seqlock: `seq` is odd while a
 * write is under way). Without the variable or the file, every clock is the real one.
 */
#define _GNU_SOURCE
/* Declared differently by different C libraries (the type of its second argument):
 * the header's prototype is renamed out of the way, and ours is the only one. */
#define gettimeofday redreentrant_clockshim_hidden_gettimeofday
#include <sys/time.h>
#undef gettimeofday

#include <fcntl.h>
#include <sched.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#define CLOCK_FILE_ENV "REDREENTRANT_CLOCK_FILE"
#define MAGIC 0x6b636f6c63657272ULL /* "rreclock" as a little-endian word */
#define NS 1000000000LL
#define MAX_SPINS 100000

/* The file's layout; clocks.py packs the same fields ("=QQdqqqQ", 56 bytes). */
struct params {
    uint64_t magic;
    uint64_t seq;
    double rate;
    int64_t anchor;  /* real CLOCK_MONOTONIC, ns, when gained0 held */
    int64_t gained0; /* ns */
    int64_t offset;  /* ns, wall clocks only */
    uint64_t check;  /* seq ^ the other fields' bits ^ MAGIC */
};

static const volatile struct params *shared;

__attribute__((constructor)) static void clockshim_init(void) {
    const char *path = getenv(CLOCK_FILE_ENV);
    if (path == NULL || *path == '\0')
        return;
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return;
    struct stat st;
    /* A short file would fault (SIGBUS) when read past its end through the map. */
    void *map = fstat(fd, &st) == 0 && st.st_size >= (off_t)sizeof(struct params)
        ? mmap(NULL, sizeof(struct params), PROT_READ, MAP_SHARED, fd, 0)
        : MAP_FAILED;
    close(fd);
    if (map == MAP_FAILED)
        return;
    /* Not ours: follow the real clocks rather than spin on parameters that never
     * check out. */
    if (((const struct params *)map)->magic != MAGIC) {
        munmap(map, sizeof(struct params));
        return;
    }
    shared = map;
}

static uint64_t bits(double value) {
    uint64_t out;
    memcpy(&out, &value, sizeof out);
    return out;
}

/* A consistent copy of the parameters, or 0 when there are none to follow. */
static int load(struct params *out) {
    if (shared == NULL)
        return 0;
    for (int spin = 0; spin < MAX_SPINS; spin++) {
        uint64_t seq = __atomic_load_n(&shared->seq, __ATOMIC_ACQUIRE);
        if ((seq & 1) == 0) {
            out->magic = shared->magic;
            out->rate = shared->rate;
            out->anchor = shared->anchor;
            out->gained0 = shared->gained0;
            out->offset = shared->offset;
            out->check = shared->check;
            __atomic_thread_fence(__ATOMIC_ACQUIRE);
            /* The checksum also catches a torn copy where the writer's stores become
             * visible out of order (CPUs weaker than x86's). */
            if (__atomic_load_n(&shared->seq, __ATOMIC_RELAXED) == seq
                && out->magic == MAGIC
                && out->check == (seq ^ bits(out->rate) ^ (uint64_t)out->anchor
                                  ^ (uint64_t)out->gained0 ^ (uint64_t)out->offset ^ MAGIC))
                return 1;
        }
        sched_yield();
    }
    /* A writer killed in mid-write: real time rather than a server that hangs. */
    return 0;
}

static int64_t to_ns(const struct timespec *ts) {
    return (int64_t)ts->tv_sec * NS + ts->tv_nsec;
}

static int real_clock(clockid_t id, struct timespec *ts) {
    return (int)syscall(SYS_clock_gettime, id, ts);
}

static int64_t gained(const struct params *p) {
    if (p->rate == 1.0)
        return p->gained0;
    struct timespec mono;
    if (real_clock(CLOCK_MONOTONIC, &mono) != 0)
        return p->gained0;
    return p->gained0 + (int64_t)((p->rate - 1.0) * (double)(to_ns(&mono) - p->anchor));
}

static int is_wall(clockid_t id) {
    return id == CLOCK_REALTIME || id == CLOCK_REALTIME_COARSE;
}

static int is_monotonic(clockid_t id) {
    return id == CLOCK_MONOTONIC || id == CLOCK_MONOTONIC_COARSE || id == CLOCK_MONOTONIC_RAW
        || id == CLOCK_BOOTTIME;
}

static int fake_clock(clockid_t id, struct timespec *ts) {
    int rc = real_clock(id, ts);
    struct params p;
    if (rc != 0 || !(is_wall(id) || is_monotonic(id)) || !load(&p))
        return rc;
    int64_t shift = gained(&p) + (is_wall(id) ? p.offset : 0);
    int64_t now = to_ns(ts) + shift;
    /* Floor division: a wall clock stepped back before 1970 still has 0 <= nsec < 1e9. */
    int64_t sec = now / NS, nsec = now % NS;
    if (nsec < 0) {
        nsec += NS;
        sec -= 1;
    }
    ts->tv_sec = (time_t)sec;
    ts->tv_nsec = (long)nsec;
    return 0;
}

int clock_gettime(clockid_t id, struct timespec *ts) {
    return fake_clock(id, ts);
}

int gettimeofday(struct timeval *tv, void *tz) {
    if (tz != NULL && syscall(SYS_gettimeofday, NULL, tz) != 0)
        return -1;
    if (tv == NULL)
        return 0;
    struct timespec ts;
    if (fake_clock(CLOCK_REALTIME, &ts) != 0)
        return -1;
    tv->tv_sec = ts.tv_sec;
    tv->tv_usec = (suseconds_t)(ts.tv_nsec / 1000);
    return 0;
}

time_t time(time_t *out) {
    struct timespec ts;
    if (fake_clock(CLOCK_REALTIME, &ts) != 0)
        return (time_t)-1;
    if (out != NULL)
        *out = ts.tv_sec;
    return ts.tv_sec;
}
