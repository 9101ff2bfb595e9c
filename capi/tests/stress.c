/* libcupool under threads, through the header and the shared library, on a simulated card:
 *  - frees from a pthread key's destructor and from an exit handler, which run after the
 *    library's own thread locals are destroyed (as PyTorch's frees do at process exit);
 *  - cupool_shutdown racing allocations, frees, writes and the PyTorch entry points' own
 *    opening of the library: a shutdown either refuses or returns nothing a thread still holds;
 *  - the error text of a failed call, read after a shutdown.
 * CI builds it with -fsanitize=address (and runs it under valgrind where installed): a block
 * whose memory went back under its owner faults at the owner's next write, and a freed error
 * text is a use after free. STRESS_ROUNDS sets how many shutdowns must go through. */
#define _POSIX_C_SOURCE 200809L
#include <pthread.h>
#include <sched.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include "cupool.h"

#define MIB ((size_t)1 << 20)
#define WORKERS 4

#define FAIL(what) do { fprintf(stderr, "stress: %s:%d: %s (last error: %s)\n", __FILE__, __LINE__, what, cupool_last_error()); _exit(1); } while (0)
#define CHECK(cond) do { if (!(cond)) FAIL(#cond); } while (0)

/* The counter `key` of device 0's statistics. */
static unsigned long long stat_of(const char *key) {
    static char json[1 << 16];
    size_t n = cupool_stats_json(0, json, sizeof json);
    CHECK(n > 0 && n < sizeof json);
    char pattern[128];
    snprintf(pattern, sizeof pattern, "\"%s\":", key);
    const char *at = strstr(json, pattern);
    CHECK(at != NULL);
    return strtoull(at + strlen(pattern), NULL, 10);
}

static void open_library(void) {
    /* The PyTorch entry points open the library from the environment (the same
     * configuration): a worker may have opened it first. */
    enum cupool_status s = cupool_init(NULL);
    CHECK(s == CUPOOL_STATUS_OK || (s == CUPOOL_STATUS_INVALID_ARGUMENT && strstr(cupool_last_error(), "already initialised")));
}

static void pause_briefly(void) {
    struct timespec t = {0, 50 * 1000};
    nanosleep(&t, NULL);
}

/* --- Frees after the thread's locals are gone --------------------------------------------- */

struct late {
    void *ptr;
    size_t size;
    int torch;
};
static pthread_key_t late_key;
static struct late late_blocks[2];
static int late_status = -1;

/* glibc runs a thread's thread_local destructors (Rust's among them) before its pthread keys'
 * destructors: libcupool's locals are gone when this runs. */
static void free_late(void *arg) {
    struct late *blocks = arg;
    for (int i = 0; i < 2; i++) {
        if (blocks[i].torch) {
            cupool_torch_free(blocks[i].ptr, blocks[i].size, 0, NULL);
        } else {
            late_status = cupool_free(0, 0, blocks[i].ptr, blocks[i].size);
        }
    }
}

static void *exiting_thread(void *unused) {
    (void)unused;
    void *a = cupool_alloc(0, 0, MIB, NULL);
    void *b = cupool_torch_alloc(3 * MIB, 0, NULL);
    CHECK(a != NULL && b != NULL);
    late_blocks[0] = (struct late){a, MIB, 0};
    late_blocks[1] = (struct late){b, 3 * MIB, 1};
    CHECK(pthread_setspecific(late_key, late_blocks) == 0);
    return NULL;
}

static void frees_after_thread_exit(void) {
    unsigned long long freed = stat_of("allocation.all.freed");
    CHECK(pthread_key_create(&late_key, free_late) == 0);
    pthread_t t;
    CHECK(pthread_create(&t, NULL, exiting_thread, NULL) == 0);
    CHECK(pthread_join(t, NULL) == 0);
    CHECK(late_status == CUPOOL_STATUS_OK);
    CHECK(stat_of("allocation.all.freed") == freed + 2);
    CHECK(stat_of("allocated_bytes.all.current") == 0);
}

/* --- Shutdown racing the workers ---------------------------------------------------------- */

static volatile int stop;
static unsigned long served; /* blocks written and freed, all workers */

static void *worker(void *arg) {
    unsigned t = (unsigned)(uintptr_t)arg;
    for (size_t i = 1; !__atomic_load_n(&stop, __ATOMIC_RELAXED); i++) {
        size_t size = 4096 + (i * 7919 + t * 104729) % (256 << 10);
        int torch = (i + t) % 3 == 0;
        uint64_t stream = t % 2;
        void *p = torch ? cupool_torch_alloc(size, 0, (void *)(uintptr_t)stream) : cupool_alloc(0, stream, size, NULL);
        if (p == NULL) {
            CHECK(strstr(cupool_last_error(), "not initialised") != NULL);
            continue;
        }
        unsigned char tag = (unsigned char)((t * 31 + i) | 1);
        memset(p, tag, size);
        sched_yield();
        for (size_t k = 0; k < size; k += 512) {
            if (((unsigned char *)p)[k] != tag) FAIL("a block changed under its owner");
        }
        if (torch) {
            cupool_torch_free(p, size, 0, (void *)(uintptr_t)stream);
            CHECK(cupool_last_error()[0] == '\0');
        } else {
            CHECK(cupool_free(0, stream, p, size) == CUPOOL_STATUS_OK);
        }
        __atomic_add_fetch(&served, 1, __ATOMIC_RELAXED);
        /* Now and then every worker is between blocks at once, so shutdowns go through. */
        if (i % 2 == 0) pause_briefly();
    }
    return NULL;
}

static void shutdown_races_workers(long rounds) {
    pthread_t threads[WORKERS];
    for (unsigned t = 0; t < WORKERS; t++) {
        CHECK(pthread_create(&threads[t], NULL, worker, (void *)(uintptr_t)t) == 0);
    }
    long closed = 0, refused = 0;
    time_t deadline = time(NULL) + 60; /* ends a run on a machine too loaded to get there */
    /* Until enough shutdowns went through while the workers were serving blocks. */
    while ((closed < rounds || __atomic_load_n(&served, __ATOMIC_RELAXED) < (unsigned long)rounds) && time(NULL) < deadline) {
        enum cupool_status s = cupool_shutdown();
        if (s == CUPOOL_STATUS_OK) {
            closed++;
            sched_yield();
            open_library();
        } else {
            CHECK(s == CUPOOL_STATUS_INVALID_ARGUMENT && strstr(cupool_last_error(), "still live"));
            refused++;
        }
        sched_yield();
    }
    __atomic_store_n(&stop, 1, __ATOMIC_RELAXED);
    for (unsigned t = 0; t < WORKERS; t++) CHECK(pthread_join(threads[t], NULL) == 0);
    open_library();
    CHECK(closed > 0 && served > 0);
    CHECK(stat_of("allocated_bytes.all.current") == 0);
    printf("stress: %ld shutdowns went through, %ld refused, %lu blocks served\n", closed, refused, served);
}

/* --- The error text across a shutdown ------------------------------------------------------ */

static void error_text_outlives_shutdown(void) {
    CHECK(cupool_alloc(7, 0, 64, NULL) == NULL);
    const char *text = cupool_last_error();
    char copy[512];
    snprintf(copy, sizeof copy, "%s", text);
    CHECK(strstr(copy, "device 7") != NULL);
    CHECK(cupool_shutdown() == CUPOOL_STATUS_OK);
    CHECK(strcmp(text, copy) == 0);
    open_library();
}

/* --- A free from an exit handler ------------------------------------------------------------ */

static void *exit_block;
static unsigned long long freed_before_exit;

/* exit() destroys the main thread's thread locals before it runs the atexit handlers. */
static void free_at_exit(void) {
    CHECK(cupool_free(0, 0, exit_block, MIB) == CUPOOL_STATUS_OK);
    CHECK(stat_of("allocation.all.freed") == freed_before_exit + 1);
    CHECK(cupool_shutdown() == CUPOOL_STATUS_OK);
    printf("stress: ok\n");
}

int main(void) {
    /* What the PyTorch entry points read when they open the library themselves. */
    setenv("CUPOOL_DEVICE", "sim", 1);
    setenv("CUPOOL_SIM_GIB", "1", 1);
    setenv("GGML_POOL", "legacy", 1);
    const char *r = getenv("STRESS_ROUNDS");
    long rounds = r ? atol(r) : 200;
    open_library();
    frees_after_thread_exit();
    shutdown_races_workers(rounds > 0 ? rounds : 1);
    error_text_outlives_shutdown();
    exit_block = cupool_alloc(0, 0, MIB, NULL);
    CHECK(exit_block != NULL);
    freed_before_exit = stat_of("allocation.all.freed");
    CHECK(atexit(free_at_exit) == 0);
    fflush(stdout);
    return 0;
}
