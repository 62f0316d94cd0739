/* Shard reads through the page cache, and the question whether they would wait for storage (which
 * starts no I/O), shared by the C loops of the read-ahead (dlfs/readahead/_push.c) and of the
 * native request server (dlfs/fuse/_server.c); the Python side of that question is
 * dlfs/core/libc.py's in_memory, and of the read dlfs/core/store/local.py's _read_in_memory.
 * Include after defining _GNU_SOURCE (preadv2, RWF_NOWAIT).
 */
#ifndef DLFS_PAGECACHE_H
#define DLFS_PAGECACHE_H

#include <errno.h>
#include <stdint.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <unistd.h>

/* cachestat's number in the generic syscall table, the same on every architecture. */
#define SYS_CACHESTAT 451

/* Is every page of the range in the page cache? 1 yes, 0 no, -1 cannot tell (a kernel before 6.5
 * has no cachestat). Unlike a read that must not wait, asking starts no read. */
static inline int cached(int fd, int64_t off, int64_t len) {
    struct {
        uint64_t off, len;
    } range = {(uint64_t)off, (uint64_t)len};
    struct {
        uint64_t nr_cache, nr_dirty, nr_writeback, nr_evicted, nr_recently_evicted;
    } stat;
    if (len == 0)
        return 1;
    if (syscall(SYS_CACHESTAT, fd, &range, &stat, 0) != 0)
        return -1;
    int64_t page = sysconf(_SC_PAGESIZE);
    return (int64_t)stat.nr_cache >= (off + len - 1) / page - off / page + 1;
}

/* Read len bytes at off. nowait: only what is in the page cache, or -EAGAIN. Returns bytes read
 * (fewer only at the end of the file) or -errno. A filesystem that cannot promise a read will not
 * wait refuses RWF_NOWAIT (EOPNOTSUPP: tmpfs, squashfs, overlayfs, FUSE); there cachestat answers
 * instead. */
static inline int64_t read_all(int fd, uint8_t *buf, int64_t len, int64_t off, int nowait) {
    int64_t got = 0;
    while (got < len) {
        struct iovec iov = {buf + got, (size_t)(len - got)};
        ssize_t n = preadv2(fd, &iov, 1, off + got, nowait ? RWF_NOWAIT : 0);
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0 && errno == EOPNOTSUPP && nowait) {
            if (cached(fd, off + got, len - got) != 1)
                return -EAGAIN;
            nowait = 0;
            continue;
        }
        if (n < 0)
            return -errno;
        if (n == 0)
            break;
        if (nowait && n < len - got)
            return -EAGAIN; /* a part is cached, the rest would wait for storage */
        got += n;
    }
    return got;
}

#endif
