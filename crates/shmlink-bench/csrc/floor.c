/* floor-c: the minimal shared-memory ping-pong ring, the floor the shmlink rows are
 * compared with. One ring of fixed-size slots per direction; a slot is a word (the
 * message's number + 1 in the high 32 bits, its length in the low 32) and the bytes.
 * The sender copies the bytes in and stores the word (release); the receiver spins on
 * the word of the slot it expects (acquire), copies the bytes out and stores its count
 * of messages taken (release), which the sender reloads only when the ring looks full.
 * No validation, no wake-up: what two cores need to pass a message, and no more.
 *
 * Ring layout: word 0 (offset 0): messages taken by the receiver; slots from offset 128,
 * each `stride` bytes (a multiple of 64), the word first, the bytes at +8. */

#include <sched.h>
#include <stdint.h>
#include <string.h>

struct floor_end {
    unsigned char *tx;   /* the ring this end writes */
    unsigned char *rx;   /* the ring this end reads */
    uint64_t nslots;
    uint64_t stride;
    uint64_t sent;       /* messages written to tx */
    uint64_t tx_taken;   /* tx's receiver count, as last loaded */
    uint64_t received;   /* messages taken from rx */
    int yield;           /* both ends on one CPU: give it up while waiting */
};

#define SLOTS_AT 128

static inline uint64_t load_acquire(const unsigned char *p)
{
    return __atomic_load_n((const uint64_t *)p, __ATOMIC_ACQUIRE);
}

static inline void store_release(unsigned char *p, uint64_t v)
{
    __atomic_store_n((uint64_t *)p, v, __ATOMIC_RELEASE);
}

static inline void wait_a_little(const struct floor_end *e)
{
    if (e->yield)
        sched_yield();
}

/* Sends `len` bytes (len + 8 <= stride). */
void floor_send(struct floor_end *e, const unsigned char *msg, uint64_t len)
{
    while (e->sent - e->tx_taken >= e->nslots) {
        e->tx_taken = load_acquire(e->tx);
        if (e->sent - e->tx_taken >= e->nslots)
            wait_a_little(e);
    }
    unsigned char *slot = e->tx + SLOTS_AT + (e->sent % e->nslots) * e->stride;
    memcpy(slot + 8, msg, len);
    e->sent++;
    store_release(slot, (e->sent << 32) | len);
}

/* Receives the next message into `buf` (room for `cap` bytes); returns its length, or
 * -1 if it is longer than `cap` (left unread). */
int64_t floor_recv(struct floor_end *e, unsigned char *buf, uint64_t cap)
{
    unsigned char *slot = e->rx + SLOTS_AT + (e->received % e->nslots) * e->stride;
    uint64_t want = (e->received + 1) & 0xffffffffu;
    uint64_t word;
    while (((word = load_acquire(slot)) >> 32) != want)
        wait_a_little(e);
    uint64_t len = word & 0xffffffffu;
    if (len > cap)
        return -1;
    memcpy(buf, slot + 8, len);
    e->received++;
    store_release(e->rx, e->received);
    return (int64_t)len;
}
