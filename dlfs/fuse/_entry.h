/* A FUSE entry (struct fuse_entry_out, attributes included) from the index's columns: shared by the
 * directory listings (_dirents.c) and the native request server (_server.c), so that a LOOKUP and a
 * READDIRPLUS record of one row carry the same bytes.
 */
#ifndef DLFS_ENTRY_H
#define DLFS_ENTRY_H

#include <linux/fuse.h>
#include <stdint.h>
#include <string.h>
#include <sys/stat.h>

/* The index format these columns are laid out for (dlfs/core/format.py FORMAT_VERSION), exported as
 * dlfs_index_format: Python will not use a library built for another, which would read the columns
 * at the wrong widths. */
#define DLFS_INDEX_FORMAT 2

/* The index's columns (dlfs/core/format.py SECTIONS), little-endian like the host this is built for. */
struct columns {
    const uint32_t *name_off; /* one past the last row too: names of row r are [name_off[r], name_off[r+1]) */
    const uint8_t *names;
    const uint16_t *mode, *owner;
    const uint32_t *owners; /* (uid, gid) pairs; row r's are owners[2 * owner[r]] and the next */
    const uint64_t *size, *stored;
    const int64_t *mtime;
};

/* What every entry of a reply shares. */
struct reply {
    uint64_t inode_base; /* inode = row + inode_base */
    uint64_t valid;      /* entry and attribute timeouts */
    uint32_t valid_nsec;
    uint32_t file_blksize, dir_blksize;
};

#define BLOCK 512
#define NSEC 1000000000

static inline void fill_entry(struct fuse_entry_out *e, const struct columns *c, const struct reply *r,
                              int64_t row, uint32_t nlink) {
    uint32_t mode = c->mode[row];
    uint64_t used = S_ISREG(mode) ? c->stored[row] : S_ISDIR(mode) ? c->size[row] : 0;
    int64_t sec = c->mtime[row] / NSEC, nsec = c->mtime[row] % NSEC;
    if (nsec < 0) { /* floor, like numpy's divmod, for times before 1970 */
        nsec += NSEC;
        sec -= 1;
    }
    memset(e, 0, sizeof *e);
    e->nodeid = e->attr.ino = (uint64_t)row + r->inode_base;
    e->entry_valid = e->attr_valid = r->valid;
    e->entry_valid_nsec = e->attr_valid_nsec = r->valid_nsec;
    e->attr.size = c->size[row];
    e->attr.blocks = (used + BLOCK - 1) / BLOCK;
    e->attr.atime = e->attr.mtime = e->attr.ctime = (uint64_t)sec;
    e->attr.atimensec = e->attr.mtimensec = e->attr.ctimensec = (uint32_t)nsec;
    e->attr.mode = mode;
    e->attr.nlink = nlink;
    e->attr.uid = c->owners[2 * c->owner[row]];
    e->attr.gid = c->owners[2 * c->owner[row] + 1];
    e->attr.blksize = S_ISDIR(mode) ? r->dir_blksize : r->file_blksize;
}

#endif
