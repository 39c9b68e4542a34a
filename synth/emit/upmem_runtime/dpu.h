/* Stand-in for the UPMEM SDK host API <dpu.h> (make check only).
 *
 * The same calls as the SDK, implemented on the host: the DPU programs are compiled into
 * this process (see standin.h), `dpu_load` finds one by the binary's file name, and
 * `dpu_launch` runs each DPU of the set in turn, its tasklets as threads. Transfers are
 * checked as the SDK checks them (known symbol, in bounds, MRAM transfers 8-byte aligned
 * and a multiple of 8 bytes); any misuse stops the program with a message and exit code 3.
 *
 * Every declaration here has the SDK's signature (include/dpu/dpu.h, dpu_types.h and
 * dpu_error.h of the UPMEM SDK; see SDK_NOTES.md), so that an emitted call the SDK would
 * reject does not build under `make check` either.
 */
#ifndef STANDIN_DPU_H
#define STANDIN_DPU_H

#include <limits.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

/* The status of every call: the SDK's dpu_error.h, names and values. */
typedef enum dpu_error_t {
    DPU_OK,
    DPU_ERR_INTERNAL,
    DPU_ERR_SYSTEM,
    DPU_ERR_DRIVER,
    DPU_ERR_ALLOCATION,
    DPU_ERR_INVALID_DPU_SET,
    DPU_ERR_INVALID_THREAD_ID,
    DPU_ERR_INVALID_NOTIFY_ID,
    DPU_ERR_INVALID_WRAM_ACCESS,
    DPU_ERR_INVALID_IRAM_ACCESS,
    DPU_ERR_INVALID_MRAM_ACCESS,
    DPU_ERR_INVALID_SYMBOL_ACCESS,
    DPU_ERR_MRAM_BUSY,
    DPU_ERR_TRANSFER_ALREADY_SET,
    DPU_ERR_INVALID_PARALLEL_MEMORY_TRANSFER,
    DPU_ERR_WRAM_FIFO_FULL,
    DPU_ERR_NO_PROGRAM_LOADED,
    DPU_ERR_DIFFERENT_DPU_PROGRAMS,
    DPU_ERR_CORRUPTED_MEMORY,
    DPU_ERR_DPU_DISABLED,
    DPU_ERR_DPU_ALREADY_RUNNING,
    DPU_ERR_INVALID_MEMORY_TRANSFER,
    DPU_ERR_INVALID_LAUNCH_POLICY,
    DPU_ERR_DPU_FAULT,
    DPU_ERR_ELF_INVALID_FILE,
    DPU_ERR_ELF_NO_SUCH_FILE,
    DPU_ERR_ELF_NO_SUCH_SECTION,
    DPU_ERR_TIMEOUT,
    DPU_ERR_INVALID_PROFILE,
    DPU_ERR_UNKNOWN_SYMBOL,
    DPU_ERR_LOG_FORMAT,
    DPU_ERR_LOG_CONTEXT_MISSING,
    DPU_ERR_LOG_BUFFER_TOO_SMALL,
    DPU_ERR_VPD_INVALID_FILE,
    DPU_ERR_VPD_NO_REPAIR,
    DPU_ERR_NO_THREAD_PER_RANK,
    DPU_ERR_INVALID_BUFFER_SIZE,
    DPU_ERR_NONBLOCKING_SYNC_CALLBACK,
    DPU_ERR_TOO_MANY_TASKLETS,
    DPU_ERR_SG_TOO_MANY_BLOCKS,
    DPU_ERR_SG_LENGTH_MISMATCH,
    DPU_ERR_SG_NOT_ACTIVATED,
    DPU_ERR_SG_NOT_MRAM_SYMBOL,
    DPU_ERR_ASYNC_JOBS = (int)(1U << 31),
} dpu_error_t;

typedef enum _dpu_launch_policy_t { DPU_ASYNCHRONOUS, DPU_SYNCHRONOUS } dpu_launch_policy_t;
typedef enum _dpu_xfer_t { DPU_XFER_TO_DPU, DPU_XFER_FROM_DPU } dpu_xfer_t;
typedef enum _dpu_xfer_flags_t {
    DPU_XFER_DEFAULT = 0,       /* the prepared buffers are cleared after the transfer */
    DPU_XFER_NO_RESET = 1 << 0, /* ... or kept */
    DPU_XFER_ASYNC = 1 << 1,    /* the stand-in transfers at once */
    DPU_XFER_PARALLEL = 1 << 2, /* WRAM only, while the DPU runs: not supported here */
} dpu_xfer_flags_t;

#define DPU_ALLOCATE_ALL (UINT_MAX)
#define DPU_MRAM_HEAP_POINTER_NAME "__sys_used_mram_end"

/* A set of DPUs: all those allocated, or one of them (inside DPU_FOREACH). The SDK's holds
 * rank pointers; programs never look inside. */
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
/* As in the SDK, the caller frees the string. */
char *dpu_error_to_string(dpu_error_t status);

/* The i-th DPU of `set` as a set of its own; 0 once i runs past the set. */
int standin_dpu_at(const struct dpu_set_t *set, uint32_t i, struct dpu_set_t *dpu);

/* DPU_FOREACH(set, dpu) or DPU_FOREACH(set, dpu, i): each DPU of the set, in order. As in
 * the SDK, `set` must be an lvalue (the SDK takes its address) and `i` is assigned the
 * index (a uint32_t). */
#define STANDIN_FOREACH_2(set, dpu) \
    for (uint32_t standin_each_ = 0; standin_dpu_at(&(set), standin_each_, &(dpu)); \
         standin_each_++)
#define STANDIN_FOREACH_3(set, dpu, i) \
    for ((i) = 0; standin_dpu_at(&(set), (i), &(dpu)); (i)++)
#define STANDIN_FOREACH_PICK(_1, _2, _3, name, ...) name
#define DPU_FOREACH(...) \
    STANDIN_FOREACH_PICK(__VA_ARGS__, STANDIN_FOREACH_3, STANDIN_FOREACH_2, unused)(__VA_ARGS__)

/* The SDK's DPU_CHECK and DPU_ASSERT, except that DPU_ASSERT exits with status 3 (the
 * stand-in's "a DPU rule was broken") where the SDK exits with EXIT_FAILURE. */
#define DPU_CHECK(statement, on_error)                                                   \
    do {                                                                                 \
        dpu_error_t __error = (statement);                                               \
        if (__error != DPU_OK) {                                                         \
            char *__error_string = dpu_error_to_string(__error);                         \
            fprintf(stderr, "%s:%d(%s): DPU Error (%s)\n", __FILE__, __LINE__, __func__,  \
                    __error_string);                                                     \
            free(__error_string);                                                        \
            on_error;                                                                    \
        }                                                                                \
    } while (0)
#define DPU_ASSERT(statement) DPU_CHECK(statement, exit(3))

#endif
