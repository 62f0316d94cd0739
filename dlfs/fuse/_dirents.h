/* Directory records in the kernel's FUSE wire format (_dirents.c): for dlfs/fuse/dirents.py through
 * ctypes, and for the native request server (_server.c), which is linked with it.
 */
#ifndef DLFS_DIRENTS_H
#define DLFS_DIRENTS_H

#include "_entry.h"

/* What a record carries besides name, inode and type (Attributes in dlfs/fuse/dirents.py). */
enum attrs { ATTRS_NONE, ATTRS_ALL, ATTRS_DIRS };

static inline uint32_t record_size(uint32_t head, uint64_t namelen) {
    return (uint32_t)((head + namelen + 7) & ~(uint64_t)7); /* FUSE_DIRENT_ALIGN */
}

int64_t dlfs_encode_dirents(uint8_t *out, int64_t space, int64_t first, int64_t stop, uint64_t first_next,
                            int attrs, const struct columns *c, const struct reply *r, const int64_t *nlink,
                            int64_t *used);

#endif
