import assert from 'node:assert/strict';
import { test } from 'node:test';

import { WireFormatError } from '../src/errors.js';
import { SampleMode, messageType } from '../src/proto.js';
import { VecRunner } from '../src/worker/runner.js';
import { TaskBook } from '../src/worker/tasks.js';
import { decodeUnitColumns, readTaskUnits, taskUnits } from '../src/worker/units.js';

const CoordinatorMessage = messageType('CoordinatorMessage');

/** Rows (index, envSeed, policySeed) as the three little-endian columns worker.proto describes. */
function columnsOf(/** @type {Array<[bigint, number, number]>} */ rows) {
  const indices = Buffer.alloc(8 * rows.length);
  const envSeeds = Buffer.alloc(4 * rows.length);
  const policySeeds = Buffer.alloc(4 * rows.length);
  rows.forEach(([index, env, policy], k) => {
    indices.writeBigInt64LE(index, 8 * k);
    envSeeds.writeUInt32LE(env, 4 * k);
    policySeeds.writeUInt32LE(policy, 4 * k);
  });
  return { episode_indices: indices, env_seeds: envSeeds, policy_seeds: policySeeds };
}

/** A Task as the worker gets it: serialized and decoded (Buffers at arbitrary pool offsets). */
function overTheWire(/** @type {object} */ task) {
  const message = { task: { task_id: 9, request_id: 4, mode: SampleMode.SAMPLE_MODE_EPISODES, env_generation: 1, ...task } };
  return CoordinatorMessage.deserialize(CoordinatorMessage.serialize(message)).task;
}

const ROWS = /** @type {Array<[bigint, number, number]>} */ ([
  [0n, 0, 0],
  [7n, 2 ** 32 - 1, 5],
  [2n ** 40n + 3n, 123456789, 2 ** 31],
  [2n ** 53n - 1n, 1, 2 ** 32 - 1],
]);
const EXPECTED = ROWS.map(([index, env, policy]) => ({ episodeIndex: Number(index), envSeed: env, policySeed: policy }));

test('columns and EpisodeUnit messages give the same units, exactly', () => {
  const asColumns = overTheWire({ unit_columns: columnsOf(ROWS) });
  const asMessages = overTheWire({
    units: ROWS.map(([index, env, policy]) => ({ episode_index: index.toString(), env_seed: env, policy_seed: policy })),
  });
  assert.deepEqual(taskUnits(asColumns), EXPECTED);
  assert.deepEqual(taskUnits(asMessages), EXPECTED);
  assert.ok(Number.isSafeInteger(taskUnits(asColumns)[3].episodeIndex));
  // Present but empty columns, or neither form: no units.
  assert.deepEqual(taskUnits(overTheWire({ unit_columns: columnsOf([]) })), []);
  assert.deepEqual(taskUnits(overTheWire({})), []);
});

test('columns are read wherever their bytes start', () => {
  const { episode_indices, env_seeds, policy_seeds } = columnsOf(ROWS);
  const shifted = (/** @type {Buffer} */ bytes) => Buffer.concat([Buffer.alloc(3), bytes]).subarray(3);
  const units = decodeUnitColumns({
    episode_indices: shifted(episode_indices),
    env_seeds: shifted(env_seeds),
    policy_seeds: shifted(policy_seeds),
  });
  assert.deepEqual(units, EXPECTED);
});

test('malformed columns make the task unreadable, naming what is wrong', () => {
  const good = columnsOf(ROWS.slice(0, 2));
  const cases = /** @type {Array<[object, RegExp]>} */ ([
    [{ unit_columns: { ...good, env_seeds: Buffer.alloc(7) } }, /Task\.unit_columns\.env_seeds holds 7 bytes, not a whole number of 4-byte values/],
    [{ unit_columns: { ...good, episode_indices: Buffer.alloc(12) } }, /episode_indices holds 12 bytes, not a whole number of 8-byte values/],
    [{ unit_columns: { ...good, policy_seeds: Buffer.alloc(4) } }, /columns differ in length: \{"episode_indices":2,"env_seeds":2,"policy_seeds":1\}/],
    [{ unit_columns: good, units: [{ episode_index: 1 }] }, /Task 9 carries both units and unit_columns/],
    [{ unit_columns: columnsOf([[1n, 0, 0], [-2n, 0, 0]]) }, /episode_indices\[1\]: -2 is negative/],
    [{ unit_columns: columnsOf([[2n ** 53n, 0, 0]]) }, /episode_indices\[0\]: 9007199254740992 is beyond 2\*\*53/],
    [{ units: [{ episode_index: (2n ** 60n).toString() }] }, /EpisodeUnit\.episode_index: 1152921504606846976 is beyond 2\*\*53/],
  ]);
  for (const [fields, why] of cases) {
    const task = overTheWire(fields);
    assert.throws(() => taskUnits(task), (error) => error instanceof WireFormatError && why.test(error.message));
    const { units, unreadable } = readTaskUnits(task);
    assert.deepEqual(units, []);
    assert.ok(unreadable.startsWith('units it cannot decode (') && why.test(unreadable), unreadable);
  }
  assert.deepEqual(readTaskUnits(overTheWire({ unit_columns: good })), { units: EXPECTED.slice(0, 2), unreadable: '' });
});

test('a refill in columns joins the task it names; the units run with their seeds', () => {
  const runner = new VecRunner({ numEnvs: 2, workerNumber: 3n });
  runner.setEnv({ envId: 'rlfleet/CartPoleJS-v0' });
  const book = new TaskBook(runner);
  const first = overTheWire({ unit_columns: columnsOf([[0n, 10, 20], [1n, 11, 21], [2n, 12, 22]]) });
  const refill = overTheWire({ unit_columns: columnsOf([[3n, 13, 23]]) });
  book.add(first, taskUnits(first));
  book.add(refill, taskUnits(refill));
  assert.deepEqual([...book.episodeTasks.keys()], [9]);
  assert.deepEqual([.../** @type {any} */ (book.episodeTasks.get(9)).remaining].sort(), [0, 1, 2, 3]);
  for (let guard = 0; !runner.idle || book.queuedUnits > 0; guard += 1) {
    assert.ok(guard < 100000, 'the units never finished');
    runner.step();
    book.feed();
  }
  const infos = runner.takeFinished(9).map((s) => s.infos);
  assert.deepEqual(
    infos.map((i) => [i.episode_index, i.env_seed, i.policy_seed]).sort((a, b) => Number(a[0]) - Number(b[0])),
    [0, 1, 2, 3].map((k) => [k, 10 + k, 20 + k]),
  );
});
