/* Stand-in for the UPMEM SDK <defs.h> (make check only): tasklet identity.
 *
 * The SDK's syslib/defs.h declares `static inline sysname_t me()` (sysname_t is an
 * unsigned int, syslib/sysdef.h) and `int check_stack()`; the same signatures here.
 */
#ifndef STANDIN_DEFS_H
#define STANDIN_DEFS_H

#include <stdint.h>

#include "attributes.h"

#ifndef NR_TASKLETS
#define NR_TASKLETS 1 /* as the DPU compiler driver defines it when the build does not */
#endif
#ifndef STACK_SIZE_DEFAULT
#define STACK_SIZE_DEFAULT 1024 /* the driver's default: bytes of WRAM per tasklet stack */
#endif

typedef unsigned int sysname_t;

sysname_t standin_me(void);

/* The id of the running tasklet, 0..NR_TASKLETS-1. */
static inline sysname_t me(void) { return standin_me(); }

/* Unused 32-bit words of the running tasklet's stack: the stand-in's stacks are the
 * host's threads', so it reports the whole STACK_SIZE_DEFAULT. */
static inline int check_stack(void) { return STACK_SIZE_DEFAULT / 4; }

#endif
