/* jemalloc's profiler's libm functions, so that no exec loads libm.
 *
 * With profiling compiled in, jemalloc calls `log` to draw the bytes until
 * its next sample (prof.c) and `exp` to unbias the counts of a heap dump
 * (prof_data.c), and `round` for the latter, which gcc inlines and zig's
 * clang (the wheel's build) does not. Taking them from libm.so.6 would
 * load that library into every process, profiled or not: 9 more system calls and page faults and
 * about 33,000 more instructions per exec of `/bin/true`
 * (bench/FINDINGS-profiling.md). None needs libm's last bit: they only
 * scale a sampling interval. So they are defined here, hidden (the
 * application's own `log`, `exp` and `round` are never these), accurate to a few
 * units in the last place over the whole double range.
 *
 * Compiled by shim/build.rs with unwind.c. */
#include <stdint.h>
#include <string.h>

#define HIDDEN __attribute__((visibility("hidden")))

static const double LN2_HI = 6.93147180369123816490e-01; /* 0x3fe62e42fee00000 */
static const double LN2_LO = 1.90821492927058770002e-10; /* 0x3dea39ef35793c76 */

static uint64_t bits(double x) {
    uint64_t u;
    memcpy(&u, &x, sizeof u);
    return u;
}

static double from_bits(uint64_t u) {
    double x;
    memcpy(&x, &u, sizeof x);
    return x;
}

/* x * 2^k for any int k, without overflow in the scaling itself. */
static double scale2(double x, int k) {
    while (k > 1023) {
        x *= from_bits((uint64_t)(1023 + 1023) << 52);
        k -= 1023;
    }
    while (k < -1022) {
        x *= from_bits((uint64_t)(1023 - 1022) << 52);
        k += 1022;
    }
    return x * from_bits((uint64_t)(1023 + k) << 52);
}

/* ln(x): x = m * 2^e with m in [sqrt(1/2), sqrt(2)), then
 * ln(m) = 2 atanh(s), s = (m - 1) / (m + 1), |s| < 0.172, by its series. */
HIDDEN double log(double x) {
    uint64_t u = bits(x);
    if (x != x) return x;                       /* NaN */
    if (x < 0) return (x - x) / (x - x);        /* NaN, invalid */
    if (x == 0) return -1.0 / (x * x);          /* -inf, divide-by-zero */
    if (u == 0x7ff0000000000000ull) return x;   /* +inf */
    int e = 0;
    if ((u >> 52) == 0) { /* subnormal */
        x *= from_bits((uint64_t)(1023 + 54) << 52);
        u = bits(x);
        e = -54;
    }
    e += (int)(u >> 52) - 1023;
    double m = from_bits((u & 0x000fffffffffffffull) | 0x3ff0000000000000ull);
    if (m > 1.41421356237309504880) {
        m *= 0.5;
        e += 1;
    }
    double s = (m - 1.0) / (m + 1.0);
    double s2 = s * s;
    double t = 1.0 / 23;
    for (int n = 21; n >= 1; n -= 2) t = 1.0 / n + s2 * t;
    return e * LN2_HI + (e * LN2_LO + 2.0 * s * t);
}

/* e^x: x = k ln2 + r, |r| <= ln2 / 2, then e^r by its Taylor series. */
HIDDEN double exp(double x) {
    if (x != x) return x;
    if (x > 709.782712893383973096) return x * from_bits(0x7fe0000000000000ull) * 2.0; /* +inf */
    if (x < -745.133219101941108420) return 0.0;
    double kf = x / (LN2_HI + LN2_LO);
    int k = (int)(kf < 0 ? kf - 0.5 : kf + 0.5);
    double r = (x - k * LN2_HI) - k * LN2_LO;
    double p = 1.0;
    for (int n = 17; n >= 1; n--) p = 1.0 + p * r / n;
    return scale2(p, k);
}

/* Rounds half away from zero. */
HIDDEN double round(double x) {
    if (!(x == x) || x >= 4503599627370496.0 || x <= -4503599627370496.0) return x; /* NaN, inf, >= 2^52 */
    double t = (double)(long long)x; /* toward zero */
    if (x - t >= 0.5) t += 1.0;
    else if (t - x >= 0.5) t -= 1.0;
    if (t == 0.0 && x < 0) return -0.0;
    return t;
}
