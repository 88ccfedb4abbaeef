#!/usr/bin/env node
/**
 * Drives a coordinator with the Node client and prints a JSON summary:
 * the fixture of tests/test_node_client.py.
 *
 *   node scripts/sample-summary.js HOST:PORT PARAMS_JSON_FILE
 *
 * PARAMS_JSON_FILE holds {hidden_sizes, params: {name: {shape, data}}}.
 */
import { readFileSync } from 'node:fs';

import { RlfleetClient } from '../src/client.js';

const [address, paramsFile] = process.argv.slice(2);
const { hidden_sizes: hiddenSizes, params } = JSON.parse(readFileSync(paramsFile, 'utf8'));
const client = new RlfleetClient(address, { timeoutSeconds: 60 });

/** @param {any} batch */
function summary(batch) {
  const column = (/** @type {string} */ key) => (key in batch.episodeInfos ? Array.from(batch.episodeInfos[key].data, Number) : null);
  return {
    agent_version: batch.agentVersion,
    num_episodes: batch.numEpisodes,
    total_steps: batch.totalSteps,
    footer: batch.footer,
    lengths: Array.from(batch.lengths.data, Number),
    observations_shape: batch.observations.shape,
    observations_dtype: batch.observations.dtype,
    last_observations_shape: batch.lastObservations.shape,
    actions_dtype: batch.actions.dtype,
    rewards_dtype: batch.rewards.dtype,
    step_types: Array.from(batch.stepTypes.data),
    episode_index: column('episode_index'),
    agent_versions: column('agent_version'),
    workers: column('worker'),
    stream: column('stream'),
    fragment_index: column('fragment_index'),
    agent_info_keys: Object.keys(batch.agentInfos),
    logits_shape: batch.agentInfos.logits?.shape ?? null,
    first_observation: Array.from(batch.observations.data.subarray(0, 4)),
    env_spec: batch.envSpec,
  };
}

/** @param {() => Promise<unknown>} call */
async function errorOf(call) {
  try {
    await call();
    return null;
  } catch (error) {
    const { name, message } = /** @type {Error} */ (error);
    return { name, message };
  }
}

const out = {};
out.status_workers = (await client.status()).workers.length;
const ack = await client.updateAgent({
  policy: { name: 'mlp-categorical', kwargs: { hidden_sizes: hiddenSizes } },
  params,
});
out.ack = ack;
out.episodes = summary(await client.sample({ mode: 'episodes', amount: 5, seed: 7 }));
out.episodes_again = summary(await client.sample({ mode: 'episodes', amount: 5, seed: 7 }));
out.steps = summary(await client.sample({ mode: 'steps', amount: 200, seed: 8 }));
out.fragments = summary(await client.sample({ mode: 'fragments', amount: 40, fragmentLength: 10, seed: 9 }));
out.bad_params = await errorOf(() =>
  client.updateAgent({ params: { 'layers.0.weight': { dtype: 'float32', shape: [1, 1], data: [0] } } }),
);
out.bad_env = await errorOf(() => client.updateEnv({ envId: 'NoSuchEnv-v9' }));
out.bad_amount = await errorOf(() => client.sample({ mode: 'episodes', amount: 0 }));
client.close();
const replacer = (/** @type {string} */ _key, /** @type {unknown} */ value) =>
  typeof value === 'bigint' ? value.toString() : ArrayBuffer.isView(value) ? Array.from(/** @type {any} */ (value), Number) : value;
process.stdout.write(JSON.stringify(out, replacer));
