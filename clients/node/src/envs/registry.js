/**
 * The envs a Node worker can run, by id.
 *
 * Ids are honest: each names this package's own implementation
 * ("rlfleet/CartPoleJS-v0" is a port of CartPole-v1, not CartPole-v1
 * itself), so a fleet never mixes two implementations under one id by
 * accident. rlfleet/envs/cartpole_js.py registers the same id in Python
 * (gymnasium's CartPole, same spaces and limit) for mixed fleets.
 *
 * @module
 */
import { ConfigError, EnvNotFoundError } from '../errors.js';
import { CartPoleEnv } from './cartpole.js';

/**
 * @typedef {object} Env
 * @property {import('../spaces.js').Space} observationSpace
 * @property {import('../spaces.js').Space} actionSpace
 * @property {(seed: number) => Float32Array} reset Starts an episode from a uint32 seed.
 * @property {(action: number) => {observation: Float32Array, reward: number,
 *   terminated: boolean, truncated: boolean}} step
 */

/**
 * @typedef {object} EnvEntry
 * @property {(kwargs: Record<string, unknown>) => Env} make
 * @property {number | null} maxEpisodeSteps The registered episode limit.
 */

/** @type {ReadonlyMap<string, EnvEntry>} */
export const ENVS = new Map([
  ['rlfleet/CartPoleJS-v0', { make: (kwargs) => new CartPoleEnv(kwargs), maxEpisodeSteps: 500 }],
]);

/**
 * Builds an env.
 *
 * @param {string} envId
 * @param {Record<string, unknown>} [kwargs]
 * @returns {{env: Env, maxEpisodeSteps: number | null}}
 * @throws {EnvNotFoundError} For an id this worker does not implement.
 * @throws {ConfigError} If the env rejects the kwargs.
 */
export function makeEnv(envId, kwargs = {}) {
  const entry = ENVS.get(envId);
  if (!entry) {
    throw new EnvNotFoundError(
      `env id ${JSON.stringify(envId)} is not implemented by the Node worker; it runs ` +
        `${[...ENVS.keys()].map((id) => JSON.stringify(id)).join(', ')}. ` +
        'Send one of those in the env update, or run Python workers for gymnasium ids',
    );
  }
  if (kwargs === null || typeof kwargs !== 'object' || Array.isArray(kwargs)) {
    throw new ConfigError(`env ${envId}: kwargs must be a JSON object, got ${JSON.stringify(kwargs)}`);
  }
  return { env: entry.make(kwargs), maxEpisodeSteps: entry.maxEpisodeSteps };
}
