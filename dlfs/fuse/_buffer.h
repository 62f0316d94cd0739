/* Growable byte buffers, and queues of fixed-size items built on them: a thread's scratch space for a
 * reply (_handlers.c) and what the C threads gather for Python, folders listed (_handlers.c) and
 * FORGETs (_server.c). Callers hold whatever lock guards a buffer.
 */
#ifndef DLFS_BUFFER_H
#define DLFS_BUFFER_H

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* Make *buffer hold at least need bytes; 0 when memory ran out (the buffer is left as it was). */
static inline int grow(uint8_t **buffer, size_t *size, size_t need) {
    if (need <= *size)
        return 1;
    uint8_t *bigger = realloc(*buffer, need);
    if (!bigger)
        return 0;
    *buffer = bigger;
    *size = need;
    return 1;
}

/* Items appended at the back and taken from the front. */
struct gathered {
    uint8_t *items;
    size_t held, room; /* bytes */
};

/* Append size bytes; 0 when memory ran out (the items are lost, said where it is called). */
static inline int gather(struct gathered *g, const void *items, size_t size) {
    if (g->held + size > g->room && !grow(&g->items, &g->room, (g->held + size) * 2))
        return 0;
    memcpy(g->items + g->held, items, size);
    g->held += size;
    return 1;
}

/* Move up to most bytes (whole items of item bytes) from the front to out; returns how many. */
static inline size_t take(struct gathered *g, void *out, size_t most, size_t item) {
    size_t n = (most < g->held ? most : g->held) / item * item;
    memcpy(out, g->items, n);
    g->held -= n;
    memmove(g->items, g->items + n, g->held);
    return n;
}

#endif
