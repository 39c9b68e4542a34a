/* Stand-in for the UPMEM SDK <mram.h> (make check only): DMA between MRAM and WRAM.
 *
 * Every call is checked as the hardware requires: 8..2048 bytes, a multiple of 8, both
 * addresses 8-byte aligned, both ranges inside the DPU's memories. A violation stops the
 * program with a message naming the DPU, the tasklet, the call and the numbers.
 */
#ifndef STANDIN_MRAM_H
#define STANDIN_MRAM_H

#include "attributes.h"

void mram_read(const __mram_ptr void *from, void *to, unsigned int nb_of_bytes);
void mram_write(const void *from, __mram_ptr void *to, unsigned int nb_of_bytes);

#endif
