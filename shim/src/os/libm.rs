//! `log`, `exp` and `round` of `libm.c`: jemalloc's profiler's libm
//! functions, defined in the shim so that no exec loads libm (the C file
//! says why). Nothing here but their tests: the unit-test binary links
//! `libm.c` like the library, so `f64::ln`, `exp` and `round` below are the
//! shim's own, checked against glibc's results.

#[cfg(test)]
// glibc's results, written out: some are the std constants' values.
#[allow(clippy::approx_constant)]
mod tests {
    /// Distance in units in the last place.
    fn ulps(a: f64, b: f64) -> u64 {
        (a.to_bits() as i64 - b.to_bits() as i64).unsigned_abs()
    }

    #[test]
    fn log_exp_and_round_agree_with_glibc() {
        // (x, glibc's result), from Python's math on glibc 2.36.
        let logs = [
            (2.0, 0.6931471805599453),
            (10.0, 2.302585092994046),
            (1e-300, -690.7755278982137),
            (1e308, 709.1962086421661),
            (0.1, -2.3025850929940455),
            (5e-324, -744.4400719213812),
            (1.0000001, 9.999999505838704e-08),
            (123456.789, 11.723646487185881),
        ];
        for (x, want) in logs {
            let got = std::hint::black_box::<f64>(x).ln();
            assert!(ulps(got, want) <= 2, "log({x}) = {got}, glibc {want}");
        }
        let exps = [
            (1.0, 2.718281828459045),
            (-1.0, 0.36787944117144233),
            (700.0, 1.0142320547350045e304),
            (-745.0, 5e-324),
            (1e-10, 1.0000000001),
            (-0.5, 0.6065306597126334),
            (-20.123, 1.8226032512780204e-09),
            (3.3, 27.112638920657883),
        ];
        for (x, want) in exps {
            let got = std::hint::black_box::<f64>(x).exp();
            assert!(ulps(got, want) <= 2, "exp({x}) = {got}, glibc {want}");
        }
        assert_eq!(std::hint::black_box(1.0f64).ln(), 0.0);
        assert!(std::hint::black_box(0.0f64).ln() == f64::NEG_INFINITY);
        assert!(std::hint::black_box(-1.0f64).ln().is_nan());
        assert_eq!(std::hint::black_box(800.0f64).exp(), f64::INFINITY);
        assert_eq!(std::hint::black_box(-800.0f64).exp(), 0.0);
        for (x, want) in [
            (2.5, 3.0),
            (-2.5, -3.0),
            (-0.5, -1.0),
            (0.49999999999999994, 0.0),
            (4503599627370495.5, 4503599627370496.0),
            (1e300, 1e300),
        ] {
            assert_eq!(std::hint::black_box::<f64>(x).round(), want, "round({x})");
        }
    }
}
