/* Directory listings in the kernel's FUSE wire format, one loop over a run of index rows.
 *
 * The numpy encoder in dlfs/fuse/dirents.py makes about thirty array calls per reply, most of what
 * a cold ImageFolder scan waits for in the daemon; this loop writes the same bytes with none.
 * dlfs/fuse/dirents.py calls it through ctypes, the native request server (_handlers.c) directly;
 * build: `make install`.
 */
#include <stddef.h>

#include "_dirents.h"

/* In _server.so too, which links this file. */
const uint32_t dlfs_index_format = DLFS_INDEX_FORMAT;

/* The layouts of the structs dlfs/fuse/dirents.py mirrors with ctypes, which it compares before it
 * uses this library: how many fields, the size, then each field's offset in declaration order. */
const uint64_t dlfs_columns_layout[] = {
    12, sizeof(struct columns), offsetof(struct columns, name_off), offsetof(struct columns, names),
    offsetof(struct columns, mode), offsetof(struct columns, owner), offsetof(struct columns, owners),
    offsetof(struct columns, size), offsetof(struct columns, stored), offsetof(struct columns, mtime),
    offsetof(struct columns, hard_rows), offsetof(struct columns, hard_inodes),
    offsetof(struct columns, hard_nlink), offsetof(struct columns, hard_count)
};
const uint64_t dlfs_reply_layout[] = {
    5, sizeof(struct reply), offsetof(struct reply, inode_base), offsetof(struct reply, valid),
    offsetof(struct reply, valid_nsec), offsetof(struct reply, file_blksize), offsetof(struct reply, dir_blksize)
};

/* Records (READDIRPLUS ones unless attrs is ATTRS_NONE) for rows first, first+1, ... below stop, as
 * many as fit whole in space bytes of out; row first + k says the listing goes on at offset
 * first_next + k.
 * nlink[k]: the link count of row first + k (directories count their subdirectories, which the
 * caller knows). Returns how many rows; *used: the bytes written. */
int64_t dlfs_encode_dirents(uint8_t *out, int64_t space, int64_t first, int64_t stop, uint64_t first_next,
                            int attrs, const struct columns *c, const struct reply *r, const int64_t *nlink,
                            int64_t *used) {
    uint32_t head = (uint32_t)(sizeof(struct fuse_dirent) + (attrs ? sizeof(struct fuse_entry_out) : 0));
    int64_t at = 0, row;
    for (row = first; row < stop; row++) {
        uint64_t start = c->name_off[row], namelen = c->name_off[row + 1] - start;
        uint32_t size = record_size(head, namelen);
        if (at + size > space)
            break;
        uint8_t *record = out + at;
        struct fuse_dirent *d = (struct fuse_dirent *)(record + head - sizeof(struct fuse_dirent));
        if (attrs == ATTRS_ALL || (attrs == ATTRS_DIRS && S_ISDIR(c->mode[row])))
            fill_entry((struct fuse_entry_out *)record, c, r, row, (uint32_t)nlink[row - first]);
        else if (attrs == ATTRS_DIRS) /* node id 0: the kernel builds nothing for this name */
            memset(record, 0, sizeof(struct fuse_entry_out));
        uint32_t nlink_unused;
        d->ino = (uint64_t)inode_row(c, row, &nlink_unused) + r->inode_base;
        d->off = first_next + (uint64_t)(row - first);
        d->namelen = (uint32_t)namelen;
        d->type = (c->mode[row] & S_IFMT) >> 12;
        memcpy(d->name, c->names + start, namelen);
        memset(d->name + namelen, 0, size - head - namelen);
        at += size;
    }
    *used = at;
    return row - first;
}
