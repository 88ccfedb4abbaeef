#!/usr/bin/env node
/**
 * Reads {policy: {name, kwargs}, params: {name: {shape, data}}, observations:
 * [[...]], seeds: [...]} as JSON on stdin and prints {logits, actions,
 * log_prob} of the Node policy: the fixture tests/test_node_worker.py
 * compares with the Python policy.
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
const mlp = /** @type {import('../src/policies/mlp.js').MLPCategoricalPolicy} */ (policy);
const logits = mlp.logits(observations, n);
const out = mlp.act(observations, n, input.seeds.map((/** @type {number} */ seed) => new Generator(seed)));
process.stdout.write(
  JSON.stringify({
    logits: Array.from({ length: n }, (_, row) => Array.from(logits.subarray(row * input.n_actions, (row + 1) * input.n_actions))),
    actions: out.actions,
    log_prob: Array.from(out.agentInfos.log_prob.data, Number),
  }),
);
