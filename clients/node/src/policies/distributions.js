/**
 * Row-by-row categorical sampling, exactly as docs/policies.md specifies
 * (and rlfleet/policies/_distributions.py computes): float32 shift and exp,
 * float64 cumulative sum, one `random()` per row from the row's generator.
 *
 * @module
 */
import { PolicyError } from '../errors.js';

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
    let max = -Infinity;
    for (let i = 0; i < k; i += 1) {
      max = Math.max(max, logits[base + i]);
    }
    let total = 0;
    let argmax = 0;
    for (let i = 0; i < k; i += 1) {
      shifted[i] = f32(logits[base + i] - max);
      weights[i] = f32(Math.exp(shifted[i]));
      total += weights[i];
      cumulative[i] = total;
      if (shifted[i] > shifted[argmax]) {
        argmax = i;
      }
    }
    let chosen = argmax;
    if (!deterministic) {
      const threshold = rngs[row].random() * total;
      // cumulative is non-decreasing: the count of c[i] <= t is the first i with c[i] > t.
      chosen = 0;
      while (chosen < k && cumulative[chosen] <= threshold) {
        chosen += 1;
      }
      if (chosen === k) {
        chosen = k - 1;
        while (chosen > 0 && !(weights[chosen] > 0)) {
          chosen -= 1;
        }
      }
    }
    index[row] = chosen;
    logProb[row] = shifted[chosen] - Math.log(total);
  }
  return { index, logProb };
}
