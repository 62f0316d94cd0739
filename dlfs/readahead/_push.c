/* The read-ahead's inner loop in C: read files from shards, check them, push them into the kernel.
 *
 * In Python every file cost the daemon more interpreter time and GIL hand-offs between the fetching
 * threads than the copies themselves. Called through ctypes, which lets go of the GIL, this loop
 * runs on both cores at once and costs about what its system calls cost. dlfs/readahead/native.py
 * is its only caller; build: `make install`.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <linux/aio_abi.h>
#include <linux/fuse.h>
#include <pthread.h>
#include <stdint.h>
#include <string.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <unistd.h>

#include "../core/_pagecache.h"

#include <xxhash.h>
#if defined(__x86_64__) || defined(__i386__)
/* libxxhash picks the widest vector unit at run time (AVX2, AVX-512), faster than the default SSE2. */
#include <xxh_x86dispatch.h>
#define checksum XXH3_64bits_dispatch
#else
#define checksum XXH3_64bits
#endif

/* Direct reads start and end on this boundary (a page: enough for any logical block size). */
#define ALIGN 4096
/* Direct reads in flight per call. */
#define DEPTH 64

/* Store the whole of a file as the page cache of inode nodeid: one FUSE_NOTIFY_STORE message. */
static int push(int fuse_fd, uint64_t nodeid, const uint8_t *data, uint32_t len) {
    struct fuse_notify_store_out store = {.nodeid = nodeid, .offset = 0, .size = len};
    struct fuse_out_header out = {
        .len = (uint32_t)(sizeof out + sizeof store + len), .error = FUSE_NOTIFY_STORE, .unique = 0};
    struct iovec iov[3] = {{&out, sizeof out}, {&store, sizeof store}, {(void *)data, len}};
    ssize_t n;
    do
        n = writev(fuse_fd, iov, 3);
    while (n < 0 && errno == EINTR);
    return n < 0 ? errno : 0;
}

struct files {
    const int32_t *ends; /* read r holds files ends[r-1] (0 for the first) to ends[r] */
    const int64_t *offsets, *lengths;
    const uint64_t *checksums, *nodeids;
    int32_t *status;
};

/* Check and push the files of read r, which put the shard's bytes from `start` in `data` (got
 * bytes, or -errno). */
static void deliver(int fuse_fd, const struct files *f, int r, int64_t start, const uint8_t *data, int64_t got) {
    for (int i = r ? f->ends[r - 1] : 0; i < f->ends[r]; i++) {
        int64_t at = f->offsets[i] - start, len = f->lengths[i];
        if (got < 0)
            f->status[i] = (int32_t)-got;
        else if (at < 0 || at + len > got || len > UINT32_MAX / 2 ||
                 checksum(data + at, (size_t)len) != f->checksums[i])
            f->status[i] = EIO;
        else
            f->status[i] = len && f->nodeids[i] ? push(fuse_fd, f->nodeids[i], data + at, (uint32_t)len) : 0;
    }
}

static int64_t align_down(int64_t x) { return x & ~(int64_t)(ALIGN - 1); }
static int64_t align_up(int64_t x) { return align_down(x + ALIGN - 1); }
/* The room a direct read of len bytes at off takes: widened to ALIGN boundaries both ways. */
static int64_t widened(int64_t off, int64_t len) { return align_up(off + len) - align_down(off); }

/* Each thread's AIO context, made on its first direct read and destroyed when the thread ends: one
 * per call cost milliseconds, as io_destroy waits for an RCU grace period. */
static pthread_key_t context_key;
static pthread_once_t context_once = PTHREAD_ONCE_INIT;

static void context_destroy(void *ctx) { syscall(SYS_io_destroy, (aio_context_t)(uintptr_t)ctx); }

static void context_key_create(void) { pthread_key_create(&context_key, context_destroy); }

static aio_context_t thread_context(void) {
    pthread_once(&context_once, context_key_create);
    aio_context_t ctx = (aio_context_t)(uintptr_t)pthread_getspecific(context_key);
    if (!ctx && syscall(SYS_io_setup, DEPTH, &ctx) == 0)
        pthread_setspecific(context_key, (void *)(uintptr_t)ctx);
    return ctx;
}

/* Reads which[0 .. m) straight from the device (O_DIRECT descriptors), all at once with Linux AIO,
 * so the disk works on them side by side; each read's files are delivered once it and those before
 * it are done. Nothing lands in the shards' page cache: the files' only cached copy is the one
 * pushed to the mount. The buffer holds every read side by side, each widened to ALIGN boundaries.
 * Returns how many of them were delivered (the caller reads the rest through the page cache), or
 * -errno when nothing could be submitted. */
static int read_direct(int fuse_fd, uint8_t *buffer, int64_t buffer_size, const int32_t *which, int m,
                       const int32_t *fds, const int32_t *direct_fds, const int64_t *offsets,
                       const int64_t *lengths, const struct files *f) {
    uint8_t *base = (uint8_t *)(uintptr_t)align_up((int64_t)(uintptr_t)buffer);
    int64_t room = buffer_size - (base - buffer), need = 0;
    for (int k = 0; k < m; k++)
        need += widened(offsets[which[k]], lengths[which[k]]);
    if (need > room)
        return -EFBIG;
    aio_context_t ctx = thread_context();
    if (!ctx)
        return -EAGAIN;
    struct iocb cbs[DEPTH], *list[DEPTH];
    int64_t results[DEPTH], slot = 0;
    uint8_t *data[DEPTH];
    int submitted = 0, done = 0;
    while (done < m) {
        int batch = 0;
        for (; submitted + batch < m && submitted + batch - done < DEPTH; batch++) {
            int k = submitted + batch, r = which[k];
            int64_t start = align_down(offsets[r]), size = widened(offsets[r], lengths[r]);
            struct iocb *cb = &cbs[k % DEPTH];
            memset(cb, 0, sizeof *cb);
            cb->aio_data = (uint64_t)k;
            cb->aio_lio_opcode = IOCB_CMD_PREAD;
            cb->aio_fildes = (uint32_t)direct_fds[r];
            cb->aio_buf = (uint64_t)(uintptr_t)(base + slot);
            cb->aio_nbytes = (uint64_t)size;
            cb->aio_offset = start;
            data[k % DEPTH] = base + slot;
            results[k % DEPTH] = INT64_MIN;
            list[batch] = cb;
            slot += size;
        }
        long took = batch ? syscall(SYS_io_submit, ctx, batch, list) : 0;
        if (took > 0)
            submitted += (int)took;
        for (int k = submitted; k < submitted + batch - (took > 0 ? took : 0); k++) /* not taken: reuse */
            slot -= widened(offsets[which[k]], lengths[which[k]]);
        if (submitted == done) /* the kernel took nothing: stop here, the caller reads the rest */
            return done ? done : -EAGAIN;
        while (results[done % DEPTH] == INT64_MIN) {
            struct io_event events[DEPTH];
            long got = syscall(SYS_io_getevents, ctx, 1, DEPTH, events, NULL);
            if (got < 0 && errno != EINTR) { /* a broken context: drop it, the caller reads the rest */
                pthread_setspecific(context_key, NULL);
                context_destroy((void *)(uintptr_t)ctx); /* waits for what is in flight */
                return done ? done : -EAGAIN;
            }
            for (long e = 0; e < got; e++)
                results[events[e].data % DEPTH] = events[e].res;
        }
        int r = which[done];
        int64_t start = align_down(offsets[r]), got = results[done % DEPTH];
        if (got < 0) { /* say the filesystem refuses this direct read: take it through the page cache */
            start = offsets[r];
            got = read_all(fds[r], data[done % DEPTH], lengths[r], start, 0);
        }
        deliver(fuse_fd, f, r, start, data[done % DEPTH], got);
        done++;
    }
    return m;
}

/* Read r through the page cache into the start of the buffer (nowait: only what is cached). */
static int64_t read_cached(const int32_t *fds, const int64_t *offsets, const int64_t *lengths, int r,
                           uint8_t *buffer, int64_t buffer_size, int nowait) {
    return lengths[r] > buffer_size ? -EFBIG : read_all(fds[r], buffer, lengths[r], offsets[r], nowait);
}

/* Storage reads, each followed by the files it holds. Read r (lengths[r] bytes at offsets[r] of
 * fds[r]) holds the files from ends[r-1] (0 for the first) to ends[r]. File i lies at shard offset
 * file_offsets[i], file_lengths[i] bytes, stored plain: check its xxh3-64 against checksums[i] and
 * push it as inode nodeids[i] (0: check it, push nothing). status[i] = 0 (done) or a positive
 * errno: EIO (checksum mismatch, or the shard ends early), ENOENT (the kernel does not know the
 * inode), EFBIG (the read is larger than the buffer), or the error of the read or of the push.
 *
 * Each read goes where its bytes are: through the page cache when it holds all of them (cachestat
 * says so, and a read that would wait after all is refused, RWF_NOWAIT), else with O_DIRECT from
 * direct_fds (where one is -1: through the page cache), all such reads at once. Each read is
 * decided on its own: sending the rest of a batch to the disk once one read found storage cold would
 * send hundreds of cached files to the disk for a few pages a warm shard lacks. Returns 1 when it
 * read directly, else 0. */
int dlfs_push_files(int fuse_fd, uint8_t *buffer, int64_t buffer_size, int n_reads, const int32_t *fds,
                    const int32_t *direct_fds, const int64_t *offsets, const int64_t *lengths, const int32_t *ends,
                    const int64_t *file_offsets, const int64_t *file_lengths, const uint64_t *checksums,
                    const uint64_t *nodeids, int32_t *status) {
    struct files f = {ends, file_offsets, file_lengths, checksums, nodeids, status};
    int32_t which[n_reads];
    int m = 0;
    for (int r = 0; r < n_reads; r++) {
        int may_wait = direct_fds[r] < 0;
        if (!may_wait && cached(fds[r], offsets[r], lengths[r]) == 0) {
            which[m++] = r;
            continue;
        }
        int64_t got = read_cached(fds, offsets, lengths, r, buffer, buffer_size, !may_wait);
        if (got == -EAGAIN && !may_wait)
            which[m++] = r;
        else
            deliver(fuse_fd, &f, r, offsets[r], buffer, got);
    }
    if (!m)
        return 0;
    int got = read_direct(fuse_fd, buffer, buffer_size, which, m, fds, direct_fds, offsets, lengths, &f);
    for (int k = got < 0 ? 0 : got; k < m; k++) { /* through the page cache after all */
        int r = which[k];
        deliver(fuse_fd, &f, r, offsets[r], buffer, read_cached(fds, offsets, lengths, r, buffer, buffer_size, 0));
    }
    return 1;
}
