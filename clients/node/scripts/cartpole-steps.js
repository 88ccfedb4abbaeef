#!/usr/bin/env node
/**
 * Reads {transitions: [[x, x_dot, theta, theta_dot, action], ...], seeds: [...]}
 * as JSON on stdin and prints, for each transition, the JS CartPole's next
 * float64 state, observation and terminated flag, and the Math.sin and
 * Math.cos of its theta, and for each seed the state reset(seed) draws: the
 * fixture tests/test_node_worker.py compares with gymnasium's CartPole-v1.
 */
import { text } from 'node:stream/consumers';

import { CartPoleEnv } from '../src/envs/cartpole.js';

const input = JSON.parse(await text(process.stdin));
const env = new CartPoleEnv();
const steps = input.transitions.map((/** @type {number[]} */ row) => {
  env.reset(0);
  env.state.set(row.slice(0, 4));
  const { observation, terminated, reward } = env.step(row[4]);
  const sinCos = [Math.sin(row[2]), Math.cos(row[2])];
  return { state: Array.from(env.state), observation: Array.from(observation), terminated, reward, sinCos };
});
const resets = input.seeds.map((/** @type {number} */ seed) => {
  env.reset(seed);
  return Array.from(env.state);
});
process.stdout.write(JSON.stringify({ steps, resets }));
