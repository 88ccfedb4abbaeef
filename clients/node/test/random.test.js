// numpy's generator and rlfleet's seed derivation, checked against values
// printed by numpy 2 / rlfleet.core.seeding (Python) for the same inputs.
import assert from 'node:assert/strict';
import { test } from 'node:test';

import { Generator, SeedSequence } from '../src/random.js';
import { episodeSeeds, streamSeeds } from '../src/seeding.js';

test('Generator(seed) draws what numpy.random.default_rng(seed) draws', () => {
  const g = new Generator(12345);
  assert.deepEqual(
    [g.random(), g.random(), g.integers(2), g.integers(7), g.integers(2), g.uniform(-0.05, 0.05)],
    [0.22733602246716966, 0.31675833970975287, 0, 5, 1, -0.010889044939809099],
  );
  const h = new Generator(4294967295);
  assert.deepEqual([h.random(), h.random(), h.random()], [0.2519435680449965, 0.21906579628685663, 0.28728472043517017]);
  assert.deepEqual(Array.from({ length: 5 }, () => h.integers(3)), [0, 1, 2, 2, 0]);
});

test('SeedSequence.generateState matches numpy for lists and 64-bit words', () => {
  assert.deepEqual(Array.from(new SeedSequence([7, 3, 11]).generateState(2)), [3011630493, 4006072737]);
  assert.deepEqual(Array.from(new SeedSequence([2n ** 40n + 5n, 0x46524147, 3, 1]).generateState(2)), [3154578591, 3422395433]);
});

test('episode and stream seeds match rlfleet.core.seeding', () => {
  assert.deepEqual(episodeSeeds(0, 0, 0), [2968811710, 3677149159]);
  assert.deepEqual(episodeSeeds(7, 3, 11), [3011630493, 4006072737]);
  assert.deepEqual(streamSeeds(2n ** 40n + 5n, 3, 1), [3154578591, 3422395433]);
  assert.throws(() => streamSeeds(-1, 0, 0), RangeError);
});

test('integers(n) stays in range and refuses bad bounds', () => {
  const g = new Generator(1);
  for (let i = 0; i < 200; i += 1) {
    const x = g.integers(5);
    assert.ok(Number.isInteger(x) && x >= 0 && x < 5);
  }
  assert.equal(g.integers(1), 0);
  assert.throws(() => g.integers(0), RangeError);
  assert.throws(() => g.integers(2 ** 32 + 1), RangeError);
});
