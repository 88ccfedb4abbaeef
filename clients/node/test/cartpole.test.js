import assert from 'node:assert/strict';
import { test } from 'node:test';

import { ConfigError, EnvNotFoundError } from '../src/errors.js';
import { CartPoleEnv, THETA_THRESHOLD_RADIANS } from '../src/envs/cartpole.js';
import { makeEnv } from '../src/envs/registry.js';

test('reset(seed) gives gymnasium CartPole-v1 initial state for that seed', () => {
  const env = new CartPoleEnv();
  const observation = env.reset(123);
  // gymnasium: gym.make("CartPole-v1").reset(seed=123); env.unwrapped.state
  assert.deepEqual(Array.from(env.state), [
    0.018235186324814343, -0.04461789811977773, -0.027964012722738865, -0.03156281893013303,
  ]);
  assert.ok(observation instanceof Float32Array);
  assert.deepEqual(observation, Float32Array.from(env.state));
});

test('one push right from rest follows the closed-form dynamics', () => {
  const env = new CartPoleEnv();
  env.reset(0);
  env.state.fill(0);
  const { observation, reward, terminated, truncated } = env.step(1);
  // thetaacc = -600/41 and xacc = 4400/451 at rest; Euler with tau = 0.02.
  const expected = [0, 0.02 * (4400 / 451), 0, 0.02 * (-600 / 41)];
  env.state.forEach((value, i) => assert.ok(Math.abs(value - expected[i]) < 1e-15, `state[${i}] = ${value}`));
  assert.deepEqual(observation, Float32Array.from(expected));
  assert.deepEqual([reward, terminated, truncated], [1, false, false]);
});

test('crossing the angle or position threshold terminates', () => {
  const env = new CartPoleEnv();
  env.reset(0);
  env.state.set([0, 0, THETA_THRESHOLD_RADIANS - 1e-6, 1]);
  assert.equal(env.step(0).terminated, true);
  assert.throws(() => env.step(0), /before reset/);
  env.reset(0);
  env.state.set([2.39, 1, 0, 0]);
  assert.equal(env.step(1).terminated, true);
  env.reset(0);
  env.state.set([2.3, 1, 0, 0]);
  assert.equal(env.step(1).terminated, false);
});

test('sutton_barto_reward gives 0 per step and -1 on failure', () => {
  const env = new CartPoleEnv({ sutton_barto_reward: true });
  env.reset(0);
  assert.equal(env.step(0).reward, 0);
  env.state.set([2.39, 1, 0, 0]);
  assert.equal(env.step(1).reward, -1);
});

test('bad actions and kwargs are refused', () => {
  const env = new CartPoleEnv();
  env.reset(0);
  assert.throws(() => env.step(2), /action must be 0 or 1, got 2/);
  assert.throws(() => new CartPoleEnv({ render_mode: 'human' }), ConfigError);
  assert.throws(() => new CartPoleEnv({ sutton_barto_reward: 1 }), /must be true or false/);
});

test('the registry serves only its own ids and names them when refusing', () => {
  const { env, maxEpisodeSteps } = makeEnv('rlfleet/CartPoleJS-v0');
  assert.equal(maxEpisodeSteps, 500);
  assert.deepEqual(env.actionSpace, { kind: 'discrete', n: 2, start: 0 });
  assert.throws(
    () => makeEnv('CartPole-v1'),
    (error) => error instanceof EnvNotFoundError && /"CartPole-v1".*"rlfleet\/CartPoleJS-v0"/.test(error.message),
  );
});
