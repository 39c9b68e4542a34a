/* calibrate.c: micro-benchmarks of the machine synth runs on (`synth calibrate`).
 *
 * Built by synth.calibrate with the system compiler (-O3 -march=native -fopenmp, SYNTH_VB
 * defined as the emitted code's vector width) and called through ctypes. Every function
 * runs its loop `n` times and returns the seconds it took (CLOCK_MONOTONIC); the Python side
 * repeats, takes medians and converts to cycles with the measured clock.
 *
 * The loops must not be folded by the compiler: every value a loop carries goes through an
 * empty `asm volatile` that claims to modify it ("+r" for scalars, "+x" for vectors), so
 * each arithmetic instruction is executed as written, and each result is consumed by one
 * (the "x" input keeps it alive). The vector math routines are synth_vec.h's, as the
 * emitted code calls them.
 */
#define _GNU_SOURCE
#include "synth_vec.h"

#include <omp.h>
#include <stdint.h>
#include <stdlib.h>
#include <time.h>

#define KEEP(v) __asm__ volatile("" : "+x"(v))
#define USE(v) __asm__ volatile("" : : "x"(v))
#define KEEP_R(v) __asm__ volatile("" : "+r"(v))

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

int synth_cal_vector_bytes(void) { return SYNTH_VB; }

/* The core clock: a chain of dependent register-register integer adds, one cycle each, 16
 * per iteration (not adds of a constant: recent x86 cores fold those at rename, in no
 * cycle at all). */
double synth_cal_clock(int64_t n) {
    uint64_t x = 1, y = 3;
    KEEP_R(y);
    double t = now();
    for (int64_t i = 0; i < n; i++) {
#define STEP x += y; KEEP_R(x);
        STEP STEP STEP STEP STEP STEP STEP STEP
        STEP STEP STEP STEP STEP STEP STEP STEP
#undef STEP
    }
    t = now() - t;
    __asm__ volatile("" : : "r"(x));
    return t;
}

/* Throughput of one vector operation: 12 independent chains (enough to cover a 4-6 cycle
 * latency on two pipes), 12 instructions per iteration. */
#define THROUGHPUT(NAME, OP)                                                                \
    double synth_cal_##NAME(int64_t n) {                                                    \
        vf32 a0 = vsplat_f32(1.0f), a1 = a0 + 0.1f, a2 = a0 + 0.2f, a3 = a0 + 0.3f;         \
        vf32 a4 = a0 + 0.4f, a5 = a0 + 0.5f, a6 = a0 + 0.6f, a7 = a0 + 0.7f;                \
        vf32 a8 = a0 + 0.8f, a9 = a0 + 0.9f, a10 = a0 + 1.0f, a11 = a0 + 1.1f;              \
        vf32 m = vsplat_f32(0.999999f), c = vsplat_f32(1e-7f);                              \
        KEEP(m); KEEP(c);                                                                   \
        double t = now();                                                                   \
        for (int64_t i = 0; i < n; i++) {                                                   \
            a0 = OP(a0); KEEP(a0); a1 = OP(a1); KEEP(a1); a2 = OP(a2); KEEP(a2);            \
            a3 = OP(a3); KEEP(a3); a4 = OP(a4); KEEP(a4); a5 = OP(a5); KEEP(a5);            \
            a6 = OP(a6); KEEP(a6); a7 = OP(a7); KEEP(a7); a8 = OP(a8); KEEP(a8);            \
            a9 = OP(a9); KEEP(a9); a10 = OP(a10); KEEP(a10); a11 = OP(a11); KEEP(a11);      \
        }                                                                                   \
        t = now() - t;                                                                      \
        USE(a0); USE(a1); USE(a2); USE(a3); USE(a4); USE(a5);                               \
        USE(a6); USE(a7); USE(a8); USE(a9); USE(a10); USE(a11);                             \
        return t;                                                                           \
    }

#if defined(__AVX512F__) && SYNTH_VB == 64
#define FMA(x) (vf32) _mm512_fmadd_ps((__m512)(x), (__m512)m, (__m512)c)
#elif defined(__FMA__) && SYNTH_VB == 32
#define FMA(x) (vf32) _mm256_fmadd_ps((__m256)(x), (__m256)m, (__m256)c)
#elif defined(__FMA__) && SYNTH_VB == 16
#define FMA(x) (vf32) _mm_fmadd_ps((__m128)(x), (__m128)m, (__m128)c)
#else
#define FMA(x) ((x) * m + c)
#endif
#define ADD(x) ((x) + c)
#define MUL(x) ((x) * m)
#define MAX(x) vmax_f32((x), c)

THROUGHPUT(fma, FMA)
THROUGHPUT(add, ADD)
THROUGHPUT(mul, MUL)
THROUGHPUT(max, MAX)

/* The latency of a dependent chain of one operation (an accumulator's updates): one
 * accumulator, 8 operations per iteration. */
#define LATENCY(NAME, OP)                                                                   \
    double synth_cal_##NAME##_latency(int64_t n) {                                          \
        vf32 a0 = vsplat_f32(1.0f), m = vsplat_f32(0.999999f), c = vsplat_f32(1e-7f);      \
        KEEP(m); KEEP(c);                                                                   \
        double t = now();                                                                   \
        for (int64_t i = 0; i < n; i++) {                                                   \
            a0 = OP(a0); KEEP(a0); a0 = OP(a0); KEEP(a0); a0 = OP(a0); KEEP(a0);            \
            a0 = OP(a0); KEEP(a0); a0 = OP(a0); KEEP(a0); a0 = OP(a0); KEEP(a0);            \
            a0 = OP(a0); KEEP(a0); a0 = OP(a0); KEEP(a0);                                   \
        }                                                                                   \
        t = now() - t;                                                                      \
        USE(a0);                                                                            \
        return t;                                                                           \
    }

LATENCY(fma, FMA)
LATENCY(add, ADD)
LATENCY(max, MAX)

/* The ISA's gather as vgather_f32 does it: lanes 33 floats apart (each from its own line),
 * from a 16 KiB buffer in L1, 8 independent gathers per iteration, each summed. */
#define GATHER_FLOATS 4096
static float gather_in[GATHER_FLOATS] __attribute__((aligned(64)));

double synth_cal_gather(int64_t n) {
    for (int i = 0; i < GATHER_FLOATS; i++) gather_in[i] = 1.0f;
    vf32 a0 = vsplat_f32(0.0f), a1 = a0, a2 = a0, a3 = a0, a4 = a0, a5 = a0, a6 = a0, a7 = a0;
    int64_t span = GATHER_FLOATS - 33 * SYNTH_W - 8;
    double t = now();
    for (int64_t i = 0; i < n; i++) {
        const float *p = &gather_in[(i * 8) % span];
        a0 = a0 + vgather_f32(p, 33); a1 = a1 + vgather_f32(p + 1, 33);
        a2 = a2 + vgather_f32(p + 2, 33); a3 = a3 + vgather_f32(p + 3, 33);
        a4 = a4 + vgather_f32(p + 4, 33); a5 = a5 + vgather_f32(p + 5, 33);
        a6 = a6 + vgather_f32(p + 6, 33); a7 = a7 + vgather_f32(p + 7, 33);
        KEEP(a0); KEEP(a1); KEEP(a2); KEEP(a3); KEEP(a4); KEEP(a5); KEEP(a6); KEEP(a7);
    }
    t = now() - t;
    USE(a0); USE(a1); USE(a2); USE(a3); USE(a4); USE(a5); USE(a6); USE(a7);
    return t;
}

/* The same gathers in runs: per iteration, 8 gathers back to back into 8 registers (as the
 * emitted code fills a register tile of 8 vectors), then their 8 sums. On AMD Zen 5 a run
 * of 2 to 8 gathers took 13.5 cycles each, a gather between other instructions (the loop
 * above, each followed by its add) 20.5 (RESULTS.md, "Gathers alone and in runs"). */
double synth_cal_gather_run(int64_t n) {
    for (int i = 0; i < GATHER_FLOATS; i++) gather_in[i] = 1.0f;
    vf32 a0 = vsplat_f32(0.0f), a1 = a0, a2 = a0, a3 = a0, a4 = a0, a5 = a0, a6 = a0, a7 = a0;
    int64_t span = GATHER_FLOATS - 33 * SYNTH_W - 8;
    double t = now();
    for (int64_t i = 0; i < n; i++) {
        const float *p = &gather_in[(i * 8) % span];
        vf32 g0 = vgather_f32(p, 33), g1 = vgather_f32(p + 1, 33);
        vf32 g2 = vgather_f32(p + 2, 33), g3 = vgather_f32(p + 3, 33);
        vf32 g4 = vgather_f32(p + 4, 33), g5 = vgather_f32(p + 5, 33);
        vf32 g6 = vgather_f32(p + 6, 33), g7 = vgather_f32(p + 7, 33);
        KEEP(g0); KEEP(g1); KEEP(g2); KEEP(g3); KEEP(g4); KEEP(g5); KEEP(g6); KEEP(g7);
        a0 = a0 + g0; a1 = a1 + g1; a2 = a2 + g2; a3 = a3 + g3;
        a4 = a4 + g4; a5 = a5 + g5; a6 = a6 + g6; a7 = a7 + g7;
        KEEP(a0); KEEP(a1); KEEP(a2); KEEP(a3); KEEP(a4); KEEP(a5); KEEP(a6); KEEP(a7);
    }
    t = now() - t;
    USE(a0); USE(a1); USE(a2); USE(a3); USE(a4); USE(a5); USE(a6); USE(a7);
    return t;
}

/* The two loops below walk their buffer with a mask, not `%` (a modulo by a count that
 * is not a power of two is a multiply, shifts and a subtraction per iteration). */
#define WALK_MASK (GATHER_FLOATS / 2 - 1) /* offsets in the buffer's first half */

/* One element of `p` into every lane by the ISA's broadcasting load, the instruction a
 * GEMM's register tile loads its A operand with (gcc folds the emitted code's
 * `vsplat_f32(A[i])` into it). `vsplat_f32(p[k])` here would not measure it: with 12 of
 * them kept apart by `USE`, gcc loaded 12 scalars and broadcast each from a register, on
 * the vector unit's shuffle port (AMD Zen 3: 0.92 cycles each, against 0.51 for the
 * broadcasting load). */
static inline vf32 vbroadcast_load_f32(const float *p) {
#if SYNTH_VB == 64 && defined(__AVX512F__)
    return (vf32)_mm512_broadcastss_ps(_mm_load_ss(p));
#elif SYNTH_VB == 32 && defined(__AVX__)
    return (vf32)_mm256_broadcast_ss(p);
#elif SYNTH_VB == 16 && defined(__AVX__)
    return (vf32)_mm_broadcast_ss(p);
#else
    return vsplat_f32(*(const volatile float *)p); /* a load each, then the broadcast */
#endif
}

/* A broadcasting load (one element into every lane), as a GEMM's register tile loads
 * its A operand: 12 independent ones per iteration from a 16 KiB buffer in L1. */
double synth_cal_broadcast(int64_t n) {
    for (int i = 0; i < GATHER_FLOATS; i++) gather_in[i] = 1.0f;
    double t = now();
    for (int64_t i = 0; i < n; i++) {
        const float *p = &gather_in[(i * 16) & WALK_MASK];
        vf32 b0 = vbroadcast_load_f32(p), b1 = vbroadcast_load_f32(p + 1);
        vf32 b2 = vbroadcast_load_f32(p + 2), b3 = vbroadcast_load_f32(p + 3);
        vf32 b4 = vbroadcast_load_f32(p + 4), b5 = vbroadcast_load_f32(p + 5);
        vf32 b6 = vbroadcast_load_f32(p + 6), b7 = vbroadcast_load_f32(p + 7);
        vf32 b8 = vbroadcast_load_f32(p + 8), b9 = vbroadcast_load_f32(p + 9);
        vf32 b10 = vbroadcast_load_f32(p + 10), b11 = vbroadcast_load_f32(p + 11);
        USE(b0); USE(b1); USE(b2); USE(b3); USE(b4); USE(b5);
        USE(b6); USE(b7); USE(b8); USE(b9); USE(b10); USE(b11);
    }
    return now() - t;
}

/* A GEMM's register tile as the emitted code runs it: per iteration, 8 rows of A
 * broadcast, one vector of B loaded, 8 FMAs into 8 accumulators ([8 x 16] f32 at
 * AVX-512), the operands streaming through a 16 KiB buffer in L1. Against the FMAs' and
 * the loads' own times it says how much of the loads the FMAs hide. */
double synth_cal_microkernel(int64_t n) {
    for (int i = 0; i < GATHER_FLOATS; i++) gather_in[i] = 1e-3f * (float)(i % 7);
    vf32 c0 = vsplat_f32(0.0f), c1 = c0, c2 = c0, c3 = c0, c4 = c0, c5 = c0, c6 = c0, c7 = c0;
    double t = now();
    for (int64_t i = 0; i < n; i++) {
        const float *a = &gather_in[(i * 8) & WALK_MASK];
        vf32 b = vload_f32(&gather_in[GATHER_FLOATS / 2 + ((i * SYNTH_W) & WALK_MASK)]);
        c0 += vsplat_f32(a[0]) * b; c1 += vsplat_f32(a[1]) * b;
        c2 += vsplat_f32(a[2]) * b; c3 += vsplat_f32(a[3]) * b;
        c4 += vsplat_f32(a[4]) * b; c5 += vsplat_f32(a[5]) * b;
        c6 += vsplat_f32(a[6]) * b; c7 += vsplat_f32(a[7]) * b;
    }
    t = now() - t;
    USE(c0); USE(c1); USE(c2); USE(c3); USE(c4); USE(c5); USE(c6); USE(c7);
    return t;
}

/* The fold of a vector's lanes into one (`vsum_f32`: log2(lanes) shuffles and adds) where
 * the emitted code folds: after each vector of exps of a softmax-like row, as a kernel with
 * a one-vector register tile of the sum does. synth_cal_exp_sum keeps the sum in a vector
 * accumulator, synth_cal_exp_fold folds every vector into a scalar: the difference is
 * what a fold costs beside the work around it (on AMD Zen 5, 8.3 cycles, where 8
 * independent folds alone ran 2.6 each: the exps' long chains leave the out-of-order
 * core no room to hide the fold's). One vector per iteration, from a 16 KiB buffer in L1,
 * each exp stored back as the kernel stores e. */
#define FOLD_VECTORS 256
static float fold_in[FOLD_VECTORS * SYNTH_W] __attribute__((aligned(64)));
static float fold_out[FOLD_VECTORS * SYNTH_W] __attribute__((aligned(64)));

double synth_cal_exp_sum(int64_t n) {
    for (int i = 0; i < FOLD_VECTORS * SYNTH_W; i++) fold_in[i] = (float)(i % 97) * 0.01f - 0.5f;
    vf32 a = vsplat_f32(0.0f);
    double t = now();
    for (int64_t i = 0; i < n; i++) {
        int64_t at = (i % FOLD_VECTORS) * SYNTH_W;
        vf32 e = vexp_f32(vload_f32(&fold_in[at]));
        vstore_f32(&fold_out[at], e);
        a = a + e;
    }
    t = now() - t;
    USE(a);
    return t;
}

double synth_cal_exp_fold(int64_t n) {
    for (int i = 0; i < FOLD_VECTORS * SYNTH_W; i++) fold_in[i] = (float)(i % 97) * 0.01f - 0.5f;
    float s = 0.0f;
    double t = now();
    for (int64_t i = 0; i < n; i++) {
        int64_t at = (i % FOLD_VECTORS) * SYNTH_W;
        vf32 e = vexp_f32(vload_f32(&fold_in[at]));
        vstore_f32(&fold_out[at], e);
        s = s + vsum_f32(e);
    }
    t = now() - t;
    USE(s);
    return t;
}

/* The vector math routines: 8 independent inputs per iteration, each result consumed; the
 * inputs are "modified" (KEEP) so every call is computed again. Inputs in the routines'
 * ordinary ranges (positive for log, sqrt and rsqrt). */
#define ROUTINE(NAME, EXPR)                                                                 \
    double synth_cal_##NAME(int64_t n) {                                                    \
        vf32 x0 = vsplat_f32(0.5f), x1 = x0 + 0.25f, x2 = x0 + 0.5f, x3 = x0 + 0.75f;       \
        vf32 x4 = x0 + 1.0f, x5 = x0 + 1.25f, x6 = x0 + 1.5f, x7 = x0 + 1.75f;              \
        vf32 y = vsplat_f32(1.5f);                                                          \
        KEEP(y);                                                                            \
        double t = now();                                                                   \
        for (int64_t i = 0; i < n; i++) {                                                   \
            KEEP(x0); KEEP(x1); KEEP(x2); KEEP(x3); KEEP(x4); KEEP(x5); KEEP(x6); KEEP(x7); \
            vf32 r0 = EXPR(x0), r1 = EXPR(x1), r2 = EXPR(x2), r3 = EXPR(x3);                \
            vf32 r4 = EXPR(x4), r5 = EXPR(x5), r6 = EXPR(x6), r7 = EXPR(x7);                \
            USE(r0); USE(r1); USE(r2); USE(r3); USE(r4); USE(r5); USE(r6); USE(r7);         \
        }                                                                                   \
        return now() - t;                                                                   \
    }

/* as synth.emit.c writes them */
#define DIV(x) ((x) / y)
#define RSQRT(x) (1.0f / vsqrt_f32(x))
#define RECIP(x) (1.0f / (x))

ROUTINE(exp, vexp_f32)
ROUTINE(log, vlog_f32)
ROUTINE(tanh, vtanh_f32)
ROUTINE(sqrt, vsqrt_f32)
ROUTINE(div, DIV)
ROUTINE(rsqrt, RSQRT)
ROUTINE(recip, RECIP)

/* Read bandwidth: `passes` sweeps over `bytes` of `buf` with 8 vector accumulators, on
 * `threads` threads (each reads its own contiguous share). */
double synth_cal_read(const float *buf, int64_t bytes, int64_t passes, int threads) {
    int64_t floats = bytes / 4;
    double t = now();
#pragma omp parallel num_threads(threads)
    {
        int nt = omp_get_num_threads(), id = omp_get_thread_num();
        int64_t per = floats / nt / (8 * SYNTH_W) * (8 * SYNTH_W);
        const float *p = buf + (int64_t)id * per;
        vf32 s0 = {0}, s1 = {0}, s2 = {0}, s3 = {0}, s4 = {0}, s5 = {0}, s6 = {0}, s7 = {0};
        for (int64_t pass = 0; pass < passes; pass++) {
            for (int64_t i = 0; i < per; i += 8 * SYNTH_W) {
                s0 += vload_f32(p + i);
                s1 += vload_f32(p + i + SYNTH_W);
                s2 += vload_f32(p + i + 2 * SYNTH_W);
                s3 += vload_f32(p + i + 3 * SYNTH_W);
                s4 += vload_f32(p + i + 4 * SYNTH_W);
                s5 += vload_f32(p + i + 5 * SYNTH_W);
                s6 += vload_f32(p + i + 6 * SYNTH_W);
                s7 += vload_f32(p + i + 7 * SYNTH_W);
            }
            KEEP(s0); KEEP(s1); KEEP(s2); KEEP(s3); KEEP(s4); KEEP(s5); KEEP(s6); KEEP(s7);
        }
        vf32 s = ((s0 + s1) + (s2 + s3)) + ((s4 + s5) + (s6 + s7));
        USE(s);
    }
    return now() - t;
}

/* Runs of `run` floats from each of `rows` rows `stride` floats apart, a column of runs
 * after another until the rows are read whole, `passes` times, on `threads` threads (each
 * its own columns): how the C emitter's packs read a tile narrower than the tensor's rows
 * out of DRAM, each run on another page. */
double synth_cal_runs(const float *buf, int64_t stride, int64_t rows, int64_t run,
                      int64_t passes, int threads) {
    double t = now();
#pragma omp parallel num_threads(threads)
    {
        int nt = omp_get_num_threads(), id = omp_get_thread_num();
        vf32 s0 = {0}, s1 = {0};
        for (int64_t pass = 0; pass < passes; pass++) {
            for (int64_t col = (int64_t)id * run; col < stride; col += (int64_t)nt * run) {
                for (int64_t r = 0; r < rows; r++) {
                    const float *p = buf + r * stride + col;
                    int64_t j = 0;
                    for (; j + 2 * SYNTH_W <= run; j += 2 * SYNTH_W) {
                        s0 += vload_f32(p + j);
                        s1 += vload_f32(p + j + SYNTH_W);
                    }
                    if (j < run) s0 += vload_f32(p + j); /* `run`: a multiple of a vector */
                }
            }
            KEEP(s0); KEEP(s1);
        }
        vf32 s = s0 + s1;
        USE(s);
    }
    return now() - t;
}

/* A strip a line wide walked down `rows` rows `stride` floats apart (rows that share one
 * set of the L1d when `stride` is a way's bytes), `walks` times, a new column every 4
 * walks: per row a vector load and, with `write`, an add and a store back (an accumulator
 * tile read and written, as a kernel's register tiles walking down a column of it). */
double synth_cal_strip(float *buf, int64_t stride, int64_t rows, int write, int64_t walks) {
    vf32 acc = vsplat_f32(0.0f), step = vsplat_f32(1e-7f);
    double t = now();
    for (int64_t w = 0; w < walks; w++) {
        float *column = buf + ((w / 4) % 16) * SYNTH_W;
        if (write) {
            for (int64_t r = 0; r < rows; r++) {
                vstore_f32(column + r * stride, vload_f32(column + r * stride) + step);
            }
        } else {
            for (int64_t r = 0; r < rows; r++) {
                acc = acc + vload_f32(column + r * stride);
            }
            KEEP(acc);
        }
    }
    t = now() - t;
    USE(acc);
    return t;
}

/* Load-to-use latency: `steps` dependent loads through `next`, a cyclic permutation of
 * cache-line indices (one line per step) written by the caller, from `*at` on (where the
 * last call stopped: a repeated call walks on to lines not visited yet, instead of the
 * ones the last call left in the caches). */
double synth_cal_chase(const int64_t *next, int64_t steps, int64_t *at) {
    int64_t here = *at;
    double t = now();
    for (int64_t i = 0; i < steps; i++) {
        here = next[here];
    }
    t = now() - t;
    *at = here;
    return t;
}

/* An OpenMP parallel region on `threads` threads, started and joined `n` times. */
double synth_cal_region(int64_t n, int threads) {
    double t = now();
    for (int64_t i = 0; i < n; i++) {
#pragma omp parallel num_threads(threads)
        {
            int id = omp_get_thread_num();
            KEEP_R(id);
        }
    }
    return now() - t;
}

/* `n` barriers inside one parallel region on `threads` threads. */
double synth_cal_barrier(int64_t n, int threads) {
    double t = 0;
#pragma omp parallel num_threads(threads)
    {
#pragma omp barrier
        double start = now();
        for (int64_t i = 0; i < n; i++) {
#pragma omp barrier
        }
#pragma omp master
        t = now() - start;
    }
    return t;
}

/* FMA throughput on `threads` threads at once: the seconds the slowest thread took to run
 * `n` iterations of synth_cal_fma's loop. */
double synth_cal_fma_parallel(int64_t n, int threads) {
    double slowest = 0;
#pragma omp parallel num_threads(threads) reduction(max : slowest)
    {
        slowest = synth_cal_fma(n);
    }
    return slowest;
}
