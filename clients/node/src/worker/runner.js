/**
 * VecRunner: K env slots stepped together with one batched policy call,
 * the Node counterpart of rlfleet/worker/vec.py (VecWorker).
 *
 * Episodes: a slot takes a unit, resets its env with the unit's env_seed
 * and draws the episode's actions from its own generator seeded with
 * policy_seed, so an episode depends on its unit and the agent only.
 *
 * Fragments (RLlib truncate_episodes): slot i is stream first_stream + i,
 * whose episodes go on across windows; a window gives every slot exactly
 * `fragmentLength` steps, cut into pieces at episode boundaries. A piece
 * cut by the window ends MID and is parked, to resume in the next window
 * of the same (base_seed, stream). The k-th episode of a stream takes
 * streamSeeds(base_seed, stream, k).
 *
 * Updates abort episodes in flight and re-queue their units (same seeds),
 * so every episode is produced by exactly one agent version and one env.
 *
 * Step types: terminated -> TERMINAL (wins), truncated or the episode
 * limit -> TIMEOUT, else FIRST/MID (rlfleet.core.step_type_from_gym).
 *
 * @module
 */
import { EnvError, PolicyError, RlfleetError } from '../errors.js';
import { makeEnv } from '../envs/registry.js';
import { makePolicy } from '../policies/index.js';
import { RandomPolicy } from '../policies/random.js';
import { StepType } from '../proto.js';
import { Generator } from '../random.js';
import { streamSeeds } from '../seeding.js';
import { RestartLedger } from './restarts.js';

/** @typedef {import('../batch.js').Segment} Segment */
/** @typedef {import('../spaces.js').EnvSpec} EnvSpec */
/** @typedef {import('../envs/registry.js').Env} Env */
/** @typedef {import('../policies/index.js').Policy} Policy */

/**
 * One episode to run.
 *
 * @typedef {object} Unit
 * @property {number} episodeIndex
 * @property {number} envSeed
 * @property {number} policySeed
 * @property {number} task The task id the unit belongs to.
 */

/** A non-finite observation, reported as ERROR_KIND_NONFINITE. */
export class NonFiniteObservationError extends EnvError {
  static kind = 'ERROR_KIND_NONFINITE';
}

/**
 * The segment a slot is running: an episode, or a piece of a stream's episode.
 */
class Live {
  /**
   * @param {{unit: Unit | null, rng: Generator, meta: Record<string, number | bigint>,
   *          key: number[], stream?: string | null}} init
   */
  constructor({ unit, rng, meta, key, stream = null }) {
    this.unit = unit;
    this.rng = rng;
    this.meta = meta;
    this.key = key;
    /** `${baseSeed}:${stream}` of a fragment stream, else null. */
    this.stream = stream;
    /** Steps of the episode taken before this segment (fragments). */
    this.offset = 0;
    /** Whether the segment starts its episode. */
    this.first = true;
    /** @type {Float32Array} The observation the next action is chosen on. */
    this.observation = new Float32Array(0);
    /** @type {number[]} */
    this.observations = [];
    /** @type {number[]} */
    this.actions = [];
    /** @type {number[]} */
    this.rewards = [];
    /** @type {Record<string, {dtype: string, rowShape: number[], values: number[]}>} */
    this.agentInfos = {};
  }

  /** Forgets the recorded steps (a new segment of the same episode). */
  clear() {
    this.observations = [];
    this.actions = [];
    this.rewards = [];
    this.agentInfos = {};
  }

  /** @returns {string} For messages. */
  describe() {
    if (this.unit) {
      return `episode ${this.unit.episodeIndex} of task ${this.unit.task}`;
    }
    return `episode ${this.meta.episode_index} of stream ${this.meta.stream}`;
  }
}

export class VecRunner {
  /**
   * @param {{numEnvs: number, workerNumber?: bigint, name?: string,
   *          restartLedger?: RestartLedger}} options
   *   workerNumber: the Welcome.worker_id recorded in episode_infos.
   */
  constructor({ numEnvs, workerNumber = 0n, name = 'node-worker', restartLedger = new RestartLedger() }) {
    if (!Number.isSafeInteger(numEnvs) || numEnvs < 1) {
      throw new RangeError(`numEnvs must be an integer >= 1, got ${numEnvs}`);
    }
    this.numEnvs = numEnvs;
    this.workerNumber = workerNumber;
    this.name = name;
    this.ledger = restartLedger;
    /** @type {{envId: string, kwargs: Record<string, unknown>} | null} */
    this.envConfig = null;
    /** @type {Array<Env | null>} */
    this.envs = new Array(numEnvs).fill(null);
    /** @type {EnvSpec | null} */
    this.envSpec = null;
    /** @type {Policy | null} */
    this.policy = null;
    this.agentVersion = 0;
    /** @type {Unit[]} Units waiting for a slot (started at the next step). */
    this.queue = [];
    /** @type {Array<Live | null>} */
    this.live = new Array(numEnvs).fill(null);
    /** @type {Array<Segment & {task: number}>} Finished episodes, not yet taken. */
    this.finished = [];
    /** @type {RlfleetError[]} Errors raised once the current step is done. */
    this.errors = [];
    /** @type {Array<Live | null>} Stream episodes cut by a window, by slot. */
    this.parked = new Array(numEnvs).fill(null);
    /** @type {Map<string, number>} Next episode index per `${baseSeed}:${stream}`. */
    this.streamNext = new Map();
    /** @type {{quota: number[], baseSeed: bigint, firstStream: bigint, pieces: Segment[]} | null} */
    this.window = null;
    this.stepsTotal = 0;
  }

  /** @returns {number} Episodes in flight. */
  get activeCount() {
    return this.live.filter((live) => live !== null).length;
  }

  /** @returns {boolean} Nothing queued or running (finished ones may wait). */
  get idle() {
    return this.queue.length === 0 && this.activeCount === 0;
  }

  /** @returns {number} Steps of the finished episodes not yet taken. */
  get finishedSteps() {
    return this.finished.reduce((sum, s) => sum + s.rewards.length, 0);
  }

  // ----------------------------------------------------------------- updates

  /**
   * Builds new envs for every slot; aborts and re-queues episodes in flight.
   *
   * @param {{envId: string, kwargs?: Record<string, unknown>, maxEpisodeLength?: number | null}} update
   * @returns {EnvSpec} The spec, with the effective episode limit.
   * @throws {import('../errors.js').ConfigError} If the env cannot be built (nothing changes).
   */
  setEnv({ envId, kwargs = {}, maxEpisodeLength = null }) {
    const built = Array.from({ length: this.numEnvs }, () => makeEnv(envId, kwargs));
    const { env, maxEpisodeSteps } = built[0];
    const spec = {
      observationSpace: env.observationSpace,
      actionSpace: env.actionSpace,
      maxEpisodeLength: maxEpisodeLength ?? maxEpisodeSteps,
    };
    this.abortInFlight();
    this.parked.fill(null);
    this.envConfig = { envId, kwargs };
    this.envs = built.map((entry) => entry.env);
    this.envSpec = spec;
    if (this.policy === null || this.policy instanceof RandomPolicy) {
      this.policy = new RandomPolicy(spec);
    }
    return spec;
  }

  /**
   * Applies an agent update; aborts and re-queues episodes in flight.
   * Parameters are merged over the current (or new) policy's, as the
   * Python worker does: names it lacks or shapes that differ are refused.
   *
   * @param {{version: number, policy?: {name: string, kwargsJson: string} | null,
   *          params?: Record<string, unknown>}} update
   * @throws {PolicyError} If the spec or a parameter is refused (nothing changes).
   */
  setAgent({ version, policy = null, params = {} }) {
    if (this.envSpec === null) {
      throw new PolicyError('an agent update arrived before any env update; the worker builds policies for its env');
    }
    let next = this.policy;
    if (policy) {
      next = makePolicy(policy.name, policy.kwargsJson, this.envSpec);
    } else if (Object.keys(params).length === 0) {
      throw new PolicyError('the agent update carries neither a policy spec nor parameters');
    }
    if (next === null) {
      throw new PolicyError('parameters arrived before the worker had a policy');
    }
    if (policy || Object.keys(params).length > 0) {
      next.setParamValues({ ...next.getParamValues(), ...params });
    }
    this.policy = next;
    this.agentVersion = version;
    this.abortInFlight();
  }

  // -------------------------------------------------------------------- work

  /**
   * Queues units; they start on free slots at the next step.
   *
   * @param {Unit[]} units
   */
  submit(units) {
    if (units.length > 0) {
      this.parked.fill(null);
    }
    this.queue.push(...units);
  }

  /**
   * Drops queued, running and finished-but-untaken episodes of a task.
   *
   * @param {number} task
   * @param {Set<number> | null} indices Which episodes; null for all of the task's.
   */
  cancel(task, indices) {
    /** @param {number} t @param {number} i */
    const matches = (t, i) => t === task && (indices === null || indices.has(i));
    this.queue = this.queue.filter((u) => !matches(u.task, u.episodeIndex));
    this.live.forEach((live, slot) => {
      if (live?.unit && matches(live.unit.task, live.unit.episodeIndex)) {
        this.live[slot] = null;
      }
    });
    this.finished = this.finished.filter((s) => !matches(s.task, Number(s.infos.episode_index)));
  }

  /**
   * Removes and returns the finished episodes of a task, by episode index.
   *
   * @param {number} task
   * @returns {Segment[]}
   */
  takeFinished(task) {
    const taken = this.finished.filter((s) => s.task === task);
    this.finished = this.finished.filter((s) => s.task !== task);
    return taken.sort((a, b) => a.key[0] - b.key[0]);
  }

  /** Drops every finished episode (of tasks that no longer exist). */
  dropFinished() {
    this.finished = [];
  }

  /**
   * One vector step over the busy slots; idle slots first take queued units.
   *
   * @returns {number} Env steps taken.
   * @throws {PolicyError | EnvError} After the step completed for the other slots.
   */
  step() {
    this.fillFromQueue();
    const taken = this.advance();
    this.raiseDeferred();
    return taken;
  }

  /** Starts queued units on idle slots. */
  fillFromQueue() {
    for (let slot = 0; slot < this.numEnvs && this.queue.length > 0; slot += 1) {
      if (this.live[slot] !== null) {
        continue;
      }
      const unit = /** @type {Unit} */ (this.queue.shift());
      const live = new Live({
        unit,
        rng: new Generator(unit.policySeed),
        meta: this.meta(unit.episodeIndex, unit.envSeed, unit.policySeed),
        key: [unit.episodeIndex],
      });
      this.begin(slot, live, unit.envSeed);
    }
  }

  /**
   * The episode_infos of a new episode, in the Python worker's key order.
   *
   * @param {number} episodeIndex
   * @param {number} envSeed
   * @param {number} policySeed
   * @returns {Record<string, number | bigint>}
   */
  meta(episodeIndex, envSeed, policySeed) {
    return {
      agent_version: this.agentVersion,
      env_seed: envSeed,
      policy_seed: policySeed,
      episode_index: episodeIndex,
      worker: this.workerNumber,
    };
  }

  /**
   * Resets the slot's env and makes `live` run on it; a crashing reset is
   * retried on a rebuilt env within the restart budget.
   *
   * @param {number} slot
   * @param {Live} live
   * @param {number} envSeed
   * @returns {boolean} False if the env failed past the budget.
   */
  begin(slot, live, envSeed) {
    for (;;) {
      try {
        const env = this.envs[slot] ?? this.rebuildEnv(slot);
        live.observation = env.reset(envSeed);
        break;
      } catch (error) {
        if (!this.restartEnv(slot, error, 'reset', live, 0)) {
          return false;
        }
      }
    }
    if (!this.checkFinite(slot, live, live.observation, 0)) {
      return false;
    }
    this.live[slot] = live;
    return true;
  }

  /**
   * @param {number} slot
   * @returns {Env}
   */
  rebuildEnv(slot) {
    const config = /** @type {{envId: string, kwargs: Record<string, unknown>}} */ (this.envConfig);
    const env = makeEnv(config.envId, config.kwargs).env;
    this.envs[slot] = env;
    return env;
  }

  /**
   * @param {number} slot
   * @param {Live} live
   * @param {Float32Array} observation
   * @param {number} step The step that returned it (0: reset).
   * @returns {boolean} False (and an error queued) if it holds NaN or inf.
   */
  checkFinite(slot, live, observation, step) {
    if (observation.every(Number.isFinite)) {
      return true;
    }
    const from = step === 0 ? 'reset' : `step ${step}`;
    this.errors.push(
      new NonFiniteObservationError(
        `env ${this.envConfig?.envId} returned a non-finite observation (NaN or inf) from ${from} ` +
          `of ${live.describe()} on env ${slot} of worker ${this.name}; the episode was dropped. Fix the env`,
        { worker: this.name, envIndex: slot, step, episodeIndex: Number(live.meta.episode_index) },
      ),
    );
    return false;
  }

  /**
   * Closes a crashed env; true if it may be rebuilt, else queues an EnvError.
   *
   * @param {number} slot
   * @param {unknown} error
   * @param {string} call "reset" or "step".
   * @param {Live} live
   * @param {number} step
   * @returns {boolean}
   */
  restartEnv(slot, error, call, live, step) {
    this.envs[slot] = null;
    if (this.ledger.tryRestart()) {
      return true;
    }
    const cause = error instanceof Error ? `${error.name}: ${error.message}` : String(error);
    this.errors.push(
      new EnvError(
        `env ${this.envConfig?.envId} raised ${cause} in ${call} of ${live.describe()} on env ${slot} ` +
          `of worker ${this.name}; not restarted (${this.ledger.describe()})`,
        {
          worker: this.name,
          envIndex: slot,
          step,
          episodeIndex: Number(live.meta.episode_index),
          remoteTraceback: error instanceof Error ? error.stack : undefined,
          cause: error,
        },
      ),
    );
    return false;
  }

  /**
   * One vector step over the live slots.
   *
   * @returns {number} Env steps taken.
   */
  advance() {
    const active = [];
    for (let slot = 0; slot < this.numEnvs; slot += 1) {
      if (this.live[slot] !== null) {
        active.push(slot);
      }
    }
    const n = active.length;
    if (n === 0) {
      return 0;
    }
    const spec = /** @type {EnvSpec} */ (this.envSpec);
    const policy = /** @type {Policy} */ (this.policy);
    const lives = active.map((slot) => /** @type {Live} */ (this.live[slot]));
    const dim = lives[0].observation.length;
    const observations = new Float32Array(n * dim);
    lives.forEach((live, row) => observations.set(live.observation, row * dim));
    let output;
    try {
      output = policy.act(observations, n, lives.map((live) => live.rng));
    } catch (error) {
      this.abortInFlight();
      throw error instanceof RlfleetError
        ? error
        : new PolicyError(`the policy raised ${error}`, { cause: error });
    }
    const infoKeys = Object.entries(output.agentInfos);
    let taken = 0;
    for (let row = 0; row < n; row += 1) {
      const slot = active[row];
      const live = lives[row];
      const action = output.actions[row];
      const steps = live.offset + live.rewards.length + 1;
      let result;
      try {
        result = /** @type {Env} */ (this.envs[slot]).step(action);
      } catch (error) {
        this.onStepFailure(slot, live, error, steps);
        continue;
      }
      taken += 1;
      live.observations.push(...live.observation);
      live.actions.push(action);
      live.rewards.push(result.reward);
      for (const [key, info] of infoKeys) {
        const width = info.rowShape.reduce((a, b) => a * b, 1);
        const record = (live.agentInfos[key] ??= { dtype: info.dtype, rowShape: info.rowShape, values: [] });
        for (let j = 0; j < width; j += 1) {
          record.values.push(Number(info.data[row * width + j]));
        }
      }
      live.observation = result.observation;
      if (!this.checkFinite(slot, live, result.observation, steps)) {
        this.live[slot] = null;
        continue;
      }
      const limit = spec.maxEpisodeLength;
      if (result.terminated || result.truncated || (limit !== null && steps >= limit)) {
        const last = result.terminated ? StepType.STEP_TYPE_TERMINAL : StepType.STEP_TYPE_TIMEOUT;
        this.finish(slot, live, last);
      } else if (this.window && live.rewards.length >= this.window.quota[slot]) {
        this.finish(slot, live, null);
      }
    }
    this.stepsTotal += taken;
    return taken;
  }

  /**
   * Records a segment that ended (last !== null) or was cut by the window.
   *
   * @param {number} slot
   * @param {Live} live
   * @param {number | null} last
   */
  finish(slot, live, last) {
    this.live[slot] = null;
    const segment = {
      key: live.key,
      infos: { ...live.meta },
      observations: live.observations,
      lastObservation: live.observation,
      actions: live.actions,
      rewards: live.rewards,
      agentInfos: live.agentInfos,
      first: live.first,
      last,
    };
    if (this.window) {
      this.window.quota[slot] -= live.rewards.length;
      this.window.pieces.push(segment);
      if (last === null) {
        live.offset += live.rewards.length;
        live.clear();
        this.parked[slot] = live;
      }
    } else {
      this.finished.push({ ...segment, task: /** @type {Unit} */ (live.unit).task });
    }
  }

  /**
   * An env raised in step: its episode is re-run on a rebuilt env within
   * the budget (a stream keeps the piece so far, cut), else an EnvError.
   *
   * @param {number} slot
   * @param {Live} live
   * @param {unknown} error
   * @param {number} step
   */
  onStepFailure(slot, live, error, step) {
    this.live[slot] = null;
    if (this.window && live.rewards.length > 0) {
      this.window.quota[slot] -= live.rewards.length;
      this.window.pieces.push({
        key: live.key,
        infos: { ...live.meta },
        observations: live.observations,
        lastObservation: live.observation,
        actions: live.actions,
        rewards: live.rewards,
        agentInfos: live.agentInfos,
        first: live.first,
        last: null,
      });
    }
    if (this.restartEnv(slot, error, 'step', live, step) && live.unit) {
      this.queue.unshift(live.unit);
    } else if (this.window) {
      this.window.quota[slot] = 0;
    }
  }

  /** Re-queues the units in flight at the front (in order); drops stream episodes in flight. */
  abortInFlight() {
    const units = [];
    for (let slot = 0; slot < this.numEnvs; slot += 1) {
      const live = this.live[slot];
      if (live?.unit) {
        units.push(live.unit);
      }
      this.live[slot] = null;
    }
    units.sort((a, b) => a.task - b.task || a.episodeIndex - b.episodeIndex);
    this.queue.unshift(...units);
  }

  /** Throws the first deferred error, noting the others. */
  raiseDeferred() {
    if (this.errors.length === 0) {
      return;
    }
    const [first, ...rest] = this.errors;
    this.errors = [];
    if (rest.length > 0) {
      first.message += rest.map((other) => `\nalso in the same step: ${other.message.split('\n')[0]}`).join('');
    }
    throw first;
  }

  // --------------------------------------------------------------- fragments

  /**
   * Starts a window of `fragmentLength` steps on every slot.
   *
   * @param {number} fragmentLength
   * @param {bigint} baseSeed
   * @param {bigint} firstStream Global stream of slot 0.
   * @throws {RangeError} If episode units are queued or running.
   */
  startWindow(fragmentLength, baseSeed, firstStream) {
    if (!this.idle) {
      throw new RangeError('a fragment window needs a worker without episode units; take or cancel them first');
    }
    this.parked.forEach((live, slot) => {
      if (live && live.stream !== `${baseSeed}:${firstStream + BigInt(slot)}`) {
        this.parked[slot] = null;
      }
    });
    this.window = { quota: new Array(this.numEnvs).fill(fragmentLength), baseSeed, firstStream, pieces: [] };
  }

  /** @returns {boolean} Whether a window is in progress. */
  get inWindow() {
    return this.window !== null;
  }

  /**
   * One vector step of the window in progress.
   *
   * @returns {Segment[] | null} The window's pieces, ordered by (stream,
   *   episode_index, fragment_index), once every slot has its steps; else null.
   * @throws {PolicyError | EnvError} The window is abandoned (streams restart).
   */
  stepWindow() {
    const window = /** @type {NonNullable<VecRunner['window']>} */ (this.window);
    try {
      this.fillStreams(window);
      this.advance();
      this.raiseDeferred();
    } catch (error) {
      this.live.fill(null);
      this.parked.fill(null);
      this.window = null;
      throw error;
    }
    if (window.quota.some((q) => q > 0)) {
      return null;
    }
    this.window = null;
    return window.pieces.sort((a, b) => compareKeys(a.key, b.key));
  }

  /**
   * Gives idle slots with steps left their stream's parked or next episode.
   *
   * @param {NonNullable<VecRunner['window']>} window
   */
  fillStreams(window) {
    for (let slot = 0; slot < this.numEnvs; slot += 1) {
      if (this.live[slot] !== null || window.quota[slot] <= 0) {
        continue;
      }
      const parked = this.parked[slot];
      if (parked) {
        this.parked[slot] = null;
        parked.first = false;
        parked.meta = { ...parked.meta, agent_version: this.agentVersion };
        parked.meta.fragment_index = Number(parked.meta.fragment_index) + 1;
        parked.key = [parked.key[0], parked.key[1], Number(parked.meta.fragment_index)];
        this.live[slot] = parked;
        continue;
      }
      const stream = window.firstStream + BigInt(slot);
      const streamKey = `${window.baseSeed}:${stream}`;
      const index = this.streamNext.get(streamKey) ?? 0;
      this.streamNext.set(streamKey, index + 1);
      const [envSeed, policySeed] = streamSeeds(window.baseSeed, stream, index);
      const live = new Live({
        unit: null,
        rng: new Generator(policySeed),
        meta: { ...this.meta(index, envSeed, policySeed), stream, fragment_index: 0 },
        key: [Number(stream), index, 0],
        stream: streamKey,
      });
      if (!this.begin(slot, live, envSeed)) {
        window.quota[slot] = 0;
      }
    }
  }
}

/**
 * @param {number[]} a
 * @param {number[]} b
 * @returns {number}
 */
function compareKeys(a, b) {
  for (let i = 0; i < Math.min(a.length, b.length); i += 1) {
    if (a[i] !== b[i]) {
      return a[i] - b[i];
    }
  }
  return a.length - b.length;
}
