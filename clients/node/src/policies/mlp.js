/**
 * The built-in "mlp-categorical" policy (docs/policies.md): an MLP from
 * encoded observations to logits over a Discrete action space.
 *
 *     h_0     = encode(obs)                                  float32 (N, D)
 *     h_{i+1} = act(h_i @ layers.i.weight + layers.i.bias)   hidden layers
 *     logits  = h_L @ layers.L.weight + layers.L.bias
 *
 * The arithmetic is the contract's (docs/policies.md, tests/mlp_reference.py),
 * so the logits are the Python worker's bit for bit: each output is summed
 * in float32, input by input in index order, from +0, every product and sum
 * rounded to float32, then the bias added; activations from arithmetic.js.
 *
 * @module
 */
import { ConfigError, PolicyError } from '../errors.js';
import { tensor } from '../tensor.js';
import { relu32, tanh32 } from './arithmetic.js';
import { categorical, checkFinite } from './distributions.js';
import { ObservationEncoder } from './observations.js';
import { checkedParams } from './params.js';

const f32 = Math.fround;

/** Hidden-layer activations by name, in place on float32 values. */
export const ACTIVATIONS = Object.freeze({
  tanh: (/** @type {Float32Array} */ x) => {
    for (let i = 0; i < x.length; i += 1) x[i] = tanh32(x[i]);
  },
  relu: (/** @type {Float32Array} */ x) => {
    for (let i = 0; i < x.length; i += 1) x[i] = relu32(x[i]);
  },
  identity: (/** @type {Float32Array} */ _x) => {},
});

/** @param {number} layer @returns {string} */
export const weightName = (layer) => `layers.${layer}.weight`;
/** @param {number} layer @returns {string} */
export const biasName = (layer) => `layers.${layer}.bias`;

/**
 * @typedef {object} AgentInfo
 * @property {string} dtype
 * @property {number[]} rowShape Shape of one row.
 * @property {import('../tensor.js').TypedArray} data (n, ...rowShape) row-major.
 */

/**
 * @typedef {object} PolicyOutput
 * @property {number[]} actions One integer action per row.
 * @property {Record<string, AgentInfo>} agentInfos
 */

/** "mlp-categorical". */
export class MLPCategoricalPolicy {
  /**
   * @param {import('../spaces.js').EnvSpec} envSpec Discrete actions; Box,
   *   MultiBinary or Discrete observations.
   * @param {Record<string, unknown>} [kwargs] hidden_sizes (default [32, 32]),
   *   activation ("tanh", "relu", "identity"), deterministic (bool), seed
   *   (accepted for compatibility: parameters start at zero here, i.e. a
   *   uniform policy, until an agent update sets them).
   * @throws {ConfigError} For an unsupported space or invalid kwargs.
   */
  constructor(envSpec, kwargs = {}) {
    const owner = 'MLPCategoricalPolicy';
    this.owner = owner;
    const space = envSpec.actionSpace;
    if (space.kind !== 'discrete') {
      throw new ConfigError(`${owner} needs a Discrete action space, got ${space.kind}`);
    }
    const { hidden_sizes: hidden = [32, 32], activation = 'tanh', deterministic = false, seed = null, ...rest } = kwargs;
    const unknown = Object.keys(rest);
    if (unknown.length > 0) {
      throw new ConfigError(
        `${owner} got unexpected kwargs ${JSON.stringify(unknown)}; it takes hidden_sizes, activation, seed, deterministic`,
      );
    }
    if (!Array.isArray(hidden) || !hidden.every((h) => Number.isSafeInteger(h) && h >= 1)) {
      throw new ConfigError(`${owner} hidden_sizes must be a list of ints >= 1, got ${JSON.stringify(hidden)}`);
    }
    if (typeof activation !== 'string' || !Object.hasOwn(ACTIVATIONS, activation)) {
      throw new ConfigError(
        `${owner} activation must be one of ${Object.keys(ACTIVATIONS).join(', ')}, got ${JSON.stringify(activation)}`,
      );
    }
    if (typeof deterministic !== 'boolean') {
      throw new ConfigError(`${owner} deterministic must be true or false, got ${JSON.stringify(deterministic)}`);
    }
    if (seed !== null && !Number.isSafeInteger(seed)) {
      throw new ConfigError(`${owner} seed must be an int or null, got ${JSON.stringify(seed)}`);
    }
    this.encoder = new ObservationEncoder(envSpec.observationSpace, owner);
    this.deterministic = deterministic;
    this.activation = /** @type {keyof typeof ACTIVATIONS} */ (activation);
    this.start = space.start;
    this.nActions = space.n;
    /** @type {number[]} */
    this.sizes = [this.encoder.dim, ...hidden, space.n];
    /** @type {Map<string, number[]>} Name -> shape, canonical order. */
    this.paramShapes = new Map();
    for (let i = 0; i + 1 < this.sizes.length; i += 1) {
      this.paramShapes.set(weightName(i), [this.sizes[i], this.sizes[i + 1]]);
      this.paramShapes.set(biasName(i), [this.sizes[i + 1]]);
    }
    /** @type {Map<string, Float32Array>} */
    this.params = new Map(
      [...this.paramShapes].map(([name, shape]) => [name, new Float32Array(shape.reduce((a, b) => a * b, 1))]),
    );
  }

  /** @returns {Record<string, import('../tensor.js').Tensor>} float32 copies, by name. */
  getParamValues() {
    return Object.fromEntries(
      [...this.params].map(([name, data]) => [name, tensor('float32', /** @type {number[]} */ (this.paramShapes.get(name)), data.slice())]),
    );
  }

  /**
   * Replaces every parameter (exactly the names of getParamValues()).
   *
   * @param {Record<string, unknown>} params Name -> tensor.
   * @throws {PolicyError} Naming the parameter; nothing changes then.
   */
  setParamValues(params) {
    this.params = checkedParams(params, this.paramShapes, this.owner);
  }

  /**
   * The logits of a batch.
   *
   * @param {ArrayLike<number>} observations n rows, C order.
   * @param {number} n
   * @returns {Float32Array} (n, nActions) row-major.
   */
  logits(observations, n) {
    let h = this.encoder.encode(observations, n);
    const layers = this.sizes.length - 1;
    const act = ACTIVATIONS[this.activation];
    for (let i = 0; i < layers; i += 1) {
      const weight = /** @type {Float32Array} */ (this.params.get(weightName(i)));
      const bias = /** @type {Float32Array} */ (this.params.get(biasName(i)));
      h = dense(h, n, this.sizes[i], this.sizes[i + 1], weight, bias);
      if (i < layers - 1) {
        act(h);
      }
    }
    return h;
  }

  /**
   * Samples one action per row.
   *
   * @param {ArrayLike<number>} observations n rows, C order.
   * @param {number} n
   * @param {ArrayLike<{random(): number}>} rngs One generator per row.
   * @returns {PolicyOutput} agentInfos log_prob (n,) and logits (n, k), float32.
   * @throws {PolicyError} If the observations do not fit or the logits are not finite.
   */
  act(observations, n, rngs) {
    if (rngs.length !== n) {
      throw new PolicyError(`${this.owner}.get_actions: got ${rngs.length} generators for ${n} observations`);
    }
    const logits = this.logits(observations, n);
    checkFinite(logits, this.nActions, 'logits', this.owner);
    const { index, logProb } = categorical(logits, n, this.nActions, rngs, this.deterministic);
    return {
      actions: Array.from(index, (i) => i + this.start),
      agentInfos: {
        log_prob: { dtype: 'float32', rowShape: [], data: logProb },
        logits: { dtype: 'float32', rowShape: [this.nActions], data: logits },
      },
    };
  }
}

/**
 * out = h @ weight + bias for n rows, as the contract sums it:
 * `out[j] = (((0 + h[0] w[0, j]) + h[1] w[1, j]) + ...) + b[j]` in float32.
 *
 * @param {Float32Array} h (n, fanIn)
 * @param {number} n
 * @param {number} fanIn
 * @param {number} fanOut
 * @param {Float32Array} weight (fanIn, fanOut) row-major.
 * @param {Float32Array} bias (fanOut,)
 * @returns {Float32Array} (n, fanOut)
 */
function dense(h, n, fanIn, fanOut, weight, bias) {
  const out = new Float32Array(n * fanOut); // +0: the sums start there
  for (let row = 0; row < n; row += 1) {
    const o = row * fanOut;
    for (let k = 0; k < fanIn; k += 1) {
      const x = h[row * fanIn + k];
      const base = k * fanOut;
      for (let j = 0; j < fanOut; j += 1) {
        // Rounded product first: a fused x * w + acc would round once.
        out[o + j] = f32(out[o + j] + f32(x * weight[base + j]));
      }
    }
    for (let j = 0; j < fanOut; j += 1) {
      out[o + j] = f32(out[o + j] + bias[j]);
    }
  }
  return out;
}
