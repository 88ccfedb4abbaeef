/**
 * The Node worker's MLP arithmetic against the golden vectors of
 * tests/mlp_reference.py (test/fixtures/mlp-golden.json, written by
 * `python -m tests.node_mlp_golden`): every value bit for bit.
 */
import assert from 'node:assert/strict';
import { readFileSync } from 'node:fs';
import { test } from 'node:test';

import { exp32, log64, relu32, tanh32 } from '../src/policies/arithmetic.js';
import { MLPCategoricalPolicy } from '../src/policies/mlp.js';
import { tensor } from '../src/tensor.js';

const golden = JSON.parse(readFileSync(new URL('fixtures/mlp-golden.json', import.meta.url), 'utf8'));

/** @param {string[]} hex float32 bit patterns. @returns {Float32Array} */
const float32s = (hex) => new Float32Array(Uint32Array.from(hex, (h) => parseInt(h, 16)).buffer);
/** @param {ArrayLike<number>} values @returns {string[]} float32 bit patterns. */
const hex32 = (values) => Array.from(new Uint32Array(Float32Array.from(values).buffer), (b) => b.toString(16).padStart(8, '0'));
/** @param {string[]} hex float64 bit patterns. @returns {Float64Array} */
const float64s = (hex) => new Float64Array(BigUint64Array.from(hex, (h) => BigInt(`0x${h}`)).buffer);
/** @param {ArrayLike<number>} values @returns {string[]} float64 bit patterns. */
const hex64 = (values) => Array.from(new BigUint64Array(Float64Array.from(values).buffer), (b) => b.toString(16).padStart(16, '0'));

/**
 * Asserts equal bit patterns, naming the first difference with its values.
 *
 * @param {string[]} actual
 * @param {string[]} expected
 * @param {(hex: string[]) => ArrayLike<number>} decode
 * @param {string} what
 */
function assertBits(actual, expected, decode, what) {
  const i = actual.findIndex((bits, j) => bits !== expected[j]);
  if (i >= 0 || actual.length !== expected.length) {
    const [got, want] = [decode([actual[i] ?? '0']), decode([expected[i] ?? '0'])];
    assert.fail(`${what}[${i}]: got ${actual[i]} (${got[0]}), expected ${expected[i]} (${want[0]})`);
  }
}

for (const [name, fn, width] of /** @type {const} */ ([
  ['tanh32', tanh32, 32],
  ['relu32', relu32, 32],
  ['exp32', exp32, 32],
  ['log64', log64, 64],
])) {
  test(`${name} gives the reference's bits`, () => {
    const pairs = golden.functions[name];
    const [decode, encode] = width === 32 ? [float32s, hex32] : [float64s, hex64];
    const inputs = decode(pairs.map((/** @type {string[]} */ p) => p[0]));
    const outputs = encode(Array.from(inputs, fn));
    assertBits(outputs, pairs.map((/** @type {string[]} */ p) => p[1]), decode, `${name} of ${name === 'log64' ? 'Z' : 'x'}`);
  });
}

/** A generator stand-in that returns one fixed uniform. */
const fixed = (/** @type {number} */ u) => ({ random: () => u });
const noDraws = { random: () => assert.fail('a deterministic policy drew a number') };

for (const net of golden.networks) {
  test(`mlp-categorical "${net.name}": logits, actions and log_probs are the reference's bits`, () => {
    const n = net.observations.length;
    const [obsDim, nActions] = [net.observations[0].length, net.logits[0].length];
    const spec = {
      observationSpace: { kind: 'box', shape: [obsDim], dtype: 'float32', low: null, high: null },
      actionSpace: { kind: 'discrete', n: nActions, start: 0 },
      maxEpisodeLength: null,
    };
    const policy = new MLPCategoricalPolicy(/** @type {any} */ (spec), {
      hidden_sizes: net.hidden_sizes,
      activation: net.activation,
      deterministic: net.deterministic,
    });
    policy.setParamValues(
      Object.fromEntries(
        Object.entries(net.params).map(([key, p]) => [key, tensor('float32', p.shape, float32s(p.data))]),
      ),
    );
    const observations = float32s(net.observations.flat());
    const rngs = net.deterministic ? new Array(n).fill(noDraws) : Array.from(float64s(net.u), fixed);
    const { actions, agentInfos } = policy.act(observations, n, rngs);
    assertBits(hex32(agentInfos.logits.data), net.logits.flat(), float32s, 'logits');
    assert.deepEqual(actions, net.actions);
    assertBits(hex32(agentInfos.log_prob.data), net.log_prob, float32s, 'log_prob');
  });
}

test('the fixture covers every activation, sampled and deterministic, and a linear policy', () => {
  const nets = golden.networks;
  assert.deepEqual(new Set(nets.map((/** @type {any} */ net) => net.activation)), new Set(['tanh', 'relu', 'identity']));
  assert.deepEqual(new Set(nets.map((/** @type {any} */ net) => net.deterministic)), new Set([true, false]));
  assert.ok(nets.some((/** @type {any} */ net) => net.hidden_sizes.length === 0));
});
