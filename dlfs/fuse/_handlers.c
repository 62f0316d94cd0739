/* The hot requests of a mount answered from the index's columns and the shards: a request's bytes in,
 * its reply written to the descriptor it came from.
 *
 * LOOKUP, GETATTR and READ of the dataset's entries, listings that give files no attributes, IOCTL
 * (ENOTTY: no dataset file is a terminal) and STATFS are answered here; every other request (the
 * .dlfs control tree, listings with every entry's attributes, files the read-ahead watches or that
 * are not read here) is left to Python, which the thread loop (_server.c) hands it to unchanged.
 *
 * A READ returns bytes only after the whole file matched its xxh3-64; a file that does not (or a
 * failed read) goes to Python, which answers EIO and logs it, once. The thread loop is the caller
 * in a mount, tests/fuse/test_handlers.py over a socket pair; build: `make install`.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <lz4.h>
#include <stddef.h>
#include <sys/uio.h>

#include "../core/_pagecache.h"
#include "_handlers.h"

#include <xxhash.h>
#if defined(__x86_64__) || defined(__i386__)
#include <xxh_x86dispatch.h>
#define xxh3 XXH3_64bits_dispatch
#else
#define xxh3 XXH3_64bits
#endif

/* Files up to this size are read here; larger ones (and their range reads) by Python, whose
 * RAM cache holds them between the several READs each takes. */
#define FILE_LIMIT (4 << 20)
/* The index's flag for an lz4-compressed payload (dlfs/core/format.py FLAG_LZ4). */
#define FLAG_LZ4 1

/* The layouts of the structs dlfs/fuse/server.py mirrors with ctypes, which it compares before it
 * uses this library: how many fields, the size, then each field's offset in declaration order. */
const uint64_t dlfs_dataset_layout[] = {
    19, sizeof(struct dataset), offsetof(struct dataset, c), offsetof(struct dataset, r),
    offsetof(struct dataset, parent), offsetof(struct dataset, shard), offsetof(struct dataset, offset),
    offsetof(struct dataset, checksum), offsetof(struct dataset, flags), offsetof(struct dataset, shard_fds),
    offsetof(struct dataset, shard_base),
    offsetof(struct dataset, count), offsetof(struct dataset, statfs_blocks),
    offsetof(struct dataset, statfs_bsize), offsetof(struct dataset, control_name),
    offsetof(struct dataset, region), offsetof(struct dataset, wanted), offsetof(struct dataset, readdirplus_auto),
    offsetof(struct dataset, run_parent), offsetof(struct dataset, run_start), offsetof(struct dataset, runs)
};
const uint64_t dlfs_counts_layout[] = {
    7, sizeof(struct counts), offsetof(struct counts, answered), offsetof(struct counts, cpu_ns),
    offsetof(struct counts, forwarded), offsetof(struct counts, read_bytes), offsetof(struct counts, regions),
    offsetof(struct counts, read_latency), offsetof(struct counts, read_ns)
};

void reply(int fd, uint64_t unique, int error, const void *data, size_t size) {
    struct fuse_out_header out = {.len = (uint32_t)(sizeof out + size), .error = error, .unique = unique};
    struct iovec iov[2] = {{&out, sizeof out}, {(void *)data, size}};
    ssize_t n;
    do
        n = writev(fd, iov, size ? 2 : 1);
    while (n < 0 && errno == EINTR); /* ENOENT: the request was interrupted, nobody waits for it */
}

static int is_dataset(const struct dataset *ds, uint64_t inode) { return inode >= 1 && inode <= ds->count; }

/* The rows whose parent is row: [*start, *stop), empty (1, 1) for a folder without children;
 * from the index's table of runs (dlfs.core.index.Index.run_start, which says why). */
static void children(const struct dataset *ds, uint64_t row, uint64_t *start, uint64_t *stop) {
    uint64_t lo = 0, hi = ds->runs;
    while (lo < hi) {
        uint64_t mid = lo + (hi - lo) / 2;
        if (ds->run_parent[mid] < row)
            lo = mid + 1;
        else
            hi = mid;
    }
    if (lo == ds->runs || ds->run_parent[lo] != row) {
        *start = *stop = 1;
        return;
    }
    *start = (uint64_t)ds->run_start[lo];
    *stop = lo + 1 < ds->runs ? (uint64_t)ds->run_start[lo + 1] : ds->count;
}

/* The link count, as dlfs.core.index.Index.link_counts gives it: 2 + subdirectories for a folder. */
static uint32_t nlink(const struct dataset *ds, uint64_t row) {
    if (!S_ISDIR(ds->c.mode[row]))
        return 1;
    uint64_t start, stop;
    uint32_t n = 2;
    children(ds, row, &start, &stop);
    for (uint64_t k = start; k < stop; k++)
        n += S_ISDIR(ds->c.mode[k]);
    return n;
}

/* Names are sorted by their bytes, shorter first on a common prefix (Python's bytes order). */
static int compare_name(const struct dataset *ds, uint64_t row, const char *name, size_t len) {
    uint64_t start = ds->c.name_off[row], have = ds->c.name_off[row + 1] - start;
    int k = memcmp(ds->c.names + start, name, have < len ? have : len);
    return k ? k : (have > len) - (have < len);
}

static int64_t find_child(const struct dataset *ds, uint64_t row, const char *name, size_t len) {
    if (!S_ISDIR(ds->c.mode[row]))
        return -1;
    uint64_t lo, hi;
    children(ds, row, &lo, &hi);
    while (lo < hi) {
        uint64_t mid = lo + (hi - lo) / 2;
        int k = compare_name(ds, mid, name, len);
        if (!k)
            return (int64_t)mid;
        if (k < 0)
            lo = mid + 1;
        else
            hi = mid;
    }
    return -1;
}

static int do_lookup(struct answerer *a, const struct fuse_in_header *in, const char *name, size_t room) {
    const struct dataset *ds = &a->h->ds;
    size_t len = strnlen(name, room);
    if (!is_dataset(ds, in->nodeid) || len == room)
        return 0;
    uint64_t parent = in->nodeid - 1;
    if (parent == 0 && !strcmp(name, ds->control_name))
        return 0;
    int64_t row = !strcmp(name, ".") ? (int64_t)parent
                  : !strcmp(name, "..") ? (int64_t)ds->parent[parent]
                                        : find_child(ds, parent, name, len);
    if (row < 0) {
        reply(a->fd, in->unique, -ENOENT, NULL, 0);
        return 1;
    }
    struct fuse_entry_out e;
    fill_entry(&e, &ds->c, &ds->r, row, nlink(ds, (uint64_t)row));
    reply(a->fd, in->unique, 0, &e, sizeof e);
    return 1;
}

static int do_getattr(struct answerer *a, const struct fuse_in_header *in) {
    const struct dataset *ds = &a->h->ds;
    if (!is_dataset(ds, in->nodeid))
        return 0;
    struct fuse_entry_out e;
    uint64_t row = in->nodeid - 1;
    fill_entry(&e, &ds->c, &ds->r, (int64_t)row, nlink(ds, row));
    struct fuse_attr_out out = {.attr_valid = e.attr_valid, .attr_valid_nsec = e.attr_valid_nsec, .attr = e.attr};
    reply(a->fd, in->unique, 0, &out, sizeof out);
    return 1;
}

static int do_statfs(struct answerer *a, const struct fuse_in_header *in) {
    const struct dataset *ds = &a->h->ds;
    struct fuse_statfs_out s = {.st = {.blocks = ds->statfs_blocks, .files = ds->count, .bsize = ds->statfs_bsize,
                                       .frsize = ds->statfs_bsize, .namelen = 255}};
    reply(a->fd, in->unique, 0, &s, sizeof s);
    return 1;
}

/* Before a file is read from storage, have the kernel read the whole aligned region of the shard
 * around it into the page cache, in one request: with no published order (shuffle=True) each file
 * would otherwise cost the disk one seek, and on a disk bound by its IOPS a uniformly shuffled epoch
 * runs at the disk's IOPS. The files that share the region with it then find their bytes in memory
 * when their own READs come. Only the page cache holds the region (reclaimable, never the
 * daemon's RSS), and the mount turns this off when the shards do not fit in half the machine's
 * memory, where a region would be evicted before the reader came back to it. */
static void fetch_region(struct answerer *a, int fd, uint64_t off, uint64_t len) {
    uint64_t region = a->h->ds.region;
    if (!region || cached(fd, (int64_t)off, (int64_t)len) != 0)
        return;
    uint64_t start = off / region * region, end = (off + len + region - 1) / region * region;
    if (posix_fadvise(fd, (off_t)start, (off_t)(end - start), POSIX_FADV_WILLNEED) == 0)
        a->counts.regions++;
}

/* The whole of a file, checked against its checksum: NULL when it cannot be read or does not match
 * (Python then answers, and logs why). */
static const uint8_t *load(struct answerer *a, uint64_t row) {
    const struct dataset *ds = &a->h->ds;
    uint64_t stored = ds->c.stored[row], size = ds->c.size[row];
    uint32_t shard = ds->shard[row];
    int fd = ds->shard_fds[shard];
    int64_t at = ds->shard_base[shard] + (int64_t)ds->offset[row];
    fetch_region(a, fd, (uint64_t)at, stored);
    if (!grow(&a->stored, &a->stored_size, stored ? stored : 1))
        return NULL;
    if (read_all(fd, a->stored, (int64_t)stored, at, 0) != (int64_t)stored)
        return NULL;
    const uint8_t *data = a->stored;
    if (ds->flags[row] & FLAG_LZ4) {
        if (!grow(&a->plain, &a->plain_size, size ? size : 1) || stored > INT32_MAX)
            return NULL;
        int n = LZ4_decompress_safe((const char *)a->stored, (char *)a->plain, (int)stored, (int)size);
        if (n < 0 || (uint64_t)n != size)
            return NULL;
        data = a->plain;
    } else if (stored != size) {
        return NULL;
    }
    return xxh3(data, size) == ds->checksum[row] ? data : NULL;
}

static void reply_range(struct answerer *a, uint64_t unique, const uint8_t *data, uint64_t size, uint64_t off,
                        uint32_t want) {
    uint64_t n = off >= size ? 0 : size - off < want ? size - off : want;
    reply(a->fd, unique, 0, data + (off < size ? off : 0), n);
    a->counts.read_bytes += n;
}

static int do_read(struct answerer *a, const struct fuse_in_header *in, const struct fuse_read_in *r) {
    struct handlers *h = a->h;
    const struct dataset *ds = &h->ds;
    if (!is_dataset(ds, in->nodeid) || atomic_load_explicit(&h->watch_reads, memory_order_relaxed))
        return 0;
    uint64_t row = in->nodeid - 1, size = ds->c.size[row];
    if (!S_ISREG(ds->c.mode[row]) || size > FILE_LIMIT || ds->flags[row] & ~FLAG_LZ4 ||
        ds->shard_fds[ds->shard[row]] < 0)
        return 0;
    int several = size > r->size;
    struct slot *s = &h->slots[row % SLOTS];
    if (several) {
        pthread_mutex_lock(&s->lock);
        int held = s->row1 == row + 1;
        if (held) /* under the lock: another READ may want the slot for another file meanwhile */
            reply_range(a, in->unique, s->data, s->size, r->offset, r->size);
        pthread_mutex_unlock(&s->lock);
        if (held)
            return 1;
    }
    const uint8_t *data = load(a, row);
    if (!data)
        return 0;
    reply_range(a, in->unique, data, size, r->offset, r->size);
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
 * one the read-ahead is listing for its inodes (ds->wanted). Those give files no attributes and
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

static void note_scanned(struct handlers *h, uint64_t row) {
    pthread_mutex_lock(&h->scanned_lock);
    gather(&h->scanned, &row, sizeof row); /* out of memory: the lister misses a scan, never data */
    pthread_mutex_unlock(&h->scanned_lock);
}

static int do_readdir(struct answerer *a, const struct fuse_in_header *in, const struct fuse_read_in *r,
                      int plus) {
    const struct dataset *ds = &a->h->ds;
    if (!is_dataset(ds, in->nodeid))
        return 0;
    uint64_t row = in->nodeid - 1;
    if (!S_ISDIR(ds->c.mode[row]) || (plus && (!ds->readdirplus_auto || ds->wanted[row])))
        return 0;
    int attrs = plus ? ATTRS_DIRS : ATTRS_NONE;
    if (!grow(&a->listing, &a->listing_size, r->size ? r->size : 1))
        return 0;
    uint64_t start, stop, position = r->offset;
    children(ds, row, &start, &stop);
    size_t at = 0, space = r->size;
    for (; position < 2; position++) {
        uint64_t target = position ? (uint64_t)ds->parent[row] : row;
        uint32_t size = dot_record(a->listing + at, space - at, target + ds->r.inode_base, position + 1,
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
        if (!grow(&a->nlinks, &a->nlinks_size, n * sizeof(int64_t)))
            return 0;
        int64_t *links = (int64_t *)(void *)a->nlinks, used = 0;
        for (size_t k = 0; k < n; k++)
            links[k] = attrs == ATTRS_DIRS ? nlink(ds, first + k) : 1;
        dlfs_encode_dirents(a->listing + at, (int64_t)(space - at), (int64_t)first, (int64_t)(first + n),
                            position + 1, attrs, &ds->c, &ds->r, links, &used);
        at += (size_t)used;
    }
    reply(a->fd, in->unique, 0, a->listing, at);
    if (r->offset == 0 && stop > start)
        note_scanned(a->h, row);
    return 1;
}

int dlfs_answer(struct answerer *a, const uint8_t *request, size_t size) {
    if (size < sizeof(struct fuse_in_header))
        return 0;
    const struct fuse_in_header *in = (const struct fuse_in_header *)request;
    const uint8_t *body = request + sizeof *in;
    size -= sizeof *in;
    switch (in->opcode) {
    case FUSE_LOOKUP:
        return do_lookup(a, in, (const char *)body, size);
    case FUSE_GETATTR:
        return do_getattr(a, in);
    case FUSE_READ:
        return size >= sizeof(struct fuse_read_in) && do_read(a, in, (const struct fuse_read_in *)body);
    case FUSE_IOCTL: /* isatty() and friends: a dataset file is no terminal, as on any disk */
        reply(a->fd, in->unique, -ENOTTY, NULL, 0);
        return 1;
    case FUSE_STATFS:
        return do_statfs(a, in);
    case FUSE_INTERRUPT: /* no reply is due; the interrupted request is answered as it would be */
        return 1;
    case FUSE_READDIR:
    case FUSE_READDIRPLUS:
        return size >= sizeof(struct fuse_read_in) &&
               do_readdir(a, in, (const struct fuse_read_in *)body, in->opcode == FUSE_READDIRPLUS);
    default:
        return 0;
    }
}

/* The handlers of one mount, answering from a copy of *ds (whose columns the caller keeps), or NULL
 * when memory ran out. */
struct handlers *dlfs_handlers_new(const struct dataset *ds) {
    struct handlers *h = calloc(1, sizeof *h);
    if (!h)
        return NULL;
    h->ds = *ds;
    for (int k = 0; k < SLOTS; k++)
        pthread_mutex_init(&h->slots[k].lock, NULL);
    pthread_mutex_init(&h->scanned_lock, NULL);
    return h;
}

/* Once no thread answers with them any more. */
void dlfs_handlers_free(struct handlers *h) {
    for (int k = 0; k < SLOTS; k++) {
        pthread_mutex_destroy(&h->slots[k].lock);
        free(h->slots[k].data);
    }
    pthread_mutex_destroy(&h->scanned_lock);
    free(h->scanned.items);
    free(h);
}

/* READs of the dataset's files go to Python from now on (1) or are answered here (0): the
 * read-ahead follows a reader by the READs it sees. */
void dlfs_handlers_watch_reads(struct handlers *h, int on) { atomic_store(&h->watch_reads, on); }

/* Take up to room folders whose listing began here without attributes for their files (Python's
 * lister counts them: a scan of the whole tree is relisted with attributes, for the read-ahead).
 * Returns how many. */
int64_t dlfs_handlers_take_scanned(struct handlers *h, uint64_t *out, int64_t room) {
    pthread_mutex_lock(&h->scanned_lock);
    size_t n = take(&h->scanned, out, (size_t)room * sizeof *out, sizeof *out);
    pthread_mutex_unlock(&h->scanned_lock);
    return (int64_t)(n / sizeof *out);
}

/* Folders listed here not yet taken by dlfs_handlers_take_scanned. */
int64_t dlfs_handlers_scans_pending(struct handlers *h) {
    pthread_mutex_lock(&h->scanned_lock);
    size_t n = h->scanned.held / sizeof(uint64_t);
    pthread_mutex_unlock(&h->scanned_lock);
    return (int64_t)n;
}

/* A thread's answerer, whose replies go to fd, or NULL when memory ran out. */
struct answerer *dlfs_answerer_new(struct handlers *h, int fd) {
    struct answerer *a = calloc(1, sizeof *a);
    if (a) {
        a->h = h;
        a->fd = fd;
    }
    return a;
}

void dlfs_answerer_free(struct answerer *a) {
    free(a->stored);
    free(a->plain);
    free(a->listing);
    free(a->nlinks);
    free(a);
}
