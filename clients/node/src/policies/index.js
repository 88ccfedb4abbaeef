/**
 * Builds the policy a PolicySpec names. The Node worker offers the
 * built-ins its envs can use: "random" and "mlp-categorical" (Discrete
 * actions). "mlp-gaussian" and import paths ("package.module:Class") are
 * refused with PolicyError (ERROR_KIND_POLICY), as worker.proto allows.
 *
 * @module
 */
import { ConfigError, PolicyError } from '../errors.js';
import { MLPCategoricalPolicy } from './mlp.js';
import { RandomPolicy } from './random.js';

/**
 * @typedef {MLPCategoricalPolicy | RandomPolicy} Policy
 */

/** @type {Readonly<Record<string, new (envSpec: any, kwargs: Record<string, unknown>) => Policy>>} */
export const BUILTIN_POLICIES = Object.freeze({
  random: RandomPolicy,
  'mlp-categorical': MLPCategoricalPolicy,
});

/**
 * @param {string} name Spec name.
 * @param {string} kwargsJson JSON object text ("" means {}).
 * @param {import('../spaces.js').EnvSpec} envSpec
 * @returns {Policy}
 * @throws {PolicyError} For an unknown name, bad JSON, or kwargs the policy rejects.
 */
export function makePolicy(name, kwargsJson, envSpec) {
  const cls = Object.hasOwn(BUILTIN_POLICIES, name) ? BUILTIN_POLICIES[name] : undefined;
  if (!cls) {
    const why = name.includes(':')
      ? 'import paths name Python classes, which only Python workers can load'
      : name === 'mlp-gaussian'
        ? 'it needs a Box action space, and no env of the Node worker has one'
        : 'it is not a built-in policy';
    throw new PolicyError(
      `the Node worker cannot build policy ${JSON.stringify(name)}: ${why}; it builds ` +
        `${Object.keys(BUILTIN_POLICIES).join(', ')}`,
    );
  }
  let kwargs;
  try {
    kwargs = kwargsJson ? JSON.parse(kwargsJson) : {};
  } catch (error) {
    throw new PolicyError(`policy ${name}: kwargs_json is not valid JSON (${error}): ${kwargsJson.slice(0, 200)}`);
  }
  if (kwargs === null || typeof kwargs !== 'object' || Array.isArray(kwargs)) {
    throw new PolicyError(`policy ${name}: kwargs_json must be a JSON object, got ${kwargsJson.slice(0, 200)}`);
  }
  try {
    return new cls(envSpec, kwargs);
  } catch (error) {
    if (error instanceof ConfigError) {
      throw new PolicyError(`policy spec ${name} ${kwargsJson}: ${error.message}`, { cause: error });
    }
    throw error;
  }
}
