/* synth's math functions for DPU programs (not a stand-in: the SDK build uses them too).
 *
 * The UPMEM DPU runtime has no libm: its C library (share/upmem/include/stdlib) has no
 * <math.h>, and its system library only the soft-float arithmetic the compiler calls
 * (__addsf3, __mulsf3, __divsf3, ...), see SDK_NOTES.md. So synth/emit/upmem.py copies
 * into each DPU program the functions below that the program calls, and the same code
 * runs on the DPUs and, under `make check`, on the host.
 *
 * They use only + - * /, comparisons and integer bit operations. The float versions are
 * within a few ulp of the correctly rounded result, the double versions within a few ulp
 * of theirs (sqrt is correctly rounded: perfect squares stay exact); NaN, infinities,
 * zeros and subnormals behave as C99 Annex F says. tests/test_emit_upmem.py checks them
 * against NumPy.
 *
 * Format (read by the emitter): each function starts at a line "static ... math_NAME(" and
 * ends at the next line "}"; a comment line "needs: math_a, math_b" just above it lists
 * the functions it calls, which the emitter copies first.
 */

/* The bits of a float, and the float of some bits. */
static inline uint32_t math_float_bits(float x)
{
    union { float f; uint32_t u; } v;
    v.f = x;
    return v.u;
}

static inline float math_bits_float(uint32_t u)
{
    union { float f; uint32_t u; } v;
    v.u = u;
    return v.f;
}

static inline uint64_t math_double_bits(double x)
{
    union { double f; uint64_t u; } v;
    v.f = x;
    return v.u;
}

static inline double math_bits_double(uint64_t u)
{
    union { double f; uint64_t u; } v;
    v.u = u;
    return v.f;
}

/* needs: math_float_bits, math_bits_float */
static inline float math_fabsf(float x)
{
    return math_bits_float(math_float_bits(x) & 0x7fffffffu);
}

/* needs: math_double_bits, math_bits_double */
static inline double math_fabs(double x)
{
    return math_bits_double(math_double_bits(x) & 0x7fffffffffffffffull);
}

/* x * 2^n in steps that keep the intermediate normal, so that a subnormal result is
 * rounded once.
 * needs: math_bits_float */
static float math_scalbnf(float x, int n)
{
    if (n > 127) {
        x *= 0x1p127f;
        n -= 127;
        if (n > 127) {
            x *= 0x1p127f;
            n = n - 127 > 127 ? 127 : n - 127;
        }
    } else if (n < -126) {
        x *= 0x1p-102f; /* 2^-126 * 2^24 */
        n += 102;
        if (n < -126) {
            x *= 0x1p-102f;
            n = n + 102 < -126 ? -126 : n + 102;
        }
    }
    return x * math_bits_float((uint32_t)(127 + n) << 23);
}

/* needs: math_bits_double */
static double math_scalbn(double x, int n)
{
    if (n > 1023) {
        x *= 0x1p1023;
        n -= 1023;
        if (n > 1023) {
            x *= 0x1p1023;
            n = n - 1023 > 1023 ? 1023 : n - 1023;
        }
    } else if (n < -1022) {
        x *= 0x1p-969; /* 2^-1022 * 2^53 */
        n += 969;
        if (n < -1022) {
            x *= 0x1p-969;
            n = n + 969 < -1022 ? -1022 : n + 969;
        }
    }
    return x * math_bits_double((uint64_t)(1023 + n) << 52);
}

/* e^x = 2^n e^r with n = round(x / ln 2), |r| <= ln(2) / 2, e^r by its Taylor series.
 * needs: math_scalbnf */
static float math_expf(float x)
{
    if (x != x)
        return x;
    if (x > 89.0f) /* beyond the largest float */
        return __builtin_inff();
    if (x < -104.0f) /* below half the smallest subnormal */
        return 0.0f;
    float k = x * 1.44269502f; /* 1 / ln 2 */
    int n = (int)(k < 0.0f ? k - 0.5f : k + 0.5f);
    /* ln 2 = 0.693145751953125 (exact times any |n| < 256) + 1.42860682e-6 */
    float r = (x - (float)n * 0.693145751953125f) - (float)n * 1.42860682e-6f;
    float p = 1.0f + r * (1.0f + r * (0.5f + r * (0.166666672f + r * (0.0416666679f
              + r * (0.00833333377f + r * (0.00138888892f + r * 0.000198412701f))))));
    return math_scalbnf(p, n);
}

/* needs: math_scalbn */
static double math_exp(double x)
{
    if (x != x)
        return x;
    if (x > 710.0)
        return __builtin_inf();
    if (x < -746.0)
        return 0.0;
    double k = x * 1.4426950408889634;
    int n = (int)(k < 0.0 ? k - 0.5 : k + 0.5);
    /* fdlibm's split of ln 2: the high part has 32 significant bits */
    double r = (x - (double)n * 6.93147180369123816490e-01)
               - (double)n * 1.90821492927058770002e-10;
    double p = 2.08767569878681e-09 + r * 1.6059043836821613e-10;
    p = 2.505210838544172e-08 + r * p;
    p = 2.755731922398589e-07 + r * p;
    p = 2.7557319223985893e-06 + r * p;
    p = 2.48015873015873e-05 + r * p;
    p = 0.0001984126984126984 + r * p;
    p = 0.001388888888888889 + r * p;
    p = 0.008333333333333333 + r * p;
    p = 0.041666666666666664 + r * p;
    p = 0.16666666666666666 + r * p;
    p = 0.5 + r * p;
    p = 1.0 + r * p;
    p = 1.0 + r * p;
    return math_scalbn(p, n);
}

/* ln x = e ln 2 + ln m, m in [sqrt(2)/2, sqrt(2)], ln m = 2 atanh(s), s = (m-1)/(m+1).
 * needs: math_float_bits, math_bits_float */
static float math_logf(float x)
{
    if (x != x)
        return x;
    if (x < 0.0f)
        return __builtin_nanf("");
    if (x == 0.0f)
        return -__builtin_inff();
    if (x == __builtin_inff())
        return x;
    int e = 0;
    uint32_t bits = math_float_bits(x);
    if (bits < 0x00800000u) { /* subnormal: scale it into the normal range first */
        bits = math_float_bits(x * 0x1p25f);
        e = -25;
    }
    e += (int)(bits >> 23) - 127;
    float m = math_bits_float((bits & 0x007fffffu) | 0x3f800000u); /* [1, 2) */
    if (m > 1.41421354f) {
        m *= 0.5f;
        e += 1;
    }
    float f = m - 1.0f;
    float s = f / (2.0f + f);
    float z = s * s;
    float tail = z * (0.666666687f + z * (0.400000006f + z * (0.285714298f
                 + z * (0.222222224f + z * 0.181818187f))));
    float log_m = 2.0f * s + s * tail;
    return (float)e * 0.693145751953125f + ((float)e * 1.42860682e-6f + log_m);
}

/* needs: math_double_bits, math_bits_double */
static double math_log(double x)
{
    if (x != x)
        return x;
    if (x < 0.0)
        return __builtin_nan("");
    if (x == 0.0)
        return -__builtin_inf();
    if (x == __builtin_inf())
        return x;
    int e = 0;
    uint64_t bits = math_double_bits(x);
    if (bits < 0x0010000000000000ull) { /* subnormal */
        bits = math_double_bits(x * 0x1p54);
        e = -54;
    }
    e += (int)(bits >> 52) - 1023;
    double m = math_bits_double((bits & 0x000fffffffffffffull) | 0x3ff0000000000000ull);
    if (m > 1.4142135623730951) {
        m *= 0.5;
        e += 1;
    }
    double f = m - 1.0;
    double s = f / (2.0 + f);
    double z = s * s;
    double t = 0.09523809523809523 + z * 0.08695652173913043;
    t = 0.10526315789473684 + z * t;
    t = 0.11764705882352941 + z * t;
    t = 0.13333333333333333 + z * t;
    t = 0.15384615384615385 + z * t;
    t = 0.18181818181818182 + z * t;
    t = 0.2222222222222222 + z * t;
    t = 0.2857142857142857 + z * t;
    t = 0.4 + z * t;
    t = 0.6666666666666666 + z * t;
    double log_m = 2.0 * s + s * (z * t);
    return (double)e * 6.93147180369123816490e-01
           + ((double)e * 1.90821492927058770002e-10 + log_m);
}

/* Correctly rounded, digit by digit on the significand (fdlibm's e_sqrtf.c method).
 * needs: math_float_bits, math_bits_float */
static float math_sqrtf(float x)
{
    if (x != x || x == 0.0f || x == __builtin_inff()) /* NaN, +-0 and +inf: themselves */
        return x;
    if (x < 0.0f)
        return __builtin_nanf("");
    uint32_t bits = math_float_bits(x);
    int e = (int)(bits >> 23);
    uint32_t m = bits & 0x007fffffu;
    if (e == 0) { /* subnormal: normalise */
        while (!(m & 0x00800000u)) {
            m <<= 1;
            e -= 1;
        }
        e += 1;
    } else {
        m |= 0x00800000u;
    }
    e -= 127;
    if (e & 1) /* an even exponent halves exactly */
        m <<= 1;
    e = (e - (e & 1)) / 2;
    uint32_t rest = m << 1, root = 0, s = 0;
    for (uint32_t bit = 0x01000000u; bit; bit >>= 1) {
        uint32_t t = s + bit;
        if (t <= rest) {
            s = t + bit;
            rest -= t;
            root += bit;
        }
        rest <<= 1;
    }
    if (rest) /* inexact: the last digit decides the rounding, never a tie */
        root += root & 1;
    return math_bits_float((root >> 1) + 0x3f000000u + ((uint32_t)e << 23));
}

/* needs: math_double_bits, math_bits_double */
static double math_sqrt(double x)
{
    if (x != x || x == 0.0 || x == __builtin_inf())
        return x;
    if (x < 0.0)
        return __builtin_nan("");
    uint64_t bits = math_double_bits(x);
    int e = (int)(bits >> 52);
    uint64_t m = bits & 0x000fffffffffffffull;
    if (e == 0) {
        while (!(m & 0x0010000000000000ull)) {
            m <<= 1;
            e -= 1;
        }
        e += 1;
    } else {
        m |= 0x0010000000000000ull;
    }
    e -= 1023;
    if (e & 1)
        m <<= 1;
    e = (e - (e & 1)) / 2;
    uint64_t rest = m << 1, root = 0, s = 0;
    for (uint64_t bit = 0x0020000000000000ull; bit; bit >>= 1) {
        uint64_t t = s + bit;
        if (t <= rest) {
            s = t + bit;
            rest -= t;
            root += bit;
        }
        rest <<= 1;
    }
    if (rest)
        root += root & 1;
    return math_bits_double((root >> 1) + 0x3fe0000000000000ull + ((uint64_t)e << 52));
}

/* tanh |x| = 1 - 2 / (e^2|x| + 1), and near zero expm1(2|x|) / (expm1(2|x|) + 2) with
 * expm1 by its Taylor series (no cancellation).
 * needs: math_expf */
static float math_tanhf(float x)
{
    if (x != x)
        return x;
    float a = x < 0.0f ? -x : x, t;
    if (a > 9.5f) {
        t = 1.0f;
    } else if (a >= 0.55f) {
        t = 1.0f - 2.0f / (math_expf(2.0f * a) + 1.0f);
    } else {
        float u = 2.0f * a;
        float em1 = u * (1.0f + u * (0.5f + u * (0.166666672f + u * (0.0416666679f
                    + u * (0.00833333377f + u * (0.00138888892f + u * (0.000198412701f
                    + u * (2.48015876e-05f + u * (2.75573188e-06f + u * 2.75573200e-07f)))))))));
        t = em1 / (em1 + 2.0f);
    }
    return x < 0.0f ? -t : t;
}

/* needs: math_exp */
static double math_tanh(double x)
{
    if (x != x)
        return x;
    double a = x < 0.0 ? -x : x, t;
    if (a > 22.0) {
        t = 1.0;
    } else if (a >= 0.55) {
        t = 1.0 - 2.0 / (math_exp(2.0 * a) + 1.0);
    } else {
        double u = 2.0 * a;
        /* expm1(u) = u + u^2/2! + ... + u^18/18! */
        double p = 1.5619206968586225e-16;
        p = 2.8114572543455206e-15 + u * p;
        p = 4.779477332387385e-14 + u * p;
        p = 7.647163731819816e-13 + u * p;
        p = 1.1470745597729725e-11 + u * p;
        p = 1.6059043836821613e-10 + u * p;
        p = 2.08767569878681e-09 + u * p;
        p = 2.505210838544172e-08 + u * p;
        p = 2.755731922398589e-07 + u * p;
        p = 2.7557319223985893e-06 + u * p;
        p = 2.48015873015873e-05 + u * p;
        p = 0.0001984126984126984 + u * p;
        p = 0.001388888888888889 + u * p;
        p = 0.008333333333333333 + u * p;
        p = 0.041666666666666664 + u * p;
        p = 0.16666666666666666 + u * p;
        p = 0.5 + u * p;
        p *= u;
        double em1 = u + u * p;
        t = em1 / (em1 + 2.0);
    }
    return x < 0.0 ? -t : t;
}
