/* Stand-in for the UPMEM SDK host API <dpu.h> (make check only).
 *
 * The same calls as the SDK, implemented on the host: the DPU programs are compiled into
 * this process (see standin.h), `dpu_load` finds one by the binary's file name, and
 * `dpu_launch` runs each DPU of the set in turn, its tasklets as threads. Transfers are
 * checked as the SDK checks them (known symbol, in bounds, MRAM transfers 8-byte aligned
 * and a multiple of 8 bytes); any misuse stops the program with a message and exit code 3.
 */
#ifndef STANDIN_DPU_H
#define STANDIN_DPU_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

typedef enum dpu_error_t {
    DPU_OK = 0,
    DPU_ERR_INTERNAL,
    DPU_ERR_ALLOCATION,
    DPU_ERR_UNKNOWN_SYMBOL,
    DPU_ERR_INVALID_MEMORY_TRANSFER,
    DPU_ERR_ELF_NO_SUCH_FILE,
} dpu_error_t;

typedef enum dpu_xfer_t { DPU_XFER_TO_DPU, DPU_XFER_FROM_DPU } dpu_xfer_t;
typedef enum dpu_xfer_flags_t { DPU_XFER_DEFAULT = 0, DPU_XFER_NO_RESET = 1 } dpu_xfer_flags_t;
typedef enum dpu_launch_policy_t { DPU_ASYNCHRONOUS, DPU_SYNCHRONOUS } dpu_launch_policy_t;

#define DPU_ALLOCATE_ALL ((uint32_t)-1)

/* A set of DPUs: all those allocated, or one of them (inside DPU_FOREACH). */
struct dpu_set_t {
    uint32_t first;
    uint32_t count;
};

struct dpu_program_t;

dpu_error_t dpu_alloc(uint32_t nr_dpus, const char *profile, struct dpu_set_t *dpu_set);
dpu_error_t dpu_free(struct dpu_set_t dpu_set);
dpu_error_t dpu_get_nr_dpus(struct dpu_set_t dpu_set, uint32_t *nr_dpus);
dpu_error_t dpu_load(struct dpu_set_t dpu_set, const char *binary_path,
                     struct dpu_program_t **program);
dpu_error_t dpu_launch(struct dpu_set_t dpu_set, dpu_launch_policy_t policy);
dpu_error_t dpu_sync(struct dpu_set_t dpu_set);
dpu_error_t dpu_prepare_xfer(struct dpu_set_t dpu_set, void *buffer);
dpu_error_t dpu_push_xfer(struct dpu_set_t dpu_set, dpu_xfer_t xfer, const char *symbol_name,
                          uint32_t symbol_offset, size_t length, dpu_xfer_flags_t flags);
dpu_error_t dpu_broadcast_to(struct dpu_set_t dpu_set, const char *symbol_name,
                             uint32_t symbol_offset, const void *src, size_t length,
                             dpu_xfer_flags_t flags);
dpu_error_t dpu_copy_to(struct dpu_set_t dpu_set, const char *symbol_name,
                        uint32_t symbol_offset, const void *src, size_t length);
dpu_error_t dpu_copy_from(struct dpu_set_t dpu_set, const char *symbol_name,
                          uint32_t symbol_offset, void *dst, size_t length);
const char *dpu_error_to_string(dpu_error_t status);

/* The i-th DPU of `set` as a set of its own; 0 once i runs past the set. */
int standin_dpu_at(struct dpu_set_t set, uint32_t i, struct dpu_set_t *dpu);

/* DPU_FOREACH(set, dpu) or DPU_FOREACH(set, dpu, i): each DPU of the set, in order. */
#define STANDIN_FOREACH_2(set, dpu) \
    for (uint32_t standin_each_ = 0; standin_dpu_at((set), standin_each_, &(dpu)); \
         standin_each_++)
#define STANDIN_FOREACH_3(set, dpu, i) \
    for ((i) = 0; standin_dpu_at((set), (i), &(dpu)); (i)++)
#define STANDIN_FOREACH_PICK(_1, _2, _3, name, ...) name
#define DPU_FOREACH(...) \
    STANDIN_FOREACH_PICK(__VA_ARGS__, STANDIN_FOREACH_3, STANDIN_FOREACH_2, unused)(__VA_ARGS__)

#define DPU_ASSERT(call)                                                                 \
    do {                                                                                 \
        dpu_error_t standin_status_ = (call);                                            \
        if (standin_status_ != DPU_OK) {                                                 \
            fprintf(stderr, "%s:%d: %s failed: %s\n", __FILE__, __LINE__, #call,         \
                    dpu_error_to_string(standin_status_));                              \
            exit(3);                                                                     \
        }                                                                                \
    } while (0)

#endif
