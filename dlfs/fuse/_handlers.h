/* The native request server's handlers (_handlers.c): a request's bytes in, its reply written out,
 * from the index's columns and the shards. The thread loop and libfuse's custom I/O (_server.c)
 * call them; dlfs/fuse/server.py sets them up through ctypes and mirrors struct dataset and struct
 * counts, whose layouts _handlers.c exports for it to compare.
 */
#ifndef DLFS_HANDLERS_H
#define DLFS_HANDLERS_H

#include <pthread.h>
#include <stdatomic.h>

#include "_buffer.h"
#include "_dirents.h"

/* For what only the two C files share: kept out of the library's dynamic symbols. */
#define INTERNAL __attribute__((visibility("hidden")))

/* Opcodes counted one by one (FUSE_STATX is 52); the rest share the last counter. */
#define OPCODES 64
/* READ latencies: bucket k counts those of [2^k, 2^(k+1)) us, bucket 0 also faster ones, the last
 * also slower ones (dlfs/core/protocol.py LATENCY_BUCKETS, latency_bucket). */
#define LATENCY_BUCKETS 32
/* Files that take several READs (over the kernel's request size, 128 KiB by default) are kept
 * whole in one of these slots between them: a 500 KB image is read and checked once, not four
 * times. Bound: SLOTS * FILE_LIMIT bytes. */
#define SLOTS 16

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

/* Each thread's own, summed when Python asks (dlfs_server_counts): the hot path takes no lock. The
 * handlers count bytes and regions, the thread loop requests and their time. */
struct counts {
    uint64_t answered[OPCODES], cpu_ns[OPCODES], forwarded[OPCODES], read_bytes, regions;
    uint64_t read_latency[LATENCY_BUCKETS], read_ns; /* READs answered here, from request to reply */
};

struct slot {
    pthread_mutex_t lock;
    uint64_t row1; /* row + 1 of the file held, 0 for none */
    uint64_t size, capacity;
    uint8_t *data;
};

/* What every thread's handlers share, for one mount (dlfs_handlers_new). */
struct handlers {
    struct dataset ds;
    atomic_int watch_reads; /* READs of the dataset's files go to Python (dlfs_handlers_watch_reads) */
    struct slot slots[SLOTS];
    pthread_mutex_t scanned_lock;
    /* Folders whose listing began here without attributes for their files, for Python's lister
     * (dlfs_handlers_take_scanned): uint64_t rows. */
    struct gathered scanned;
};

/* One thread's: where its replies go, its scratch buffers and its counters (dlfs_answerer_new). */
struct answerer {
    struct handlers *h;
    int fd;
    uint8_t *stored, *plain, *listing; /* a file as stored, decompressed; a listing's reply */
    size_t stored_size, plain_size, listing_size;
    uint8_t *nlinks; /* link counts of a listing's rows (int64_t each) */
    size_t nlinks_size;
    struct counts counts;
};

struct handlers *dlfs_handlers_new(const struct dataset *ds);
void dlfs_handlers_free(struct handlers *h);
struct answerer *dlfs_answerer_new(struct handlers *h, int fd);
void dlfs_answerer_free(struct answerer *a);

/* Answer the request (size bytes, its fuse_in_header first) by writing the reply to a->fd, or
 * return 0 to hand it to Python. */
int dlfs_answer(struct answerer *a, const uint8_t *request, size_t size);

/* Write a reply to the kernel through fd: error (-errno, or 0 with size bytes of data). */
INTERNAL void reply(int fd, uint64_t unique, int error, const void *data, size_t size);

#endif
