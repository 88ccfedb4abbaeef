/**
 * The tasks a worker holds and the units it has not started yet, as
 * rlfleet/worker/_tasks.py. The coordinator may hand out more units than
 * there are slots (prefetch); they wait here, not in the runner, so they
 * can be dropped at once when the worker leaves or a task is cancelled.
 * The runner is topped up to one unit per slot after every step.
 *
 * @module
 */
import { SampleMode } from '../proto.js';
import { toBigInt, toSafeInt } from '../int64.js';

/** @typedef {import('./runner.js').Unit} Unit */
/** @typedef {import('./runner.js').VecRunner} VecRunner */
/** @typedef {import('./units.js').UnitRow} UnitRow */

/**
 * @typedef {object} EpisodeTask
 * @property {number} taskId
 * @property {number} requestId
 * @property {number} agentVersion -1: the latest.
 * @property {number} envGeneration
 * @property {Set<number>} remaining Episode indices neither reported nor cancelled.
 */

/**
 * @typedef {object} FragmentTask
 * @property {number} taskId
 * @property {number} requestId
 * @property {number} agentVersion
 * @property {number} envGeneration
 * @property {number} fragmentLength
 * @property {bigint} baseSeed
 * @property {number} roundsLeft
 */

export class TaskBook {
  /** @param {VecRunner} runner */
  constructor(runner) {
    this.runner = runner;
    /** @type {Map<number, EpisodeTask>} */
    this.episodeTasks = new Map();
    /** @type {FragmentTask[]} */
    this.fragmentTasks = [];
    /** @type {Unit[]} */
    this.pending = [];
  }

  /** @returns {number} Units not started yet. */
  get queuedUnits() {
    return this.pending.length + this.runner.queue.length;
  }

  /**
   * Takes a Task message (its versions and mode already checked) and, for
   * episodes, its units (./units.js taskUnits: either form, decoded).
   *
   * @param {any} task
   * @param {UnitRow[]} [units]
   */
  add(task, units = []) {
    const taskId = toSafeInt(task.task_id, 'Task.task_id');
    const common = {
      taskId,
      requestId: toSafeInt(task.request_id, 'Task.request_id'),
      agentVersion: toSafeInt(task.agent_version, 'Task.agent_version'),
      envGeneration: toSafeInt(task.env_generation, 'Task.env_generation'),
    };
    if (task.mode === SampleMode.SAMPLE_MODE_FRAGMENTS) {
      if (task.rounds > 0) {
        this.fragmentTasks.push({
          ...common,
          fragmentLength: task.fragment_length,
          baseSeed: toBigInt(task.base_seed, 'Task.base_seed'),
          roundsLeft: task.rounds,
        });
      }
      return;
    }
    let entry = this.episodeTasks.get(taskId);
    if (!entry) {
      entry = { ...common, remaining: new Set() };
      this.episodeTasks.set(taskId, entry);
    }
    for (const { episodeIndex, envSeed, policySeed } of units) {
      entry.remaining.add(episodeIndex);
      this.pending.push({ episodeIndex, envSeed, policySeed, task: taskId });
    }
    this.feed();
  }

  /** Gives the runner units until it holds one per slot. */
  feed() {
    const room = this.runner.numEnvs - this.runner.activeCount - this.runner.queue.length;
    if (room > 0 && this.pending.length > 0) {
      this.runner.submit(this.pending.splice(0, room));
    }
  }

  /**
   * Marks episodes as sent; forgets the task once all of them are.
   *
   * @param {number} taskId
   * @param {number[]} indices
   */
  reported(taskId, indices) {
    const entry = this.episodeTasks.get(taskId);
    if (!entry) {
      return;
    }
    for (const index of indices) {
      entry.remaining.delete(index);
    }
    if (entry.remaining.size === 0) {
      this.episodeTasks.delete(taskId);
    }
  }

  /**
   * Drops units of a task wherever they are (all of them if none are named).
   *
   * @param {number} taskId
   * @param {number[]} indices
   */
  cancel(taskId, indices) {
    if (indices.length === 0) {
      this.drop([taskId]);
      return;
    }
    const named = new Set(indices);
    this.pending = this.pending.filter((u) => u.task !== taskId || !named.has(u.episodeIndex));
    this.runner.cancel(taskId, named);
    this.reported(taskId, indices);
  }

  /**
   * Forgets tasks and drops all their units.
   *
   * @param {Iterable<number>} taskIds
   */
  drop(taskIds) {
    const ids = new Set(taskIds);
    if (ids.size === 0) {
      return;
    }
    this.pending = this.pending.filter((u) => !ids.has(u.task));
    this.fragmentTasks = this.fragmentTasks.filter((t) => !ids.has(t.taskId));
    for (const taskId of ids) {
      if (this.episodeTasks.delete(taskId)) {
        this.runner.cancel(taskId, null);
      }
    }
  }

  /**
   * Drops tasks an update made impossible to serve (another agent version,
   * not -1, or env generation); the coordinator cancels those before it
   * sends an update, so this only catches stragglers.
   *
   * @param {{agentVersion?: number, envGeneration?: number}} now
   * @returns {number[]} The dropped task ids.
   */
  dropStale({ agentVersion, envGeneration }) {
    const stale = this.tasks()
      .filter(
        (t) =>
          (agentVersion !== undefined && t.agentVersion !== -1 && t.agentVersion !== agentVersion) ||
          (envGeneration !== undefined && t.envGeneration !== envGeneration),
      )
      .map((t) => t.taskId);
    this.drop(stale);
    return stale;
  }

  /** Drops every unit not started yet and every fragment task (leaving). */
  dropUnstarted() {
    this.pending = [];
    this.fragmentTasks = [];
  }

  /** @returns {Array<EpisodeTask | FragmentTask>} Every task, episode tasks first. */
  tasks() {
    return [...this.episodeTasks.values(), ...this.fragmentTasks];
  }

  /** @returns {number[]} Task ids of the request of the oldest task (whose episodes are running). */
  runningRequest() {
    const tasks = this.tasks().sort((a, b) => a.taskId - b.taskId);
    if (tasks.length === 0) {
      return [];
    }
    const request = tasks[0].requestId;
    return tasks.filter((t) => t.requestId === request).map((t) => t.taskId);
  }

  /** @returns {number[]} */
  allTaskIds() {
    return this.tasks().map((t) => t.taskId);
  }
}
