import assert from 'node:assert/strict';
import { test } from 'node:test';

import { PolicyError } from '../src/errors.js';
import { log64, tanh32 } from '../src/policies/arithmetic.js';
import { categorical } from '../src/policies/distributions.js';
import { makePolicy } from '../src/policies/index.js';
import { MLPCategoricalPolicy } from '../src/policies/mlp.js';
import { RandomPolicy } from '../src/policies/random.js';
import { Generator } from '../src/random.js';
import { tensor } from '../src/tensor.js';

const box4 = { kind: 'box', shape: [4], dtype: 'float32', low: null, high: null };
const spec = { observationSpace: box4, actionSpace: { kind: 'discrete', n: 2, start: 0 }, maxEpisodeLength: 500 };

/** A generator stand-in that returns fixed uniforms. */
const fixed = (/** @type {number} */ u) => ({ random: () => u });

test('a linear policy computes obs @ W + b', () => {
  const policy = new MLPCategoricalPolicy(spec, { hidden_sizes: [] });
  policy.setParamValues({
    'layers.0.weight': tensor('float32', [4, 2], [1, 0, 0, 1, 1, 1, 0.5, -0.5]),
    'layers.0.bias': tensor('float32', [2], [0.5, -0.5]),
  });
  const logits = policy.logits(Float32Array.of(1, 2, 3, 4, 0, 0, 0, 0), 2);
  assert.deepEqual([...logits], [6.5, 2.5, 0.5, -0.5]);
});

test('hidden layers apply the activation, the output layer does not', () => {
  const params = {
    'layers.0.weight': tensor('float32', [4, 1], [1, 0, 0, 0]),
    'layers.0.bias': tensor('float32', [1], [0]),
    'layers.1.weight': tensor('float32', [1, 2], [1, -1]),
    'layers.1.bias': tensor('float32', [2], [0, 0]),
  };
  const obs = Float32Array.of(-2, 0, 0, 0);
  const relu = new MLPCategoricalPolicy(spec, { hidden_sizes: [1], activation: 'relu' });
  relu.setParamValues(params);
  assert.deepEqual([...relu.logits(obs, 1)], [0, 0]);
  const tanh = new MLPCategoricalPolicy(spec, { hidden_sizes: [1] });
  tanh.setParamValues(params);
  assert.deepEqual([...tanh.logits(obs, 1)], [tanh32(-2), -tanh32(-2)]);
});

test('categorical sampling is the inverse CDF of docs/policies.md', () => {
  const logits = Float32Array.of(0, 0);
  assert.equal(categorical(logits, 1, 2, [fixed(0.4)], false).index[0], 0);
  assert.equal(categorical(logits, 1, 2, [fixed(0.6)], false).index[0], 1);
  assert.equal(categorical(logits, 1, 2, [fixed(0.5)], false).index[0], 1); // c[0] = 1 <= t = 1
  const { logProb } = categorical(logits, 1, 2, [fixed(0.1)], false);
  assert.equal(logProb[0], Math.fround(-log64(2)));
  // An action whose weight underflows to 0 is never chosen, even at u -> 1.
  const skewed = Float32Array.of(0, -1000);
  assert.equal(categorical(skewed, 1, 2, [fixed(0.9999999999)], false).index[0], 0);
  assert.equal(categorical(Float32Array.of(1, 3, 3), 1, 3, [], true).index[0], 1); // first argmax
});

test('act draws one random() per row from that row\'s generator', () => {
  const policy = new MLPCategoricalPolicy(spec, { hidden_sizes: [] });
  const rngs = [new Generator(1), new Generator(2)];
  const expectedU = [new Generator(1).random(), new Generator(2).random()];
  const { actions, agentInfos } = policy.act(new Float32Array(8), 2, rngs);
  // Zero parameters: uniform over 2 actions, so action = u >= 0.5.
  assert.deepEqual(actions, expectedU.map((u) => (u * 2 >= 1 ? 1 : 0)));
  assert.deepEqual(Object.keys(agentInfos), ['log_prob', 'logits']);
  assert.deepEqual(agentInfos.logits.rowShape, [2]);
});

test('parameters are checked as the Python policy checks them, and nothing changes on error', () => {
  const policy = new MLPCategoricalPolicy(spec, { hidden_sizes: [3] });
  const good = policy.getParamValues();
  assert.deepEqual(Object.keys(good), ['layers.0.weight', 'layers.0.bias', 'layers.1.weight', 'layers.1.bias']);
  assert.deepEqual(good['layers.0.weight'].shape, [4, 3]);
  const before = policy.params;
  assert.throws(
    () => policy.setParamValues({ ...good, extra: tensor('float32', [1], [0]) }),
    /missing parameters \[\], unexpected parameters \['extra'\]/,
  );
  assert.throws(
    () => policy.setParamValues({ ...good, 'layers.0.weight': tensor('float32', [3, 4], new Array(12).fill(0)) }),
    /parameter 'layers.0.weight' must have shape \(4, 3\), got \(3, 4\)/,
  );
  assert.throws(
    () => policy.setParamValues({ ...good, 'layers.1.bias': tensor('float64', [2], [0, 1e39]) }),
    /'layers.1.bias' has a non-finite float32 value at index \(1,\)/,
  );
  assert.throws(
    () => policy.setParamValues({ ...good, 'layers.1.bias': tensor('bool', [2], [0, 1]) }),
    /must hold real numbers \(int or float\), got dtype bool/,
  );
  assert.equal(policy.params, before);
  policy.setParamValues({ ...good, 'layers.1.bias': tensor('int32', [2], [1, 2]) });
  assert.deepEqual([...policy.params.get('layers.1.bias')], [1, 2]);
});

test('non-finite logits are a PolicyError naming the row', () => {
  const policy = new MLPCategoricalPolicy(spec, { hidden_sizes: [] });
  assert.throws(
    () => policy.act(Float32Array.of(0, 0, 0, 0, NaN, 0, 0, 0), 2, [fixed(0), fixed(0)]),
    /logits of row 1 are not finite/,
  );
});

test('makePolicy builds the built-ins and refuses the rest with ERROR_KIND_POLICY', () => {
  assert.ok(makePolicy('random', '', spec) instanceof RandomPolicy);
  const mlp = makePolicy('mlp-categorical', '{"hidden_sizes":[8],"activation":"relu"}', spec);
  assert.deepEqual(mlp.sizes, [4, 8, 2]);
  for (const [name, kwargs, pattern] of [
    ['mlp-gaussian', '', /needs a Box action space/],
    ['mypkg.mod:Policy', '', /only Python workers/],
    ['mlp-categorical', '{"hidden_sizes":[0]}', /hidden_sizes must be a list of ints >= 1/],
    ['mlp-categorical', '{"width":3}', /unexpected kwargs \["width"\]/],
    ['mlp-categorical', '[1]', /must be a JSON object/],
  ]) {
    assert.throws(
      () => makePolicy(name, kwargs, spec),
      (error) => error instanceof PolicyError && error.kind === 'ERROR_KIND_POLICY' && pattern.test(error.message),
    );
  }
});

test('the random policy acts start + rng.integers(n) per row', () => {
  const policy = new RandomPolicy({ ...spec, actionSpace: { kind: 'discrete', n: 3, start: 5 } });
  const { actions, agentInfos } = policy.act(new Float32Array(8), 2, [new Generator(4294967295), new Generator(12345)]);
  const u = new Generator(4294967295);
  const v = new Generator(12345);
  assert.deepEqual(actions, [5 + u.integers(3), 5 + v.integers(3)]);
  assert.deepEqual(agentInfos, {});
  assert.throws(() => policy.setParamValues({ w: tensor('float32', [1], [0]) }), PolicyError);
});
