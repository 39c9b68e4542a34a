/* Stand-in for the UPMEM SDK <barrier.h> (make check only).
 *
 * Tasklets are threads, and a barrier really blocks them until `count` have arrived. When
 * every running tasklet is blocked, or one returns while others wait, nothing can release
 * them: the stand-in reports the deadlock instead of hanging.
 *
 * As the SDK's (syslib/barrier.h): `BARRIER_INIT(name, counter)` defines the barrier, whose
 * counter must be a constant below 128 (the SDK stores it in a byte, in assembly), and
 * `void barrier_wait(barrier_t *barrier)` waits at it.
 */
#ifndef STANDIN_BARRIER_H
#define STANDIN_BARRIER_H

typedef struct barrier_t {
    unsigned count;      /* tasklets that must arrive */
    const char *name;
    unsigned arrived;    /* in the current round */
    unsigned generation; /* rounds completed */
} barrier_t;

#define BARRIER_INIT(name, counter)                                                         \
    _Static_assert((counter) < 128 && (counter) >= -127,                                  \
                   "barrier counter must be encoded on a byte");                          \
    static barrier_t name __attribute__((used)) = {(counter), #name, 0, 0}

void barrier_wait(barrier_t *barrier);

#endif
