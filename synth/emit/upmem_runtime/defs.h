/* Stand-in for the UPMEM SDK <defs.h> (make check only): tasklet identity. */
#ifndef STANDIN_DEFS_H
#define STANDIN_DEFS_H

#include <stdint.h>

#include "attributes.h"

#ifndef NR_TASKLETS
#define NR_TASKLETS 1
#endif
#ifndef STACK_SIZE_DEFAULT
#define STACK_SIZE_DEFAULT 256 /* bytes of WRAM per tasklet stack, when the build sets none */
#endif

typedef uint32_t sysname_t;

sysname_t standin_me(void);

/* The id of the running tasklet, 0..NR_TASKLETS-1. */
static inline sysname_t me(void) { return standin_me(); }

#endif
