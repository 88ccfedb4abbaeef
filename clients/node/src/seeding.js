/**
 * Per-episode seeds, as rlfleet/core/seeding.py derives them.
 *
 * Workers normally only use the seeds a task carries; the one exception is
 * fragment sampling, where episodes that start during a task take their
 * seeds from the task's base_seed (worker.proto Task.base_seed).
 *
 * @module
 */
import { SeedSequence } from './random.js';

/** Keeps fragment seeds disjoint from episodeSeeds' triples ("FRAG"). */
const STREAM_TAG = 0x46524147;

/**
 * @param {Array<number | bigint>} entropy
 * @returns {[number, number]}
 */
function twoSeeds(entropy) {
  for (const value of entropy) {
    if (BigInt(value) < 0n) {
      throw new RangeError(`seeds are derived from non-negative integers, got [${entropy}]`);
    }
  }
  const [envSeed, policySeed] = new SeedSequence(entropy).generateState(2);
  return [envSeed, policySeed];
}

/**
 * The (env_seed, policy_seed) of episode `episodeIndex` of a request
 * (rlfleet.core.seeding.episode_seeds); the coordinator's job, here for tests.
 *
 * @param {number | bigint} baseSeed
 * @param {number | bigint} request
 * @param {number | bigint} episodeIndex
 * @returns {[number, number]} Two uint32 seeds.
 */
export function episodeSeeds(baseSeed, request, episodeIndex) {
  return twoSeeds([baseSeed, request, episodeIndex]);
}

/**
 * The (env_seed, policy_seed) of episode `episodeInStream` of a fragment
 * stream (rlfleet.core.seeding.stream_seeds).
 *
 * @param {number | bigint} baseSeed The task's base_seed (a uint64).
 * @param {number | bigint} stream The global env slot (Welcome.first_stream + slot).
 * @param {number | bigint} episodeInStream Index of the episode within the stream.
 * @returns {[number, number]} Two uint32 seeds.
 */
export function streamSeeds(baseSeed, stream, episodeInStream) {
  return twoSeeds([baseSeed, STREAM_TAG, stream, episodeInStream]);
}
