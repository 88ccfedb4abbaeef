/**
 * Row-by-row categorical sampling, exactly as docs/policies.md specifies
 * and tests/mlp_reference.py computes it: float32 shift and exp (the
 * contract's exp32), float64 cumulative sum and log (log64), one `random()`
 * per row from the row's generator.
 *
 * @module
 */
import { PolicyError } from '../errors.js';
import { exp32, log64 } from './arithmetic.js';

const f32 = Math.fround;

/**
 * @typedef {object} CategoricalDraw
 * @property {Int32Array} index Chosen index per row.
 * @property {Float32Array} logProb log softmax(l)[index] per row.
 */

/**
 * Throws PolicyError naming the first row of `values` holding NaN or inf.
 *
 * @param {Float32Array} values (n, width) row-major.
 * @param {number} width
 * @param {string} what E.g. "logits".
 * @param {string} owner Policy class name.
 */
export function checkFinite(values, width, what, owner) {
  const bad = values.findIndex((x) => !Number.isFinite(x));
  if (bad < 0) {
    return;
  }
  const row = Math.floor(bad / width);
  const shown = Array.from(values.subarray(row * width, (row + 1) * width));
  throw new PolicyError(
    `${owner}.get_actions: ${what} of row ${row} are not finite ([${shown.join(', ')}]); ` +
      "check that row's observation and the policy parameters for NaN, inf or overflow",
  );
}

/**
 * Samples (or takes the argmax of) softmax(logits), row by row.
 *
 * @param {Float32Array} logits Finite (n, k) row-major.
 * @param {number} n Rows.
 * @param {number} k Categories.
 * @param {ArrayLike<{random(): number}>} rngs One generator per row (unused if deterministic).
 * @param {boolean} deterministic Take the first argmax instead of sampling.
 * @returns {CategoricalDraw}
 */
export function categorical(logits, n, k, rngs, deterministic) {
  const index = new Int32Array(n);
  const logProb = new Float32Array(n);
  const shifted = new Float32Array(k);
  const weights = new Float32Array(k);
  const cumulative = new Float64Array(k);
  for (let row = 0; row < n; row += 1) {
    const base = row * k;
    let max = logits[base];
    for (let i = 1; i < k; i += 1) {
      max = logits[base + i] > max ? logits[base + i] : max; // the first of equal values, as Python's max
    }
    let total = 0;
    for (let i = 0; i < k; i += 1) {
      shifted[i] = f32(logits[base + i] - max);
      weights[i] = exp32(shifted[i]);
      total += weights[i];
      cumulative[i] = total;
    }
    let chosen = 0;
    if (deterministic) {
      while (logits[base + chosen] !== max) {
        chosen += 1;
      }
    } else {
      const threshold = rngs[row].random() * total;
      // cumulative is non-decreasing: the count of c[i] <= t is the first i with c[i] > t.
      while (chosen < k && cumulative[chosen] <= threshold) {
        chosen += 1;
      }
      if (chosen === k) {
        // None above t (t rounded up to Z): the last index of positive weight.
        chosen = k - 1;
        while (chosen > 0 && !(weights[chosen] > 0)) {
          chosen -= 1;
        }
      }
    }
    index[row] = chosen;
    logProb[row] = shifted[chosen] - log64(total);
  }
  return { index, logProb };
}
