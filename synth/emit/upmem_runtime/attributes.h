/* Stand-in for the UPMEM SDK <attributes.h>, used by `make check` only.
 *
 * Each DPU program is compiled into the one host program, so its globals must not clash
 * with another kernel's: MRAM variables and __host variables become `static` host globals.
 * MRAM variables are never read or written through their host storage: their addresses
 * only name a place in the running DPU's MRAM (see standin.c), so a 64 MiB MRAM array
 * costs address space, not memory. Alignment is kept because the DMA checks test it.
 */
#ifndef STANDIN_ATTRIBUTES_H
#define STANDIN_ATTRIBUTES_H

#define __dma_aligned __attribute__((aligned(8)))
#define __mram_ptr
#define __mram_noinit static __attribute__((aligned(8), used))
#define __mram static __attribute__((aligned(8), used)) /* initial values are not loaded */
#define __host static __attribute__((aligned(8), used))

#endif
