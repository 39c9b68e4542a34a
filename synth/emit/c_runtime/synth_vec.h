/* synth's vector helpers for emitted CPU code (C11 + GCC/Clang vector extensions).
 *
 * SYNTH_VB, the vector width in bytes, is defined before this file is included: the
 * hardware model's register width (64 with AVX-512, 32 with AVX2, 16 with SSE/NEON).
 * Vectors are plain `vector_size` types, so the arithmetic below is explicit SIMD on any
 * target GCC or Clang supports; where the machine has narrower registers the compiler
 * splits them. No -ffast-math is needed or assumed: every routine here is written to stay
 * within synth's f32 validation tolerance (about 1e-4 relative) on its own.
 *
 * exp, log and tanh are Cephes-style range reductions with minimax polynomials (Moshier,
 * Cephes Math Library, expf.c / logf.c / tanhf.c: max relative error about 2 ulp on the
 * ranges used here); sqrt is the hardware's correctly rounded square root.
 */
#ifndef SYNTH_VEC_H
#define SYNTH_VEC_H

#include <math.h>
#include <stdint.h>
#include <string.h>
#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#endif

#define SYNTH_W (SYNTH_VB / 4) /* lanes of a 32-bit vector */

typedef float vf32 __attribute__((vector_size(SYNTH_VB)));
typedef int32_t vi32 __attribute__((vector_size(SYNTH_VB)));
/* unaligned, aliasing views for loads and stores from plain arrays */
typedef float uf32 __attribute__((vector_size(SYNTH_VB), aligned(4), may_alias));
typedef int32_t ui32 __attribute__((vector_size(SYNTH_VB), aligned(4), may_alias));

static inline vf32 vload_f32(const float *p) { return *(const uf32 *)p; }
static inline vi32 vload_i32(const int32_t *p) { return *(const ui32 *)p; }
static inline void vstore_f32(float *p, vf32 v) { *(uf32 *)p = v; }
static inline void vstore_i32(int32_t *p, vi32 v) { *(ui32 *)p = v; }
/* a vector loaded once into a register for several uses. Without the empty asm, which
 * claims to change the register, GCC may fold the load into every use (an FMA with a
 * memory operand): one load per use on the load ports. An online step's outer product
 * with 4 rows so issued 20 loads for 16 FMAs (attention S=1024's online kernel: 1.72 ms,
 * 1.45 with the vector kept: RESULTS.md, "Operand vectors kept in registers") */
#if (defined(__x86_64__) || defined(__i386__)) && (SYNTH_VB == 16 \
    || (SYNTH_VB == 32 && defined(__AVX__)) || (SYNTH_VB == 64 && defined(__AVX512F__)))
#define SYNTH_KEEP(v) __asm__("" : "+v"(v)) /* a vector the size of one register */
#elif defined(__aarch64__) && SYNTH_VB == 16
#define SYNTH_KEEP(v) __asm__("" : "+w"(v))
#else
#define SYNTH_KEEP(v) ((void)0)
#endif
static inline vf32 vload_kept_f32(const float *p) { vf32 v = *(const uf32 *)p; SYNTH_KEEP(v); return v; }
static inline vi32 vload_kept_i32(const int32_t *p) { vi32 v = *(const ui32 *)p; SYNTH_KEEP(v); return v; }
/* a scalar in every lane: the ISA's broadcast, which a load feeding it folds into (one
 * broadcasting load on a load port; `(vf32){0} + x` became a scalar load and a
 * register broadcast on the port an FMA needs: GEMM micro-kernels ran 1.3-1.7x slower) */
static inline vf32 vsplat_f32(float x) {
#if SYNTH_VB == 64 && defined(__AVX512F__)
    return (vf32)_mm512_set1_ps(x);
#elif SYNTH_VB == 32 && defined(__AVX__)
    return (vf32)_mm256_set1_ps(x);
#else
    return x - (vf32){0}; /* not 0 + x, which makes -0.0 +0.0 */
#endif
}
static inline vi32 vsplat_i32(int32_t x) {
#if SYNTH_VB == 64 && defined(__AVX512F__)
    return (vi32)_mm512_set1_epi32(x);
#elif SYNTH_VB == 32 && defined(__AVX__)
    return (vi32)_mm256_set1_epi32(x);
#else
    return (vi32){0} + x;
#endif
}

/* a vector whose lane l is p[l * stride] (a tile gathered along its rows): the ISA's
 * gather where the offsets fit 32 bits, else lane by lane into a register. Writing the
 * lanes into a vector variable one by one, then using it, stalls on store forwarding:
 * a row sum's [16 x 2] register tiles so ran 0.48 ms against 0.10 with the gather
 * (rownorm, RESULTS.md "Gathered loads"). */
#define SYNTH_GATHER(T, V, P, S, ISA512, ISA256, CAST)                                  \
    if ((S) > 0 && (S) * (SYNTH_W - 1) <= INT32_MAX) { ISA512 ISA256 }                   \
    T l_[SYNTH_W];                                                                        \
    for (int l = 0; l < SYNTH_W; l++) l_[l] = (P)[l * (S)];                               \
    return CAST(l_);
#if SYNTH_VB == 64 && defined(__AVX512F__)
#define SYNTH_G512(I, P, F) return (I)F(_mm512_mullo_epi32(_mm512_set_epi32(              \
    15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0), _mm512_set1_epi32((int)stride)), \
    (P), 4);
#else
#define SYNTH_G512(I, P, F)
#endif
#if SYNTH_VB == 32 && defined(__AVX2__)
#define SYNTH_G256(I, P, F) return (I)F(P, _mm256_mullo_epi32(_mm256_set_epi32(           \
    7, 6, 5, 4, 3, 2, 1, 0), _mm256_set1_epi32((int)stride)), 4);
#else
#define SYNTH_G256(I, P, F)
#endif
static inline vf32 vgather_f32(const float *p, int64_t stride) {
    SYNTH_GATHER(float, vf32, p, stride, SYNTH_G512(vf32, p, _mm512_i32gather_ps),
                 SYNTH_G256(vf32, p, _mm256_i32gather_ps), vload_f32)
}
static inline vi32 vgather_i32(const int32_t *p, int64_t stride) {
    SYNTH_GATHER(int32_t, vi32, p, stride, SYNTH_G512(vi32, p, _mm512_i32gather_epi32),
                 SYNTH_G256(vi32, p, _mm256_i32gather_epi32), vload_i32)
}

/* m ? a : b per lane, m from a vector comparison (all ones or all zeros) */
static inline vf32 vselect_f32(vi32 m, vf32 a, vf32 b) {
    return (vf32)((m & (vi32)a) | (~m & (vi32)b));
}
static inline vi32 vselect_i32(vi32 m, vi32 a, vi32 b) { return (m & a) | (~m & b); }

/* max and min as the scalar C helpers compute them: a > b ? a : b. x86's maxps/minps
 * compute exactly that (the second operand when either is NaN or both are zeros), in
 * one instruction: a chain of them waits 2 cycles per step, where the compare and
 * select waited 10.6 (AMD Zen 5, RESULTS.md "Max as one instruction"). */
#if SYNTH_VB == 64 && defined(__AVX512F__)
static inline vf32 vmax_f32(vf32 a, vf32 b) { return (vf32)_mm512_max_ps((__m512)a, (__m512)b); }
static inline vf32 vmin_f32(vf32 a, vf32 b) { return (vf32)_mm512_min_ps((__m512)a, (__m512)b); }
static inline vi32 vmax_i32(vi32 a, vi32 b) { return (vi32)_mm512_max_epi32((__m512i)a, (__m512i)b); }
static inline vi32 vmin_i32(vi32 a, vi32 b) { return (vi32)_mm512_min_epi32((__m512i)a, (__m512i)b); }
#elif SYNTH_VB == 32 && defined(__AVX2__)
static inline vf32 vmax_f32(vf32 a, vf32 b) { return (vf32)_mm256_max_ps((__m256)a, (__m256)b); }
static inline vf32 vmin_f32(vf32 a, vf32 b) { return (vf32)_mm256_min_ps((__m256)a, (__m256)b); }
static inline vi32 vmax_i32(vi32 a, vi32 b) { return (vi32)_mm256_max_epi32((__m256i)a, (__m256i)b); }
static inline vi32 vmin_i32(vi32 a, vi32 b) { return (vi32)_mm256_min_epi32((__m256i)a, (__m256i)b); }
#else
static inline vf32 vmax_f32(vf32 a, vf32 b) { return vselect_f32(a > b, a, b); }
static inline vf32 vmin_f32(vf32 a, vf32 b) { return vselect_f32(a < b, a, b); }
static inline vi32 vmax_i32(vi32 a, vi32 b) { return vselect_i32(a > b, a, b); }
static inline vi32 vmin_i32(vi32 a, vi32 b) { return vselect_i32(a < b, a, b); }
#endif
static inline vf32 vabs_f32(vf32 a) { return (vf32)((vi32)a & 0x7fffffff); }
static inline vi32 vabs_i32(vi32 a) { return vselect_i32(a < 0, -a, a); }

/* integer division as synth's reference defines it: truncating, x / 0 == 0 */
static inline vi32 vdiv_i32(vi32 a, vi32 b) {
    vi32 r;
    for (int l = 0; l < SYNTH_W; l++)
        r[l] = b[l] == 0 ? 0 : b[l] == -1 ? -a[l] : a[l] / b[l];
    return r;
}

static inline vf32 vsqrt_f32(vf32 x) {
#if SYNTH_VB == 64 && defined(__AVX512F__)
    return (vf32)_mm512_sqrt_ps((__m512)x);
#elif SYNTH_VB == 32 && defined(__AVX__)
    return (vf32)_mm256_sqrt_ps((__m256)x);
#elif SYNTH_VB == 16 && defined(__SSE__)
    return (vf32)_mm_sqrt_ps((__m128)x);
#else
    vf32 r;
    for (int l = 0; l < SYNTH_W; l++) r[l] = sqrtf(x[l]);
    return r;
#endif
}

static inline vf32 vexp_f32(vf32 x) {
    const vf32 magic = vsplat_f32(12582912.0f); /* 1.5 * 2^23: adding it rounds to an integer */
    vi32 over = x > 88.72283935546875f;         /* exp overflows f32 */
    vi32 under = x < -86.5f;                    /* below: 0 (the result would be < 2.7e-38) */
    vi32 nan = x != x;
    vf32 xc = vselect_f32(under, vsplat_f32(0.0f), vselect_f32(over, vsplat_f32(0.0f), x));
    vf32 t = xc * 1.44269504088896341f + magic;
    vi32 n = (vi32)t - (vi32)magic; /* round(x / ln 2) */
    vf32 nf = t - magic;
    vf32 r = xc - nf * 0.693359375f + nf * 2.12194440e-4f; /* x - n ln 2, in two parts */
    vf32 z = r * r;
    vf32 p = ((((1.9875691500e-4f * r + 1.3981999507e-3f) * r + 8.3334519073e-3f) * r
               + 4.1665795894e-2f) * r + 1.6666665459e-1f) * r + 5.0000001201e-1f;
    p = p * z + r + 1.0f;
    vf32 y = (p + p) * (vf32)((n + 126) << 23); /* p * 2^n, as (2p) * 2^(n-1) */
    y = vselect_f32(over, vsplat_f32(INFINITY), vselect_f32(under, vsplat_f32(0.0f), y));
    return vselect_f32(nan, x, y);
}

static inline vf32 vlog_f32(vf32 x) {
    vi32 bits = (vi32)x;
    vi32 e = ((bits >> 23) & 0xff) - 126;
    vf32 m = (vf32)((bits & 0x007fffff) | 0x3f000000); /* x = m * 2^e, m in [0.5, 1) */
    vi32 small = m < 0.707106781186547524f;
    e = e - (small & 1);
    m = vselect_f32(small, m + m, m) - 1.0f;
    vf32 ef = __builtin_convertvector(e, vf32);
    vf32 z = m * m;
    vf32 p = ((((((((7.0376836292e-2f * m - 1.1514610310e-1f) * m + 1.1676998740e-1f) * m
                   - 1.2420140846e-1f) * m + 1.4249322787e-1f) * m - 1.6668057665e-1f) * m
                + 2.0000714765e-1f) * m - 2.4999993993e-1f) * m + 3.3333331174e-1f);
    vf32 y = m * z * p + ef * -2.12194440e-4f - 0.5f * z;
    y = m + y + ef * 0.693359375f;
    y = vselect_f32(x == 0.0f, vsplat_f32(-INFINITY), y);
    y = vselect_f32(x < 0.0f, vsplat_f32(NAN), y);
    y = vselect_f32(x == INFINITY, vsplat_f32(INFINITY), y);
    /* subnormal inputs: computed in double, lane by lane (rare) */
    vi32 tiny = (x > 0.0f) & (x < 1.17549435e-38f);
    for (int l = 0; l < SYNTH_W; l++)
        if (tiny[l]) y[l] = (float)log((double)x[l]);
    return vselect_f32(x != x, x, y);
}

static inline vf32 vtanh_f32(vf32 x) {
    vf32 a = vabs_f32(x);
    vf32 z = x * x; /* |x| < 0.625: odd polynomial */
    vf32 p = ((((-5.70498872745e-3f * z + 2.06390887954e-2f) * z - 5.37397155531e-2f) * z
               + 1.33314422036e-1f) * z - 3.33332819422e-1f);
    vf32 near = x + x * z * p;
    vf32 far = 1.0f - 2.0f / (vexp_f32(a + a) + 1.0f); /* tanh|x| = 1 - 2 / (e^2|x| + 1) */
    far = (vf32)(((vi32)far) | ((vi32)x & (int32_t)0x80000000)); /* the sign of x */
    return vselect_f32(a < 0.625f, near, far);
}

/* horizontal folds of a vector of partial results, pairwise (halves, then quarters, ...):
 * log2(lanes) dependent steps of a few instructions, the ISA's reduce sequences where
 * there are; folding the lanes one after another in lane order made a 16-lane fold a
 * chain of 16 extracts and adds (softmax's e_s with a fold per 16 elements ran 1.8x
 * its model: 0.97 against 0.53 ms, pairwise 0.53 ms) */
#define SYNTH_PAIRWISE(T, V, OP) \
    T a_[SYNTH_W]; \
    for (int l = 0; l < SYNTH_W; l++) a_[l] = (V)[l]; \
    for (int w = SYNTH_W / 2; w > 0; w /= 2) \
        for (int l = 0; l < w; l++) a_[l] = OP(a_[l], a_[l + w]); \
    return a_[0];
#define SYNTH_ADD(a, b) ((a) + (b))
#define SYNTH_MUL(a, b) ((a) * (b))
#define SYNTH_MAX(a, b) ((b) > (a) ? (b) : (a))
#define SYNTH_MIN(a, b) ((b) < (a) ? (b) : (a))
#if SYNTH_VB == 64 && defined(__AVX512F__)
static inline float vsum_f32(vf32 v) { return _mm512_reduce_add_ps((__m512)v); }
static inline float vprod_f32(vf32 v) { return _mm512_reduce_mul_ps((__m512)v); }
static inline float vhmax_f32(vf32 v) { return _mm512_reduce_max_ps((__m512)v); }
static inline float vhmin_f32(vf32 v) { return _mm512_reduce_min_ps((__m512)v); }
static inline int32_t vsum_i32(vi32 v) { return _mm512_reduce_add_epi32((__m512i)v); }
static inline int32_t vprod_i32(vi32 v) { return _mm512_reduce_mul_epi32((__m512i)v); }
static inline int32_t vhmax_i32(vi32 v) { return _mm512_reduce_max_epi32((__m512i)v); }
static inline int32_t vhmin_i32(vi32 v) { return _mm512_reduce_min_epi32((__m512i)v); }
#else
static inline float vsum_f32(vf32 v) { SYNTH_PAIRWISE(float, v, SYNTH_ADD) }
static inline float vprod_f32(vf32 v) { SYNTH_PAIRWISE(float, v, SYNTH_MUL) }
static inline float vhmax_f32(vf32 v) { SYNTH_PAIRWISE(float, v, SYNTH_MAX) }
static inline float vhmin_f32(vf32 v) { SYNTH_PAIRWISE(float, v, SYNTH_MIN) }
static inline int32_t vsum_i32(vi32 v) { SYNTH_PAIRWISE(int32_t, v, SYNTH_ADD) }
static inline int32_t vprod_i32(vi32 v) { SYNTH_PAIRWISE(int32_t, v, SYNTH_MUL) }
static inline int32_t vhmax_i32(vi32 v) { SYNTH_PAIRWISE(int32_t, v, SYNTH_MAX) }
static inline int32_t vhmin_i32(vi32 v) { SYNTH_PAIRWISE(int32_t, v, SYNTH_MIN) }
#endif

#endif /* SYNTH_VEC_H */
