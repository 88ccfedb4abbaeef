/**
 * The built-in MLPs' exact arithmetic (docs/policies.md), line for line as
 * tests/mlp_reference.py writes it: every float32 operation is a JS double
 * operation rounded with Math.fround (exact: a double holds more than twice
 * float32's precision, so one rounding to double then one to float32 gives
 * the correctly rounded float32 result of +, -, * and /), and the float64
 * parts are plain JS numbers in the reference's order (JS never fuses a
 * multiply-add). Math.tanh, Math.exp and Math.log are not used: their
 * rounding is the engine's, not the contract's.
 *
 * @module
 */

const f32 = Math.fround;

// ---------------------------------------------------------------- tanh (f32)
const TANH_CLAMP = f32(7.90531110763549805);
const TANH_TINY = f32(0.0004);
/** x^13 .. x^1, Horner order (Eigen's float tanh). */
const TANH_ALPHA = [
  -2.76076847742355e-16, 2.00018790482477e-13, -8.60467152213735e-11, 5.12229709037114e-08, 1.48572235717979e-05,
  6.37261928875436e-04, 4.89352455891786e-03,
].map(f32);
/** x^6 .. x^0, Horner order. */
const TANH_BETA = [1.19825839466702e-06, 1.18534705686654e-04, 2.26843463243900e-03, 4.89352518554385e-03].map(f32);

/**
 * The contract's float32 tanh: a clamped rational function, and the
 * identity below 0.0004 in magnitude (NaN in, NaN out).
 *
 * @param {number} a A float32 value.
 * @returns {number} A float32 value.
 */
export function tanh32(a) {
  let x = a > TANH_CLAMP ? TANH_CLAMP : a;
  x = x < -TANH_CLAMP ? -TANH_CLAMP : x;
  const x2 = f32(x * x);
  let p = TANH_ALPHA[0];
  for (let i = 1; i < TANH_ALPHA.length; i += 1) {
    p = f32(f32(x2 * p) + TANH_ALPHA[i]);
  }
  p = f32(x * p);
  let q = TANH_BETA[0];
  for (let i = 1; i < TANH_BETA.length; i += 1) {
    q = f32(f32(x2 * q) + TANH_BETA[i]);
  }
  const r = f32(p / q);
  return Math.abs(a) < TANH_TINY ? a : r;
}

/**
 * `0 if x < 0 else x`: NaN and -0 pass through (Math.max(-0, 0) would give +0).
 *
 * @param {number} x
 * @returns {number}
 */
export function relu32(x) {
  return x < 0 ? 0 : x;
}

// ----------------------------------------------------------------- exp (f32)
const EXP_HI = f32(88.72283935546875);
const EXP_LO = f32(-103.97208404541015625);
const EXP_LOG2E = f32(1.44269504088896341);
const EXP_C1 = f32(0.693359375);
const EXP_C2 = f32(-2.12194440e-4);
/** Horner order (Cephes' expf). */
const EXP_P = [
  1.9875691500e-4, 1.3981999507e-3, 8.3334519073e-3, 4.1665795894e-2, 1.6666665459e-1, 5.0000001201e-1,
].map(f32);

/**
 * The contract's float32 exp (Cephes' expf, the scaling by 2**n rounded once).
 *
 * @param {number} x A float32 value.
 * @returns {number} A float32 value: +inf above 88.72..., 0 below -103.97...
 */
export function exp32(x) {
  if (Number.isNaN(x)) {
    return x;
  }
  if (x > EXP_HI) {
    return Infinity;
  }
  if (x < EXP_LO) {
    return 0;
  }
  const n = Math.floor(f32(f32(x * EXP_LOG2E) + 0.5));
  let r = f32(x - f32(n * EXP_C1));
  r = f32(r - f32(n * EXP_C2));
  const z = f32(r * r);
  let y = EXP_P[0];
  for (let i = 1; i < EXP_P.length; i += 1) {
    y = f32(f32(y * r) + EXP_P[i]);
  }
  y = f32(f32(f32(y * z) + r) + 1);
  // The reference scales by 2**n in two float32 steps whose first is exact;
  // in double, y * 2**n is exact for every n in [-150, 128], so one rounding
  // (maybe to a subnormal, or to inf) gives the same float32.
  return f32(y * powerOfTwo(n));
}

// ----------------------------------------------------------------- log (f64)
const LOG_SQRT_HALF = 0.70710678118654752440;
const LN2_HI = 6.93147180369123816490e-01;
const LN2_LO = 1.90821492927058770002e-10;
/** 1 / (2k + 1) for k = 11 .. 1, Horner order. */
const LOG_SERIES = Array.from({ length: 11 }, (_, i) => 1 / (2 * (11 - i) + 1));

/**
 * The contract's float64 log, for finite z >= 1 (the categorical's Z):
 * `z = m 2**e` with m in [sqrt(1/2), sqrt(2)), `log(m) = 2 atanh(s)` with
 * `s = (m - 1) / (m + 1)`, a series in s**2.
 *
 * @param {number} z
 * @returns {number}
 */
export function log64(z) {
  let [m, e] = frexp(z);
  if (m < LOG_SQRT_HALF) {
    m *= 2;
    e -= 1;
  }
  const f = m - 1;
  const s = f / (2 + f);
  const s2 = s * s;
  let p = LOG_SERIES[0];
  for (let i = 1; i < LOG_SERIES.length; i += 1) {
    p = p * s2 + LOG_SERIES[i];
  }
  p = p * s2 + 1;
  const logM = 2 * s * p;
  return e * LN2_HI + (logM + e * LN2_LO);
}

// ------------------------------------------------------------ bit helpers
const bits = new DataView(new ArrayBuffer(8));

/**
 * `2**n` built from its bits, exact for every normal double (-1022 <= n <= 1023).
 *
 * @param {number} n
 * @returns {number}
 */
function powerOfTwo(n) {
  bits.setUint32(0, (n + 1023) << 20);
  bits.setUint32(4, 0);
  return bits.getFloat64(0);
}

/**
 * Python's math.frexp for a positive normal double: `[m, e]` with
 * `z = m * 2**e` and m in [0.5, 1), read from the bits.
 *
 * @param {number} z
 * @returns {[number, number]}
 */
function frexp(z) {
  bits.setFloat64(0, z);
  const high = bits.getUint32(0);
  const e = ((high >>> 20) & 0x7ff) - 1022;
  bits.setUint32(0, ((high & 0x800fffff) | (1022 << 20)) >>> 0);
  return [bits.getFloat64(0), e];
}
