/**
 * The built-in "random" policy for Discrete actions (docs/policies.md):
 * row i acts `start + rngs[i].integers(n)`, numpy's draw, so the same
 * policy_seed gives the same actions as a Python worker.
 *
 * @module
 */
import { ConfigError, PolicyError } from '../errors.js';

/** "random". */
export class RandomPolicy {
  /**
   * @param {import('../spaces.js').EnvSpec} envSpec
   * @param {Record<string, unknown>} [kwargs] Only `seed` (ignored: rows draw from their own generators).
   * @throws {ConfigError} For a non-Discrete action space or unknown kwargs.
   */
  constructor(envSpec, kwargs = {}) {
    this.owner = 'RandomPolicy';
    const space = envSpec.actionSpace;
    if (space.kind !== 'discrete') {
      throw new ConfigError(`RandomPolicy in the Node worker draws Discrete actions, got a ${space.kind} space`);
    }
    const unknown = Object.keys(kwargs).filter((key) => key !== 'seed');
    if (unknown.length > 0) {
      throw new ConfigError(`RandomPolicy got unexpected kwargs ${JSON.stringify(unknown)}; it takes only seed`);
    }
    this.start = space.start;
    this.n = space.n;
    /** @type {Map<string, number[]>} */
    this.paramShapes = new Map();
  }

  /** @returns {{}} No parameters. */
  getParamValues() {
    return {};
  }

  /**
   * @param {Record<string, unknown>} params Must be empty.
   * @throws {PolicyError} If any parameter is given.
   */
  setParamValues(params) {
    const names = Object.keys(params);
    if (names.length > 0) {
      throw new PolicyError(
        `RandomPolicy.set_param_values: missing parameters [], unexpected parameters ` +
          `[${names.sort().map((n) => `'${n}'`).join(', ')}]; expected exactly [] (the random policy has no parameters)`,
      );
    }
  }

  /**
   * @param {ArrayLike<number>} _observations Unused.
   * @param {number} n
   * @param {ArrayLike<{integers(n: number): number}>} rngs One generator per row.
   * @returns {import('./mlp.js').PolicyOutput} Empty agentInfos.
   */
  act(_observations, n, rngs) {
    if (rngs.length !== n) {
      throw new PolicyError(`RandomPolicy.get_actions: got ${rngs.length} generators for ${n} observations`);
    }
    return { actions: Array.from({ length: n }, (_, row) => this.start + rngs[row].integers(this.n)), agentInfos: {} };
  }
}
