/**
 * The float32 encoding the built-in MLPs read (docs/policies.md,
 * "Observation encoding"): Box and MultiBinary flattened and cast, Discrete
 * one-hot. MultiDiscrete is not needed by any env the Node worker runs and
 * is refused when a policy is built.
 *
 * @module
 */
import { ConfigError, PolicyError } from '../errors.js';

/** @typedef {import('../spaces.js').Space} Space */

/**
 * Encodes batches of observations of one space.
 */
export class ObservationEncoder {
  /**
   * @param {Space} space The observation space.
   * @param {string} owner The policy class name, for messages.
   * @throws {ConfigError} For a space the Node MLPs cannot encode.
   */
  constructor(space, owner) {
    this.space = space;
    this.owner = owner;
    if (space.kind === 'box' || space.kind === 'multi_binary') {
      /** Width of an encoded row. */
      this.dim = space.shape.reduce((a, b) => a * b, 1);
    } else if (space.kind === 'discrete') {
      this.dim = space.n;
    } else {
      throw new ConfigError(
        `${owner} in the Node worker reads Box, MultiBinary or Discrete observations, got a ` +
          `${space.kind} space; flatten the observations in the env`,
      );
    }
  }

  /**
   * @param {ArrayLike<number>} observations n rows, each the space's
   *   elements in C order (one integer per row for Discrete).
   * @param {number} n Number of rows.
   * @returns {Float32Array} (n, dim) row-major.
   * @throws {PolicyError} For a wrong size or a Discrete value outside the space.
   */
  encode(observations, n) {
    const space = this.space;
    if (space.kind === 'discrete') {
      if (observations.length !== n) {
        throw new PolicyError(`${this.owner}.get_actions: ${observations.length} observations for ${n} rows`);
      }
      const encoded = new Float32Array(n * this.dim);
      for (let row = 0; row < n; row += 1) {
        const index = observations[row] - space.start;
        if (!Number.isInteger(index) || index < 0 || index >= space.n) {
          throw new PolicyError(
            `${this.owner}.get_actions: observation row ${row} (${observations[row]}) is outside ` +
              `Discrete(${space.n}, start=${space.start})`,
          );
        }
        encoded[row * this.dim + index] = 1;
      }
      return encoded;
    }
    if (observations.length !== n * this.dim) {
      throw new PolicyError(
        `${this.owner}.get_actions: ${observations.length} observation elements for ${n} rows of ${this.dim}`,
      );
    }
    return observations instanceof Float32Array ? observations : Float32Array.from(observations);
  }
}
