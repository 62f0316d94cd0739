/* Questions to the page cache that start no I/O, shared by the C loops of the read-ahead
 * (dlfs/readahead/_push.c) and of the native request server (dlfs/fuse/_server.c); the Python side
 * of the same question is dlfs/core/libc.py's in_memory.
 */
#ifndef DLFS_PAGECACHE_H
#define DLFS_PAGECACHE_H

#include <stdint.h>
#include <sys/syscall.h>
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

#endif
