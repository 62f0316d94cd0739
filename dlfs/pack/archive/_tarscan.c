/* Runs of plain tar members parsed, named and checksummed in C, from a buffer of the tar's bytes.
 *
 * In Python each member cost its header's parse, its name's checks and a hashing call, tens of
 * microseconds where an ImageNet member's bytes take a few to read; this loop does all three for a
 * whole buffer in one call. It takes only the common member: a regular file (type '0' or NUL) in a
 * ustar or GNU header with a valid unsigned checksum, numbers in octal or positive base-256, a name
 * that normalises without a rule to apply (no leading '/', no '..', no component past name_max, not
 * the root, no trailing '/') and, when tars are expanded, not NAME.tar. It stops at any other header
 * (pax, GNU long names, sparse files, folders, links, the end-of-archive marker, a damaged header):
 * the Python reader (dlfs/pack/archive/tar.py) takes that one, with tarfile's own rules, so every
 * dialect and every refusal stays where it was. dlfs/pack/archive/tarscan.py is its only caller;
 * build: `make install`.
 */
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <xxhash.h>
#if defined(__x86_64__) || defined(__i386__)
/* libxxhash picks the widest vector unit at run time (AVX2, AVX-512), faster than the default SSE2. */
#include <xxh_x86dispatch.h>
#define checksum XXH3_64bits_dispatch
#else
#define checksum XXH3_64bits
#endif

#define BLOCK 512
#define NS_PER_S 1000000000LL

/* Why a scan stopped (the `stop` output). */
enum {
    STOP_BUFFER = 0, /* the next header or its member's bytes lie past the buffer: read on from `next` */
    STOP_HEADER = 1, /* the header at `next` is one for the Python reader */
    STOP_ROOM = 2,   /* the output columns are full */
};

/* Where a scan puts what it took: one entry per member, paths back to back in `paths`. */
struct run {
    int64_t *offsets;   /* the member's bytes, in the stream */
    int64_t *sizes;
    int64_t *mtimes_ns;
    uint32_t *modes;    /* the mode field & 07777; the caller keeps members.KEPT_MODE of it */
    uint32_t *uids, *gids;
    uint64_t *checksums;
    int64_t *path_ends; /* path i is paths[path_ends[i-1] (0 for the first) : path_ends[i]] */
    int64_t *name_starts;  /* where its last component starts */
    uint8_t *new_folder;   /* 1 where its folder differs from the previous member's in this scan */
    uint8_t *paths;
    int64_t paths_room;
    int32_t room;
};

/* A number field as tarfile.nti reads it, or -1 where this loop leaves the field to Python: a
 * negative base-256 number, one past 63 bits, or octal with anything but spaces around the digits. */
static int number(const uint8_t *field, int width, int64_t *out) {
    uint64_t value = 0;
    if (field[0] == 0x80) {
        for (int i = 1; i < width; i++) {
            if (value >> 55)
                return -1;
            value = value << 8 | field[i];
        }
        if (value > INT64_MAX)
            return -1;
        *out = (int64_t)value;
        return 0;
    }
    int end = 0;
    while (end < width && field[end])
        end++;
    int first = 0;
    while (first < end && field[first] == ' ')
        first++;
    while (end > first && field[end - 1] == ' ')
        end--;
    for (int i = first; i < end; i++) {
        if (field[i] < '0' || field[i] > '7' || value >> 60)
            return -1;
        value = value * 8 + (uint64_t)(field[i] - '0');
    }
    *out = (int64_t)value;
    return 0;
}

static size_t field_length(const uint8_t *field, size_t width) {
    const uint8_t *nul = memchr(field, 0, width);
    return nul ? (size_t)(nul - field) : width;
}

/* Append the components of `raw` to `out` as members.normalize keeps them ('' and '.' dropped),
 * each after a '/' once `*count` components are written; -1 where a rule applies ('..', a component
 * past name_max) or the room runs out. `*last` is where the last component starts in `out`. */
static int normalize(const uint8_t *raw, size_t length, uint8_t *out, int64_t room, int64_t *at,
                     int64_t *last, int *count, int name_max) {
    for (size_t i = 0; i < length;) {
        size_t end = i;
        while (end < length && raw[end] != '/')
            end++;
        size_t part = end - i;
        if (part == 2 && raw[i] == '.' && raw[i + 1] == '.')
            return -1;
        if (part > (size_t)name_max || *at + (int64_t)part + 1 > room)
            return -1;
        if (part && !(part == 1 && raw[i] == '.')) {
            if ((*count)++)
                out[(*at)++] = '/';
            *last = *at;
            memcpy(out + *at, raw + i, part);
            *at += (int64_t)part;
        }
        i = end + 1;
    }
    return 0;
}

/* The member whose header is `header`, written as entry k of `run` (its path from paths[*used]);
 * 0 if it is not one this loop takes. */
static int member(const uint8_t *header, const uint8_t *prefix, int64_t prefix_length, int expand,
                  int name_max, struct run *run, int32_t k, int64_t *used) {
    if (header[156] != '0' && header[156] != 0)
        return 0;
    int64_t sum = 0, chksum, mode, uid, gid, size, mtime, major, minor;
    for (int i = 0; i < BLOCK; i++)
        sum += (i >= 148 && i < 156) ? ' ' : header[i];
    if (number(header + 148, 8, &chksum) || chksum != sum || number(header + 100, 8, &mode) ||
        number(header + 108, 8, &uid) || number(header + 116, 8, &gid) || number(header + 124, 12, &size) ||
        number(header + 136, 12, &mtime) || number(header + 329, 8, &major) || number(header + 337, 8, &minor))
        return 0;
    if (uid >> 32 || gid >> 32 || mtime > INT64_MAX / NS_PER_S)
        return 0;
    size_t name_length = field_length(header, 100);
    /* Only a POSIX header has a name prefix; GNU's keeps atime, ctime and more there (tar.py). */
    size_t ustar_prefix = memcmp(header + 257, "ustar", 6) ? 0 : field_length(header + 345, 155);
    if (name_length == 0 || header[name_length - 1] == '/')
        return 0; /* a folder by tar's old convention, or a name to look at closer */
    if ((ustar_prefix ? header[345] : header[0]) == '/')
        return 0; /* a leading '/': removed, with a warning */

    int64_t start = *used, at = start, last = start;
    if (at + prefix_length > run->paths_room)
        return 0;
    memcpy(run->paths + at, prefix, (size_t)prefix_length);
    at += prefix_length;
    int count = prefix_length > 0;
    if (normalize(header + 345, ustar_prefix, run->paths, run->paths_room, &at, &last, &count, name_max) ||
        normalize(header, name_length, run->paths, run->paths_room, &at, &last, &count, name_max))
        return 0;
    if (count == (prefix_length > 0))
        return 0; /* the root itself */
    if (expand && at - last > 4 && !memcmp(run->paths + at - 4, ".tar", 4))
        return 0; /* a tar to expand */

    run->sizes[k] = size;
    run->mtimes_ns[k] = mtime * NS_PER_S;
    run->modes[k] = (uint32_t)(mode & 07777);
    run->uids[k] = (uint32_t)uid;
    run->gids[k] = (uint32_t)gid;
    run->path_ends[k] = at;
    run->name_starts[k] = last;
    int64_t folder = last - start;
    run->new_folder[k] = 1;
    if (k) {
        int64_t previous = k > 1 ? run->path_ends[k - 2] : 0;
        run->new_folder[k] = !(run->name_starts[k - 1] - previous == folder &&
                               !memcmp(run->paths + previous, run->paths + start, (size_t)folder));
    }
    *used = at;
    return 1;
}

/* Take the plain members of a tar from the header at stream offset `at` on, while each one's header
 * and bytes lie in `buf` (the stream's bytes from `start`, `length` of them) and before `end` (where
 * the tar's bytes end); `hash`: checksum each member's bytes. Members go into the columns (`room`
 * of them, `paths_room` bytes of paths), each path under `prefix`. Returns how many were taken;
 * `*next` is the offset of the first header not taken, `*stop` why (STOP_*). */
int32_t dlfs_tar_scan(const uint8_t *buf, int64_t start, int64_t length, int64_t at, int64_t end,
                      const uint8_t *prefix, int64_t prefix_length, int32_t expand, int32_t hash,
                      int32_t name_max, int32_t room, int64_t paths_room, int64_t *offsets, int64_t *sizes,
                      int64_t *mtimes_ns, uint32_t *modes, uint32_t *uids, uint32_t *gids,
                      uint64_t *checksums, int64_t *path_ends, int64_t *name_starts, uint8_t *new_folder,
                      uint8_t *paths, int64_t *next, int32_t *stop) {
    struct run run = {offsets, sizes, mtimes_ns, modes, uids, gids, checksums, path_ends, name_starts,
                      new_folder, paths, paths_room, room};
    int64_t used = 0, buffered = start + length;
    int32_t k = 0;
    *stop = STOP_HEADER;
    while (1) {
        if (k == room) {
            *stop = STOP_ROOM;
            break;
        }
        if (at + BLOCK > end)
            break; /* a header cut short, which the Python reader reports */
        if (at < start || at + BLOCK > buffered) {
            *stop = STOP_BUFFER;
            break;
        }
        const uint8_t *header = buf + (at - start);
        int64_t before = used;
        if (!member(header, prefix, prefix_length, expand, name_max, &run, k, &used))
            break;
        int64_t size = sizes[k], data = at + BLOCK;
        if (size > end - data) {
            used = before;
            break; /* past the tar's end: cut short, which the Python reader reports */
        }
        if (size > buffered - data) {
            used = before;
            *stop = STOP_BUFFER;
            break;
        }
        offsets[k] = data;
        checksums[k] = hash ? checksum(buf + (data - start), (size_t)size) : 0;
        at = data + ((size + BLOCK - 1) / BLOCK) * BLOCK;
        k++;
    }
    *next = at;
    return k;
}
