import assert from 'node:assert/strict';
import { test } from 'node:test';

import { PolicyError } from '../src/errors.js';
import { StepType } from '../src/proto.js';
import { streamSeeds } from '../src/seeding.js';
import { tensor } from '../src/tensor.js';
import { VecRunner } from '../src/worker/runner.js';

const ENV = { envId: 'rlfleet/CartPoleJS-v0' };
const units = (/** @type {number} */ n, task = 1) =>
  Array.from({ length: n }, (_, i) => ({ episodeIndex: i, envSeed: 1000 + i, policySeed: 2000 + i, task }));

/** @param {VecRunner} runner */
function runToIdle(runner) {
  let guard = 0;
  while (!runner.idle) {
    runner.step();
    guard += 1;
    assert.ok(guard < 100000, 'runner never became idle');
  }
}

/** @param {number} numEnvs */
function runUnits(numEnvs, n = 6) {
  const runner = new VecRunner({ numEnvs, workerNumber: 9n });
  runner.setEnv(ENV);
  runner.submit(units(n));
  runToIdle(runner);
  return runner.takeFinished(1);
}

test('every unit comes back once, with its seeds and garage step types', () => {
  const segments = runUnits(3);
  assert.deepEqual(segments.map((s) => s.infos.episode_index), [0, 1, 2, 3, 4, 5]);
  for (const [i, s] of segments.entries()) {
    assert.deepEqual(s.infos, { agent_version: 0, env_seed: 1000 + i, policy_seed: 2000 + i, episode_index: i, worker: 9n });
    assert.equal(s.first, true);
    assert.equal(s.last, s.rewards.length >= 500 ? StepType.STEP_TYPE_TIMEOUT : StepType.STEP_TYPE_TERMINAL);
    assert.equal(s.observations.length, 4 * s.rewards.length);
    assert.equal(s.actions.length, s.rewards.length);
  }
});

test('an episode does not depend on the slot or the number of slots', () => {
  const one = runUnits(1);
  const four = runUnits(4);
  assert.deepEqual(
    four.map((s) => [s.observations, s.actions, s.rewards]),
    one.map((s) => [s.observations, s.actions, s.rewards]),
  );
});

test('max_episode_length cuts episodes with TIMEOUT', () => {
  const runner = new VecRunner({ numEnvs: 2 });
  const spec = runner.setEnv({ ...ENV, maxEpisodeLength: 5 });
  assert.equal(spec.maxEpisodeLength, 5);
  runner.submit(units(4));
  runToIdle(runner);
  for (const s of runner.takeFinished(1)) {
    assert.ok(s.rewards.length <= 5);
    if (s.rewards.length === 5) {
      assert.equal(s.last, StepType.STEP_TYPE_TIMEOUT);
    }
  }
});

test('fragment windows give each stream exactly fragmentLength steps, continuing episodes', () => {
  const runner = new VecRunner({ numEnvs: 2 });
  runner.setEnv(ENV);
  const windows = [];
  for (let w = 0; w < 3; w += 1) {
    runner.startWindow(7, 5n, 10n);
    let pieces = null;
    while (pieces === null) {
      pieces = runner.stepWindow();
    }
    windows.push(pieces);
  }
  for (const pieces of windows) {
    for (const stream of [10, 11]) {
      const mine = pieces.filter((p) => p.infos.stream === 10n + BigInt(stream - 10));
      assert.equal(mine.reduce((sum, p) => sum + p.rewards.length, 0), 7, `stream ${stream}`);
    }
    const keys = pieces.map((p) => p.key.join(','));
    assert.deepEqual(keys, [...keys].sort((a, b) => a.localeCompare(b, 'en', { numeric: true })));
  }
  // Stream 10's first episode started with the stream seeds of episode 0.
  const first = windows[0][0];
  assert.deepEqual([first.infos.env_seed, first.infos.policy_seed], streamSeeds(5n, 10n, 0));
  // A piece cut by the window ends MID and the next window resumes it.
  const cut = windows[0].filter((p) => p.infos.stream === 10n).at(-1);
  const resumed = windows[1].filter((p) => p.infos.stream === 10n)[0];
  if (cut.last === null) {
    assert.equal(resumed.first, false);
    assert.equal(resumed.infos.episode_index, cut.infos.episode_index);
    assert.equal(resumed.infos.fragment_index, cut.infos.fragment_index + 1);
    assert.deepEqual(resumed.observations.slice(0, 4), Array.from(cut.lastObservation));
  } else {
    assert.equal(resumed.first, true);
  }
});

test('a refused agent update changes nothing; an accepted one re-runs episodes in flight', () => {
  const runner = new VecRunner({ numEnvs: 2 });
  runner.setEnv(ENV);
  runner.setAgent({ version: 1, policy: { name: 'mlp-categorical', kwargsJson: '{"hidden_sizes":[]}' } });
  const policy = runner.policy;
  assert.throws(
    () => runner.setAgent({ version: 2, params: { 'layers.0.weight': tensor('float32', [2, 4], new Array(8).fill(0)) } }),
    (error) => error instanceof PolicyError && /must have shape \(4, 2\), got \(2, 4\)/.test(error.message),
  );
  assert.equal(runner.policy, policy);
  assert.equal(runner.agentVersion, 1);
  runner.submit(units(2));
  runner.step();
  assert.equal(runner.activeCount, 2);
  runner.setAgent({ version: 2, params: { 'layers.0.bias': tensor('float32', [2], [5, 0]) } });
  assert.deepEqual([runner.activeCount, runner.queue.length], [0, 2]);
  runToIdle(runner);
  const done = runner.takeFinished(1);
  assert.deepEqual(done.map((s) => s.infos.agent_version), [2, 2]);
  // A bias of 5 on action 0 makes it the usual choice.
  const zeros = done.flatMap((s) => s.actions).filter((a) => a === 0).length;
  assert.ok(zeros > 0.9 * done.reduce((n, s) => n + s.actions.length, 0));
});

test('cancel drops a task\'s queued, running and finished episodes', () => {
  const runner = new VecRunner({ numEnvs: 2 });
  runner.setEnv(ENV);
  runner.submit([...units(3, 1), ...units(2, 2)]);
  runner.step();
  runner.cancel(1, new Set([0, 2]));
  runner.cancel(2, null);
  runToIdle(runner);
  assert.deepEqual(runner.takeFinished(1).map((s) => s.infos.episode_index), [1]);
  assert.deepEqual(runner.takeFinished(2), []);
});
