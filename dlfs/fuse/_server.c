/* The mount's hot requests answered in C, on several threads, without the Python interpreter: the
 * thread loop, and the custom I/O through which libfuse reads what is left for Python.
 *
 * pyfuse3 answers every request on one Python thread: an unmodified loader that reads in no
 * published order (shuffle=True) makes a LOOKUP, an IOCTL (Python's open() asks isatty) and a READ
 * per image, and the daemon caps the node whatever its core count. Here `threads` threads each read
 * requests from their own clone of the session's /dev/fuse descriptor (FUSE_DEV_IOC_CLONE, as
 * libfuse's multi-threaded loop does) and have the handlers (_handlers.c) answer them, and gather
 * FORGETs for Python. Every request the handlers leave (INIT, the .dlfs control tree, listings with
 * every entry's attributes, files the read-ahead watches or that they do not read) goes to pyfuse3
 * unchanged: libfuse reads it through the fuse_custom_io below, from a queue this loop fills, and
 * its reply goes back to the descriptor the request came from (a reply on another clone is
 * refused). dlfs/fuse/server.py is the only caller (through ctypes); build: `make install`.
 */
#define _GNU_SOURCE
#define FUSE_USE_VERSION 35
#include <errno.h>
#include <fcntl.h>
#include <fuse_lowlevel.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <sys/eventfd.h>
#include <sys/ioctl.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

#include "_handlers.h"

/* Threads at most: a forwarded request carries its thread's number in the low byte of its id. */
#define MAX_THREADS 64
#define THREAD_BITS 8
/* A request buffer: the largest request is a WRITE of max_write (1 MiB with libfuse 3) plus its
 * headers, and the kernel refuses a read into anything smaller. */
#define REQUEST_SIZE ((1 << 20) + 8192)

struct worker {
    int fd, number;
    pthread_t thread;
    uint8_t *request;
    struct answerer *answerer; /* replies through fd */
};

struct forwarded {
    struct forwarded *next;
    size_t size;
    uint8_t bytes[];
};

/* FORGETs, handed over as one BATCH_FORGET (see gather_forgets): struct fuse_forget_one; under
 * queue_lock. */
static struct gathered forgets;
static int forgets_signalled; /* a wake-up for them is outstanding */

static struct handlers *handlers;
static void wake_python(void);
static struct worker workers[MAX_THREADS];
static int n_workers;
static atomic_int running;
/* Python waits on this (a semaphore eventfd): one count per queued request, one when all threads
 * have stopped. */
static int wake_fd = -1;
static pthread_mutex_t queue_lock = PTHREAD_MUTEX_INITIALIZER;
static struct forwarded *queue_head, *queue_tail;

static uint64_t cpu_now(void) {
    struct timespec t;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
    return (uint64_t)t.tv_sec * NSEC + (uint64_t)t.tv_nsec;
}

static uint64_t wall_now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (uint64_t)t.tv_sec * NSEC + (uint64_t)t.tv_nsec;
}

/* A READ answered here took ns from the moment its request was read to its reply's write. */
static void note_read_latency(struct counts *c, uint64_t ns) {
    uint64_t us = ns / 1000;
    int bucket = us ? 63 - __builtin_clzll(us) : 0;
    c->read_latency[bucket < LATENCY_BUCKETS ? bucket : LATENCY_BUCKETS - 1]++;
    c->read_ns += ns;
}

/* FORGET and BATCH_FORGET: the kernel dropped inodes. Python keeps what the read-ahead knows the
 * kernel holds, and needs them, but not one by one: the C threads read as soon as the kernel queues
 * a forget, so an eviction of a large tree (drop_caches, memory pressure) comes as a flood of single
 * FORGETs and small batches, and Python, handling each as a request, would hold up a cold `find`
 * for many times its own length. They are gathered here and handed to Python as one
 * BATCH_FORGET whenever it next reads (python_read), however many arrived meanwhile. No reply is
 * due. */
static int gather_forgets(const struct fuse_in_header *in, const uint8_t *body, size_t size) {
    const struct fuse_forget_one *list;
    struct fuse_forget_one single;
    size_t count;
    if (in->opcode == FUSE_FORGET) {
        if (size < sizeof(struct fuse_forget_in))
            return 1;
        single.nodeid = in->nodeid;
        single.nlookup = ((const struct fuse_forget_in *)body)->nlookup;
        list = &single;
        count = 1;
    } else {
        if (size < sizeof(struct fuse_batch_forget_in))
            return 1;
        count = ((const struct fuse_batch_forget_in *)body)->count;
        size_t most = (size - sizeof(struct fuse_batch_forget_in)) / sizeof(struct fuse_forget_one);
        count = count < most ? count : most;
        list = (const struct fuse_forget_one *)(body + sizeof(struct fuse_batch_forget_in));
    }
    pthread_mutex_lock(&queue_lock);
    /* Out of memory, Python misses these: a folder listed once more later, never wrong data. */
    int wake = gather(&forgets, list, count * sizeof *list) && !forgets_signalled;
    if (wake)
        forgets_signalled = 1;
    pthread_mutex_unlock(&queue_lock);
    if (wake)
        wake_python();
    return 1;
}

static void wake_python(void) {
    uint64_t one = 1;
    ssize_t n;
    do
        n = write(wake_fd, &one, sizeof one);
    while (n < 0 && errno == EINTR);
}

static void forward(struct worker *w, uint8_t *request, size_t size) {
    struct fuse_in_header *in = (struct fuse_in_header *)request;
    if (in->unique) /* the reply names the thread whose descriptor it must go back through */
        in->unique = in->unique << THREAD_BITS | (uint64_t)w->number;
    struct forwarded *f = malloc(sizeof *f + size);
    if (!f) { /* the kernel waits for an answer (FORGET, unique 0, waits for none): give it one */
        if (in->unique)
            reply(w->fd, in->unique >> THREAD_BITS, -ENOMEM, NULL, 0);
        return;
    }
    f->next = NULL;
    f->size = size;
    memcpy(f->bytes, request, size);
    pthread_mutex_lock(&queue_lock);
    if (queue_tail)
        queue_tail->next = f;
    else
        queue_head = f;
    queue_tail = f;
    pthread_mutex_unlock(&queue_lock);
    wake_python();
}

static void *serve(void *arg) {
    struct worker *w = arg;
    for (;;) {
        uint64_t started = cpu_now();
        ssize_t n = read(w->fd, w->request, REQUEST_SIZE);
        if (n < 0 && (errno == EINTR || errno == EAGAIN || errno == ENOENT))
            continue;
        if (n < 0) /* ENODEV: unmounted, or the connection was aborted */
            break;
        if ((size_t)n < sizeof(struct fuse_in_header))
            continue;
        struct fuse_in_header *in = (struct fuse_in_header *)w->request;
        uint32_t op = in->opcode < OPCODES ? in->opcode : OPCODES - 1;
        uint64_t arrived = op == FUSE_READ ? wall_now() : 0; /* two vDSO calls per READ, none else */
        struct counts *counts = &w->answerer->counts;
        int done = in->opcode == FUSE_FORGET || in->opcode == FUSE_BATCH_FORGET
                       ? gather_forgets(in, w->request + sizeof *in, (size_t)n - sizeof *in)
                       : dlfs_answer(w->answerer, w->request, (size_t)n);
        if (done) {
            if (op == FUSE_READ)
                note_read_latency(counts, wall_now() - arrived);
            counts->answered[op]++;
            counts->cpu_ns[op] += cpu_now() - started;
        } else {
            counts->forwarded[op]++;
            forward(w, w->request, (size_t)n);
        }
    }
    if (atomic_fetch_sub(&running, 1) == 1)
        wake_python(); /* the last one: Python's next read says the session is over */
    return NULL;
}

/* The gathered forgets as one BATCH_FORGET in buffer (as many as fit; the rest on the next read).
 * Called with queue_lock held. */
static ssize_t hand_over_forgets(void *buffer, size_t size) {
    size_t head = sizeof(struct fuse_in_header) + sizeof(struct fuse_batch_forget_in);
    size_t n = take(&forgets, (uint8_t *)buffer + head, size - head, sizeof(struct fuse_forget_one));
    struct fuse_in_header in = {.len = (uint32_t)(head + n), .opcode = FUSE_BATCH_FORGET};
    struct fuse_batch_forget_in batch = {.count = (uint32_t)(n / sizeof(struct fuse_forget_one))};
    memcpy(buffer, &in, sizeof in);
    memcpy((uint8_t *)buffer + sizeof in, &batch, sizeof batch);
    if (forgets.held)
        wake_python(); /* for the rest */
    else
        forgets_signalled = 0;
    return (ssize_t)in.len;
}

/* libfuse's side (fuse_custom_io): called from pyfuse3's thread. */
static ssize_t python_read(int fd, void *buffer, size_t size, void *userdata) {
    (void)fd;
    (void)userdata;
    uint64_t count;
    if (read(wake_fd, &count, sizeof count) < 0) {
        errno = EINTR; /* nothing queued after all: pyfuse3 waits again */
        return -1;
    }
    pthread_mutex_lock(&queue_lock);
    if (forgets.held) {
        ssize_t n = hand_over_forgets(buffer, size);
        pthread_mutex_unlock(&queue_lock);
        return n;
    }
    struct forwarded *f = queue_head;
    if (f && !(queue_head = f->next))
        queue_tail = NULL;
    pthread_mutex_unlock(&queue_lock);
    if (!f) {
        errno = atomic_load(&running) ? EINTR : ENODEV;
        return -1;
    }
    if (f->size > size) { /* cannot happen: libfuse's buffer takes any request the kernel sends */
        free(f);
        errno = EINTR;
        return -1;
    }
    size_t n = f->size;
    memcpy(buffer, f->bytes, n);
    free(f);
    return (ssize_t)n;
}

static ssize_t python_writev(int fd, struct iovec *iov, int count, void *userdata) {
    (void)fd;
    (void)userdata;
    if (count < 1 || iov[0].iov_len < sizeof(struct fuse_out_header)) {
        errno = EINVAL;
        return -1;
    }
    struct fuse_out_header out = *(struct fuse_out_header *)iov[0].iov_base;
    int target = 0; /* a notification (unique 0) goes through any descriptor of the session */
    if (out.unique) {
        target = (int)(out.unique & ((1 << THREAD_BITS) - 1));
        out.unique >>= THREAD_BITS;
        if (target >= n_workers) {
            errno = EINVAL;
            return -1;
        }
    }
    struct iovec copy[count];
    memcpy(copy, iov, sizeof copy);
    copy[0].iov_base = &out;
    return writev(workers[target].fd, copy, count);
}

static const struct fuse_custom_io io = {.read = python_read, .writev = python_writev};

/* The fuse_custom_io to hand pyfuse3's session (pyfuse3.custom_io). */
const void *dlfs_server_io(void) { return &io; }

/* Take over the mounted session's descriptor: the threads will answer with h (which outlives them),
 * and return the descriptor Python's loop waits on (libfuse closes it at the end), or -errno. */
int dlfs_server_prepare(struct handlers *h) {
    handlers = h;
    wake_fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK | EFD_SEMAPHORE);
    if (wake_fd < 0)
        return -errno;
    int theirs = fcntl(wake_fd, F_DUPFD_CLOEXEC, 0);
    return theirs < 0 ? -errno : theirs;
}

/* Start `threads` threads on the session of session_fd (the first reads session_fd itself, the
 * others clones of it). Returns how many started, or -errno when none did. */
int dlfs_server_start(int session_fd, int threads) {
    threads = threads < 1 ? 1 : threads > MAX_THREADS ? MAX_THREADS : threads;
    int error = 0;
    for (n_workers = 0; n_workers < threads; n_workers++) {
        struct worker *w = &workers[n_workers];
        memset(w, 0, sizeof *w);
        w->number = n_workers;
        w->fd = session_fd;
        if (n_workers) {
            uint32_t original = (uint32_t)session_fd;
            w->fd = open("/dev/fuse", O_RDWR | O_CLOEXEC);
            if (w->fd < 0 || ioctl(w->fd, FUSE_DEV_IOC_CLONE, &original) < 0) {
                error = errno;
                if (w->fd >= 0)
                    close(w->fd);
                break;
            }
        }
        w->request = malloc(REQUEST_SIZE);
        w->answerer = dlfs_answerer_new(handlers, w->fd);
        error = w->request && w->answerer ? 0 : ENOMEM;
        if (!error) {
            atomic_fetch_add(&running, 1);
            if ((error = pthread_create(&w->thread, NULL, serve, w)))
                atomic_fetch_sub(&running, 1);
        }
        if (error) {
            if (n_workers)
                close(w->fd);
            free(w->request);
            if (w->answerer)
                dlfs_answerer_free(w->answerer);
            w->request = NULL;
            break;
        }
    }
    return n_workers ? n_workers : -error;
}

/* Whether any thread still serves: none once the kernel ended the session (an unmount from outside). */
int dlfs_server_running(void) { return atomic_load(&running) > 0; }

/* Sums of the serving threads' counters (read while they run: each figure may lag by a request). */
void dlfs_server_counts(struct counts *out) {
    memset(out, 0, sizeof *out);
    for (int k = 0; k < n_workers; k++) {
        if (!workers[k].request) /* stopped */
            continue;
        const struct counts *c = &workers[k].answerer->counts;
        for (int op = 0; op < OPCODES; op++) {
            out->answered[op] += c->answered[op];
            out->cpu_ns[op] += c->cpu_ns[op];
            out->forwarded[op] += c->forwarded[op];
        }
        out->read_bytes += c->read_bytes;
        out->regions += c->regions;
        for (int b = 0; b < LATENCY_BUCKETS; b++)
            out->read_latency[b] += c->read_latency[b];
        out->read_ns += c->read_ns;
    }
}

/* After the unmount: wait up to timeout_ms for the threads, which stop when their reads fail with
 * ENODEV; free what the stopped ones held. Returns how many still run (a lazy unmount of a busy
 * mount keeps the session, and them, alive until its last file is closed). */
int dlfs_server_stop(int timeout_ms) {
    struct timespec deadline;
    clock_gettime(CLOCK_REALTIME, &deadline);
    deadline.tv_sec += timeout_ms / 1000;
    deadline.tv_nsec += (long)(timeout_ms % 1000) * 1000000L;
    if (deadline.tv_nsec >= NSEC) {
        deadline.tv_sec++;
        deadline.tv_nsec -= NSEC;
    }
    int left = 0;
    for (int k = 0; k < n_workers; k++) {
        struct worker *w = &workers[k];
        if (!w->request)
            continue;
        if (pthread_timedjoin_np(w->thread, NULL, &deadline)) {
            left++;
            continue;
        }
        close(w->fd);
        free(w->request);
        dlfs_answerer_free(w->answerer);
        w->request = NULL;
    }
    return left;
}
