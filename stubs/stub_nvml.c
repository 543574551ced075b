/* Stub libnvidia-ml: exports the NVML symbols nvmlcheck uses and answers from a scenario file.
 *
 * The contract is stubs/README.md. This file is compiled against the real nvml.h (package nvidia-nvml-dev) so the
 * compiler checks every exported signature against NVIDIA's declarations; nothing of the header is copied here.
 *
 *     gcc -shared -fPIC -O2 -DNVML_NO_UNVERSIONED_FUNC_DEFS -I<dir of nvml.h> stub_nvml.c -o libnvidia-ml.so.1 -lpthread
 *
 * Structure: one global mutex serialises every call; `begin()` does the bookkeeping every exported function shares
 * (count, log, initialised?, timeline, faults, lost device) and the function body answers from `g_state`, the parsed
 * scenario. The scenario is parsed completely (timeline lines included) when it is loaded, so a bad file fails at
 * nvmlInit with a message naming the line, never later.
 */
#define _GNU_SOURCE
#include <nvml.h>

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

/* ------------------------------------------------------------------------------------------------------------ */
/* The exported NVML functions. F_DEVICE: takes a device handle; F_INDEX: takes a device index; F_INIT: an        */
/* nvmlInit* variant; F_NOFAULT: cannot carry a fault (does not return nvmlReturn_t).                             */
/* The table lists every name whatever the build variant, so a fault or a count query on a missing symbol is not  */
/* an error.                                                                                                      */

/* F_UNCOUNTED: not counted in the calls that `at call=N` counts (event calls come from a listener thread at times
 * nobody controls: counting them would make call-numbered timelines depend on thread scheduling).              */
enum { F_DEVICE = 1, F_INDEX = 2, F_INIT = 4, F_NOFAULT = 8, F_UNCOUNTED = 16 };

#define STUB_FUNCTIONS(X)                                                                                          \
    X(nvmlInit, F_INIT)                                                                                            \
    X(nvmlInit_v2, F_INIT)                                                                                         \
    X(nvmlInitWithFlags, F_INIT)                                                                                   \
    X(nvmlShutdown, 0)                                                                                             \
    X(nvmlErrorString, F_NOFAULT)                                                                                  \
    X(nvmlSystemGetDriverVersion, 0)                                                                               \
    X(nvmlSystemGetNVMLVersion, 0)                                                                                 \
    X(nvmlSystemGetCudaDriverVersion, 0)                                                                           \
    X(nvmlSystemGetCudaDriverVersion_v2, 0)                                                                        \
    X(nvmlDeviceGetCount, 0)                                                                                       \
    X(nvmlDeviceGetCount_v2, 0)                                                                                    \
    X(nvmlDeviceGetHandleByIndex, F_INDEX)                                                                         \
    X(nvmlDeviceGetHandleByIndex_v2, F_INDEX)                                                                      \
    X(nvmlDeviceGetName, F_DEVICE)                                                                                 \
    X(nvmlDeviceGetUUID, F_DEVICE)                                                                                 \
    X(nvmlDeviceGetSerial, F_DEVICE)                                                                               \
    X(nvmlDeviceGetMinorNumber, F_DEVICE)                                                                          \
    X(nvmlDeviceGetPciInfo_v2, F_DEVICE)                                                                           \
    X(nvmlDeviceGetPciInfo_v3, F_DEVICE)                                                                           \
    X(nvmlDeviceGetMemoryInfo, F_DEVICE)                                                                           \
    X(nvmlDeviceGetMemoryInfo_v2, F_DEVICE)                                                                        \
    X(nvmlDeviceGetComputeRunningProcesses, F_DEVICE)                                                              \
    X(nvmlDeviceGetComputeRunningProcesses_v2, F_DEVICE)                                                           \
    X(nvmlDeviceGetComputeRunningProcesses_v3, F_DEVICE)                                                           \
    X(nvmlDeviceGetGraphicsRunningProcesses, F_DEVICE)                                                             \
    X(nvmlDeviceGetGraphicsRunningProcesses_v2, F_DEVICE)                                                          \
    X(nvmlDeviceGetGraphicsRunningProcesses_v3, F_DEVICE)                                                          \
    X(nvmlDeviceGetMPSComputeRunningProcesses, F_DEVICE)                                                           \
    X(nvmlDeviceGetMPSComputeRunningProcesses_v2, F_DEVICE)                                                        \
    X(nvmlDeviceGetMPSComputeRunningProcesses_v3, F_DEVICE)                                                        \
    X(nvmlDeviceGetClockInfo, F_DEVICE)                                                                            \
    X(nvmlDeviceGetMaxClockInfo, F_DEVICE)                                                                         \
    X(nvmlDeviceGetApplicationsClock, F_DEVICE)                                                                    \
    X(nvmlDeviceGetCurrentClocksEventReasons, F_DEVICE)                                                            \
    X(nvmlDeviceGetCurrentClocksThrottleReasons, F_DEVICE)                                                         \
    X(nvmlDeviceGetRetiredPages, F_DEVICE)                                                                         \
    X(nvmlDeviceGetRetiredPages_v2, F_DEVICE)                                                                      \
    X(nvmlDeviceGetRetiredPagesPendingStatus, F_DEVICE)                                                            \
    X(nvmlDeviceGetRemappedRows, F_DEVICE)                                                                         \
    X(nvmlDeviceGetTotalEccErrors, F_DEVICE)                                                                       \
    X(nvmlDeviceGetFieldValues, F_DEVICE)                                                                          \
    X(nvmlDeviceGetMigMode, F_DEVICE)                                                                              \
    X(nvmlDeviceGetMaxMigDeviceCount, F_DEVICE)                                                                    \
    X(nvmlDeviceGetMigDeviceHandleByIndex, F_DEVICE)                                                               \
    X(nvmlDeviceGetDeviceHandleFromMigDeviceHandle, 0)                                                             \
    X(nvmlDeviceGetGpuInstanceId, 0)                                                                               \
    X(nvmlDeviceGetComputeInstanceId, 0)                                                                           \
    X(nvmlEventSetCreate, F_UNCOUNTED)                                                                             \
    X(nvmlDeviceRegisterEvents, F_DEVICE | F_UNCOUNTED)                                                            \
    X(nvmlDeviceGetSupportedEventTypes, F_DEVICE | F_UNCOUNTED)                                                    \
    X(nvmlEventSetWait_v2, F_UNCOUNTED)                                                                            \
    X(nvmlEventSetFree, F_UNCOUNTED)

#define X_ENUM(name, flags) FN_##name,
enum { STUB_FUNCTIONS(X_ENUM) FN_COUNT };
#undef X_ENUM

#define X_NAME(name, flags) #name,
static const char *const fn_names[FN_COUNT] = {STUB_FUNCTIONS(X_NAME)};
#undef X_NAME

#define X_FLAGS(name, flags) flags,
static const int fn_flags[FN_COUNT] = {STUB_FUNCTIONS(X_FLAGS)};
#undef X_FLAGS

static int fn_lookup(const char *name) {
    for (int i = 0; i < FN_COUNT; i++)
        if (strcmp(fn_names[i], name) == 0) return i;
    return -1;
}

/* ------------------------------------------------------------------------------------------------------------ */
/* Scenario state                                                                                               */

enum { K_COMPUTE, K_GRAPHICS, K_MPS, K_COUNT };
static const char *const kind_names[K_COUNT] = {"compute", "graphics", "mps"};

enum { CLK_CUR, CLK_MAX, CLK_APP, CLK_SETS };
static const char *const clock_set_names[CLK_SETS] = {"clock", "max", "app"};
static const char *const clock_domain_names[4] = {"graphics", "sm", "mem", "video"}; /* = nvmlClockType_t 0..3 */

/* Bits of `unsupported`. The clock bits are U_CLOCK_BASE + set * 4 + domain. */
enum {
    U_NAME,
    U_UUID,
    U_SERIAL,
    U_MINOR,
    U_PCI,
    U_MEMORY,
    U_REASONS,
    U_RETIRED_PAGES,
    U_RETIRED_PENDING,
    U_REMAPPED,
    U_MIG,
    U_EVENTS,
    U_ECC,
    U_RECOVERY,
    U_PROC_BASE,                  /* + kind */
    U_CLOCK_BASE = U_PROC_BASE + K_COUNT, /* + set * 4 + domain */
    U_COUNT = U_CLOCK_BASE + CLK_SETS * 4
};
static const char *const unsupported_names[U_CLOCK_BASE] = {
    "name",    "uuid",          "serial",          "minor",    "pci",
    "memory",  "reasons",       "retired_pages",   "retired_pending",
    "remapped", "mig", "events", "ecc", "recovery", "processes.compute", "processes.graphics", "processes.mps",
};

#define NOT_AVAILABLE (~0ULL) /* NVML_VALUE_NOT_AVAILABLE as an unsigned long long: all bits set */
#define NOT_MIG 0xFFFFFFFFu
#define RACE_PID_BASE 4100000u
#define RACE_BYTES (1024ULL * 1024ULL)

struct page {
    int cause; /* nvmlPageRetirementCause_t: 0 sbe, 1 dbe */
    unsigned long long address, timestamp;
};

struct device {
    char *name, *uuid, *pci, *serial;
    unsigned int pci_domain, pci_bus, pci_device, pci_device_id, pci_subsystem_id;
    unsigned int minor;
    unsigned long long total, reserved, used;
    unsigned int clocks[CLK_SETS][4];
    unsigned long long reasons;
    struct page *pages;
    size_t npages;
    int retired_pending;
    unsigned int remapped[4];
    unsigned long long ecc_volatile, ecc_aggregate; /* uncorrected ECC totals */
    unsigned int recovery;                           /* nvmlDeviceGpuRecoveryAction_t */
    unsigned long long unsupported; /* bit set of U_* */
    int lost;
    int mig;                        /* MIG mode (current = pending) */
    unsigned long long event_types; /* what nvmlDeviceGetSupportedEventTypes reports (`event_types=`) */
};

/* What nvmlDeviceGetSupportedEventTypes reports for a device without `unsupported=events` or `event_types=`. */
#define STUB_SUPPORTED_EVENTS                                                                                      \
    (nvmlEventTypeSingleBitEccError | nvmlEventTypeDoubleBitEccError | nvmlEventTypePState |                        \
     nvmlEventTypeXidCriticalError | nvmlEventTypeClock)

/* A MIG device (`mig device=D index=I gi=G ci=C uuid=MIG-... total=B used=B`). Processes whose gi (and ci) match
 * run in it: they are listed on the parent, as NVML does, and their memory counts on both. */
#define MAX_MIG 7 /* nvmlDeviceGetMaxMigDeviceCount: seven 1g slices on an H100/H200 */
struct mig {
    unsigned int device, index, gi, ci;
    char *uuid;
    unsigned long long total, used;
};

struct proc {
    unsigned int device, pid, gi, ci;
    int kind;
    unsigned long long used; /* NOT_AVAILABLE for `used=na` */
    unsigned long long holds;
    int holds_set; /* 0: holds follows used (0 when used=na) */
    int bound, zombie_holds, gone;
    unsigned long long release_ms, list_ms;
    uint64_t gone_ns; /* CLOCK_MONOTONIC when a call first found the bound pid gone */
};

/* A raised event (`event device=D type=xid data=79`): kept in order; each event set reads the log from its start. */
struct event {
    unsigned int device, gi, ci;
    unsigned long long type, data;
};

struct fault {
    int fn, has_device, has_code;
    unsigned int device;
    int code;
    unsigned long long after, count, delay_ms, seen;
};

struct race {
    unsigned int device;
    int kind;
    long long grow;
    unsigned long long count, fired;
};

struct kv {
    char *key, *val;
};

/* One tokenised scenario line: `keyword key=value ...`. */
struct line {
    int lineno;
    char *keyword;
    struct kv *kv;
    size_t nkv;
};

struct action { /* an `at` line, applied once when due */
    int is_ms, applied;
    unsigned long long when;
    struct line line;
};

struct state {
    char *path;
    char *driver, *nvml;
    int cuda;
    struct device *dev;
    size_t ndev, capdev;
    struct proc *proc;
    size_t nproc, capproc;
    struct mig *mig;
    size_t nmig, capmig;
    struct fault *fault;
    size_t nfault, capfault;
    struct race *race;
    size_t nrace, caprace;
    struct action *action;
    size_t naction, capaction, pending; /* pending: actions not applied yet */
    struct event *event;
    size_t nevent, capevent;
    int quirk_535_43;
    unsigned int next_race_pid;
    unsigned long long calls; /* NVML calls since the scenario was loaded */
    uint64_t loaded_ns;
};

/* ------------------------------------------------------------------------------------------------------------ */
/* Globals (all guarded by g_mu)                                                                                */

static pthread_mutex_t g_mu = PTHREAD_MUTEX_INITIALIZER;
static struct state *g_state;          /* the loaded scenario, NULL when the refcount is 0 */
static int g_refcount;
static pid_t g_init_pid;               /* the process that initialised; a forked child is not it */
static unsigned long long g_generation; /* bumped whenever g_state is installed or dropped */
static unsigned long long g_counts[FN_COUNT], g_total_calls;
static int g_init_total, g_shutdown_total;
#define MSGLEN 512  /* one problem, without file and line */
#define ERRLEN 2048 /* "scenario PATH line N: " + a message */
static char g_last_error[ERRLEN];
/* Signalled (under g_mu) when an event is raised, NVML shuts down or a set is freed: nvmlEventSetWait_v2 sleeps on
 * it instead of polling. CLOCK_MONOTONIC, set up in the constructor. */
static pthread_cond_t g_event_cond;

static uint64_t now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ULL + (uint64_t)ts.tv_nsec;
}

static void sleep_ms(unsigned long long ms) {
    struct timespec ts = {.tv_sec = (time_t)(ms / 1000), .tv_nsec = (long)(ms % 1000) * 1000000L};
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
    }
}

static uint64_t ms_to_ns(unsigned long long ms) {
    return ms > UINT64_MAX / 1000000ULL ? UINT64_MAX : (uint64_t)ms * 1000000ULL;
}

static unsigned long long sat_add(unsigned long long a, unsigned long long b) {
    return a > ~0ULL - b ? ~0ULL : a + b;
}

static void *xrealloc(void *p, size_t n) {
    void *q = realloc(p, n ? n : 1);
    if (!q) {
        fprintf(stderr, "stub libnvidia-ml: out of memory\n");
        abort();
    }
    return q;
}

static char *xstrdup(const char *s) {
    size_t n = strlen(s) + 1;
    return memcpy(xrealloc(NULL, n), s, n);
}

/* Grow a dynamic array so that one more element fits. */
#define PUSH(arr, n, cap)                                                                                          \
    do {                                                                                                           \
        if ((n) == (cap)) {                                                                                        \
            (cap) = (cap) ? 2 * (cap) : 8;                                                                         \
            (arr) = xrealloc((arr), (cap) * sizeof *(arr));                                                        \
        }                                                                                                          \
    } while (0)

/* ------------------------------------------------------------------------------------------------------------ */
/* Freeing                                                                                                      */

static void free_line(struct line *ln) {
    free(ln->keyword);
    for (size_t i = 0; i < ln->nkv; i++) {
        free(ln->kv[i].key);
        free(ln->kv[i].val);
    }
    free(ln->kv);
    memset(ln, 0, sizeof *ln);
}

static void free_state(struct state *st) {
    if (!st) return;
    for (size_t i = 0; i < st->ndev; i++) {
        struct device *d = &st->dev[i];
        free(d->name);
        free(d->uuid);
        free(d->pci);
        free(d->serial);
        free(d->pages);
    }
    for (size_t i = 0; i < st->naction; i++) free_line(&st->action[i].line);
    for (size_t i = 0; i < st->nmig; i++) free(st->mig[i].uuid);
    free(st->mig);
    free(st->dev);
    free(st->proc);
    free(st->fault);
    free(st->race);
    free(st->action);
    free(st->event);
    free(st->driver);
    free(st->nvml);
    free(st->path);
    free(st);
}

/* ------------------------------------------------------------------------------------------------------------ */
/* Value parsing. Each returns 0 on success, -1 with a message in err.                                          */


static int fail(char *err, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static int fail(char *err, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err, MSGLEN, fmt, ap);
    va_end(ap);
    return -1;
}

/* Decimal or 0x hex, no sign, no spaces, no overflow. */
static int parse_u64_span(const char *s, size_t len, unsigned long long *out) {
    unsigned long long v = 0;
    unsigned base = 10;
    size_t i = 0;
    if (len >= 2 && s[0] == '0' && (s[1] == 'x' || s[1] == 'X')) {
        base = 16;
        i = 2;
    }
    if (i == len) return -1;
    for (; i < len; i++) {
        unsigned digit;
        char c = s[i];
        if (c >= '0' && c <= '9')
            digit = (unsigned)(c - '0');
        else if (base == 16 && c >= 'a' && c <= 'f')
            digit = (unsigned)(c - 'a' + 10);
        else if (base == 16 && c >= 'A' && c <= 'F')
            digit = (unsigned)(c - 'A' + 10);
        else
            return -1;
        if (v > (~0ULL - digit) / base) return -1;
        v = v * base + digit;
    }
    *out = v;
    return 0;
}

static int parse_u64(const char *key, const char *s, unsigned long long *out, char *err) {
    if (parse_u64_span(s, strlen(s), out) != 0)
        return fail(err, "%s=%s: expected a non-negative decimal or 0x hex number (at most 64 bits)", key, s);
    return 0;
}

static int parse_u32(const char *key, const char *s, unsigned int *out, char *err) {
    unsigned long long v;
    if (parse_u64(key, s, &v, err) != 0) return -1;
    if (v > UINT_MAX) return fail(err, "%s=%s: out of range (at most %u)", key, s, UINT_MAX);
    *out = (unsigned int)v;
    return 0;
}

static int parse_int(const char *key, const char *s, int *out, char *err) {
    unsigned long long v;
    if (parse_u64(key, s, &v, err) != 0) return -1;
    if (v > INT_MAX) return fail(err, "%s=%s: out of range (at most %d)", key, s, INT_MAX);
    *out = (int)v;
    return 0;
}

static int parse_i64(const char *key, const char *s, long long *out, char *err) {
    int neg = s[0] == '-';
    unsigned long long v;
    if (parse_u64_span(s + neg, strlen(s + neg), &v) != 0 || v > (unsigned long long)LLONG_MAX)
        return fail(err, "%s=%s: expected a signed decimal or 0x hex number", key, s);
    *out = neg ? -(long long)v : (long long)v;
    return 0;
}

static int parse_bool(const char *key, const char *s, int *out, char *err) {
    if (strcmp(s, "0") == 0 || strcmp(s, "1") == 0) {
        *out = s[0] == '1';
        return 0;
    }
    return fail(err, "%s=%s: expected 0 or 1", key, s);
}

static int parse_kind(const char *s, int *out, char *err) {
    for (int k = 0; k < K_COUNT; k++)
        if (strcmp(s, kind_names[k]) == 0) {
            *out = k;
            return 0;
        }
    return fail(err, "kind=%s: expected compute, graphics or mps", s);
}

/* `sbe:0x1000@1700000000,dbe:0x2000@1700000100`; empty means none. */
static int parse_pages(const char *s, struct page **out, size_t *nout, char *err) {
    struct page *pages = NULL;
    size_t n = 0, cap = 0;
    const char *p = s;
    while (*p) {
        const char *end = strchr(p, ',');
        size_t len = end ? (size_t)(end - p) : strlen(p);
        const char *colon = memchr(p, ':', len);
        const char *at = memchr(p, '@', len);
        struct page pg;
        if (!colon || !at || at < colon) goto bad;
        if ((size_t)(colon - p) == 3 && strncmp(p, "sbe", 3) == 0)
            pg.cause = 0;
        else if ((size_t)(colon - p) == 3 && strncmp(p, "dbe", 3) == 0)
            pg.cause = 1;
        else
            goto bad;
        if (parse_u64_span(colon + 1, (size_t)(at - colon - 1), &pg.address) != 0) goto bad;
        if (parse_u64_span(at + 1, (size_t)(p + len - at - 1), &pg.timestamp) != 0) goto bad;
        PUSH(pages, n, cap);
        pages[n++] = pg;
        p += len;
        if (*p == ',') {
            p++;
            if (!*p) goto bad;
        }
        continue;
    bad:
        free(pages);
        return fail(err, "retired=%s: expected cause:address@timestamp,... with cause sbe or dbe", s);
    }
    *out = pages;
    *nout = n;
    return 0;
}

/* Comma-separated list of unsupported field names; empty means none. */
static int parse_unsupported(const char *s, unsigned long long *out, char *err) {
    unsigned long long bits = 0;
    const char *p = s;
    while (*p) {
        const char *end = strchr(p, ',');
        size_t len = end ? (size_t)(end - p) : strlen(p);
        int bit = -1;
        for (int i = 0; i < U_CLOCK_BASE && bit < 0; i++)
            if (strlen(unsupported_names[i]) == len && strncmp(unsupported_names[i], p, len) == 0) bit = i;
        for (int set = 0; set < CLK_SETS && bit < 0; set++)
            for (int d = 0; d < 4 && bit < 0; d++) {
                char name[32];
                snprintf(name, sizeof name, "%s.%s", clock_set_names[set], clock_domain_names[d]);
                if (strlen(name) == len && strncmp(name, p, len) == 0) bit = U_CLOCK_BASE + set * 4 + d;
            }
        if (bit < 0) return fail(err, "unsupported=%s: unknown field '%.*s'", s, (int)len, p);
        bits |= 1ULL << bit;
        p += len;
        if (*p == ',') {
            p++;
            if (!*p) return fail(err, "unsupported=%s: trailing comma", s);
        }
    }
    *out = bits;
    return 0;
}

/* `domain:bus:device.function`, each part hex (as nvidia-smi prints it). */
static int parse_hex_part(const char *p, size_t len, unsigned long long max, unsigned int *out) {
    unsigned long long v = 0;
    if (len == 0 || len > 8) return -1;
    for (size_t i = 0; i < len; i++) {
        char c = p[i];
        unsigned digit;
        if (c >= '0' && c <= '9')
            digit = (unsigned)(c - '0');
        else if (c >= 'a' && c <= 'f')
            digit = (unsigned)(c - 'a' + 10);
        else if (c >= 'A' && c <= 'F')
            digit = (unsigned)(c - 'A' + 10);
        else
            return -1;
        v = v * 16 + digit;
    }
    if (v > max) return -1;
    *out = (unsigned int)v;
    return 0;
}

static int parse_pci(const char *s, unsigned int *domain, unsigned int *bus, unsigned int *device, char *err) {
    const char *c1 = strchr(s, ':');
    const char *c2 = c1 ? strchr(c1 + 1, ':') : NULL;
    const char *dot = c2 ? strchr(c2 + 1, '.') : NULL;
    unsigned int fn;
    if (!dot || strlen(s) >= NVML_DEVICE_PCI_BUS_ID_BUFFER_SIZE ||
        parse_hex_part(s, (size_t)(c1 - s), 0xffffffffULL, domain) ||
        parse_hex_part(c1 + 1, (size_t)(c2 - c1 - 1), 0xff, bus) ||
        parse_hex_part(c2 + 1, (size_t)(dot - c2 - 1), 0x1f, device) ||
        parse_hex_part(dot + 1, strlen(dot + 1), 7, &fn))
        return fail(err, "pci=%s: expected domain:bus:device.function in hex (bus <= ff, device <= 1f, function <= 7)",
                    s);
    return 0;
}

/* ------------------------------------------------------------------------------------------------------------ */
/* Tokenising                                                                                                   */

/* Split one line into keyword and key=value pairs. Returns 0 and fills ln (ln->keyword NULL for a blank line). */
static int tokenize(char *text, int lineno, struct line *ln, char *err) {
    size_t cap = 0;
    char *p = text;
    memset(ln, 0, sizeof *ln);
    ln->lineno = lineno;
    for (;;) {
        while (*p == ' ' || *p == '\t') p++;
        if (*p == '\0' || *p == '#') break;
        char *start = p;
        while (*p && *p != ' ' && *p != '\t' && *p != '=' && *p != '#' && *p != '"') p++;
        size_t klen = (size_t)(p - start);
        if (*p == '"') return fail(err, "unexpected '\"' (quotes may only start a value)");
        if (*p != '=') { /* a bare word: the keyword, or the keyword after `at call=N` */
            if (klen == 0) return fail(err, "syntax error");
            char *word = xrealloc(NULL, klen + 1);
            memcpy(word, start, klen);
            word[klen] = '\0';
            if (!ln->keyword) {
                ln->keyword = word;
            } else {
                /* stored as a pair with a NULL value; the caller decides whether a bare word is allowed here */
                PUSH(ln->kv, ln->nkv, cap);
                ln->kv[ln->nkv].key = word;
                ln->kv[ln->nkv].val = NULL;
                ln->nkv++;
            }
            continue;
        }
        if (klen == 0) return fail(err, "'=' without a key");
        if (!ln->keyword) return fail(err, "a line must start with a keyword, not '%.*s='", (int)klen, start);
        p++; /* past '=' */
        char *val;
        if (*p == '"') {
            p++;
            size_t vcap = 16, vlen = 0;
            val = xrealloc(NULL, vcap);
            for (;;) {
                char c = *p;
                if (c == '\0') {
                    free(val);
                    return fail(err, "unterminated quoted value for '%.*s'", (int)klen, start);
                }
                if (c == '"') {
                    p++;
                    break;
                }
                if (c == '\\') {
                    if (p[1] != '"' && p[1] != '\\') {
                        free(val);
                        return fail(err, "bad escape in value of '%.*s' (only \\\" and \\\\)", (int)klen, start);
                    }
                    c = p[1];
                    p++;
                }
                p++;
                if (vlen + 1 >= vcap) val = xrealloc(val, vcap *= 2);
                val[vlen++] = c;
            }
            val[vlen] = '\0';
            if (*p && *p != ' ' && *p != '\t' && *p != '#') {
                free(val);
                return fail(err, "text after the closing quote of '%.*s'", (int)klen, start);
            }
        } else {
            char *vs = p;
            while (*p && *p != ' ' && *p != '\t' && *p != '#') {
                if (*p == '"') return fail(err, "unexpected '\"' inside the value of '%.*s'", (int)klen, start);
                p++;
            }
            size_t vlen = (size_t)(p - vs);
            val = xrealloc(NULL, vlen + 1);
            memcpy(val, vs, vlen);
            val[vlen] = '\0';
        }
        char *key = xrealloc(NULL, klen + 1);
        memcpy(key, start, klen);
        key[klen] = '\0';
        PUSH(ln->kv, ln->nkv, cap);
        ln->kv[ln->nkv].key = key;
        ln->kv[ln->nkv].val = val;
        ln->nkv++;
    }
    return 0;
}

/* Reject bare words and repeated keys among kv[from..]. */
static int check_pairs(const struct line *ln, size_t from, char *err) {
    for (size_t i = from; i < ln->nkv; i++) {
        if (!ln->kv[i].val) return fail(err, "'%s': expected key=value", ln->kv[i].key);
        for (size_t j = from; j < i; j++)
            if (strcmp(ln->kv[i].key, ln->kv[j].key) == 0) return fail(err, "key '%s' given twice", ln->kv[i].key);
    }
    return 0;
}

/* ------------------------------------------------------------------------------------------------------------ */
/* Applying lines. With dry != 0 a line is only validated (timeline lines at load time).                       */

static void device_defaults(struct device *d, unsigned int index) {
    char buf[64];
    static const unsigned int clocks[CLK_SETS][4] = {{345, 345, 3201, 765}, {1980, 1980, 3201, 1545},
                                                     {1980, 1980, 3201, 1545}};
    memset(d, 0, sizeof *d);
    d->name = xstrdup("NVIDIA H200");
    snprintf(buf, sizeof buf, "GPU-00000000-0000-0000-0000-%012x", index);
    d->uuid = xstrdup(buf);
    snprintf(buf, sizeof buf, "00000000:%02X:00.0", (index + 1) & 0xff);
    d->pci = xstrdup(buf);
    d->pci_bus = (index + 1) & 0xff;
    snprintf(buf, sizeof buf, "%llu", 1650924060042ULL + index);
    d->serial = xstrdup(buf);
    d->pci_device_id = 0x233510DEu; /* 10de:2335, H200 */
    d->minor = index;
    d->total = 150754820096ULL;
    d->reserved = 644939776ULL;
    memcpy(d->clocks, clocks, sizeof clocks);
    d->reasons = 0x1; /* nvmlClocksEventReasonGpuIdle */
    d->event_types = STUB_SUPPORTED_EVENTS;
    d->unsupported = (1ULL << U_RETIRED_PAGES) | (1ULL << U_RETIRED_PENDING); /* Hopper remaps rows instead */
}

static int set_string(char **dst, const char *key, const char *val, size_t max, int dry, char *err) {
    if (strlen(val) >= max) return fail(err, "%s: longer than %zu bytes", key, max - 1);
    if (!dry) {
        free(*dst);
        *dst = xstrdup(val);
    }
    return 0;
}

/* The keys of a device line other than index, set on d (checked only when dry). */
static int device_keys(struct device *d, const struct line *ln, int dry, char *err) {
    for (size_t i = 0; i < ln->nkv; i++) {
        const char *k = ln->kv[i].key, *v = ln->kv[i].val;
        int found = 0;
        if (strcmp(k, "index") == 0) continue;
        if (strcmp(k, "name") == 0) {
            if (set_string(&d->name, k, v, NVML_DEVICE_NAME_BUFFER_SIZE, dry, err)) return -1;
        } else if (strcmp(k, "uuid") == 0) {
            if (set_string(&d->uuid, k, v, NVML_DEVICE_UUID_V2_BUFFER_SIZE, dry, err)) return -1;
        } else if (strcmp(k, "serial") == 0) {
            if (set_string(&d->serial, k, v, NVML_DEVICE_SERIAL_BUFFER_SIZE, dry, err)) return -1;
        } else if (strcmp(k, "pci") == 0) {
            unsigned int dom, bus, dv;
            if (parse_pci(v, &dom, &bus, &dv, err)) return -1;
            if (set_string(&d->pci, k, v, NVML_DEVICE_PCI_BUS_ID_BUFFER_SIZE, dry, err)) return -1;
            if (!dry) {
                d->pci_domain = dom;
                d->pci_bus = bus;
                d->pci_device = dv;
            }
        } else if (strcmp(k, "pci.device_id") == 0) {
            unsigned int x;
            if (parse_u32(k, v, &x, err)) return -1;
            d->pci_device_id = x;
        } else if (strcmp(k, "pci.subsystem_id") == 0) {
            unsigned int x;
            if (parse_u32(k, v, &x, err)) return -1;
            d->pci_subsystem_id = x;
        } else if (strcmp(k, "minor") == 0) {
            if (parse_u32(k, v, &d->minor, err)) return -1;
        } else if (strcmp(k, "total") == 0) {
            if (parse_u64(k, v, &d->total, err)) return -1;
        } else if (strcmp(k, "reserved") == 0) {
            if (parse_u64(k, v, &d->reserved, err)) return -1;
        } else if (strcmp(k, "used") == 0) {
            if (parse_u64(k, v, &d->used, err)) return -1;
        } else if (strcmp(k, "reasons") == 0) {
            if (parse_u64(k, v, &d->reasons, err)) return -1;
        } else if (strcmp(k, "retired") == 0) {
            struct page *pages = NULL;
            size_t n = 0;
            if (parse_pages(v, &pages, &n, err)) return -1;
            if (dry) {
                free(pages);
            } else {
                free(d->pages);
                d->pages = pages;
                d->npages = n;
            }
        } else if (strcmp(k, "retired_pending") == 0) {
            if (parse_bool(k, v, &d->retired_pending, err)) return -1;
        } else if (strcmp(k, "remapped") == 0) {
            unsigned int r[4];
            const char *p = v;
            for (int j = 0; j < 4; j++) {
                const char *end = strchr(p, ',');
                size_t len = end ? (size_t)(end - p) : strlen(p);
                unsigned long long x;
                if ((j < 3) != (end != NULL) || parse_u64_span(p, len, &x) || x > UINT_MAX)
                    return fail(err, "remapped=%s: expected four numbers corr,unc,pending,failure", v);
                r[j] = (unsigned int)x;
                p += len + (end ? 1 : 0);
            }
            memcpy(d->remapped, r, sizeof r);
        } else if (strcmp(k, "ecc_volatile") == 0) {
            if (parse_u64(k, v, &d->ecc_volatile, err)) return -1;
        } else if (strcmp(k, "ecc_aggregate") == 0) {
            if (parse_u64(k, v, &d->ecc_aggregate, err)) return -1;
        } else if (strcmp(k, "recovery") == 0) {
            if (parse_u32(k, v, &d->recovery, err)) return -1;
        } else if (strcmp(k, "unsupported") == 0) {
            if (parse_unsupported(v, &d->unsupported, err)) return -1;
        } else if (strcmp(k, "lost") == 0) {
            if (parse_bool(k, v, &d->lost, err)) return -1;
        } else if (strcmp(k, "mig") == 0) {
            if (parse_bool(k, v, &d->mig, err)) return -1;
        } else if (strcmp(k, "event_types") == 0) {
            if (parse_u64(k, v, &d->event_types, err)) return -1;
        } else {
            for (int set = 0; set < CLK_SETS && !found; set++)
                for (int dm = 0; dm < 4 && !found; dm++) {
                    char name[32];
                    snprintf(name, sizeof name, "%s.%s", clock_set_names[set], clock_domain_names[dm]);
                    if (strcmp(k, name) == 0) {
                        found = 1;
                        if (parse_u32(k, v, &d->clocks[set][dm], err)) return -1;
                    }
                }
            if (!found) return fail(err, "device: unknown key '%s'", k);
        }
    }
    return 0;
}

static int apply_device(struct state *st, const struct line *ln, int dry, int in_timeline, char *err) {
    struct device scratch, *d;
    unsigned int index = 0;
    int have_index = 0;
    if (check_pairs(ln, 0, err)) return -1;
    for (size_t i = 0; i < ln->nkv; i++)
        if (strcmp(ln->kv[i].key, "index") == 0) {
            if (parse_u32("index", ln->kv[i].val, &index, err)) return -1;
            have_index = 1;
        }
    if (!have_index) {
        /* A misspelt index (idx=0) is an unknown key: name it, rather than only that index= is missing. */
        memset(&scratch, 0, sizeof scratch);
        if (device_keys(&scratch, ln, 1, err)) return -1;
        return fail(err, "device: index= is required");
    }
    if (in_timeline && index >= st->ndev)
        return fail(err, "device index=%u: the timeline can change declared devices only (%zu declared)", index,
                    st->ndev);
    if (index > st->ndev)
        return fail(err, "device index=%u: devices must be declared in order (next is %zu)", index, st->ndev);
    if (dry) {
        memset(&scratch, 0, sizeof scratch);
        d = &scratch;
    } else {
        if (index == st->ndev) {
            PUSH(st->dev, st->ndev, st->capdev);
            device_defaults(&st->dev[st->ndev], index);
            st->ndev++;
        }
        d = &st->dev[index];
    }
    return device_keys(d, ln, dry, err);
}

static int find_proc(const struct state *st, unsigned int device, int kind, unsigned int pid) {
    for (size_t i = 0; i < st->nproc; i++)
        if (st->proc[i].device == device && st->proc[i].kind == kind && st->proc[i].pid == pid) return (int)i;
    return -1;
}

static int apply_process(struct state *st, const struct line *ln, int dry, char *err) {
    struct proc p;
    int have_dev = 0, have_kind = 0, have_pid = 0, remove = 0, have_used = 0;
    unsigned long long used = 0;
    struct {
        int holds, gi, ci, bound, release_ms, list_ms, zombie_holds;
    } has = {0};
    memset(&p, 0, sizeof p);
    if (check_pairs(ln, 0, err)) return -1;
    for (size_t i = 0; i < ln->nkv; i++) {
        const char *k = ln->kv[i].key, *v = ln->kv[i].val;
        if (strcmp(k, "device") == 0) {
            if (parse_u32(k, v, &p.device, err)) return -1;
            have_dev = 1;
        } else if (strcmp(k, "kind") == 0) {
            if (parse_kind(v, &p.kind, err)) return -1;
            have_kind = 1;
        } else if (strcmp(k, "pid") == 0) {
            if (parse_u32(k, v, &p.pid, err)) return -1;
            have_pid = 1;
        } else if (strcmp(k, "used") == 0) {
            have_used = 1;
            if (strcmp(v, "na") == 0)
                used = NOT_AVAILABLE;
            else if (parse_u64(k, v, &used, err))
                return -1;
        } else if (strcmp(k, "holds") == 0) {
            if (parse_u64(k, v, &p.holds, err)) return -1;
            has.holds = 1;
        } else if (strcmp(k, "gi") == 0) {
            if (parse_u32(k, v, &p.gi, err)) return -1;
            has.gi = 1;
        } else if (strcmp(k, "ci") == 0) {
            if (parse_u32(k, v, &p.ci, err)) return -1;
            has.ci = 1;
        } else if (strcmp(k, "bound") == 0) {
            if (parse_bool(k, v, &p.bound, err)) return -1;
            has.bound = 1;
        } else if (strcmp(k, "zombie_holds") == 0) {
            if (parse_bool(k, v, &p.zombie_holds, err)) return -1;
            has.zombie_holds = 1;
        } else if (strcmp(k, "release_ms") == 0) {
            if (parse_u64(k, v, &p.release_ms, err)) return -1;
            has.release_ms = 1;
        } else if (strcmp(k, "list_ms") == 0) {
            if (parse_u64(k, v, &p.list_ms, err)) return -1;
            has.list_ms = 1;
        } else if (strcmp(k, "remove") == 0) {
            if (parse_bool(k, v, &remove, err)) return -1;
        } else {
            return fail(err, "process: unknown key '%s'", k);
        }
    }
    if (!have_dev || !have_kind || !have_pid) return fail(err, "process: device=, kind= and pid= are required");
    if (p.device >= st->ndev) return fail(err, "process device=%u: no such device (%zu declared)", p.device, st->ndev);
    if (remove && ln->nkv != 4) return fail(err, "process remove=1 takes only device, kind and pid");
    if (dry) return 0;
    int at = find_proc(st, p.device, p.kind, p.pid);
    if (remove) {
        if (at >= 0) {
            memmove(&st->proc[at], &st->proc[at + 1], (st->nproc - (size_t)at - 1) * sizeof *st->proc);
            st->nproc--;
        }
        return 0;
    }
    struct proc *e;
    if (at >= 0) {
        e = &st->proc[at]; /* an existing entry: change only the keys named */
    } else {
        PUSH(st->proc, st->nproc, st->capproc);
        e = &st->proc[st->nproc++];
        memset(e, 0, sizeof *e);
        e->device = p.device;
        e->kind = p.kind;
        e->pid = p.pid;
        e->gi = e->ci = NOT_MIG;
    }
    if (have_used) e->used = used;
    if (has.holds) {
        e->holds = p.holds;
        e->holds_set = 1;
    }
    if (has.gi) e->gi = p.gi;
    if (has.ci) e->ci = p.ci;
    if (has.bound) e->bound = p.bound;
    if (has.zombie_holds) e->zombie_holds = p.zombie_holds;
    if (has.release_ms) e->release_ms = p.release_ms;
    if (has.list_ms) e->list_ms = p.list_ms;
    return 0;
}

static int apply_fault(struct state *st, const struct line *ln, int dry, char *err) {
    struct fault f;
    int have_fn = 0;
    memset(&f, 0, sizeof f);
    if (check_pairs(ln, 0, err)) return -1;
    for (size_t i = 0; i < ln->nkv; i++) {
        const char *k = ln->kv[i].key, *v = ln->kv[i].val;
        if (strcmp(k, "fn") == 0) {
            f.fn = fn_lookup(v);
            if (f.fn < 0) return fail(err, "fault fn=%s: not a function this stub exports", v);
            if (fn_flags[f.fn] & F_NOFAULT) return fail(err, "fault fn=%s: this function cannot fail", v);
            have_fn = 1;
        } else if (strcmp(k, "code") == 0) {
            if (parse_int(k, v, &f.code, err)) return -1;
            if (f.code == 0) return fail(err, "fault code=0: that is success; leave code= out to answer normally");
            f.has_code = 1;
        } else if (strcmp(k, "device") == 0) {
            if (parse_u32(k, v, &f.device, err)) return -1;
            f.has_device = 1;
        } else if (strcmp(k, "after") == 0) {
            if (parse_u64(k, v, &f.after, err)) return -1;
        } else if (strcmp(k, "count") == 0) {
            if (parse_u64(k, v, &f.count, err)) return -1;
        } else if (strcmp(k, "delay_ms") == 0) {
            if (parse_u64(k, v, &f.delay_ms, err)) return -1;
        } else {
            return fail(err, "fault: unknown key '%s'", k);
        }
    }
    if (!have_fn) return fail(err, "fault: fn= is required");
    if (f.has_device && !(fn_flags[f.fn] & (F_DEVICE | F_INDEX)))
        return fail(err, "fault fn=%s: device= given but the function takes no device", fn_names[f.fn]);
    if (dry) return 0;
    PUSH(st->fault, st->nfault, st->capfault);
    st->fault[st->nfault++] = f;
    return 0;
}

static int apply_race(struct state *st, const struct line *ln, int dry, char *err) {
    struct race r;
    int have_dev = 0, have_kind = 0, have_grow = 0;
    memset(&r, 0, sizeof r);
    r.count = 1;
    if (check_pairs(ln, 0, err)) return -1;
    for (size_t i = 0; i < ln->nkv; i++) {
        const char *k = ln->kv[i].key, *v = ln->kv[i].val;
        if (strcmp(k, "device") == 0) {
            if (parse_u32(k, v, &r.device, err)) return -1;
            have_dev = 1;
        } else if (strcmp(k, "kind") == 0) {
            if (parse_kind(v, &r.kind, err)) return -1;
            have_kind = 1;
        } else if (strcmp(k, "grow") == 0) {
            if (parse_i64(k, v, &r.grow, err)) return -1;
            have_grow = 1;
        } else if (strcmp(k, "count") == 0) {
            if (parse_u64(k, v, &r.count, err)) return -1;
        } else {
            return fail(err, "race: unknown key '%s'", k);
        }
    }
    if (!have_dev || !have_kind || !have_grow) return fail(err, "race: device=, kind= and grow= are required");
    if (r.device >= st->ndev) return fail(err, "race device=%u: no such device (%zu declared)", r.device, st->ndev);
    if (dry) return 0;
    PUSH(st->race, st->nrace, st->caprace);
    st->race[st->nrace++] = r;
    return 0;
}

static int apply_quirk(struct state *st, const struct line *ln, int dry, char *err) {
    if (check_pairs(ln, 0, err)) return -1;
    if (ln->nkv == 0) return fail(err, "quirk: expected proc_struct=535.43 or proc_struct=none");
    for (size_t i = 0; i < ln->nkv; i++) {
        const char *k = ln->kv[i].key, *v = ln->kv[i].val;
        int on;
        if (strcmp(k, "proc_struct") != 0) return fail(err, "quirk: unknown key '%s'", k);
        if (strcmp(v, "535.43") == 0)
            on = 1;
        else if (strcmp(v, "none") == 0)
            on = 0;
        else
            return fail(err, "quirk proc_struct=%s: expected 535.43 or none", v);
        if (!dry) st->quirk_535_43 = on;
    }
    return 0;
}

static int apply_system(struct state *st, const struct line *ln, char *err) {
    if (check_pairs(ln, 0, err)) return -1;
    for (size_t i = 0; i < ln->nkv; i++) {
        const char *k = ln->kv[i].key, *v = ln->kv[i].val;
        if (strcmp(k, "driver") == 0) {
            if (set_string(&st->driver, k, v, NVML_SYSTEM_DRIVER_VERSION_BUFFER_SIZE, 0, err)) return -1;
        } else if (strcmp(k, "nvml") == 0) {
            if (set_string(&st->nvml, k, v, NVML_SYSTEM_NVML_VERSION_BUFFER_SIZE, 0, err)) return -1;
        } else if (strcmp(k, "cuda") == 0) {
            if (parse_int(k, v, &st->cuda, err)) return -1;
        } else {
            return fail(err, "system: unknown key '%s'", k);
        }
    }
    return 0;
}

static int find_mig(const struct state *st, unsigned int device, unsigned int index) {
    for (size_t i = 0; i < st->nmig; i++)
        if (st->mig[i].device == device && st->mig[i].index == index) return (int)i;
    return -1;
}

static int apply_mig(struct state *st, const struct line *ln, int dry, char *err) {
    struct mig m;
    int have_dev = 0, have_index = 0, remove = 0, has_gi = 0;
    char *uuid = NULL;
    memset(&m, 0, sizeof m);
    if (check_pairs(ln, 0, err)) return -1;
    for (size_t i = 0; i < ln->nkv; i++) {
        const char *k = ln->kv[i].key, *v = ln->kv[i].val;
        if (strcmp(k, "device") == 0) {
            if (parse_u32(k, v, &m.device, err)) return -1;
            have_dev = 1;
        } else if (strcmp(k, "index") == 0) {
            if (parse_u32(k, v, &m.index, err)) return -1;
            have_index = 1;
        } else if (strcmp(k, "gi") == 0) {
            if (parse_u32(k, v, &m.gi, err)) return -1;
            has_gi = 1;
        } else if (strcmp(k, "ci") == 0) {
            if (parse_u32(k, v, &m.ci, err)) return -1;
        } else if (strcmp(k, "total") == 0) {
            if (parse_u64(k, v, &m.total, err)) return -1;
        } else if (strcmp(k, "used") == 0) {
            if (parse_u64(k, v, &m.used, err)) return -1;
        } else if (strcmp(k, "uuid") == 0) {
            if (strlen(v) >= NVML_DEVICE_UUID_V2_BUFFER_SIZE) return fail(err, "mig uuid: too long");
            uuid = (char *)v;
        } else if (strcmp(k, "remove") == 0) {
            if (parse_bool(k, v, &remove, err)) return -1;
        } else {
            return fail(err, "mig: unknown key '%s'", k);
        }
    }
    if (!have_dev || !have_index) return fail(err, "mig: device= and index= are required");
    if (m.index >= MAX_MIG) return fail(err, "mig index=%u: at most %d MIG devices a GPU", m.index, MAX_MIG);
    if (m.device >= st->ndev) return fail(err, "mig device=%u: no such device (%zu declared)", m.device, st->ndev);
    if (m.used > m.total) return fail(err, "mig: used=%llu exceeds total=%llu", m.used, m.total);
    if (dry) return 0;
    int at = find_mig(st, m.device, m.index);
    if (remove) {
        if (at >= 0) {
            free(st->mig[at].uuid);
            st->mig[at] = st->mig[--st->nmig];
        }
        return 0;
    }
    if (!has_gi) m.gi = m.index + 1;
    char buf[64];
    if (!uuid) {
        snprintf(buf, sizeof buf, "MIG-00000000-0000-0000-%04x-%012x", m.device, m.index);
        uuid = buf;
    }
    m.uuid = xstrdup(uuid);
    if (at >= 0) {
        free(st->mig[at].uuid);
        st->mig[at] = m;
    } else {
        PUSH(st->mig, st->nmig, st->capmig);
        st->mig[st->nmig++] = m;
    }
    return 0;
}

/* The event types the stub knows, by scenario name (nvmlEventType* bits of nvml.h; the newer ones as numbers, which
 * older headers lack). Any other type is given as a number (`type=0x10008`): its bits are delivered as they are. */
static const struct {
    const char *name;
    unsigned long long bit;
} event_types[] = {
    {"sbe", nvmlEventTypeSingleBitEccError},
    {"dbe", nvmlEventTypeDoubleBitEccError},
    {"pstate", nvmlEventTypePState},
    {"xid", nvmlEventTypeXidCriticalError},
    {"clock", nvmlEventTypeClock},
    {"power", nvmlEventTypePowerSourceChange},
    {"mig", 0x100ULL},                     /* nvmlEventMigConfigChange */
    {"sbe_storm", 0x200ULL},               /* single-bit ECC error storm */
    {"dram_retirement", 0x400ULL},         /* DRAM retirement event */
    {"dram_retirement_failure", 0x800ULL}, /* DRAM retirement failure */
    {"nonfatal_poison", 0x1000ULL},        /* non-fatal poison error */
    {"fatal_poison", 0x2000ULL},           /* fatal poison error */
    {"gpu_unavailable", 0x4000ULL},        /* GPU unavailable */
    {"recovery_action", 0x8000ULL},        /* GPU recovery action changed */
};

static int apply_event(struct state *st, const struct line *ln, int dry, int in_timeline, char *err) {
    struct event e;
    int have_dev = 0, have_type = 0;
    memset(&e, 0, sizeof e);
    e.gi = e.ci = NOT_MIG;
    if (!in_timeline) return fail(err, "event: only in the timeline (at call=N event ... / at ms=T event ...)");
    if (check_pairs(ln, 0, err)) return -1;
    for (size_t i = 0; i < ln->nkv; i++) {
        const char *k = ln->kv[i].key, *v = ln->kv[i].val;
        if (strcmp(k, "device") == 0) {
            if (parse_u32(k, v, &e.device, err)) return -1;
            have_dev = 1;
        } else if (strcmp(k, "type") == 0) {
            int named = 0;
            for (size_t t = 0; t < sizeof event_types / sizeof event_types[0]; t++)
                if (strcmp(v, event_types[t].name) == 0) {
                    e.type = event_types[t].bit;
                    named = 1;
                }
            if (!named && parse_u64_span(v, strlen(v), &e.type) != 0)
                return fail(err,
                            "event type=%s: expected xid, sbe, dbe, pstate, clock, power, mig, sbe_storm, "
                            "dram_retirement, dram_retirement_failure, nonfatal_poison, fatal_poison, "
                            "gpu_unavailable, recovery_action or the type bits as a number",
                            v);
            have_type = 1;
        } else if (strcmp(k, "data") == 0) {
            if (parse_u64(k, v, &e.data, err)) return -1;
        } else if (strcmp(k, "gi") == 0) {
            if (parse_u32(k, v, &e.gi, err)) return -1;
        } else if (strcmp(k, "ci") == 0) {
            if (parse_u32(k, v, &e.ci, err)) return -1;
        } else {
            return fail(err, "event: unknown key '%s'", k);
        }
    }
    if (!have_dev || !have_type) return fail(err, "event: device= and type= are required");
    if (e.device >= st->ndev) return fail(err, "event device=%u: no such device (%zu declared)", e.device, st->ndev);
    if (dry) return 0;
    PUSH(st->event, st->nevent, st->capevent);
    st->event[st->nevent++] = e;
    pthread_cond_broadcast(&g_event_cond); /* called with g_mu held (a timeline line applied by some call) */
    return 0;
}

/* A line that may also appear after `at`. */
static int apply_changing_line(struct state *st, const struct line *ln, int dry, int in_timeline, char *err) {
    const char *kw = ln->keyword;
    if (strcmp(kw, "device") == 0) return apply_device(st, ln, dry, in_timeline, err);
    if (strcmp(kw, "process") == 0) return apply_process(st, ln, dry, err);
    if (strcmp(kw, "fault") == 0) return apply_fault(st, ln, dry, err);
    if (strcmp(kw, "race") == 0) return apply_race(st, ln, dry, err);
    if (strcmp(kw, "quirk") == 0) return apply_quirk(st, ln, dry, err);
    if (strcmp(kw, "mig") == 0) return apply_mig(st, ln, dry, err);
    if (strcmp(kw, "event") == 0) return apply_event(st, ln, dry, in_timeline, err);
    if (in_timeline)
        return fail(err, "at: '%s' cannot follow at (device, process, mig, event, fault, race or quirk may)", kw);
    return fail(err, "unknown keyword '%s'", kw);
}

/* `at call=N LINE` / `at ms=T LINE`: move LINE out of ln into a new action. */
static int parse_at(struct state *st, struct line *ln, char *err) {
    struct action a;
    memset(&a, 0, sizeof a);
    if (ln->nkv < 2 || !ln->kv[0].val || ln->kv[1].val)
        return fail(err, "at: expected 'at call=N LINE' or 'at ms=T LINE'");
    if (strcmp(ln->kv[0].key, "call") == 0) {
        if (parse_u64("call", ln->kv[0].val, &a.when, err)) return -1;
        if (a.when == 0) return fail(err, "at call=0: calls are counted from 1");
    } else if (strcmp(ln->kv[0].key, "ms") == 0) {
        if (parse_u64("ms", ln->kv[0].val, &a.when, err)) return -1;
        a.is_ms = 1;
    } else {
        return fail(err, "at: expected call= or ms=, not '%s='", ln->kv[0].key);
    }
    if (strcmp(ln->kv[1].key, "at") == 0) return fail(err, "at: 'at' cannot follow at");
    /* the sub-line: keyword kv[1].key, pairs kv[2..] */
    a.line.lineno = ln->lineno;
    a.line.keyword = ln->kv[1].key;
    a.line.nkv = ln->nkv - 2;
    a.line.kv = xrealloc(NULL, (a.line.nkv ? a.line.nkv : 1) * sizeof *a.line.kv);
    memcpy(a.line.kv, ln->kv + 2, a.line.nkv * sizeof *a.line.kv);
    free(ln->kv[0].key);
    free(ln->kv[0].val);
    free(ln->kv);
    ln->kv = NULL;
    ln->nkv = 0;
    PUSH(st->action, st->naction, st->capaction);
    st->action[st->naction++] = a;
    st->pending++;
    return 0;
}

/* Read and parse a scenario file. NULL on error, with the message in err (which names file and line). */
static struct state *load_scenario(const char *path, char *err) {
    char msg[MSGLEN];
    FILE *f = fopen(path, "rb");
    if (!f) {
        snprintf(err, ERRLEN, "scenario %s: cannot open: %s", path, strerror(errno));
        return NULL;
    }
    char *buf = NULL;
    size_t len = 0, cap = 0, got;
    do {
        if (len + 4096 > cap) buf = xrealloc(buf, cap = 2 * cap + 8192);
        got = fread(buf + len, 1, cap - len - 1, f);
        len += got;
    } while (got > 0);
    int read_error = ferror(f);
    fclose(f);
    if (read_error) {
        free(buf);
        snprintf(err, ERRLEN, "scenario %s: read error", path);
        return NULL;
    }
    buf[len] = '\0';

    struct state *st = xrealloc(NULL, sizeof *st);
    memset(st, 0, sizeof *st);
    st->path = xstrdup(path);
    st->driver = xstrdup("580.159.04");
    st->nvml = xstrdup("13.580.159.04");
    st->cuda = 13000;
    st->next_race_pid = RACE_PID_BASE;

    int lineno = 0, have_header = 0;
    size_t pos = 0;
    while (pos < len) {
        char *p = buf + pos;
        char *nl = memchr(p, '\n', len - pos);
        size_t l = nl ? (size_t)(nl - p) : len - pos;
        pos += l + (nl ? 1 : 0);
        lineno++;
        if (memchr(p, '\0', l)) {
            fail(msg, "NUL byte in the line");
            goto error;
        }
        p[l] = '\0';
        if (l && p[l - 1] == '\r') p[l - 1] = '\0';
        struct line ln;
        if (tokenize(p, lineno, &ln, msg)) {
            free_line(&ln);
            goto error;
        }
        if (!ln.keyword) {
            free_line(&ln);
            continue;
        }
        int rc = 0;
        if (!have_header) {
            if (strcmp(ln.keyword, "nvmlcheck-stub-scenario") != 0 || ln.nkv != 1 || ln.kv[0].val) {
                rc = fail(msg, "the first line must be 'nvmlcheck-stub-scenario 1'");
            } else if (strcmp(ln.kv[0].key, "1") != 0) {
                rc = fail(msg, "scenario format version %s is not supported (this stub reads version 1)",
                          ln.kv[0].key);
            }
            have_header = 1;
        } else if (strcmp(ln.keyword, "system") == 0) {
            rc = apply_system(st, &ln, msg);
        } else if (strcmp(ln.keyword, "at") == 0) {
            rc = parse_at(st, &ln, msg);
        } else if (strcmp(ln.keyword, "nvmlcheck-stub-scenario") == 0) {
            rc = fail(msg, "header line repeated");
        } else {
            rc = apply_changing_line(st, &ln, 0, 0, msg);
        }
        free_line(&ln);
        if (rc) goto error;
    }
    free(buf);
    buf = NULL;
    if (!have_header) {
        snprintf(err, ERRLEN, "scenario %s line %d: empty: the first line must be 'nvmlcheck-stub-scenario 1'", path,
                 lineno);
        free_state(st);
        return NULL;
    }
    /* timeline lines are checked now, against the complete set of declared devices */
    for (size_t i = 0; i < st->naction; i++) {
        struct line *ln = &st->action[i].line;
        if (apply_changing_line(st, ln, 1, 1, msg)) {
            lineno = ln->lineno;
            goto error;
        }
    }
    return st;
error:
    free(buf);
    snprintf(err, ERRLEN, "scenario %s line %d: %s", path, lineno, msg);
    free_state(st);
    return NULL;
}

static void set_last_error(const char *msg) {
    snprintf(g_last_error, sizeof g_last_error, "%s", msg);
    if (msg[0]) fprintf(stderr, "stub libnvidia-ml: %s\n", msg);
}

/* ------------------------------------------------------------------------------------------------------------ */
/* Per-call machinery                                                                                           */

static void log_call(int fn) {
    const char *path = getenv("NVMLCHECK_STUB_LOG");
    if (!path || !*path) return;
    char line[160];
    int n = snprintf(line, sizeof line, "%s %ld %ld\n", fn_names[fn], (long)getpid(), (long)syscall(SYS_gettid));
    int fd = open(path, O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0644);
    if (fd < 0) return;
    ssize_t w = write(fd, line, (size_t)n); /* one write with O_APPEND: lines of concurrent writers do not mix */
    (void)w;
    close(fd);
}

static int initialised(void) { return g_refcount > 0 && g_state && g_init_pid == getpid(); }

static void apply_due_actions(struct state *st) {
    if (!st->pending) return;
    uint64_t elapsed_ms = (now_ns() - st->loaded_ns) / 1000000ULL;
    char msg[MSGLEN];
    for (size_t i = 0; i < st->naction; i++) {
        struct action *a = &st->action[i];
        if (a->applied || (a->is_ms ? elapsed_ms < a->when : st->calls < a->when)) continue;
        a->applied = 1;
        st->pending--;
        if (apply_changing_line(st, &a->line, 0, 1, msg)) { /* validated at load, so not expected */
            char full[ERRLEN];
            snprintf(full, sizeof full, "scenario %s line %d: %s", st->path, a->line.lineno, msg);
            set_last_error(full);
        }
    }
}

/* Evaluate the faults of st for this call. Returns the delay to sleep and sets *code (-1: answer normally; a fault
 * code is never 0, so a body never runs after a fault fired). */
static unsigned long long eval_faults(struct state *st, int fn, long long device, int *code) {
    unsigned long long delay = 0;
    *code = -1;
    for (size_t i = 0; i < st->nfault; i++) {
        struct fault *f = &st->fault[i];
        if (f->fn != fn || (f->has_device && (long long)f->device != device)) continue;
        unsigned long long k = f->seen++;
        if (k < f->after || (f->count && k - f->after >= f->count)) continue;
        delay = sat_add(delay, f->delay_ms);
        if (f->has_code && *code < 0) *code = f->code;
    }
    return delay;
}

/* Sleep outside the lock, so a "hung" call neither blocks other threads nor fork() (pthread_atfork takes the lock). */
static void unlocked_sleep(unsigned long long ms) {
    pthread_mutex_unlock(&g_mu);
    sleep_ms(ms);
    pthread_mutex_lock(&g_mu);
}

#define HANDLE_BASE ((uintptr_t)0x5700000000ULL)
#define HANDLE_STRIDE 16

static nvmlDevice_t make_handle(unsigned int index) {
    return (nvmlDevice_t)(HANDLE_BASE + (uintptr_t)index * HANDLE_STRIDE);
}

/* MIG device handles live in their own range: (device * MAX_MIG + index) slots above MIG_HANDLE_BASE. */
#define MIG_HANDLE_BASE ((uintptr_t)0x5800000000ULL)

static nvmlDevice_t make_mig_handle(unsigned int device, unsigned int index) {
    return (nvmlDevice_t)(MIG_HANDLE_BASE + ((uintptr_t)device * MAX_MIG + index) * HANDLE_STRIDE);
}

/* 1 when h is a MIG handle, with its parent's index and its MIG slot. */
static int mig_handle(nvmlDevice_t h, unsigned int *device, unsigned int *index) {
    uintptr_t v = (uintptr_t)h;
    if (v < MIG_HANDLE_BASE || (v - MIG_HANDLE_BASE) % HANDLE_STRIDE) return 0;
    uintptr_t slot = (v - MIG_HANDLE_BASE) / HANDLE_STRIDE;
    if (slot / MAX_MIG >= UINT_MAX) return 0;
    *device = (unsigned int)(slot / MAX_MIG);
    *index = (unsigned int)(slot % MAX_MIG);
    return 1;
}

/* The device index of a GPU handle, or of a MIG handle's parent (UINT_MAX for anything else). */
static unsigned int any_index(nvmlDevice_t h);

static unsigned int handle_index(nvmlDevice_t h) {
    uintptr_t v = (uintptr_t)h;
    if (v < HANDLE_BASE || (v - HANDLE_BASE) % HANDLE_STRIDE) return UINT_MAX;
    uintptr_t i = (v - HANDLE_BASE) / HANDLE_STRIDE;
    return i < UINT_MAX ? (unsigned int)i : UINT_MAX;
}

/* Shared prologue of every exported function but nvmlInit*. Takes the lock (released by `end`). Returns
 * NVML_SUCCESS when the body should answer, with *dev the device for F_DEVICE/F_INDEX functions. */
static nvmlReturn_t begin(int fn, unsigned int device_index, struct device **dev) {
    pthread_mutex_lock(&g_mu);
    g_counts[fn]++;
    g_total_calls++;
    log_call(fn);
    if (!initialised()) return NVML_ERROR_UNINITIALIZED;
    struct state *st = g_state;
    if (!(fn_flags[fn] & F_UNCOUNTED)) st->calls++;
    apply_due_actions(st);
    int code;
    unsigned long long delay = eval_faults(st, fn, device_index == UINT_MAX ? -1 : (long long)device_index, &code);
    if (delay) {
        unsigned long long gen = g_generation;
        unlocked_sleep(delay);
        if (gen != g_generation || !initialised()) return NVML_ERROR_UNINITIALIZED; /* shut down meanwhile */
        st = g_state;
    }
    if (code >= 0) return (nvmlReturn_t)code;
    if (fn_flags[fn] & (F_DEVICE | F_INDEX)) {
        if (device_index >= st->ndev) return NVML_ERROR_INVALID_ARGUMENT;
        *dev = &st->dev[device_index];
        if ((*dev)->lost) return NVML_ERROR_GPU_IS_LOST;
    }
    return NVML_SUCCESS;
}

static nvmlReturn_t end(nvmlReturn_t r) {
    pthread_mutex_unlock(&g_mu);
    return r;
}

static int unsupported(const struct device *d, int bit) { return (d->unsupported >> bit) & 1; }

static unsigned int any_index(nvmlDevice_t h) {
    unsigned int device, index;
    return mig_handle(h, &device, &index) ? device : handle_index(h);
}

/* The MIG device a MIG handle names while its parent is in MIG mode (NULL otherwise). Lock held. */
static struct mig *mig_of(nvmlDevice_t h) {
    unsigned int device, index;
    if (!mig_handle(h, &device, &index) || device >= g_state->ndev || !g_state->dev[device].mig) return NULL;
    int at = find_mig(g_state, device, index);
    return at < 0 ? NULL : &g_state->mig[at];
}

static void refresh_bound(struct state *st, unsigned int device, uint64_t now);
static unsigned long long proc_held(const struct proc *p, uint64_t now);

/* A MIG device's used bytes: its own idle use plus what the processes of its instance hold. */
static unsigned long long mig_used(struct state *st, const struct mig *m) {
    uint64_t now = now_ns();
    unsigned long long held = 0;
    refresh_bound(st, m->device, now);
    for (size_t i = 0; i < st->nproc; i++) {
        const struct proc *p = &st->proc[i];
        if (p->device == m->device && p->gi == m->gi && (p->ci == NOT_MIG || p->ci == m->ci))
            held = sat_add(held, proc_held(p, now));
    }
    /* Not clamped to total: as on a whole GPU (device_memory), a scenario whose processes hold more than the
       instance has reads as that (a corrupt reading), the same through the fake nvidia-smi. */
    return sat_add(m->used, held);
}

static nvmlReturn_t put_string(char *buf, unsigned int length, const char *s) {
    if (!buf) return NVML_ERROR_INVALID_ARGUMENT;
    size_t n = strlen(s) + 1;
    if (n > length) return NVML_ERROR_INSUFFICIENT_SIZE;
    memcpy(buf, s, n);
    return NVML_SUCCESS;
}

/* ------------------------------------------------------------------------------------------------------------ */
/* Init and shutdown                                                                                            */

static nvmlReturn_t do_init(int fn) {
    char err[ERRLEN];
    pthread_mutex_lock(&g_mu);
    g_counts[fn]++;
    g_total_calls++;
    log_call(fn);
    for (;;) {
        int code;
        unsigned long long delay;
        if (initialised()) { /* nested: just count */
            unsigned long long gen = g_generation;
            g_state->calls++;
            apply_due_actions(g_state);
            delay = eval_faults(g_state, fn, -1, &code);
            if (delay) {
                unlocked_sleep(delay);
                if (gen != g_generation) continue; /* the scenario changed while we slept: start over */
            }
            if (code >= 0) return end((nvmlReturn_t)code);
            g_refcount++;
            g_init_total++;
            return end(NVML_SUCCESS);
        }
        const char *path = getenv("NVMLCHECK_STUB_SCENARIO");
        if (!path || !*path) {
            set_last_error("");
            return end(NVML_ERROR_DRIVER_NOT_LOADED);
        }
        struct state *st = load_scenario(path, err);
        if (!st) {
            set_last_error(err);
            return end(NVML_ERROR_UNKNOWN);
        }
        set_last_error("");
        delay = eval_faults(st, fn, -1, &code);
        if (delay) {
            unlocked_sleep(delay);
            if (initialised()) { /* another thread initialised while we slept: join it */
                free_state(st);
                if (code >= 0) return end((nvmlReturn_t)code);
                g_refcount++;
                g_init_total++;
                return end(NVML_SUCCESS);
            }
        }
        if (code >= 0) {
            free_state(st);
            return end((nvmlReturn_t)code);
        }
        free_state(g_state); /* a forked child's copy of its parent's scenario, if any */
        g_state = st;
        st->loaded_ns = now_ns();
        g_refcount = 1;
        g_init_pid = getpid();
        g_generation++;
        g_init_total++;
        return end(NVML_SUCCESS);
    }
}

#ifndef STUB_NO_INIT_V2
nvmlReturn_t nvmlInit_v2(void) { return do_init(FN_nvmlInit_v2); }
#endif
nvmlReturn_t nvmlInit(void) { return do_init(FN_nvmlInit); }
nvmlReturn_t nvmlInitWithFlags(unsigned int flags) {
    (void)flags;
    return do_init(FN_nvmlInitWithFlags);
}

nvmlReturn_t nvmlShutdown(void) {
    nvmlReturn_t r = begin(FN_nvmlShutdown, UINT_MAX, NULL);
    if (r != NVML_SUCCESS) return end(r);
    if (--g_refcount == 0) {
        free_state(g_state);
        g_state = NULL;
        g_generation++;
        pthread_cond_broadcast(&g_event_cond); /* a waiting nvmlEventSetWait_v2 answers UNINITIALIZED now */
    }
    g_shutdown_total++;
    return end(NVML_SUCCESS);
}

const char *nvmlErrorString(nvmlReturn_t result) {
    pthread_mutex_lock(&g_mu);
    g_counts[FN_nvmlErrorString]++;
    g_total_calls++;
    log_call(FN_nvmlErrorString);
    if (initialised()) {
        g_state->calls++;
        apply_due_actions(g_state);
    }
    pthread_mutex_unlock(&g_mu);
    switch ((int)result) {
    case 0: return "Success";
    case 1: return "Uninitialized";
    case 2: return "Invalid Argument";
    case 3: return "Not Supported";
    case 4: return "Insufficient Permissions";
    case 5: return "Already Initialized";
    case 6: return "Not Found";
    case 7: return "Insufficient Size";
    case 8: return "Insufficient External Power";
    case 9: return "Driver Not Loaded";
    case 10: return "Timeout";
    case 11: return "Interrupt request issue";
    case 12: return "NVML Shared Library Not Found";
    case 13: return "Function Not Found";
    case 14: return "Corrupted infoROM";
    case 15: return "GPU is lost";
    case 16: return "GPU requires reset";
    case 17: return "GPU access blocked by the operating system";
    case 18: return "Driver/library version mismatch";
    case 19: return "In use by another client";
    case 20: return "Insufficient Memory";
    case 21: return "No data";
    case 25: return "Argument version mismatch";
    case 26: return "Deprecated";
    case 27: return "Not Ready";
    case 28: return "GPU not found";
    case 29: return "Invalid state";
    default: return "Unknown Error";
    }
}

/* ------------------------------------------------------------------------------------------------------------ */
/* System and enumeration                                                                                       */

nvmlReturn_t nvmlSystemGetDriverVersion(char *version, unsigned int length) {
    nvmlReturn_t r = begin(FN_nvmlSystemGetDriverVersion, UINT_MAX, NULL);
    return end(r ? r : put_string(version, length, g_state->driver));
}

nvmlReturn_t nvmlSystemGetNVMLVersion(char *version, unsigned int length) {
    nvmlReturn_t r = begin(FN_nvmlSystemGetNVMLVersion, UINT_MAX, NULL);
    return end(r ? r : put_string(version, length, g_state->nvml));
}

static nvmlReturn_t cuda_version(int fn, int *out) {
    nvmlReturn_t r = begin(fn, UINT_MAX, NULL);
    if (r) return end(r);
    if (!out) return end(NVML_ERROR_INVALID_ARGUMENT);
    *out = g_state->cuda;
    return end(NVML_SUCCESS);
}
nvmlReturn_t nvmlSystemGetCudaDriverVersion(int *v) { return cuda_version(FN_nvmlSystemGetCudaDriverVersion, v); }
#ifndef STUB_NO_CUDA_V2
nvmlReturn_t nvmlSystemGetCudaDriverVersion_v2(int *v) { return cuda_version(FN_nvmlSystemGetCudaDriverVersion_v2, v); }
#endif

static nvmlReturn_t device_count(int fn, unsigned int *count) {
    nvmlReturn_t r = begin(fn, UINT_MAX, NULL);
    if (r) return end(r);
    if (!count) return end(NVML_ERROR_INVALID_ARGUMENT);
    *count = (unsigned int)g_state->ndev;
    return end(NVML_SUCCESS);
}
nvmlReturn_t nvmlDeviceGetCount(unsigned int *count) { return device_count(FN_nvmlDeviceGetCount, count); }
#ifndef STUB_NO_INIT_V2
nvmlReturn_t nvmlDeviceGetCount_v2(unsigned int *count) { return device_count(FN_nvmlDeviceGetCount_v2, count); }
#endif

static nvmlReturn_t handle_by_index(int fn, unsigned int index, nvmlDevice_t *device) {
    struct device *d;
    nvmlReturn_t r = begin(fn, index, &d);
    if (r) return end(r);
    if (!device) return end(NVML_ERROR_INVALID_ARGUMENT);
    *device = make_handle(index);
    return end(NVML_SUCCESS);
}
nvmlReturn_t nvmlDeviceGetHandleByIndex(unsigned int index, nvmlDevice_t *device) {
    return handle_by_index(FN_nvmlDeviceGetHandleByIndex, index, device);
}
#ifndef STUB_NO_INIT_V2
nvmlReturn_t nvmlDeviceGetHandleByIndex_v2(unsigned int index, nvmlDevice_t *device) {
    return handle_by_index(FN_nvmlDeviceGetHandleByIndex_v2, index, device);
}
#endif

/* ------------------------------------------------------------------------------------------------------------ */
/* Identity                                                                                                     */

nvmlReturn_t nvmlDeviceGetName(nvmlDevice_t device, char *name, unsigned int length) {
    struct device *d;
    nvmlReturn_t r = begin(FN_nvmlDeviceGetName, handle_index(device), &d);
    if (r) return end(r);
    return end(unsupported(d, U_NAME) ? NVML_ERROR_NOT_SUPPORTED : put_string(name, length, d->name));
}

nvmlReturn_t nvmlDeviceGetUUID(nvmlDevice_t device, char *uuid, unsigned int length) {
    struct device *d;
    unsigned int pd, mi;
    nvmlReturn_t r = begin(FN_nvmlDeviceGetUUID, any_index(device), &d);
    if (r) return end(r);
    if (mig_handle(device, &pd, &mi)) {
        const struct mig *m = mig_of(device);
        return end(m ? put_string(uuid, length, m->uuid) : NVML_ERROR_INVALID_ARGUMENT);
    }
    return end(unsupported(d, U_UUID) ? NVML_ERROR_NOT_SUPPORTED : put_string(uuid, length, d->uuid));
}

nvmlReturn_t nvmlDeviceGetSerial(nvmlDevice_t device, char *serial, unsigned int length) {
    struct device *d;
    nvmlReturn_t r = begin(FN_nvmlDeviceGetSerial, handle_index(device), &d);
    if (r) return end(r);
    return end(unsupported(d, U_SERIAL) ? NVML_ERROR_NOT_SUPPORTED : put_string(serial, length, d->serial));
}

nvmlReturn_t nvmlDeviceGetMinorNumber(nvmlDevice_t device, unsigned int *minor) {
    struct device *d;
    nvmlReturn_t r = begin(FN_nvmlDeviceGetMinorNumber, handle_index(device), &d);
    if (r) return end(r);
    if (unsupported(d, U_MINOR)) return end(NVML_ERROR_NOT_SUPPORTED);
    if (!minor) return end(NVML_ERROR_INVALID_ARGUMENT);
    *minor = d->minor;
    return end(NVML_SUCCESS);
}

static nvmlReturn_t pci_info(int fn, nvmlDevice_t device, nvmlPciInfo_t *pci) {
    struct device *d;
    nvmlReturn_t r = begin(fn, handle_index(device), &d);
    if (r) return end(r);
    if (unsupported(d, U_PCI)) return end(NVML_ERROR_NOT_SUPPORTED);
    if (!pci) return end(NVML_ERROR_INVALID_ARGUMENT);
    memset(pci, 0, sizeof *pci);
    snprintf(pci->busIdLegacy, sizeof pci->busIdLegacy, "%04X:%02X:%02X.0", d->pci_domain & 0xffff, d->pci_bus,
             d->pci_device);
    pci->domain = d->pci_domain;
    pci->bus = d->pci_bus;
    pci->device = d->pci_device;
    pci->pciDeviceId = d->pci_device_id;
    pci->pciSubSystemId = d->pci_subsystem_id;
    snprintf(pci->busId, sizeof pci->busId, "%s", d->pci);
    return end(NVML_SUCCESS);
}
nvmlReturn_t nvmlDeviceGetPciInfo_v2(nvmlDevice_t device, nvmlPciInfo_t *pci) {
    return pci_info(FN_nvmlDeviceGetPciInfo_v2, device, pci);
}
#ifndef STUB_NO_PCI_V3
nvmlReturn_t nvmlDeviceGetPciInfo_v3(nvmlDevice_t device, nvmlPciInfo_t *pci) {
    return pci_info(FN_nvmlDeviceGetPciInfo_v3, device, pci);
}
#endif

/* ------------------------------------------------------------------------------------------------------------ */
/* Processes and memory                                                                                         */

/* Is the real process behind a bound entry alive? /proc/<pid>/stat's state follows the last ')' of the name. */
static int pid_alive(unsigned int pid, int zombie_holds) {
    char path[48], buf[512];
    snprintf(path, sizeof path, "/proc/%u/stat", pid);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return errno == ENOENT || errno == ESRCH ? 0 : 1;
    ssize_t n = read(fd, buf, sizeof buf - 1);
    close(fd);
    if (n <= 0) return 0; /* the process went away between open and read */
    buf[n] = '\0';
    char *rp = strrchr(buf, ')');
    if (!rp || rp[1] != ' ' || !rp[2]) return 1;
    if (rp[2] == 'X') return 0;
    if (rp[2] == 'Z') return zombie_holds;
    return 1;
}

/* Notice bound entries whose process is gone (records T once). */
static void refresh_bound(struct state *st, unsigned int device, uint64_t now) {
    for (size_t i = 0; i < st->nproc; i++) {
        struct proc *p = &st->proc[i];
        if (p->device != device || !p->bound || p->gone) continue;
        if (!pid_alive(p->pid, p->zombie_holds)) {
            p->gone = 1;
            p->gone_ns = now;
        }
    }
}

static int proc_listed(const struct proc *p, uint64_t now) {
    return !p->gone || now - p->gone_ns < ms_to_ns(p->list_ms);
}

static unsigned long long proc_held(const struct proc *p, uint64_t now) {
    if (p->gone && now - p->gone_ns >= ms_to_ns(p->release_ms)) return 0;
    if (p->holds_set) return p->holds;
    return p->used == NOT_AVAILABLE ? 0 : p->used;
}

static void device_memory(struct state *st, unsigned int index, unsigned long long *used_v2,
                          unsigned long long *free_v2) {
    const struct device *d = &st->dev[index];
    uint64_t now = now_ns();
    unsigned long long held = 0;
    refresh_bound(st, index, now);
    for (size_t i = 0; i < st->nproc; i++)
        if (st->proc[i].device == index) held = sat_add(held, proc_held(&st->proc[i], now));
    *used_v2 = sat_add(d->used, held);
    unsigned long long taken = sat_add(d->reserved, *used_v2);
    *free_v2 = d->total > taken ? d->total - taken : 0;
}

#ifndef STUB_NO_MEMORY_V2
nvmlReturn_t nvmlDeviceGetMemoryInfo_v2(nvmlDevice_t device, nvmlMemory_v2_t *memory) {
    struct device *d;
    unsigned int index = handle_index(device);
    unsigned int pd, mi;
    nvmlReturn_t r = begin(FN_nvmlDeviceGetMemoryInfo_v2, any_index(device), &d);
    if (r) return end(r);
    if (unsupported(d, U_MEMORY)) return end(NVML_ERROR_NOT_SUPPORTED);
    if (!memory) return end(NVML_ERROR_INVALID_ARGUMENT);
    if (memory->version != (unsigned int)(sizeof(nvmlMemory_v2_t) | 2u << 24))
        return end(NVML_ERROR_ARGUMENT_VERSION_MISMATCH);
    if (mig_handle(device, &pd, &mi)) {
        const struct mig *m = mig_of(device);
        if (!m) return end(NVML_ERROR_INVALID_ARGUMENT);
        memory->total = m->total;
        memory->reserved = 0;
        memory->used = mig_used(g_state, m);
        memory->free = m->total > memory->used ? m->total - memory->used : 0;
        return end(NVML_SUCCESS);
    }
    device_memory(g_state, index, &memory->used, &memory->free);
    memory->total = d->total;
    memory->reserved = d->reserved;
    return end(NVML_SUCCESS);
}
#endif

nvmlReturn_t nvmlDeviceGetMemoryInfo(nvmlDevice_t device, nvmlMemory_t *memory) {
    struct device *d;
    unsigned int index = handle_index(device);
    unsigned int pd, mi;
    nvmlReturn_t r = begin(FN_nvmlDeviceGetMemoryInfo, any_index(device), &d);
    if (r) return end(r);
    if (unsupported(d, U_MEMORY)) return end(NVML_ERROR_NOT_SUPPORTED);
    if (!memory) return end(NVML_ERROR_INVALID_ARGUMENT);
    if (mig_handle(device, &pd, &mi)) {
        const struct mig *m = mig_of(device);
        if (!m) return end(NVML_ERROR_INVALID_ARGUMENT);
        memory->total = m->total;
        memory->used = mig_used(g_state, m);
        memory->free = m->total > memory->used ? m->total - memory->used : 0;
        return end(NVML_SUCCESS);
    }
    unsigned long long used_v2, free_v2;
    device_memory(g_state, index, &used_v2, &free_v2);
    memory->total = d->total;
    memory->used = sat_add(used_v2, d->reserved);
    memory->free = d->total > memory->used ? d->total - memory->used : 0;
    return end(NVML_SUCCESS);
}

enum { LAYOUT_V1, LAYOUT_V2, LAYOUT_V3 };

/* The race lines: after answering a list call, grow (or shrink) that list. */
static void run_races(struct state *st, unsigned int device, int kind) {
    for (size_t i = 0; i < st->nrace; i++) {
        struct race *rc = &st->race[i];
        if (rc->device != device || rc->kind != kind || (rc->count && rc->fired >= rc->count)) continue;
        rc->fired++;
        if (rc->grow >= 0) {
            for (long long g = 0; g < rc->grow; g++) {
                PUSH(st->proc, st->nproc, st->capproc);
                struct proc *p = &st->proc[st->nproc++];
                memset(p, 0, sizeof *p);
                p->device = device;
                p->kind = kind;
                p->pid = st->next_race_pid++;
                p->used = RACE_BYTES;
                p->gi = p->ci = NOT_MIG;
            }
        } else {
            for (long long g = 0; g < -rc->grow; g++) {
                size_t j = st->nproc;
                while (j > 0 && !(st->proc[j - 1].device == device && st->proc[j - 1].kind == kind)) j--;
                if (j == 0) break;
                memmove(&st->proc[j - 1], &st->proc[j], (st->nproc - j) * sizeof *st->proc);
                st->nproc--;
            }
        }
    }
}

static void put_u32(unsigned char *b, unsigned int v) { memcpy(b, &v, sizeof v); }
static void put_u64(unsigned char *b, unsigned long long v) { memcpy(b, &v, sizeof v); }

/* The process lists: NVML's two-call pattern. *count in: capacity (entries); out: entries listed (or needed). */
static nvmlReturn_t process_list(int fn, int kind, int layout, nvmlDevice_t device, unsigned int *count, void *infos) {
    struct device *d;
    unsigned int index = handle_index(device);
    nvmlReturn_t r = begin(fn, index, &d);
    if (r) return end(r);
    if (unsupported(d, U_PROC_BASE + kind)) return end(NVML_ERROR_NOT_SUPPORTED);
    if (!count) return end(NVML_ERROR_INVALID_ARGUMENT);
    struct state *st = g_state;
    uint64_t now = now_ns();
    refresh_bound(st, index, now);
    size_t n = 0;
    for (size_t i = 0; i < st->nproc; i++)
        if (st->proc[i].device == index && st->proc[i].kind == kind && proc_listed(&st->proc[i], now)) n++;
    if (n > *count) {
        *count = n > UINT_MAX ? UINT_MAX : (unsigned int)n;
        r = NVML_ERROR_INSUFFICIENT_SIZE;
    } else if (n > 0 && !infos) {
        return end(NVML_ERROR_INVALID_ARGUMENT);
    } else {
        /* The entry stride the caller allocated, and what we write: with the 535.43 quirk the _v3 calls write
         * 32-byte entries, but never past the caller's *count * 24 bytes (the real driver overran the buffer). */
        size_t caller_stride = layout == LAYOUT_V1 ? sizeof(nvmlProcessInfo_v1_t) : sizeof(nvmlProcessInfo_v2_t);
        int quirk = layout == LAYOUT_V3 && st->quirk_535_43;
        size_t stride = quirk ? 32 : caller_stride;
        size_t limit = (size_t)*count * caller_stride;
        unsigned char entry[32];
        unsigned char *out = infos;
        size_t k = 0;
        for (size_t i = 0; i < st->nproc; i++) {
            const struct proc *p = &st->proc[i];
            if (p->device != index || p->kind != kind || !proc_listed(p, now)) continue;
            memset(entry, 0, sizeof entry);
            if (layout == LAYOUT_V1) {
                nvmlProcessInfo_v1_t e = {.pid = p->pid, .usedGpuMemory = p->used};
                memcpy(entry, &e, sizeof e);
            } else if (!quirk) {
                nvmlProcessInfo_v2_t e = {
                    .pid = p->pid, .usedGpuMemory = p->used, .gpuInstanceId = p->gi, .computeInstanceId = p->ci};
                memcpy(entry, &e, sizeof e);
            } else { /* pid, pad, used, gi, ci, usedGpuCcProtectedMemory */
                put_u32(entry, p->pid);
                put_u64(entry + 8, p->used);
                put_u32(entry + 16, p->gi);
                put_u32(entry + 20, p->ci);
                put_u64(entry + 24, 0);
            }
            size_t off = k * stride;
            if (off < limit) memcpy(out + off, entry, stride < limit - off ? stride : limit - off);
            k++;
        }
        *count = (unsigned int)n;
        r = NVML_SUCCESS;
    }
    run_races(st, index, kind);
    return end(r);
}

#define PROCESS_LIST_FUNCTIONS(Kind, kind)                                                                         \
    nvmlReturn_t nvmlDeviceGet##Kind##RunningProcesses(nvmlDevice_t device, unsigned int *infoCount,              \
                                                       nvmlProcessInfo_v1_t *infos) {                              \
        return process_list(FN_nvmlDeviceGet##Kind##RunningProcesses, kind, LAYOUT_V1, device, infoCount, infos);  \
    }                                                                                                              \
    PROCESS_LIST_V2(Kind, kind)                                                                                    \
    PROCESS_LIST_V3(Kind, kind)

#ifndef STUB_NO_PROC_V2
#define PROCESS_LIST_V2(Kind, kind)                                                                                \
    nvmlReturn_t nvmlDeviceGet##Kind##RunningProcesses_v2(nvmlDevice_t device, unsigned int *infoCount,           \
                                                          nvmlProcessInfo_v2_t *infos) {                           \
        return process_list(FN_nvmlDeviceGet##Kind##RunningProcesses_v2, kind, LAYOUT_V2, device, infoCount,       \
                            infos);                                                                                \
    }
#else
#define PROCESS_LIST_V2(Kind, kind)
#endif

#ifndef STUB_NO_PROC_V3
#define PROCESS_LIST_V3(Kind, kind)                                                                                \
    nvmlReturn_t nvmlDeviceGet##Kind##RunningProcesses_v3(nvmlDevice_t device, unsigned int *infoCount,           \
                                                          nvmlProcessInfo_t *infos) {                              \
        return process_list(FN_nvmlDeviceGet##Kind##RunningProcesses_v3, kind, LAYOUT_V3, device, infoCount,       \
                            infos);                                                                                \
    }
#else
#define PROCESS_LIST_V3(Kind, kind)
#endif

PROCESS_LIST_FUNCTIONS(Compute, K_COMPUTE)
PROCESS_LIST_FUNCTIONS(Graphics, K_GRAPHICS)
PROCESS_LIST_FUNCTIONS(MPSCompute, K_MPS)

/* ------------------------------------------------------------------------------------------------------------ */
/* Clocks                                                                                                       */

static nvmlReturn_t clock_info(int fn, int set, nvmlDevice_t device, nvmlClockType_t type, unsigned int *clock) {
    struct device *d;
    nvmlReturn_t r = begin(fn, handle_index(device), &d);
    if (r) return end(r);
    if ((int)type < 0 || (int)type > 3) return end(NVML_ERROR_INVALID_ARGUMENT);
    if (unsupported(d, U_CLOCK_BASE + set * 4 + (int)type)) return end(NVML_ERROR_NOT_SUPPORTED);
    if (!clock) return end(NVML_ERROR_INVALID_ARGUMENT);
    *clock = d->clocks[set][type];
    return end(NVML_SUCCESS);
}

nvmlReturn_t nvmlDeviceGetClockInfo(nvmlDevice_t device, nvmlClockType_t type, unsigned int *clock) {
    return clock_info(FN_nvmlDeviceGetClockInfo, CLK_CUR, device, type, clock);
}
nvmlReturn_t nvmlDeviceGetMaxClockInfo(nvmlDevice_t device, nvmlClockType_t type, unsigned int *clock) {
    return clock_info(FN_nvmlDeviceGetMaxClockInfo, CLK_MAX, device, type, clock);
}
nvmlReturn_t nvmlDeviceGetApplicationsClock(nvmlDevice_t device, nvmlClockType_t clockType, unsigned int *clockMHz) {
    return clock_info(FN_nvmlDeviceGetApplicationsClock, CLK_APP, device, clockType, clockMHz);
}

static nvmlReturn_t clock_reasons(int fn, nvmlDevice_t device, unsigned long long *reasons) {
    struct device *d;
    nvmlReturn_t r = begin(fn, handle_index(device), &d);
    if (r) return end(r);
    if (unsupported(d, U_REASONS)) return end(NVML_ERROR_NOT_SUPPORTED);
    if (!reasons) return end(NVML_ERROR_INVALID_ARGUMENT);
    *reasons = d->reasons;
    return end(NVML_SUCCESS);
}
#ifndef STUB_NO_EVENT_REASONS
nvmlReturn_t nvmlDeviceGetCurrentClocksEventReasons(nvmlDevice_t device, unsigned long long *clocksEventReasons) {
    return clock_reasons(FN_nvmlDeviceGetCurrentClocksEventReasons, device, clocksEventReasons);
}
#endif
nvmlReturn_t nvmlDeviceGetCurrentClocksThrottleReasons(nvmlDevice_t device,
                                                       unsigned long long *clocksThrottleReasons) {
    return clock_reasons(FN_nvmlDeviceGetCurrentClocksThrottleReasons, device, clocksThrottleReasons);
}

/* ------------------------------------------------------------------------------------------------------------ */
/* Memory health                                                                                                */

static nvmlReturn_t retired_pages(int fn, nvmlDevice_t device, nvmlPageRetirementCause_t cause, unsigned int *count,
                                  unsigned long long *addresses, unsigned long long *timestamps, int with_ts) {
    struct device *d;
    nvmlReturn_t r = begin(fn, handle_index(device), &d);
    if (r) return end(r);
    if (unsupported(d, U_RETIRED_PAGES)) return end(NVML_ERROR_NOT_SUPPORTED);
    if ((int)cause < 0 || (int)cause > 1 || !count) return end(NVML_ERROR_INVALID_ARGUMENT);
    size_t n = 0;
    for (size_t i = 0; i < d->npages; i++) n += d->pages[i].cause == (int)cause;
    if (n > *count) {
        *count = n > UINT_MAX ? UINT_MAX : (unsigned int)n;
        return end(NVML_ERROR_INSUFFICIENT_SIZE);
    }
    if (n > 0 && (!addresses || (with_ts && !timestamps))) return end(NVML_ERROR_INVALID_ARGUMENT);
    size_t k = 0;
    for (size_t i = 0; i < d->npages; i++) {
        if (d->pages[i].cause != (int)cause) continue;
        addresses[k] = d->pages[i].address;
        if (with_ts) timestamps[k] = d->pages[i].timestamp;
        k++;
    }
    *count = (unsigned int)n;
    return end(NVML_SUCCESS);
}

nvmlReturn_t nvmlDeviceGetRetiredPages(nvmlDevice_t device, nvmlPageRetirementCause_t cause, unsigned int *pageCount,
                                       unsigned long long *addresses) {
    return retired_pages(FN_nvmlDeviceGetRetiredPages, device, cause, pageCount, addresses, NULL, 0);
}
#ifndef STUB_NO_RETIRED_V2
nvmlReturn_t nvmlDeviceGetRetiredPages_v2(nvmlDevice_t device, nvmlPageRetirementCause_t cause,
                                          unsigned int *pageCount, unsigned long long *addresses,
                                          unsigned long long *timestamps) {
    return retired_pages(FN_nvmlDeviceGetRetiredPages_v2, device, cause, pageCount, addresses, timestamps, 1);
}
#endif

nvmlReturn_t nvmlDeviceGetRetiredPagesPendingStatus(nvmlDevice_t device, nvmlEnableState_t *isPending) {
    struct device *d;
    nvmlReturn_t r = begin(FN_nvmlDeviceGetRetiredPagesPendingStatus, handle_index(device), &d);
    if (r) return end(r);
    if (unsupported(d, U_RETIRED_PENDING)) return end(NVML_ERROR_NOT_SUPPORTED);
    if (!isPending) return end(NVML_ERROR_INVALID_ARGUMENT);
    *isPending = d->retired_pending ? NVML_FEATURE_ENABLED : NVML_FEATURE_DISABLED;
    return end(NVML_SUCCESS);
}

nvmlReturn_t nvmlDeviceGetRemappedRows(nvmlDevice_t device, unsigned int *corrRows, unsigned int *uncRows,
                                       unsigned int *isPending, unsigned int *failureOccurred) {
    struct device *d;
    nvmlReturn_t r = begin(FN_nvmlDeviceGetRemappedRows, handle_index(device), &d);
    if (r) return end(r);
    if (unsupported(d, U_REMAPPED)) return end(NVML_ERROR_NOT_SUPPORTED);
    if (!corrRows || !uncRows || !isPending || !failureOccurred) return end(NVML_ERROR_INVALID_ARGUMENT);
    *corrRows = d->remapped[0];
    *uncRows = d->remapped[1];
    *isPending = d->remapped[2];
    *failureOccurred = d->remapped[3];
    return end(NVML_SUCCESS);
}

nvmlReturn_t nvmlDeviceGetTotalEccErrors(nvmlDevice_t device, nvmlMemoryErrorType_t errorType,
                                         nvmlEccCounterType_t counterType, unsigned long long *eccCounts) {
    struct device *d;
    nvmlReturn_t r = begin(FN_nvmlDeviceGetTotalEccErrors, handle_index(device), &d);
    if (r) return end(r);
    if (unsupported(d, U_ECC)) return end(NVML_ERROR_NOT_SUPPORTED); /* ECC disabled, or a board without it */
    if (!eccCounts || (int)errorType < 0 || (int)errorType > 1 || (int)counterType < 0 || (int)counterType > 1)
        return end(NVML_ERROR_INVALID_ARGUMENT);
    /* Corrected errors are not modelled: 0. */
    if (errorType == NVML_MEMORY_ERROR_TYPE_UNCORRECTED)
        *eccCounts = counterType == NVML_VOLATILE_ECC ? d->ecc_volatile : d->ecc_aggregate;
    else
        *eccCounts = 0;
    return end(NVML_SUCCESS);
}

#ifndef STUB_NO_FIELD_VALUES
/* Field values: only NVML_FI_DEV_GET_GPU_RECOVERY_ACTION is answered (an unsigned int, as driver 580 does); any
 * other field id answers NOT_SUPPORTED in its own nvmlReturn, as a driver does for a field it lacks. */
nvmlReturn_t nvmlDeviceGetFieldValues(nvmlDevice_t device, int valuesCount, nvmlFieldValue_t *values) {
    struct device *d;
    nvmlReturn_t r = begin(FN_nvmlDeviceGetFieldValues, handle_index(device), &d);
    if (r) return end(r);
    if (valuesCount < 0 || (valuesCount > 0 && !values)) return end(NVML_ERROR_INVALID_ARGUMENT);
    for (int i = 0; i < valuesCount; i++) {
        nvmlFieldValue_t *v = &values[i];
        v->timestamp = 0;
        v->latencyUsec = 0;
        if (v->fieldId == NVML_FI_DEV_GET_GPU_RECOVERY_ACTION && !unsupported(d, U_RECOVERY)) {
            v->valueType = NVML_VALUE_TYPE_UNSIGNED_INT;
            v->value.ullVal = 0;
            v->value.uiVal = d->recovery;
            v->nvmlReturn = NVML_SUCCESS;
        } else {
            v->nvmlReturn = NVML_ERROR_NOT_SUPPORTED;
        }
    }
    return end(NVML_SUCCESS);
}
#endif

/* ------------------------------------------------------------------------------------------------------------ */
/* Test symbols                                                                                                 */

unsigned long long stub_call_count(const char *fn);
int stub_init_refcount(void);
int stub_init_total(void);
int stub_shutdown_total(void);
const char *stub_last_error(void);
unsigned long long stub_loaded_ns(void);

unsigned long long stub_call_count(const char *fn) {
    unsigned long long n = 0;
    pthread_mutex_lock(&g_mu);
    if (!fn) {
        n = g_total_calls;
    } else {
        int i = fn_lookup(fn);
        n = i < 0 ? 0 : g_counts[i];
    }
    pthread_mutex_unlock(&g_mu);
    return n;
}

int stub_init_refcount(void) {
    pthread_mutex_lock(&g_mu);
    int n = initialised() ? g_refcount : 0;
    pthread_mutex_unlock(&g_mu);
    return n;
}

int stub_init_total(void) {
    pthread_mutex_lock(&g_mu);
    int n = g_init_total;
    pthread_mutex_unlock(&g_mu);
    return n;
}

int stub_shutdown_total(void) {
    pthread_mutex_lock(&g_mu);
    int n = g_shutdown_total;
    pthread_mutex_unlock(&g_mu);
    return n;
}

const char *stub_last_error(void) { return g_last_error; }

/* CLOCK_MONOTONIC ns at which the current scenario was loaded (0 when none is): the origin of `at ms=` lines, so a
 * test can tell exactly when a timed change became visible (Python's time.monotonic_ns reads the same clock). */
unsigned long long stub_loaded_ns(void) {
    pthread_mutex_lock(&g_mu);
    unsigned long long t = initialised() ? (unsigned long long)g_state->loaded_ns : 0ULL;
    pthread_mutex_unlock(&g_mu);
    return t;
}

/* ------------------------------------------------------------------------------------------------------------ */
/* fork: the lock is taken around fork() so the child gets it in a consistent state; the child is not initialised */

static void atfork_prepare(void) { pthread_mutex_lock(&g_mu); }
static void atfork_parent(void) { pthread_mutex_unlock(&g_mu); }
static void init_event_cond(void) {
    pthread_condattr_t attr;
    pthread_condattr_init(&attr);
    pthread_condattr_setclock(&attr, CLOCK_MONOTONIC);
    pthread_cond_init(&g_event_cond, &attr);
    pthread_condattr_destroy(&attr);
}

static void atfork_child(void) {
    pthread_mutex_init(&g_mu, NULL);
    init_event_cond(); /* a waiter of the parent does not exist here */
    g_refcount = 0; /* g_state is kept (a copy); the child's own nvmlInit frees it */
}

__attribute__((constructor)) static void stub_loaded(void) {
    init_event_cond();
    pthread_atfork(atfork_prepare, atfork_parent, atfork_child);
}

/* ------------------------------------------------------------------------------------------------------------ */
/* MIG (STUB_NO_MIG: a driver before 450, without these symbols)                                                */

#ifndef STUB_NO_MIG
nvmlReturn_t nvmlDeviceGetMigMode(nvmlDevice_t device, unsigned int *currentMode, unsigned int *pendingMode) {
    struct device *d;
    nvmlReturn_t r = begin(FN_nvmlDeviceGetMigMode, handle_index(device), &d);
    if (r) return end(r);
    if (unsupported(d, U_MIG)) return end(NVML_ERROR_NOT_SUPPORTED);
    if (!currentMode || !pendingMode) return end(NVML_ERROR_INVALID_ARGUMENT);
    *currentMode = *pendingMode = d->mig ? NVML_DEVICE_MIG_ENABLE : NVML_DEVICE_MIG_DISABLE;
    return end(NVML_SUCCESS);
}

nvmlReturn_t nvmlDeviceGetMaxMigDeviceCount(nvmlDevice_t device, unsigned int *count) {
    struct device *d;
    nvmlReturn_t r = begin(FN_nvmlDeviceGetMaxMigDeviceCount, handle_index(device), &d);
    if (r) return end(r);
    if (unsupported(d, U_MIG)) return end(NVML_ERROR_NOT_SUPPORTED);
    if (!count) return end(NVML_ERROR_INVALID_ARGUMENT);
    *count = MAX_MIG;
    return end(NVML_SUCCESS);
}

nvmlReturn_t nvmlDeviceGetMigDeviceHandleByIndex(nvmlDevice_t device, unsigned int index, nvmlDevice_t *migDevice) {
    struct device *d;
    unsigned int dev_index = handle_index(device);
    nvmlReturn_t r = begin(FN_nvmlDeviceGetMigDeviceHandleByIndex, dev_index, &d);
    if (r) return end(r);
    if (unsupported(d, U_MIG)) return end(NVML_ERROR_NOT_SUPPORTED);
    if (!migDevice || index >= MAX_MIG || !d->mig) return end(NVML_ERROR_INVALID_ARGUMENT);
    if (find_mig(g_state, dev_index, index) < 0) return end(NVML_ERROR_NOT_FOUND);
    *migDevice = make_mig_handle(dev_index, index);
    return end(NVML_SUCCESS);
}

nvmlReturn_t nvmlDeviceGetDeviceHandleFromMigDeviceHandle(nvmlDevice_t migDevice, nvmlDevice_t *device) {
    struct device *d;
    nvmlReturn_t r = begin(FN_nvmlDeviceGetDeviceHandleFromMigDeviceHandle, any_index(migDevice), &d);
    if (r) return end(r);
    const struct mig *m = mig_of(migDevice);
    if (!m || !device) return end(NVML_ERROR_INVALID_ARGUMENT);
    *device = make_handle(m->device);
    return end(NVML_SUCCESS);
}

static nvmlReturn_t instance_id(int fn, nvmlDevice_t device, unsigned int *id, int compute) {
    struct device *d;
    nvmlReturn_t r = begin(fn, any_index(device), &d);
    if (r) return end(r);
    const struct mig *m = mig_of(device);
    if (!m || !id) return end(NVML_ERROR_INVALID_ARGUMENT); /* not a MIG device handle */
    *id = compute ? m->ci : m->gi;
    return end(NVML_SUCCESS);
}

nvmlReturn_t nvmlDeviceGetGpuInstanceId(nvmlDevice_t device, unsigned int *id) {
    return instance_id(FN_nvmlDeviceGetGpuInstanceId, device, id, 0);
}

nvmlReturn_t nvmlDeviceGetComputeInstanceId(nvmlDevice_t device, unsigned int *id) {
    return instance_id(FN_nvmlDeviceGetComputeInstanceId, device, id, 1);
}
#endif

/* ------------------------------------------------------------------------------------------------------------ */
/* Events: every set reads the scenario's whole event log; `unsupported=events` answers NOT_SUPPORTED          */

#ifndef STUB_NO_EVENTS /* a build without the event symbols: nvmlcheck must say "events not supported" */
#define MAX_EVENT_SETS 64
#define MAX_EVENT_DEVICES 64
#define EVENT_SET_BASE ((uintptr_t)0x5900000000ULL)
static struct {
    int used;
    unsigned long long generation; /* g_generation at creation: a set does not outlive its initialisation */
    size_t next;                   /* the first event of the log this set has not looked at */
    unsigned long long mask[MAX_EVENT_DEVICES];
} g_sets[MAX_EVENT_SETS];

/* The slot of a live set, or -1. Lock held. */
static int set_slot(nvmlEventSet_t set) {
    uintptr_t v = (uintptr_t)set;
    if (v < EVENT_SET_BASE || (v - EVENT_SET_BASE) % HANDLE_STRIDE) return -1;
    uintptr_t i = (v - EVENT_SET_BASE) / HANDLE_STRIDE;
    if (i >= MAX_EVENT_SETS || !g_sets[i].used || g_sets[i].generation != g_generation) return -1;
    return (int)i;
}

nvmlReturn_t nvmlEventSetCreate(nvmlEventSet_t *set) {
    nvmlReturn_t r = begin(FN_nvmlEventSetCreate, UINT_MAX, NULL);
    if (r) return end(r);
    if (!set) return end(NVML_ERROR_INVALID_ARGUMENT);
    for (int i = 0; i < MAX_EVENT_SETS; i++) {
        if (g_sets[i].used && g_sets[i].generation == g_generation) continue;
        memset(&g_sets[i], 0, sizeof g_sets[i]);
        g_sets[i].used = 1;
        g_sets[i].generation = g_generation;
        g_sets[i].next = 0; /* unlike a driver, every event since the scenario loaded: no race with a timeline */
        *set = (nvmlEventSet_t)(EVENT_SET_BASE + (uintptr_t)i * HANDLE_STRIDE);
        return end(NVML_SUCCESS);
    }
    return end(NVML_ERROR_INSUFFICIENT_RESOURCES);
}

nvmlReturn_t nvmlDeviceGetSupportedEventTypes(nvmlDevice_t device, unsigned long long *eventTypes) {
    struct device *d;
    nvmlReturn_t r = begin(FN_nvmlDeviceGetSupportedEventTypes, handle_index(device), &d);
    if (r) return end(r);
    if (unsupported(d, U_EVENTS)) return end(NVML_ERROR_NOT_SUPPORTED);
    if (!eventTypes) return end(NVML_ERROR_INVALID_ARGUMENT);
    *eventTypes = d->event_types;
    return end(NVML_SUCCESS);
}

nvmlReturn_t nvmlDeviceRegisterEvents(nvmlDevice_t device, unsigned long long eventTypes, nvmlEventSet_t set) {
    struct device *d;
    unsigned int index = handle_index(device);
    nvmlReturn_t r = begin(FN_nvmlDeviceRegisterEvents, index, &d);
    if (r) return end(r);
    if (unsupported(d, U_EVENTS)) return end(NVML_ERROR_NOT_SUPPORTED);
    int slot = set_slot(set);
    if (slot < 0 || index >= MAX_EVENT_DEVICES) return end(NVML_ERROR_INVALID_ARGUMENT);
    if (eventTypes & ~d->event_types) return end(NVML_ERROR_NOT_SUPPORTED);
    g_sets[slot].mask[index] |= eventTypes;
    return end(NVML_SUCCESS);
}

/* CLOCK_MONOTONIC ns at which the earliest pending `at ms=` line is due (0: none). Lock held. */
static uint64_t next_ms_due(const struct state *st) {
    uint64_t best = 0;
    if (!st->pending) return 0;
    for (size_t i = 0; i < st->naction; i++) {
        const struct action *a = &st->action[i];
        if (a->applied || !a->is_ms) continue;
        uint64_t at = sat_add(st->loaded_ns, ms_to_ns(a->when));
        if (!best || at < best) best = at;
    }
    return best;
}

/* Deliver the first event after the set's cursor that one of its registrations wants (any of its bits; an event
 * with no bit at all goes to every set registered on its device). Lock held. */
static int next_event(int slot, nvmlEventData_t *data) {
    struct state *st = g_state;
    while (g_sets[slot].next < st->nevent) {
        const struct event *e = &st->event[g_sets[slot].next++];
        if (e->device >= MAX_EVENT_DEVICES) continue;
        unsigned long long mask = g_sets[slot].mask[e->device];
        if (!(mask & e->type) && !(mask && !e->type)) continue;
        data->device = make_handle(e->device);
        data->eventType = e->type;
        data->eventData = e->data;
        data->gpuInstanceId = e->gi;
        data->computeInstanceId = e->ci;
        return 1;
    }
    return 0;
}

/* Whether a device registered in the set is lost (`lost=1`): its waits answer GPU_IS_LOST. Lock held. */
static int set_lost(int slot) {
    const struct state *st = g_state;
    for (size_t i = 0; i < st->ndev && i < MAX_EVENT_DEVICES; i++)
        if (g_sets[slot].mask[i] && st->dev[i].lost) return 1;
    return 0;
}

nvmlReturn_t nvmlEventSetWait_v2(nvmlEventSet_t set, nvmlEventData_t *data, unsigned int timeoutms) {
    nvmlReturn_t r = begin(FN_nvmlEventSetWait_v2, UINT_MAX, NULL);
    if (r) return end(r);
    if (!data || set_slot(set) < 0) return end(NVML_ERROR_INVALID_ARGUMENT);
    uint64_t until = now_ns() + ms_to_ns(timeoutms);
    unsigned long long gen = g_generation;
    for (;;) {
        int slot = set_slot(set);
        if (slot < 0) return end(NVML_ERROR_UNINITIALIZED); /* freed or shut down meanwhile */
        if (set_lost(slot)) return end(NVML_ERROR_GPU_IS_LOST);
        if (next_event(slot, data)) return end(NVML_SUCCESS);
        uint64_t now = now_ns();
        if (now >= until) return end(NVML_ERROR_TIMEOUT);
        /* Sleep (lock released) until an event is raised by another call, or the next `at ms=` line is due (a
         * timeline line needs a call to apply it: this one applies it), or the timeout. */
        uint64_t wake = until, due = next_ms_due(g_state);
        if (due && due < wake) wake = due;
        struct timespec ts = {.tv_sec = (time_t)(wake / 1000000000ULL), .tv_nsec = (long)(wake % 1000000000ULL)};
        pthread_cond_timedwait(&g_event_cond, &g_mu, &ts);
        if (gen != g_generation || !initialised()) return end(NVML_ERROR_UNINITIALIZED);
        apply_due_actions(g_state);
    }
}

nvmlReturn_t nvmlEventSetFree(nvmlEventSet_t set) {
    nvmlReturn_t r = begin(FN_nvmlEventSetFree, UINT_MAX, NULL);
    if (r) return end(r);
    int slot = set_slot(set);
    if (slot < 0) return end(NVML_ERROR_INVALID_ARGUMENT);
    g_sets[slot].used = 0;
    pthread_cond_broadcast(&g_event_cond);
    return end(NVML_SUCCESS);
}
#endif
