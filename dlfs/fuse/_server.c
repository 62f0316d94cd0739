/* The mount's hot requests answered in C, on several threads, without the Python interpreter.
 *
 * pyfuse3 answers every request on one Python thread, 50-650 us each: an unmodified loader that
 * reads in no published order (shuffle=True) makes a LOOKUP, an IOCTL (Python's open() asks
 * isatty) and a READ per image, and the daemon caps the node whatever its core count. Here
 * `threads` threads each read requests from their own clone of the session's /dev/fuse descriptor
 * (FUSE_DEV_IOC_CLONE, as libfuse's multi-threaded loop does) and answer, from the index columns
 * and the shards, LOOKUP, GETATTR and READ of the dataset's entries, listings that give files no
 * attributes, IOCTL (ENOTTY: no dataset file is a terminal) and STATFS, and gather FORGETs for
 * Python. Every other request (INIT, the .dlfs control tree, listings with every entry's
 * attributes, files the read-ahead watches or that this loop does not read) goes to pyfuse3
 * unchanged: libfuse reads it through the fuse_custom_io below, from a queue this loop fills, and
 * its reply goes back to the descriptor the request came from (a reply on another clone is
 * refused).
 *
 * A READ returns bytes only after the whole file matched its xxh3-64; a file that does not (or a
 * failed read) goes to Python, which answers EIO and logs it, once. dlfs/fuse/server.py is the only
 * caller (through ctypes); build: `make install`.
 */
#define _GNU_SOURCE
#define FUSE_USE_VERSION 35
#include <errno.h>
#include <fcntl.h>
#include <fuse_lowlevel.h>
#include <lz4.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <sys/eventfd.h>
#include <sys/ioctl.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

#include "../core/_pagecache.h"
#include "_dirents.h"

#include <xxhash.h>
#if defined(__x86_64__) || defined(__i386__)
#include <xxh_x86dispatch.h>
#define checksum XXH3_64bits_dispatch
#else
#define checksum XXH3_64bits
#endif

/* Threads at most: a forwarded request carries its thread's number in the low byte of its id. */
#define MAX_THREADS 64
#define THREAD_BITS 8
/* A request buffer: the largest request is a WRITE of max_write (1 MiB with libfuse 3) plus its
 * headers, and the kernel refuses a read into anything smaller. */
#define REQUEST_SIZE ((1 << 20) + 8192)
/* Files up to this size are read here; larger ones (and their range reads) by Python, whose
 * payload cache holds them between the several READs each takes. */
#define FILE_LIMIT (4 << 20)
/* Files that take several READs (over the kernel's request size, 128 KiB by default) are kept
 * whole in one of these slots between them: a 500 KB image is read and checked once, not four
 * times. Bound: SLOTS * FILE_LIMIT bytes. */
#define SLOTS 16
/* Opcodes counted one by one (FUSE_STATX is 52); the rest share the last counter. */
#define OPCODES 64
/* The index's flag for an lz4-compressed payload (dlfs/core/format.py FLAG_LZ4). */
#define FLAG_LZ4 1
/* READ latencies: bucket k counts those of [2^k, 2^(k+1)) us, bucket 0 also faster ones, the last
 * also slower ones (dlfs/core/protocol.py LATENCY_BUCKETS, latency_bucket). */
#define LATENCY_BUCKETS 32

/* Where the index's columns lie (dlfs/core/format.py SECTIONS) and what replies share. */
struct dataset {
    struct columns c;
    struct reply r;
    const uint32_t *parent, *shard, *offset;
    const uint64_t *checksum;
    const uint8_t *flags;
    const int32_t *shard_fds; /* a descriptor per shard, or -1: its files are read by Python */
    uint64_t count;           /* rows; inodes 1 .. count are the dataset's, the rest the control tree's */
    uint64_t statfs_blocks;
    uint32_t statfs_bsize;
    char control_name[32]; /* the root's hidden control folder, answered by Python */
    uint64_t region;       /* bytes of shard fetched around a file read from storage (0: none) */
    const uint8_t *wanted; /* per row: 1 for a folder whose listings must give every entry attributes */
    uint32_t readdirplus_auto; /* the mount asked the kernel for READDIRPLUS_AUTO */
    const uint32_t *run_parent; /* each folder's run of children (see children()) */
    const int64_t *run_start;
    uint64_t runs;
};

/* Each thread's own, summed when Python asks (dlfs_server_counts): the hot path takes no lock. */
struct counts {
    uint64_t answered[OPCODES], cpu_ns[OPCODES], forwarded[OPCODES], read_bytes, regions;
    uint64_t read_latency[LATENCY_BUCKETS], read_ns; /* READs answered here, from request to reply */
};

struct worker {
    int fd, number;
    pthread_t thread;
    uint8_t *request;
    uint8_t *stored, *plain, *listing; /* a file as stored, decompressed; a listing's reply */
    size_t stored_size, plain_size, listing_size;
    uint8_t *nlinks; /* link counts of a listing's rows (int64_t each) */
    size_t nlinks_size;
    struct counts counts;
};

struct forwarded {
    struct forwarded *next;
    size_t size;
    uint8_t bytes[];
};

struct slot {
    pthread_mutex_t lock;
    uint64_t row1; /* row + 1 of the file held, 0 for none */
    uint64_t size, capacity;
    uint8_t *data;
};

/* Items the C threads gather for Python, which takes them from the front; under queue_lock. */
struct gathered {
    uint8_t *items;
    size_t held, room; /* bytes */
};

/* Folders whose listing began here without attributes for their files, for Python's lister
 * (dlfs_server_take_scanned): uint64_t rows. */
static struct gathered scanned;
/* FORGETs, handed over as one BATCH_FORGET (see gather_forgets): struct fuse_forget_one. */
static struct gathered forgets;
static int forgets_signalled; /* a wake-up for them is outstanding */

static struct dataset ds;
static void wake_python(void);
static struct worker workers[MAX_THREADS];
static int n_workers;
static atomic_int running;
static atomic_int watch_reads;
/* Python waits on this (a semaphore eventfd): one count per queued request, one when all threads
 * have stopped. */
static int wake_fd = -1;
static pthread_mutex_t queue_lock = PTHREAD_MUTEX_INITIALIZER;
static struct forwarded *queue_head, *queue_tail;
static struct slot slots[SLOTS];

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

static void reply(struct worker *w, uint64_t unique, int error, const void *data, size_t size) {
    struct fuse_out_header out = {.len = (uint32_t)(sizeof out + size), .error = error, .unique = unique};
    struct iovec iov[2] = {{&out, sizeof out}, {(void *)data, size}};
    ssize_t n;
    do
        n = writev(w->fd, iov, size ? 2 : 1);
    while (n < 0 && errno == EINTR); /* ENOENT: the request was interrupted, nobody waits for it */
}

static int is_dataset(uint64_t inode) { return inode >= 1 && inode <= ds.count; }

/* The rows whose parent is row: [*start, *stop), empty (1, 1) for a folder without children;
 * from the index's table of runs (dlfs.core.index.Index.run_start, which says why). */
static void children(uint64_t row, uint64_t *start, uint64_t *stop) {
    uint64_t lo = 0, hi = ds.runs;
    while (lo < hi) {
        uint64_t mid = lo + (hi - lo) / 2;
        if (ds.run_parent[mid] < row)
            lo = mid + 1;
        else
            hi = mid;
    }
    if (lo == ds.runs || ds.run_parent[lo] != row) {
        *start = *stop = 1;
        return;
    }
    *start = (uint64_t)ds.run_start[lo];
    *stop = lo + 1 < ds.runs ? (uint64_t)ds.run_start[lo + 1] : ds.count;
}

/* The link count, as dlfs.core.index.Index.link_counts gives it: 2 + subdirectories for a folder. */
static uint32_t nlink(uint64_t row) {
    if (!S_ISDIR(ds.c.mode[row]))
        return 1;
    uint64_t start, stop;
    uint32_t n = 2;
    children(row, &start, &stop);
    for (uint64_t k = start; k < stop; k++)
        n += S_ISDIR(ds.c.mode[k]);
    return n;
}

/* Names are sorted by their bytes, shorter first on a common prefix (Python's bytes order). */
static int compare_name(uint64_t row, const char *name, size_t len) {
    uint64_t start = ds.c.name_off[row], have = ds.c.name_off[row + 1] - start;
    int k = memcmp(ds.c.names + start, name, have < len ? have : len);
    return k ? k : (have > len) - (have < len);
}

static int64_t find_child(uint64_t row, const char *name, size_t len) {
    if (!S_ISDIR(ds.c.mode[row]))
        return -1;
    uint64_t lo, hi;
    children(row, &lo, &hi);
    while (lo < hi) {
        uint64_t mid = lo + (hi - lo) / 2;
        int k = compare_name(mid, name, len);
        if (!k)
            return (int64_t)mid;
        if (k < 0)
            lo = mid + 1;
        else
            hi = mid;
    }
    return -1;
}

static int do_lookup(struct worker *w, const struct fuse_in_header *in, const char *name, size_t room) {
    size_t len = strnlen(name, room);
    if (!is_dataset(in->nodeid) || len == room)
        return 0;
    uint64_t parent = in->nodeid - 1;
    if (parent == 0 && !strcmp(name, ds.control_name))
        return 0;
    int64_t row = !strcmp(name, ".") ? (int64_t)parent
                  : !strcmp(name, "..") ? (int64_t)ds.parent[parent]
                                        : find_child(parent, name, len);
    if (row < 0) {
        reply(w, in->unique, -ENOENT, NULL, 0);
        return 1;
    }
    struct fuse_entry_out e;
    fill_entry(&e, &ds.c, &ds.r, row, nlink((uint64_t)row));
    reply(w, in->unique, 0, &e, sizeof e);
    return 1;
}

static int do_getattr(struct worker *w, const struct fuse_in_header *in) {
    if (!is_dataset(in->nodeid))
        return 0;
    struct fuse_entry_out e;
    uint64_t row = in->nodeid - 1;
    fill_entry(&e, &ds.c, &ds.r, (int64_t)row, nlink(row));
    struct fuse_attr_out a = {.attr_valid = e.attr_valid, .attr_valid_nsec = e.attr_valid_nsec, .attr = e.attr};
    reply(w, in->unique, 0, &a, sizeof a);
    return 1;
}

static int do_statfs(struct worker *w, const struct fuse_in_header *in) {
    struct fuse_statfs_out s = {.st = {.blocks = ds.statfs_blocks, .files = ds.count, .bsize = ds.statfs_bsize,
                                       .frsize = ds.statfs_bsize, .namelen = 255}};
    reply(w, in->unique, 0, &s, sizeof s);
    return 1;
}

static int grow(uint8_t **buffer, size_t *size, size_t need) {
    if (need <= *size)
        return 1;
    uint8_t *bigger = realloc(*buffer, need);
    if (!bigger)
        return 0;
    *buffer = bigger;
    *size = need;
    return 1;
}

/* Append size bytes; 0 when memory ran out (the items are lost, said where it is called). */
static int gather(struct gathered *g, const void *items, size_t size) {
    if (g->held + size > g->room && !grow(&g->items, &g->room, (g->held + size) * 2))
        return 0;
    memcpy(g->items + g->held, items, size);
    g->held += size;
    return 1;
}

/* Move up to most bytes (whole items of item bytes) from the front to out; returns how many. */
static size_t take(struct gathered *g, void *out, size_t most, size_t item) {
    size_t n = (most < g->held ? most : g->held) / item * item;
    memcpy(out, g->items, n);
    g->held -= n;
    memmove(g->items, g->items + n, g->held);
    return n;
}

/* Before a file is read from storage, have the kernel read the whole aligned region of the shard
 * around it into the page cache, in one request: with no published order (shuffle=True) each file
 * would otherwise cost the disk one seek, and on a disk bound by its IOPS a uniformly shuffled epoch
 * runs at the disk's IOPS. A region of 4 MiB holds ~36 ImageNet files; those files' own READs then
 * find them in memory. Only the page cache holds the region (reclaimable, never the daemon's RSS),
 * and the mount turns this off when the shards do not fit in half the machine's memory, where a
 * region would be evicted before the reader came back to it. */
static void fetch_region(struct worker *w, int fd, uint64_t off, uint64_t len) {
    if (!ds.region || cached(fd, (int64_t)off, (int64_t)len) != 0)
        return;
    uint64_t start = off / ds.region * ds.region, end = (off + len + ds.region - 1) / ds.region * ds.region;
    if (posix_fadvise(fd, (off_t)start, (off_t)(end - start), POSIX_FADV_WILLNEED) == 0)
        w->counts.regions++;
}

/* The whole of a file, checked against its checksum: NULL when it cannot be read or does not match
 * (Python then answers, and logs why). */
static const uint8_t *load(struct worker *w, uint64_t row) {
    uint64_t stored = ds.c.stored[row], size = ds.c.size[row];
    int fd = ds.shard_fds[ds.shard[row]];
    fetch_region(w, fd, ds.offset[row], stored);
    if (!grow(&w->stored, &w->stored_size, stored ? stored : 1))
        return NULL;
    if (read_all(fd, w->stored, (int64_t)stored, (int64_t)ds.offset[row], 0) != (int64_t)stored)
        return NULL;
    const uint8_t *data = w->stored;
    if (ds.flags[row] & FLAG_LZ4) {
        if (!grow(&w->plain, &w->plain_size, size ? size : 1) || stored > INT32_MAX)
            return NULL;
        int n = LZ4_decompress_safe((const char *)w->stored, (char *)w->plain, (int)stored, (int)size);
        if (n < 0 || (uint64_t)n != size)
            return NULL;
        data = w->plain;
    } else if (stored != size) {
        return NULL;
    }
    return checksum(data, size) == ds.checksum[row] ? data : NULL;
}

static void reply_range(struct worker *w, uint64_t unique, const uint8_t *data, uint64_t size, uint64_t off,
                        uint32_t want) {
    uint64_t n = off >= size ? 0 : size - off < want ? size - off : want;
    reply(w, unique, 0, data + (off < size ? off : 0), n);
    w->counts.read_bytes += n;
}

static int do_read(struct worker *w, const struct fuse_in_header *in, const struct fuse_read_in *r) {
    if (!is_dataset(in->nodeid) || atomic_load_explicit(&watch_reads, memory_order_relaxed))
        return 0;
    uint64_t row = in->nodeid - 1, size = ds.c.size[row];
    if (!S_ISREG(ds.c.mode[row]) || size > FILE_LIMIT || ds.flags[row] & ~FLAG_LZ4 ||
        ds.shard_fds[ds.shard[row]] < 0)
        return 0;
    int several = size > r->size;
    struct slot *s = &slots[row % SLOTS];
    if (several) {
        pthread_mutex_lock(&s->lock);
        int held = s->row1 == row + 1;
        if (held) /* under the lock: another READ may want the slot for another file meanwhile */
            reply_range(w, in->unique, s->data, s->size, r->offset, r->size);
        pthread_mutex_unlock(&s->lock);
        if (held)
            return 1;
    }
    const uint8_t *data = load(w, row);
    if (!data)
        return 0;
    reply_range(w, in->unique, data, size, r->offset, r->size);
    if (several) {
        pthread_mutex_lock(&s->lock);
        if (grow(&s->data, &s->capacity, size)) {
            memcpy(s->data, data, size);
            s->row1 = row + 1;
            s->size = size;
        }
        pthread_mutex_unlock(&s->lock);
    }
    return 1;
}

/* Listings: READDIR, and READDIRPLUS where the mount runs READDIRPLUS_AUTO and the folder is not
 * one the read-ahead is listing for its inodes (ds.wanted). Those give files no attributes and
 * folders theirs (ATTRS_DIRS), as dlfs.fuse.operations does; the others (every entry with
 * attributes, which the daemon's record of what the kernel knows must see) go to Python. Position
 * 0 is '.', 1 is '..', p >= 2 the folder's child p - 2, and each record names the next position. */
static uint32_t dot_record(uint8_t *out, size_t space, uint64_t inode, uint64_t next, uint32_t len,
                           int plus) {
    uint32_t head = (uint32_t)(sizeof(struct fuse_dirent) + (plus ? sizeof(struct fuse_entry_out) : 0));
    uint32_t size = record_size(head, len);
    if (size > space)
        return 0;
    memset(out, 0, size); /* a zero entry: the kernel takes no attributes from '.' and '..' */
    struct fuse_dirent *d = (struct fuse_dirent *)(out + head - sizeof(struct fuse_dirent));
    d->ino = inode;
    d->off = next;
    d->namelen = len;
    d->type = S_IFDIR >> 12;
    memcpy(d->name, "..", len);
    return size;
}

static void note_scanned(uint64_t row) {
    pthread_mutex_lock(&queue_lock);
    gather(&scanned, &row, sizeof row); /* out of memory: the lister misses a scan, never data */
    pthread_mutex_unlock(&queue_lock);
}

static int do_readdir(struct worker *w, const struct fuse_in_header *in, const struct fuse_read_in *r,
                      int plus) {
    if (!is_dataset(in->nodeid))
        return 0;
    uint64_t row = in->nodeid - 1;
    if (!S_ISDIR(ds.c.mode[row]) || (plus && (!ds.readdirplus_auto || ds.wanted[row])))
        return 0;
    int attrs = plus ? ATTRS_DIRS : ATTRS_NONE;
    if (!grow(&w->listing, &w->listing_size, r->size ? r->size : 1))
        return 0;
    uint64_t start, stop, position = r->offset;
    children(row, &start, &stop);
    size_t at = 0, space = r->size;
    for (; position < 2; position++) {
        uint64_t target = position ? (uint64_t)ds.parent[row] : row;
        uint32_t size = dot_record(w->listing + at, space - at, target + ds.r.inode_base, position + 1,
                                   (uint32_t)position + 1, plus);
        if (!size)
            break;
        at += size;
    }
    if (position >= 2 && start + position - 2 < stop) {
        uint64_t first = start + position - 2;
        size_t head = sizeof(struct fuse_dirent) + (plus ? sizeof(struct fuse_entry_out) : 0);
        size_t n = (space - at) / (head + 8) + 1; /* more rows than this cannot fit */
        n = n < stop - first ? n : stop - first;
        if (!grow(&w->nlinks, &w->nlinks_size, n * sizeof(int64_t)))
            return 0;
        int64_t *links = (int64_t *)(void *)w->nlinks, used = 0;
        for (size_t k = 0; k < n; k++)
            links[k] = attrs == ATTRS_DIRS ? nlink(first + k) : 1;
        dlfs_encode_dirents(w->listing + at, (int64_t)(space - at), (int64_t)first, (int64_t)(first + n),
                            position + 1, attrs, &ds.c, &ds.r, links, &used);
        at += (size_t)used;
    }
    reply(w, in->unique, 0, w->listing, at);
    if (r->offset == 0 && stop > start)
        note_scanned(row);
    return 1;
}

/* FORGET and BATCH_FORGET: the kernel dropped inodes. Python keeps what the read-ahead knows the
 * kernel holds, and needs them, but not one by one: the C threads read as soon as the kernel queues
 * a forget, so an eviction of a million inodes (drop_caches, memory pressure) came as ~900k single
 * FORGETs and ~300k small batches, and Python handled each as a request (a cold `find` of 1.28 M
 * files: 12.8 s instead of 1.1 s). They are gathered here and handed to Python as one BATCH_FORGET
 * whenever it next reads (python_read), however many arrived meanwhile. No reply is due. */
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

/* Answer the request, or return 0 to hand it to Python. */
static int handle(struct worker *w, const struct fuse_in_header *in, const uint8_t *body, size_t size) {
    switch (in->opcode) {
    case FUSE_LOOKUP:
        return do_lookup(w, in, (const char *)body, size);
    case FUSE_GETATTR:
        return do_getattr(w, in);
    case FUSE_READ:
        return size >= sizeof(struct fuse_read_in) && do_read(w, in, (const struct fuse_read_in *)body);
    case FUSE_IOCTL: /* isatty() and friends: a dataset file is no terminal, as on any disk */
        reply(w, in->unique, -ENOTTY, NULL, 0);
        return 1;
    case FUSE_STATFS:
        return do_statfs(w, in);
    case FUSE_INTERRUPT: /* no reply is due; the interrupted request is answered as it would be */
        return 1;
    case FUSE_READDIR:
    case FUSE_READDIRPLUS:
        return size >= sizeof(struct fuse_read_in) &&
               do_readdir(w, in, (const struct fuse_read_in *)body, in->opcode == FUSE_READDIRPLUS);
    case FUSE_FORGET:
    case FUSE_BATCH_FORGET:
        return gather_forgets(in, body, size);
    default:
        return 0;
    }
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
            reply(w, in->unique >> THREAD_BITS, -ENOMEM, NULL, 0);
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
        if (handle(w, in, w->request + sizeof *in, (size_t)n - sizeof *in)) {
            if (op == FUSE_READ)
                note_read_latency(&w->counts, wall_now() - arrived);
            w->counts.answered[op]++;
            w->counts.cpu_ns[op] += cpu_now() - started;
        } else {
            w->counts.forwarded[op]++;
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

/* Take over the mounted session's descriptor: describe the dataset, and return the descriptor
 * Python's loop waits on (libfuse closes it at the end), or -errno. */
int dlfs_server_prepare(const struct dataset *dataset) {
    ds = *dataset;
    for (int k = 0; k < SLOTS; k++)
        pthread_mutex_init(&slots[k].lock, NULL);
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
        if (!w->request) {
            error = ENOMEM;
            break;
        }
        atomic_fetch_add(&running, 1);
        if ((error = pthread_create(&w->thread, NULL, serve, w))) {
            atomic_fetch_sub(&running, 1);
            free(w->request);
            break;
        }
    }
    return n_workers ? n_workers : -error;
}

/* READs of the dataset's files go to Python from now on (1) or are answered here (0): the
 * read-ahead follows a reader by the READs it sees. */
void dlfs_server_watch_reads(int on) { atomic_store(&watch_reads, on); }

/* Take up to room folders whose listing began in C without attributes for their files (Python's
 * lister counts them: a scan of the whole tree is relisted with attributes, for the read-ahead).
 * Returns how many. */
int64_t dlfs_server_take_scanned(uint64_t *out, int64_t room) {
    pthread_mutex_lock(&queue_lock);
    size_t n = take(&scanned, out, (size_t)room * sizeof *out, sizeof *out);
    pthread_mutex_unlock(&queue_lock);
    return (int64_t)(n / sizeof *out);
}

/* Folders listed in C not yet taken by dlfs_server_take_scanned. */
int64_t dlfs_server_scans_pending(void) {
    pthread_mutex_lock(&queue_lock);
    size_t n = scanned.held / sizeof(uint64_t);
    pthread_mutex_unlock(&queue_lock);
    return (int64_t)n;
}

/* Whether any thread still serves: none once the kernel ended the session (an unmount from outside). */
int dlfs_server_running(void) { return atomic_load(&running) > 0; }

/* Sums of every thread's counters (read while they run: each figure may lag by a request). */
void dlfs_server_counts(struct counts *out) {
    memset(out, 0, sizeof *out);
    for (int k = 0; k < n_workers; k++) {
        const struct counts *c = &workers[k].counts;
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
        free(w->stored);
        free(w->plain);
        free(w->listing);
        free(w->nlinks);
        w->request = NULL;
    }
    return left;
}
