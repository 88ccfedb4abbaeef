#!/usr/bin/env node
/**
 * Reads {policy: {name, kwargs}, params: {name: {shape, data}}, observations:
 * [[...]], seeds: [...], n_actions} as JSON on stdin and prints {logits,
 * actions, log_prob} of the Node policy, floats as their float32 bit
 * patterns (uint32), row i drawing from `new Generator(seeds[i])`: the
 * fixture tests/test_node_worker.py compares with tests/mlp_reference.py.
 */
import { text } from 'node:stream/consumers';

import { makePolicy } from '../src/policies/index.js';
import { Generator } from '../src/random.js';
import { tensor } from '../src/tensor.js';

const input = JSON.parse(await text(process.stdin));
const n = input.observations.length;
const dim = input.observations[0].length;
const spec = {
  observationSpace: { kind: 'box', shape: [dim], dtype: 'float32', low: null, high: null },
  actionSpace: { kind: 'discrete', n: input.n_actions, start: 0 },
  maxEpisodeLength: null,
};
const policy = makePolicy(input.policy.name, JSON.stringify(input.policy.kwargs), /** @type {any} */ (spec));
const params = Object.fromEntries(
  Object.entries(input.params).map(([name, value]) => [name, tensor('float32', value.shape, value.data)]),
);
policy.setParamValues(params);
const observations = Float32Array.from(input.observations.flat());
const out = policy.act(observations, n, input.seeds.map((/** @type {number} */ seed) => new Generator(seed)));
const bits = (/** @type {string} */ key) =>
  Array.from(new Uint32Array(/** @type {Float32Array} */ (out.agentInfos[key].data).slice().buffer));
const logits = bits('logits');
process.stdout.write(
  JSON.stringify({
    logits: Array.from({ length: n }, (_, row) => logits.slice(row * input.n_actions, (row + 1) * input.n_actions)),
    actions: out.actions,
    log_prob: bits('log_prob'),
  }),
);
