/* Stand-in for the UPMEM SDK <barrier.h> (make check only).
 *
 * Tasklets are threads, and a barrier really blocks them until `count` have arrived. When
 * every running tasklet is blocked, or one returns while others wait, nothing can release
 * them: the stand-in reports the deadlock instead of hanging.
 */
#ifndef STANDIN_BARRIER_H
#define STANDIN_BARRIER_H

typedef struct barrier_t {
    unsigned count;      /* tasklets that must arrive */
    const char *name;
    unsigned arrived;    /* in the current round */
    unsigned generation; /* rounds completed */
} barrier_t;

#define BARRIER_INIT(name, counter) \
    static barrier_t name __attribute__((used)) = {(counter), #name, 0, 0}

void barrier_wait(barrier_t *barrier);

#endif
