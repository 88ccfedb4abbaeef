/**
 * EpisodeBatch (batch.proto): built from a worker's finished segments, and
 * decoded, reordered and concatenated on the client side.
 *
 * @module
 */
import { WireFormatError } from './errors.js';
import { StepType } from './proto.js';
import { decodeTensor, decodeTensorMap, encodeTensor, encodeTensorMap, isTensor, tensor } from './tensor.js';

/** @typedef {import('./tensor.js').Tensor} Tensor */
/** @typedef {import('./tensor.js').TensorTree} TensorTree */
/** @typedef {import('./tensor.js').TypedArray} TypedArray */

/**
 * One finished episode, or one piece of an episode (fragments).
 *
 * @typedef {object} Segment
 * @property {number[]} key Sort key: (episode_index) or (stream, episode_index, fragment_index).
 * @property {Record<string, number | bigint>} infos Its episode_infos values, in key order.
 * @property {number[]} observations T rows of the observation, flattened.
 * @property {ArrayLike<number>} lastObservation The observation after its last step.
 * @property {number[]} actions T integer actions.
 * @property {number[]} rewards T rewards.
 * @property {Record<string, {dtype: string, rowShape: number[], values: number[]}>} agentInfos
 * @property {boolean} first Whether it starts its episode.
 * @property {number | null} last StepType of its last step if it ends the episode, else null (MID).
 */

/**
 * Step types of one segment: FIRST (or MID for a continued piece), MID...,
 * then the last step's type, which wins over FIRST for a one-step episode.
 *
 * @param {Segment} segment
 * @param {Uint8Array} out
 * @param {number} offset
 */
function writeStepTypes(segment, out, offset) {
  const length = segment.rewards.length;
  out.fill(StepType.STEP_TYPE_MID, offset, offset + length);
  if (segment.first) {
    out[offset] = StepType.STEP_TYPE_FIRST;
  }
  if (segment.last !== null) {
    out[offset + length - 1] = segment.last;
  }
}

/**
 * The plain rlfleet.v1.EpisodeBatch object (without env_spec) of segments,
 * in the given order.
 *
 * @param {Segment[]} segments At least one.
 * @param {{shape: number[], dtype: string}} observationSpace The Box the observations belong to.
 * @returns {object}
 */
export function buildEpisodeBatch(segments, observationSpace) {
  const n = segments.length;
  const lengths = segments.map((s) => s.rewards.length);
  const total = lengths.reduce((a, b) => a + b, 0);
  const obsShape = observationSpace.shape;
  const stepTypes = new Uint8Array(total);
  let offset = 0;
  for (const segment of segments) {
    writeStepTypes(segment, stepTypes, offset);
    offset += segment.rewards.length;
  }
  /** @type {TensorTree} */
  const episodeInfos = {};
  for (const key of Object.keys(segments[0].infos)) {
    episodeInfos[key] = tensor('int64', [n], segments.map((s) => BigInt(s.infos[key])));
  }
  /** @type {TensorTree} */
  const agentInfos = {};
  for (const key of commonKeys(segments.map((s) => s.agentInfos))) {
    const { dtype, rowShape } = segments[0].agentInfos[key];
    agentInfos[key] = tensor(dtype, [total, ...rowShape], segments.flatMap((s) => s.agentInfos[key].values));
  }
  const fields = {
    episode_infos: encodeTensorMap(episodeInfos, 'EpisodeBatch.episode_infos'),
    observations: tensor(observationSpace.dtype, [total, ...obsShape], segments.flatMap((s) => s.observations)),
    last_observations: tensor(
      observationSpace.dtype,
      [n, ...obsShape],
      segments.flatMap((s) => Array.from(s.lastObservation)),
    ),
    actions: tensor('int64', [total], segments.flatMap((s) => s.actions)),
    rewards: tensor('float64', [total], segments.flatMap((s) => s.rewards)),
    step_types: { dtype: 'uint8', shape: [total], data: stepTypes },
    lengths: tensor('int64', [n], lengths),
  };
  return {
    episode_infos: fields.episode_infos,
    observations: encodeTensor(fields.observations, 'EpisodeBatch.observations'),
    last_observations: encodeTensor(fields.last_observations, 'EpisodeBatch.last_observations'),
    actions: encodeTensor(fields.actions, 'EpisodeBatch.actions'),
    rewards: encodeTensor(fields.rewards, 'EpisodeBatch.rewards'),
    env_infos: { entries: [] },
    agent_infos: encodeTensorMap(agentInfos, 'EpisodeBatch.agent_infos'),
    step_types: encodeTensor(fields.step_types, 'EpisodeBatch.step_types'),
    lengths: encodeTensor(fields.lengths, 'EpisodeBatch.lengths'),
  };
}

/**
 * Keys present in every dict (a batch cannot have a column some episodes lack).
 *
 * @param {Array<Record<string, unknown>>} dicts
 * @returns {string[]} In the first dict's order.
 */
function commonKeys(dicts) {
  return Object.keys(dicts[0]).filter((key) => dicts.every((d) => Object.hasOwn(d, key)));
}

/**
 * A decoded EpisodeBatch: tensors whose data are typed arrays.
 *
 * @typedef {object} EpisodeBatch
 * @property {TensorTree} episodeInfos Each (N, ...): agent_version, env_seed,
 *   policy_seed, episode_index, worker (int64), plus stream and
 *   fragment_index for fragments.
 * @property {Tensor} observations (S, ...obs)
 * @property {Tensor} lastObservations (N, ...obs)
 * @property {Tensor} actions (S, ...action)
 * @property {Tensor} rewards (S,)
 * @property {TensorTree} envInfos Each (S, ...).
 * @property {TensorTree} agentInfos Each (S, ...).
 * @property {Tensor} stepTypes (S,) uint8 StepType numbers.
 * @property {Tensor} lengths (N,) int64.
 */

/**
 * Decodes a plain rlfleet.v1.EpisodeBatch object and checks that its
 * fields fit together.
 *
 * @param {any} message
 * @returns {EpisodeBatch}
 * @throws {WireFormatError} If a tensor is missing or inconsistent.
 */
export function decodeEpisodeBatch(message) {
  /** @param {string} name */
  const required = (name) => {
    if (!message[name]) {
      throw new WireFormatError(`EpisodeBatch.${name}: missing; every EpisodeBatch carries it`);
    }
    return decodeTensor(message[name], `EpisodeBatch.${name}`);
  };
  const batch = {
    episodeInfos: decodeTensorMap(message.episode_infos, 'EpisodeBatch.episode_infos'),
    observations: required('observations'),
    lastObservations: required('last_observations'),
    actions: required('actions'),
    rewards: required('rewards'),
    envInfos: decodeTensorMap(message.env_infos, 'EpisodeBatch.env_infos'),
    agentInfos: decodeTensorMap(message.agent_infos, 'EpisodeBatch.agent_infos'),
    stepTypes: required('step_types'),
    lengths: required('lengths'),
  };
  if (batch.stepTypes.dtype !== 'uint8' || batch.lengths.dtype !== 'int64') {
    throw new WireFormatError(
      `EpisodeBatch: step_types must be uint8 and lengths int64, got ${batch.stepTypes.dtype} and ${batch.lengths.dtype}`,
    );
  }
  const lengths = Array.from(batch.lengths.data, Number);
  const n = lengths.length;
  const total = lengths.reduce((a, b) => a + b, 0);
  if (lengths.some((t) => t < 1)) {
    throw new WireFormatError(`EpisodeBatch.lengths must all be >= 1, got [${lengths.slice(0, 10)}]`);
  }
  /** @type {Array<[string, Tensor, number]>} */
  const checks = [
    ['observations', batch.observations, total],
    ['last_observations', batch.lastObservations, n],
    ['actions', batch.actions, total],
    ['rewards', batch.rewards, total],
    ['step_types', batch.stepTypes, total],
  ];
  for (const [name, t, rows] of checks) {
    if ((t.shape[0] ?? -1) !== rows) {
      throw new WireFormatError(`EpisodeBatch.${name}: leading dimension ${t.shape[0]}, expected ${rows}`);
    }
  }
  for (const [field, tree, rows] of /** @type {const} */ ([
    ['episode_infos', batch.episodeInfos, n],
    ['env_infos', batch.envInfos, total],
    ['agent_infos', batch.agentInfos, total],
  ])) {
    forEachTensor(tree, (path, t) => {
      if ((t.shape[0] ?? -1) !== rows) {
        throw new WireFormatError(`EpisodeBatch.${field}${path}: leading dimension ${t.shape[0]}, expected ${rows}`);
      }
    });
  }
  return batch;
}

/**
 * Calls `fn` on every tensor of a tree, depth first.
 *
 * @param {TensorTree} tree
 * @param {(path: string, t: Tensor) => void} fn
 * @param {string} [prefix]
 */
function forEachTensor(tree, fn, prefix = '') {
  for (const [key, value] of Object.entries(tree)) {
    const path = `${prefix}[${JSON.stringify(key)}]`;
    if (isTensor(value)) {
      fn(path, value);
    } else {
      forEachTensor(value, fn, path);
    }
  }
}

/**
 * Rows [start, stop) of several tensors, in order, as one new tensor.
 *
 * @param {Array<{source: Tensor, start: number, stop: number}>} pieces
 * @returns {Tensor}
 */
function gatherRows(pieces) {
  const { dtype, shape } = pieces[0].source;
  const rowShape = shape.slice(1);
  const rowSize = rowShape.reduce((a, b) => a * b, 1);
  const rows = pieces.reduce((sum, p) => sum + p.stop - p.start, 0);
  const Ctor = /** @type {any} */ (pieces[0].source.data.constructor);
  /** @type {TypedArray} */
  const data = new Ctor(rows * rowSize);
  let at = 0;
  for (const { source, start, stop } of pieces) {
    if (source.dtype !== dtype || source.shape.slice(1).join() !== rowShape.join()) {
      throw new WireFormatError(
        `cannot concatenate a ${source.dtype} [${source.shape}] tensor with a ${dtype} [${shape}] one`,
      );
    }
    const chunk = source.data.subarray(start * rowSize, stop * rowSize);
    /** @type {any} */ (data).set(chunk, at);
    at += chunk.length;
  }
  return { dtype, shape: [rows, ...rowShape], data };
}

/**
 * Builds a tree shaped like `template` whose tensors gather rows of the
 * same-path tensors of every batch.
 *
 * @param {TensorTree[]} trees One per piece, same keys.
 * @param {Array<{start: number, stop: number}>} ranges Rows of each piece.
 * @returns {TensorTree}
 */
function gatherTree(trees, ranges) {
  /** @type {TensorTree} */
  const out = {};
  const keys = Object.keys(trees[0] ?? {}).filter((key) => trees.every((tree) => Object.hasOwn(tree, key)));
  for (const key of keys) {
    const first = trees[0][key];
    if (isTensor(first)) {
      out[key] = gatherRows(trees.map((tree, i) => ({ source: /** @type {Tensor} */ (tree[key]), ...ranges[i] })));
    } else {
      out[key] = gatherTree(
        trees.map((tree) => /** @type {TensorTree} */ (tree[key])),
        ranges,
      );
    }
  }
  return out;
}

/**
 * The episodes of several batches, selected and reordered, as one batch.
 *
 * @param {EpisodeBatch[]} batches
 * @param {Array<[number, number]>} order (batch, episode) pairs, in output order.
 * @returns {EpisodeBatch}
 */
export function selectEpisodes(batches, order) {
  const starts = batches.map((batch) => {
    const out = [0];
    for (const length of batch.lengths.data) {
      out.push(out[out.length - 1] + Number(length));
    }
    return out;
  });
  const stepRanges = order.map(([b, e]) => ({ start: starts[b][e], stop: starts[b][e + 1] }));
  const episodeRanges = order.map(([, e]) => ({ start: e, stop: e + 1 }));
  /**
   * @param {(batch: EpisodeBatch) => Tensor} field
   * @param {Array<{start: number, stop: number}>} ranges
   */
  const gather = (field, ranges) =>
    gatherRows(order.map(([b], i) => ({ source: field(batches[b]), ...ranges[i] })));
  /**
   * @param {(batch: EpisodeBatch) => TensorTree} field
   * @param {Array<{start: number, stop: number}>} ranges
   */
  const gatherInfos = (field, ranges) => gatherTree(order.map(([b]) => field(batches[b])), ranges);
  return {
    episodeInfos: gatherInfos((b) => b.episodeInfos, episodeRanges),
    observations: gather((b) => b.observations, stepRanges),
    lastObservations: gather((b) => b.lastObservations, episodeRanges),
    actions: gather((b) => b.actions, stepRanges),
    rewards: gather((b) => b.rewards, stepRanges),
    envInfos: gatherInfos((b) => b.envInfos, stepRanges),
    agentInfos: gatherInfos((b) => b.agentInfos, stepRanges),
    stepTypes: gather((b) => b.stepTypes, stepRanges),
    lengths: gather((b) => b.lengths, episodeRanges),
  };
}
