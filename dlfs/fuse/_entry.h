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
#define DLFS_INDEX_FORMAT 3

/* The index's columns (dlfs/core/format.py SECTIONS), little-endian like the host this is built for. */
struct columns {
    const uint32_t *name_off; /* one past the last row too: names of row r are [name_off[r], name_off[r+1]) */
    const uint8_t *names;
    const uint16_t *mode, *owner;
    const uint32_t *owners; /* (uid, gid) pairs; row r's are owners[2 * owner[r]] and the next */
    const uint64_t *size, *stored;
    const int64_t *mtime;
    /* The hard-linked rows, increasing, each one's inode row and link count (dlfs/core/hardlinks.py). */
    const uint32_t *hard_rows, *hard_inodes, *hard_nlink;
    uint64_t hard_count;
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

/* The row whose inode row answers as: its own, or its hard-link group's first, whose link count
 * then replaces *nlink. */
static inline int64_t inode_row(const struct columns *c, int64_t row, uint32_t *nlink) {
    uint64_t lo = 0, hi = c->hard_count;
    while (lo < hi) {
        uint64_t mid = lo + (hi - lo) / 2;
        if (c->hard_rows[mid] < (uint64_t)row)
            lo = mid + 1;
        else
            hi = mid;
    }
    if (lo == c->hard_count || c->hard_rows[lo] != (uint64_t)row)
        return row;
    *nlink = c->hard_nlink[lo];
    return c->hard_inodes[lo];
}

/* The entry of a row, which answers as its inode row (inode_row). */
static inline void fill_entry(struct fuse_entry_out *e, const struct columns *c, const struct reply *r,
                              int64_t row, uint32_t nlink) {
    row = inode_row(c, row, &nlink);
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
