/* Stand-in for the UPMEM SDK <alloc.h> (make check only): the WRAM heap.
 *
 * The heap is what WRAM leaves after the program's globals and the tasklets' stacks
 * (NR_TASKLETS x STACK_SIZE_DEFAULT); allocating beyond it stops the program. The SDK's
 * signatures (syslib/alloc.h): mem_alloc returns an 8-byte aligned block, mem_reset the
 * heap's first address.
 */
#ifndef STANDIN_ALLOC_H
#define STANDIN_ALLOC_H

#include <stddef.h>

void *mem_alloc(size_t size);
void *mem_reset(void);

#endif
