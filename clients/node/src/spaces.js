/**
 * Gymnasium spaces and EnvSpec (spaces.proto) as plain JavaScript objects.
 *
 * A space is `{kind: 'box', shape, dtype, low, high}` (low/high tensors),
 * `{kind: 'discrete', n, start}`, `{kind: 'multi_discrete', nvec, start, dtype}`,
 * `{kind: 'multi_binary', shape}`, `{kind: 'dict', entries: [[key, space]]}`
 * or `{kind: 'tuple', spaces}`. Workers here only build Box and Discrete
 * spaces; decoding handles every kind so a client can describe any fleet.
 *
 * @module
 */
import { WireFormatError } from './errors.js';
import { toSafeInt } from './int64.js';
import { DTYPES, decodeTensor, encodeTensor } from './tensor.js';

/** @typedef {import('./tensor.js').Tensor} Tensor */

/**
 * @typedef {{kind: 'box', shape: number[], dtype: string, low: Tensor, high: Tensor}
 *   | {kind: 'discrete', n: number, start: number}
 *   | {kind: 'multi_discrete', nvec: Tensor, start: Tensor, dtype: string}
 *   | {kind: 'multi_binary', shape: number[]}
 *   | {kind: 'dict', entries: Array<[string, any]>}
 *   | {kind: 'tuple', spaces: any[]}} Space
 */

/**
 * @typedef {object} EnvSpec
 * @property {Space} observationSpace
 * @property {Space} actionSpace
 * @property {number | null} maxEpisodeLength Steps after which episodes are
 *   cut with TIMEOUT; null for no limit.
 */

const NAME_BY_CODE = new Map(Object.entries(DTYPES).map(([name, info]) => [info.code, name]));

/**
 * Encodes a space as a plain rlfleet.v1.Space object.
 *
 * @param {Space} space
 * @param {string} [where]
 * @returns {object}
 */
export function encodeSpace(space, where = 'space') {
  switch (space.kind) {
    case 'box':
      return {
        box: {
          shape: space.shape,
          dtype: DTYPES[space.dtype].code,
          low: encodeTensor(space.low, `${where}.low`),
          high: encodeTensor(space.high, `${where}.high`),
        },
      };
    case 'discrete':
      return { discrete: { n: space.n, start: space.start } };
    case 'multi_discrete':
      return {
        multi_discrete: {
          nvec: encodeTensor(space.nvec, `${where}.nvec`),
          start: encodeTensor(space.start, `${where}.start`),
          dtype: DTYPES[space.dtype].code,
        },
      };
    case 'multi_binary':
      return { multi_binary: { shape: space.shape } };
    case 'dict':
      return {
        dict: {
          entries: space.entries.map(([key, sub]) => ({ key, space: encodeSpace(sub, `${where}[${key}]`) })),
        },
      };
    case 'tuple':
      return { tuple: { spaces: space.spaces.map((sub, i) => encodeSpace(sub, `${where}[${i}]`)) } };
    default:
      throw new WireFormatError(`${where}: unknown space kind ${JSON.stringify(/** @type {any} */ (space).kind)}`);
  }
}

/**
 * Decodes a rlfleet.v1.Space.
 *
 * @param {any} message
 * @param {string} [where]
 * @returns {Space}
 * @throws {WireFormatError} If no kind is set or a part is malformed.
 */
export function decodeSpace(message, where = 'space') {
  const kind = message?.kind;
  const body = kind ? message[kind] : undefined;
  if (!body) {
    throw new WireFormatError(`${where}: no space kind is set`);
  }
  /** @param {unknown} code */
  const dtypeName = (code) => {
    const name = NAME_BY_CODE.get(/** @type {number} */ (code));
    if (name === undefined) {
      throw new WireFormatError(`${where}: unknown dtype ${code}`);
    }
    return name;
  };
  /** @param {unknown[]} dims */
  const shapeOf = (dims) => dims.map((dim, i) => toSafeInt(dim, `${where}.shape[${i}]`));
  switch (kind) {
    case 'box':
      return {
        kind: 'box',
        shape: shapeOf(body.shape),
        dtype: dtypeName(body.dtype),
        low: decodeTensor(body.low, `${where}.low`),
        high: decodeTensor(body.high, `${where}.high`),
      };
    case 'discrete':
      return { kind: 'discrete', n: toSafeInt(body.n, `${where}.n`), start: toSafeInt(body.start, `${where}.start`) };
    case 'multi_discrete':
      return {
        kind: 'multi_discrete',
        nvec: decodeTensor(body.nvec, `${where}.nvec`),
        start: decodeTensor(body.start, `${where}.start`),
        dtype: dtypeName(body.dtype),
      };
    case 'multi_binary':
      return { kind: 'multi_binary', shape: shapeOf(body.shape) };
    case 'dict':
      return {
        kind: 'dict',
        entries: body.entries.map((/** @type {any} */ entry) => [
          entry.key,
          decodeSpace(entry.space, `${where}[${entry.key}]`),
        ]),
      };
    case 'tuple':
      return {
        kind: 'tuple',
        spaces: body.spaces.map((/** @type {any} */ sub, /** @type {number} */ i) => decodeSpace(sub, `${where}[${i}]`)),
      };
    default:
      throw new WireFormatError(`${where}: unknown space kind ${kind}`);
  }
}

/**
 * Encodes an EnvSpec as a plain rlfleet.v1.EnvSpec object.
 *
 * @param {EnvSpec} spec
 * @returns {object}
 */
export function encodeEnvSpec(spec) {
  /** @type {Record<string, unknown>} */
  const message = {
    observation_space: encodeSpace(spec.observationSpace, 'EnvSpec.observation_space'),
    action_space: encodeSpace(spec.actionSpace, 'EnvSpec.action_space'),
  };
  if (spec.maxEpisodeLength !== null) {
    message.max_episode_length = spec.maxEpisodeLength;
  }
  return message;
}

/**
 * Decodes a rlfleet.v1.EnvSpec.
 *
 * @param {any} message
 * @returns {EnvSpec}
 */
export function decodeEnvSpec(message) {
  if (!message) {
    throw new WireFormatError('EnvSpec: missing');
  }
  return {
    observationSpace: decodeSpace(message.observation_space, 'EnvSpec.observation_space'),
    actionSpace: decodeSpace(message.action_space, 'EnvSpec.action_space'),
    maxEpisodeLength:
      message.max_episode_length === undefined || message.max_episode_length === null
        ? null
        : toSafeInt(message.max_episode_length, 'EnvSpec.max_episode_length'),
  };
}
