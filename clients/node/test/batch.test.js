import assert from 'node:assert/strict';
import { test } from 'node:test';

import { buildEpisodeBatch, decodeEpisodeBatch, selectEpisodes } from '../src/batch.js';
import { StepType, messageType } from '../src/proto.js';

const EpisodeBatch = messageType('EpisodeBatch');
const { STEP_TYPE_FIRST: F, STEP_TYPE_MID: M, STEP_TYPE_TERMINAL: T, STEP_TYPE_TIMEOUT: O } = StepType;
const space = { shape: [2], dtype: 'float32' };

/**
 * @param {number} index
 * @param {number} length
 * @param {{first?: boolean, last?: number | null}} [ends]
 */
function segment(index, length, { first = true, last = T } = {}) {
  return {
    key: [index],
    infos: { agent_version: 3, env_seed: 10 + index, policy_seed: 20 + index, episode_index: index, worker: 7n },
    observations: Array.from({ length: 2 * length }, (_, i) => index * 100 + i),
    lastObservation: [index, -index],
    actions: Array.from({ length }, (_, i) => i % 2),
    rewards: Array.from({ length }, () => 1),
    agentInfos: { log_prob: { dtype: 'float32', rowShape: [], values: Array.from({ length }, (_, i) => -i) } },
    first,
    last,
  };
}

/** @param {object[]} segments */
const roundTrip = (segments) =>
  decodeEpisodeBatch(EpisodeBatch.deserialize(EpisodeBatch.serialize(buildEpisodeBatch(segments, space))));

test('a built batch decodes to the segments with garage step types', () => {
  const batch = roundTrip([segment(0, 3), segment(1, 1, { last: O }), segment(2, 2, { first: false, last: null })]);
  assert.deepEqual([...batch.lengths.data], [3n, 1n, 2n]);
  assert.deepEqual([...batch.stepTypes.data], [F, M, T, O, M, M]);
  assert.deepEqual(batch.observations.shape, [6, 2]);
  assert.deepEqual([...batch.observations.data.subarray(0, 4)], [0, 1, 2, 3]);
  assert.deepEqual([...batch.lastObservations.data], [0, -0, 1, -1, 2, -2]);
  assert.equal(batch.actions.dtype, 'int64');
  assert.equal(batch.rewards.dtype, 'float64');
  assert.deepEqual(Object.keys(batch.episodeInfos), ['agent_version', 'env_seed', 'policy_seed', 'episode_index', 'worker']);
  assert.deepEqual([...batch.episodeInfos.worker.data], [7n, 7n, 7n]);
  assert.deepEqual([...batch.agentInfos.log_prob.data], [-0, -1, -2, -0, -0, -1]);
  assert.deepEqual(batch.envInfos, {});
});

test('selectEpisodes reorders episodes across batches, steps and infos alike', () => {
  const a = roundTrip([segment(2, 2), segment(0, 1)]);
  const b = roundTrip([segment(1, 3)]);
  const merged = selectEpisodes([a, b], [[0, 1], [1, 0], [0, 0]]);
  assert.deepEqual([...merged.episodeInfos.episode_index.data], [0n, 1n, 2n]);
  assert.deepEqual([...merged.lengths.data], [1n, 3n, 2n]);
  assert.deepEqual([...merged.observations.data.subarray(0, 2)], [0, 1]);
  assert.deepEqual([...merged.observations.data.subarray(2, 4)], [100, 101]);
  assert.deepEqual([...merged.stepTypes.data], [T, F, M, T, F, T]);
  assert.deepEqual(merged.observations.shape, [6, 2]);
});

test('inconsistent batches are refused naming the field', () => {
  const message = buildEpisodeBatch([segment(0, 2)], space);
  const broken = EpisodeBatch.deserialize(EpisodeBatch.serialize(message));
  broken.lengths.data = Buffer.from(new BigInt64Array([3n]).buffer);
  assert.throws(() => decodeEpisodeBatch(broken), /EpisodeBatch.observations: leading dimension 2, expected 3/);
  const missing = EpisodeBatch.deserialize(EpisodeBatch.serialize(message));
  missing.actions = null;
  assert.throws(() => decodeEpisodeBatch(missing), /EpisodeBatch.actions: missing/);
});
