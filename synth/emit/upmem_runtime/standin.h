/* The stand-in's view of a DPU program compiled into the host (make check only).
 *
 * synth writes one glue file per kernel, `standin_dpu_<kernel>.c`, that includes the DPU
 * program with `main` renamed and describes its globals:
 *
 *     #include "standin.h"
 *     #define main dpu_main_e
 *     #include "dpu_e.c"
 *     #undef main
 *     static const struct standin_symbol symbols[] = {STANDIN_WRAM(args), STANDIN_MRAM(x_mram)};
 *     STANDIN_PROGRAM(dpu_e, dpu_main_e, symbols)
 *
 * The symbol table is how the host's transfers find a "symbol" and how each DPU gets its
 * own copy of the WRAM globals: before a DPU runs, its saved WRAM globals are copied into
 * the program's C globals, and back after it finishes (DPUs run one after another).
 * MRAM symbols are only addresses: mram_read/mram_write translate an address inside one to
 * an offset in the running DPU's MRAM, which is allocated lazily in chunks.
 */
#ifndef STANDIN_H
#define STANDIN_H

#include <stddef.h>

#include "defs.h"

enum standin_memory { STANDIN_IN_WRAM, STANDIN_IN_MRAM };

struct standin_symbol {
    const char *name;
    void *address; /* the host global standing for it */
    size_t size;
    enum standin_memory memory;
};

struct standin_program {
    const char *name; /* the DPU binary's file name, e.g. dpu_e */
    int (*main)(void);
    unsigned nr_tasklets;
    unsigned stack_size; /* bytes of WRAM per tasklet */
    const struct standin_symbol *symbols;
    size_t nr_symbols;
};

void standin_register(const struct standin_program *program);

#define STANDIN_WRAM(symbol) {#symbol, (void *)&(symbol), sizeof(symbol), STANDIN_IN_WRAM}
#define STANDIN_MRAM(symbol) {#symbol, (void *)&(symbol), sizeof(symbol), STANDIN_IN_MRAM}

#define STANDIN_PROGRAM(name, entry, table)                                              \
    static const struct standin_program standin_program_ = {                             \
        #name, entry, NR_TASKLETS, STACK_SIZE_DEFAULT, table,                            \
        sizeof(table) / sizeof((table)[0])};                                             \
    __attribute__((constructor)) static void standin_register_program_(void)             \
    {                                                                                    \
        standin_register(&standin_program_);                                             \
    }

#endif
