/* A host-side stand-in for the UPMEM runtime, so that `make check` runs the emitted
 * program on any machine with a C compiler and still catches what would break on a DPU.
 *
 * The model:
 * - DPU programs are compiled into this process (see standin.h); `dpu_load` finds one by
 *   its binary's file name, `dpu_launch` runs the DPUs of the set one after another, each
 *   DPU's tasklets as NR_TASKLETS concurrent threads (so data races are real races).
 * - Each DPU owns a WRAM of STANDIN_WRAM_BYTES (its globals and heap) and an MRAM of
 *   STANDIN_MRAM_BYTES, allocated lazily in chunks so that idle DPUs cost nothing.
 * - Every DMA (mram_read/mram_write) is checked: STANDIN_DMA_MIN..STANDIN_DMA_MAX bytes, a
 *   multiple of 8, both addresses 8-byte aligned, both ranges inside a variable of the
 *   right memory. WRAM overflow is checked at dpu_load (globals + stacks) and by mem_alloc.
 * - Any violation prints one line naming the DPU, the tasklet, the call and the numbers,
 *   and exits with status 3. A barrier that can never be released is reported the same way.
 * - With STANDIN_DMA_TRACE=<file> in the environment, every DMA appends a line to <file>:
 *   "<dpu> <tasklet> <call> <mram symbol>+<offset> <wram symbol>+<offset> <bytes>", in the
 *   order each tasklet issued them (tests check the order of double-buffered transfers).
 */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "alloc.h"
#include "barrier.h"
#include "dpu.h"
#include "mram.h"
#include "standin.h"

#ifndef STANDIN_WRAM_BYTES
#define STANDIN_WRAM_BYTES (64u << 10)
#endif
#ifndef STANDIN_MRAM_BYTES
#define STANDIN_MRAM_BYTES (64u << 20)
#endif
#ifndef STANDIN_DMA_MIN
#define STANDIN_DMA_MIN 8u
#endif
#ifndef STANDIN_DMA_MAX
#define STANDIN_DMA_MAX 2048u
#endif
#define DMA_ALIGN 8u
#define MAX_DPUS 2560u /* 40 ranks of 64 DPUs */
#define MAX_PROGRAMS 256u
#define MRAM_CHUNK (64u << 10)
#define MRAM_CHUNKS ((STANDIN_MRAM_BYTES + MRAM_CHUNK - 1) / MRAM_CHUNK)
#define EXIT_VIOLATION 3

/* A registered program, its symbols placed in WRAM and MRAM. */
struct layout {
    const struct standin_program *program;
    size_t *offset;         /* per symbol: its byte offset in its memory */
    size_t wram_globals;    /* bytes of WRAM the globals take (the heap starts here) */
    size_t mram_used;       /* bytes of MRAM the MRAM variables take */
    unsigned char *initial; /* the WRAM globals' initial values, as dpu_load sets them */
};

struct dpu {
    const struct layout *layout; /* the loaded program, or NULL */
    unsigned char *wram;         /* STANDIN_WRAM_BYTES: globals, then the heap */
    unsigned char **mram;        /* MRAM_CHUNKS chunks, each allocated on first touch */
    size_t heap_top;             /* WRAM offset of the heap's first free byte */
    void *prepared;              /* the host buffer of the next dpu_push_xfer */
};

static struct layout programs[MAX_PROGRAMS];
static size_t nr_programs;
static struct dpu *dpus;
static uint32_t nr_dpus;

/* DPUs run one at a time: the running one, and the calling thread's tasklet id. */
static struct dpu *running;
static uint32_t running_index;
static __thread int tasklet_id = -1;

/* Barriers and deadlock detection: tasklets still running, and those blocked. */
static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t released = PTHREAD_COND_INITIALIZER;
static unsigned alive, blocked;

static size_t align8(size_t n) { return (n + 7) & ~(size_t)7; }

/* Report a violation and stop: one line naming the DPU and tasklet when inside one. */
__attribute__((noreturn, format(printf, 1, 2))) static void fail(const char *format, ...)
{
    static pthread_mutex_t report = PTHREAD_MUTEX_INITIALIZER;
    va_list args;
    pthread_mutex_lock(&report);
    fflush(stdout);
    fprintf(stderr, "upmem stand-in: ");
    if (tasklet_id >= 0)
        fprintf(stderr, "DPU %u, tasklet %d, program %s: ", running_index, tasklet_id,
                running->layout->program->name);
    va_start(args, format);
    vfprintf(stderr, format, args);
    va_end(args);
    fputc('\n', stderr);
    fflush(stderr);
    _exit(EXIT_VIOLATION); /* now: other tasklets may still be running */
}

/* A host API error: the SDK returns a status (DPU_ASSERT then stops); say why first. */
__attribute__((format(printf, 2, 3))) static dpu_error_t refuse(dpu_error_t status,
                                                                 const char *format, ...)
{
    va_list args;
    fprintf(stderr, "upmem stand-in: ");
    va_start(args, format);
    vfprintf(stderr, format, args);
    va_end(args);
    fputc('\n', stderr);
    return status;
}

/* ------------------------------------------------------------------ programs */

void standin_register(const struct standin_program *program)
{
    if (nr_programs == MAX_PROGRAMS)
        fail("more than %u DPU programs", MAX_PROGRAMS);
    for (size_t i = 0; i < nr_programs; i++)
        if (strcmp(programs[i].program->name, program->name) == 0)
            fail("two DPU programs named %s", program->name);
    struct layout *layout = &programs[nr_programs++];
    size_t ends[2] = {0, 0}; /* next free byte of WRAM, MRAM */
    layout->program = program;
    layout->offset = calloc(program->nr_symbols ? program->nr_symbols : 1, sizeof(size_t));
    for (size_t i = 0; i < program->nr_symbols; i++) {
        size_t *end = &ends[program->symbols[i].memory];
        *end = align8(*end);
        layout->offset[i] = *end;
        *end += program->symbols[i].size;
    }
    layout->wram_globals = align8(ends[STANDIN_IN_WRAM]);
    layout->mram_used = ends[STANDIN_IN_MRAM];
    layout->initial = calloc(layout->wram_globals ? layout->wram_globals : 1, 1);
    for (size_t i = 0; i < program->nr_symbols; i++)
        if (program->symbols[i].memory == STANDIN_IN_WRAM)
            memcpy(layout->initial + layout->offset[i], program->symbols[i].address,
                   program->symbols[i].size);
}

static const struct layout *find_program(const char *binary_path)
{
    const char *slash = strrchr(binary_path, '/');
    const char *name = slash ? slash + 1 : binary_path;
    for (size_t i = 0; i < nr_programs; i++)
        if (strcmp(programs[i].program->name, name) == 0)
            return &programs[i];
    return NULL;
}

static size_t stack_bytes(const struct standin_program *program)
{
    return (size_t)program->nr_tasklets * program->stack_size;
}

static const struct standin_symbol *largest(const struct standin_program *program,
                                            enum standin_memory memory)
{
    const struct standin_symbol *best = NULL;
    for (size_t i = 0; i < program->nr_symbols; i++)
        if (program->symbols[i].memory == memory &&
            (!best || program->symbols[i].size > best->size))
            best = &program->symbols[i];
    return best;
}

/* What the DPU linker would refuse: globals and stacks beyond WRAM, variables beyond MRAM. */
static void check_fits(const struct layout *layout)
{
    const struct standin_program *program = layout->program;
    size_t wram = layout->wram_globals + stack_bytes(program);
    if (wram > STANDIN_WRAM_BYTES) {
        const struct standin_symbol *big = largest(program, STANDIN_IN_WRAM);
        fail("dpu_load(%s): WRAM overflow: globals take %zu bytes and %u tasklet stacks %u "
             "bytes each, %zu bytes in all, more than the %u bytes of WRAM (largest global: "
             "%s, %zu bytes)",
             program->name, layout->wram_globals, program->nr_tasklets, program->stack_size,
             wram, (unsigned)STANDIN_WRAM_BYTES, big ? big->name : "none",
             big ? big->size : 0);
    }
    if (layout->mram_used > STANDIN_MRAM_BYTES)
        fail("dpu_load(%s): MRAM overflow: MRAM variables take %zu bytes, more than the %u "
             "bytes of MRAM",
             program->name, layout->mram_used, (unsigned)STANDIN_MRAM_BYTES);
}

/* ------------------------------------------------------------------ DPU memories */

static unsigned char *mram_chunk(struct dpu *dpu, size_t index)
{
    static pthread_mutex_t grow = PTHREAD_MUTEX_INITIALIZER;
    unsigned char *chunk = __atomic_load_n(&dpu->mram[index], __ATOMIC_ACQUIRE);
    if (chunk)
        return chunk;
    pthread_mutex_lock(&grow);
    chunk = dpu->mram[index];
    if (!chunk) {
        chunk = calloc(1, MRAM_CHUNK);
        if (!chunk)
            fail("out of host memory for DPU MRAM");
        __atomic_store_n(&dpu->mram[index], chunk, __ATOMIC_RELEASE);
    }
    pthread_mutex_unlock(&grow);
    return chunk;
}

/* Copy between a DPU's MRAM (bytes offset..offset+n) and host memory. */
static void mram_copy(struct dpu *dpu, size_t offset, unsigned char *host, size_t n,
                      int to_mram)
{
    while (n) {
        size_t within = offset % MRAM_CHUNK;
        size_t part = n < MRAM_CHUNK - within ? n : MRAM_CHUNK - within;
        unsigned char *chunk = mram_chunk(dpu, offset / MRAM_CHUNK) + within;
        memcpy(to_mram ? chunk : host, to_mram ? host : chunk, part);
        offset += part;
        host += part;
        n -= part;
    }
}

static void load_dpu(struct dpu *dpu, const struct layout *layout)
{
    if (!dpu->wram) {
        dpu->wram = aligned_alloc(64, STANDIN_WRAM_BYTES);
        dpu->mram = calloc(MRAM_CHUNKS, sizeof(unsigned char *));
        if (!dpu->wram || !dpu->mram)
            fail("out of host memory for DPU memories");
    }
    memset(dpu->wram, 0, STANDIN_WRAM_BYTES);
    memcpy(dpu->wram, layout->initial, layout->wram_globals);
    dpu->layout = layout;
    dpu->heap_top = layout->wram_globals;
    dpu->prepared = NULL;
}

/* Copy the DPU's WRAM globals into the program's C globals (in) or back (out). */
static void swap_globals(struct dpu *dpu, int in)
{
    const struct standin_program *program = dpu->layout->program;
    for (size_t i = 0; i < program->nr_symbols; i++) {
        const struct standin_symbol *symbol = &program->symbols[i];
        unsigned char *saved = dpu->wram + dpu->layout->offset[i];
        if (symbol->memory == STANDIN_IN_WRAM)
            memcpy(in ? symbol->address : saved, in ? saved : symbol->address, symbol->size);
    }
}

/* ------------------------------------------------------------------ host API */

static const char *error_text(dpu_error_t status)
{
    switch (status) {
    case DPU_OK: return "success";
    case DPU_ERR_ALLOCATION: return "cannot allocate DPUs";
    case DPU_ERR_INVALID_DPU_SET: return "invalid DPU set";
    case DPU_ERR_INVALID_WRAM_ACCESS: return "invalid WRAM access";
    case DPU_ERR_INVALID_MRAM_ACCESS: return "invalid MRAM access";
    case DPU_ERR_INVALID_SYMBOL_ACCESS: return "invalid symbol access";
    case DPU_ERR_TRANSFER_ALREADY_SET: return "transfer buffer already set";
    case DPU_ERR_NO_PROGRAM_LOADED: return "no program loaded";
    case DPU_ERR_UNKNOWN_SYMBOL: return "unknown symbol";
    case DPU_ERR_INVALID_MEMORY_TRANSFER: return "invalid memory transfer";
    case DPU_ERR_ELF_NO_SUCH_FILE: return "no such DPU binary";
    default: return "internal error";
    }
}

/* As in the SDK, a string the caller frees. */
char *dpu_error_to_string(dpu_error_t status)
{
    const char *text = error_text(status);
    char *copy = malloc(strlen(text) + 1);
    if (!copy)
        fail("out of host memory");
    return strcpy(copy, text);
}

int standin_dpu_at(const struct dpu_set_t *set, uint32_t i, struct dpu_set_t *dpu)
{
    if (i >= set->count)
        return 0;
    dpu->first = set->first + i;
    dpu->count = 1;
    return 1;
}

dpu_error_t dpu_alloc(uint32_t nr, const char *profile, struct dpu_set_t *set)
{
    (void)profile;
    if (nr == DPU_ALLOCATE_ALL)
        nr = 64;
    if (dpus)
        return refuse(DPU_ERR_ALLOCATION, "dpu_alloc: only one DPU set at a time");
    if (nr == 0 || nr > MAX_DPUS)
        return refuse(DPU_ERR_ALLOCATION, "dpu_alloc(%u): expected 1..%u DPUs", nr, MAX_DPUS);
    dpus = calloc(nr, sizeof *dpus);
    if (!dpus)
        return refuse(DPU_ERR_ALLOCATION, "dpu_alloc(%u): out of host memory", nr);
    nr_dpus = nr;
    set->first = 0;
    set->count = nr;
    return DPU_OK;
}

dpu_error_t dpu_free(struct dpu_set_t set)
{
    (void)set;
    for (uint32_t i = 0; dpus && i < nr_dpus; i++) {
        for (size_t c = 0; dpus[i].mram && c < MRAM_CHUNKS; c++)
            free(dpus[i].mram[c]);
        free(dpus[i].mram);
        free(dpus[i].wram);
    }
    free(dpus);
    dpus = NULL;
    nr_dpus = 0;
    return DPU_OK;
}

dpu_error_t dpu_get_nr_dpus(struct dpu_set_t set, uint32_t *nr)
{
    *nr = set.count;
    return DPU_OK;
}

dpu_error_t dpu_load(struct dpu_set_t set, const char *binary_path,
                     struct dpu_program_t **program)
{
    const struct layout *layout = find_program(binary_path);
    if (program)
        *program = NULL;
    if (!layout)
        return refuse(DPU_ERR_ELF_NO_SUCH_FILE,
                      "dpu_load(\"%s\"): no DPU program of that name was compiled in",
                      binary_path);
    check_fits(layout);
    for (uint32_t i = 0; i < set.count; i++)
        load_dpu(&dpus[set.first + i], layout);
    return DPU_OK;
}

/* As in the SDK: the buffer is set even when one was, but that is reported. */
dpu_error_t dpu_prepare_xfer(struct dpu_set_t set, void *buffer)
{
    dpu_error_t status = DPU_OK;
    for (uint32_t i = 0; i < set.count; i++) {
        if (buffer && dpus[set.first + i].prepared)
            status = refuse(DPU_ERR_TRANSFER_ALREADY_SET,
                            "dpu_prepare_xfer: DPU %u already has a buffer for the next transfer",
                            set.first + i);
        dpus[set.first + i].prepared = buffer;
    }
    return status;
}

static const struct standin_symbol *find_symbol(const struct dpu *dpu, const char *name,
                                                size_t *offset)
{
    const struct standin_program *program = dpu->layout->program;
    for (size_t i = 0; i < program->nr_symbols; i++)
        if (strcmp(program->symbols[i].name, name) == 0) {
            *offset = dpu->layout->offset[i];
            return &program->symbols[i];
        }
    return NULL;
}

/* One DPU's part of a host transfer, checked as the SDK checks it. */
static dpu_error_t transfer(uint32_t index, const char *call, const char *name, uint32_t offset,
                            size_t length, unsigned char *host, int to_dpu)
{
    struct dpu *dpu = &dpus[index];
    size_t base;
    if (!dpu->layout)
        return refuse(DPU_ERR_NO_PROGRAM_LOADED, "%s(\"%s\"): DPU %u has no program loaded",
                      call, name, index);
    const struct standin_symbol *symbol = find_symbol(dpu, name, &base);
    if (!symbol)
        return refuse(DPU_ERR_UNKNOWN_SYMBOL, "%s: program %s has no symbol \"%s\"", call,
                      dpu->layout->program->name, name);
    unsigned granule = symbol->memory == STANDIN_IN_MRAM ? 8 : 4;
    if (offset % granule || length % granule)
        return refuse(symbol->memory == STANDIN_IN_MRAM ? DPU_ERR_INVALID_MRAM_ACCESS
                                                        : DPU_ERR_INVALID_WRAM_ACCESS,
                      "%s(\"%s\", offset %u, %zu bytes) on DPU %u: %s transfers need offsets "
                      "and sizes that are multiples of %u",
                      call, name, offset, length, index,
                      symbol->memory == STANDIN_IN_MRAM ? "MRAM" : "WRAM", granule);
    if (offset + length > symbol->size)
        return refuse(DPU_ERR_INVALID_SYMBOL_ACCESS,
                      "%s(\"%s\", offset %u, %zu bytes) on DPU %u: runs past the end of %s "
                      "(%zu bytes)",
                      call, name, offset, length, index, name, symbol->size);
    if (symbol->memory == STANDIN_IN_MRAM)
        mram_copy(dpu, base + offset, host, length, to_dpu);
    else
        memcpy(to_dpu ? dpu->wram + base + offset : host,
               to_dpu ? host : dpu->wram + base + offset, length);
    return DPU_OK;
}

/* DPUs without a prepared buffer take no part, as with the SDK (which builds its transfer
 * matrix from the DPUs whose buffer is set, then clears them all unless NO_RESET). */
dpu_error_t dpu_push_xfer(struct dpu_set_t set, dpu_xfer_t xfer, const char *name,
                          uint32_t offset, size_t length, dpu_xfer_flags_t flags)
{
    for (uint32_t i = set.first; i < set.first + set.count; i++) {
        if (!dpus[i].prepared)
            continue;
        dpu_error_t status = transfer(i, "dpu_push_xfer", name, offset, length,
                                      dpus[i].prepared, xfer == DPU_XFER_TO_DPU);
        if (status != DPU_OK)
            return status;
        if (!(flags & DPU_XFER_NO_RESET))
            dpus[i].prepared = NULL;
    }
    return DPU_OK;
}

dpu_error_t dpu_broadcast_to(struct dpu_set_t set, const char *name, uint32_t offset,
                             const void *src, size_t length, dpu_xfer_flags_t flags)
{
    (void)flags;
    for (uint32_t i = set.first; i < set.first + set.count; i++) {
        dpu_error_t status = transfer(i, "dpu_broadcast_to", name, offset, length,
                                      (unsigned char *)src, 1);
        if (status != DPU_OK)
            return status;
    }
    return DPU_OK;
}

dpu_error_t dpu_copy_to(struct dpu_set_t set, const char *name, uint32_t offset,
                        const void *src, size_t length)
{
    return dpu_broadcast_to(set, name, offset, src, length, DPU_XFER_DEFAULT);
}

dpu_error_t dpu_copy_from(struct dpu_set_t set, const char *name, uint32_t offset, void *dst,
                          size_t length)
{
    if (set.count != 1) /* the SDK refuses a set of ranks here */
        return refuse(DPU_ERR_INVALID_DPU_SET, "dpu_copy_from(\"%s\"): expected one DPU", name);
    return transfer(set.first, "dpu_copy_from", name, offset, length, dst, 0);
}

/* ------------------------------------------------------------------ running DPUs */

/* Tasklets run on a pool of threads created once: a DPU run is one round, in which the
 * first NR_TASKLETS workers each run the program's main. */
#define MAX_TASKLETS 24u
static pthread_mutex_t pool = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t round_start = PTHREAD_COND_INITIALIZER;
static pthread_cond_t round_end = PTHREAD_COND_INITIALIZER;
static unsigned nr_workers, round_id, round_tasklets, finished;

static void run_tasklet(unsigned id)
{
    tasklet_id = (int)id;
    running->layout->program->main();
    pthread_mutex_lock(&lock);
    alive--;
    if (blocked && blocked == alive)
        fail("deadlock: this tasklet returned while the other %u running tasklets wait at a "
             "barrier that needs it",
             blocked);
    pthread_mutex_unlock(&lock);
    tasklet_id = -1;
}

static void *worker(void *arg)
{
    unsigned id = (unsigned)(uintptr_t)arg, seen = 0;
    for (;;) {
        pthread_mutex_lock(&pool);
        while (round_id == seen)
            pthread_cond_wait(&round_start, &pool);
        seen = round_id;
        unsigned needed = round_tasklets;
        pthread_mutex_unlock(&pool);
        if (id >= needed)
            continue;
        run_tasklet(id);
        pthread_mutex_lock(&pool);
        if (++finished == needed)
            pthread_cond_signal(&round_end);
        pthread_mutex_unlock(&pool);
    }
    return NULL;
}

static void run_dpu(uint32_t index)
{
    const struct standin_program *program = dpus[index].layout->program;
    unsigned tasklets = program->nr_tasklets;
    if (tasklets < 1 || tasklets > MAX_TASKLETS)
        fail("program %s: NR_TASKLETS = %u, expected 1..%u", program->name, tasklets,
             MAX_TASKLETS);
    for (; nr_workers < tasklets; nr_workers++) {
        pthread_t thread;
        if (pthread_create(&thread, NULL, worker, (void *)(uintptr_t)nr_workers) != 0)
            fail("cannot start a thread for tasklet %u", nr_workers);
        pthread_detach(thread);
    }
    running = &dpus[index];
    running_index = index;
    swap_globals(running, 1);
    alive = tasklets;
    blocked = 0;
    pthread_mutex_lock(&pool);
    finished = 0;
    round_tasklets = tasklets;
    round_id++;
    pthread_cond_broadcast(&round_start);
    while (finished < tasklets)
        pthread_cond_wait(&round_end, &pool);
    pthread_mutex_unlock(&pool);
    swap_globals(running, 0);
    running = NULL;
}

dpu_error_t dpu_launch(struct dpu_set_t set, dpu_launch_policy_t policy)
{
    (void)policy; /* DPUs always finish before dpu_launch returns */
    for (uint32_t i = set.first; i < set.first + set.count; i++) {
        if (!dpus[i].layout)
            return refuse(DPU_ERR_INTERNAL, "dpu_launch: DPU %u has no program loaded", i);
        run_dpu(i);
    }
    return DPU_OK;
}

dpu_error_t dpu_sync(struct dpu_set_t set)
{
    (void)set;
    return DPU_OK;
}

/* ------------------------------------------------------------------ DPU side */

static void require_tasklet(const char *call)
{
    if (tasklet_id < 0)
        fail("%s called on the host, outside a DPU program", call);
}

sysname_t standin_me(void)
{
    require_tasklet("me()");
    return (sysname_t)tasklet_id;
}

void barrier_wait(barrier_t *barrier)
{
    require_tasklet("barrier_wait");
    unsigned nr = running->layout->program->nr_tasklets;
    if (barrier->count > nr)
        fail("barrier_wait(&%s): the barrier waits for %u tasklets but the program runs %u "
             "(NR_TASKLETS)",
             barrier->name, barrier->count, nr);
    pthread_mutex_lock(&lock);
    if (++barrier->arrived == barrier->count) {
        barrier->arrived = 0;
        barrier->generation++;
        blocked -= barrier->count - 1;
        pthread_cond_broadcast(&released);
    } else {
        unsigned generation = barrier->generation;
        blocked++;
        if (blocked == alive)
            fail("deadlock at barrier_wait(&%s): all %u running tasklets are waiting, %u of "
                 "the %u it needs have arrived",
                 barrier->name, alive, barrier->arrived, barrier->count);
        while (generation == barrier->generation)
            pthread_cond_wait(&released, &lock);
    }
    pthread_mutex_unlock(&lock);
}

void *mem_alloc(size_t size)
{
    require_tasklet("mem_alloc");
    const struct standin_program *program = running->layout->program;
    size_t end = STANDIN_WRAM_BYTES - stack_bytes(program);
    size_t start = running->layout->wram_globals;
    pthread_mutex_lock(&lock);
    if (running->heap_top + align8(size) > end)
        fail("mem_alloc(%zu): the WRAM heap is exhausted: %zu of its %zu bytes are in use "
             "(WRAM %u bytes = globals %zu + heap %zu + %u stacks of %u bytes)",
             size, running->heap_top - start, end - start, (unsigned)STANDIN_WRAM_BYTES,
             start, end - start, program->nr_tasklets, program->stack_size);
    void *block = running->wram + running->heap_top;
    running->heap_top += align8(size);
    pthread_mutex_unlock(&lock);
    return block;
}

void *mem_reset(void)
{
    require_tasklet("mem_reset");
    pthread_mutex_lock(&lock);
    running->heap_top = running->layout->wram_globals;
    pthread_mutex_unlock(&lock);
    return running->wram + running->layout->wram_globals;
}

/* Where an address lies in one memory of the running DPU: its byte offset there, the
 * bytes left in the variable (or heap block) that holds it, and a name for messages. */
struct place {
    size_t offset;
    size_t room;
    char name[96];
};

static int find_place(const void *address, enum standin_memory memory, struct place *place)
{
    const unsigned char *at = address;
    const struct standin_program *program = running->layout->program;
    for (size_t i = 0; i < program->nr_symbols; i++) {
        const struct standin_symbol *symbol = &program->symbols[i];
        const unsigned char *start = symbol->address;
        if (symbol->memory == memory && at >= start && at < start + symbol->size) {
            place->offset = running->layout->offset[i] + (size_t)(at - start);
            place->room = symbol->size - (size_t)(at - start);
            snprintf(place->name, sizeof place->name, "%s+%zu", symbol->name,
                     (size_t)(at - start));
            return 1;
        }
    }
    const unsigned char *heap = running->wram + running->layout->wram_globals;
    const unsigned char *top = running->wram + running->heap_top;
    if (memory == STANDIN_IN_WRAM && at >= heap && at < top) {
        place->offset = (size_t)(at - running->wram);
        place->room = (size_t)(top - at);
        snprintf(place->name, sizeof place->name, "heap+%zu", (size_t)(at - heap));
        return 1;
    }
    return 0;
}

/* The DMA trace (STANDIN_DMA_TRACE), opened at the first DMA; NULL when not asked for. */
static FILE *trace;

static void open_trace(void)
{
    const char *path = getenv("STANDIN_DMA_TRACE");
    if (!path || !*path)
        return;
    trace = fopen(path, "w");
    if (!trace)
        fail("cannot open the DMA trace %s", path);
}

static void trace_dma(const char *call, const struct place *mram, const struct place *wram,
                      unsigned bytes)
{
    static pthread_once_t once = PTHREAD_ONCE_INIT;
    static pthread_mutex_t writing = PTHREAD_MUTEX_INITIALIZER;
    pthread_once(&once, open_trace);
    if (!trace)
        return;
    pthread_mutex_lock(&writing);
    fprintf(trace, "%u %d %s %s %s %u\n", running_index, tasklet_id, call, mram->name,
            wram->name, bytes);
    fflush(trace);
    pthread_mutex_unlock(&writing);
}

static void dma(const char *call, const void *mram_address, void *wram_address,
                unsigned bytes, int to_wram)
{
    struct place mram, wram;
    require_tasklet(call);
    const char *from = to_wram ? "from" : "to";
    if (bytes < STANDIN_DMA_MIN || bytes > STANDIN_DMA_MAX || bytes % DMA_ALIGN)
        fail("%s(%u bytes): a DMA moves %u..%u bytes, a multiple of %u", call, bytes,
             STANDIN_DMA_MIN, STANDIN_DMA_MAX, DMA_ALIGN);
    if (!find_place(mram_address, STANDIN_IN_MRAM, &mram))
        fail("%s(%u bytes): the MRAM address %p (%s) is not inside an MRAM variable", call,
             bytes, mram_address, from);
    if (!find_place(wram_address, STANDIN_IN_WRAM, &wram))
        fail("%s(%u bytes): the WRAM address %p is not inside a WRAM global or a mem_alloc "
             "block",
             call, bytes, wram_address);
    if (mram.offset % DMA_ALIGN)
        fail("%s(%u bytes) %s MRAM %s: the MRAM address 0x%zx is not %u-byte aligned", call,
             bytes, from, mram.name, mram.offset, DMA_ALIGN);
    if (wram.offset % DMA_ALIGN)
        fail("%s(%u bytes) with WRAM %s: the WRAM address 0x%zx is not %u-byte aligned", call,
             bytes, wram.name, wram.offset, DMA_ALIGN);
    if (bytes > mram.room || mram.offset + bytes > STANDIN_MRAM_BYTES)
        fail("%s(%u bytes) %s MRAM %s: out of range, only %zu bytes remain in the variable",
             call, bytes, from, mram.name, mram.room);
    if (bytes > wram.room)
        fail("%s(%u bytes) with WRAM %s: out of range, only %zu bytes remain there", call,
             bytes, wram.name, wram.room);
    trace_dma(call, &mram, &wram, bytes);
    mram_copy(running, mram.offset, wram_address, bytes, !to_wram);
}

void mram_read(const void *from, void *to, unsigned int bytes)
{
    dma("mram_read", from, to, bytes, 1);
}

void mram_write(const void *from, void *to, unsigned int bytes)
{
    dma("mram_write", to, (void *)from, bytes, 0);
}
