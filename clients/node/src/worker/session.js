/**
 * One joined Join stream of the remote worker (./remote.js): the loop that
 * serves the coordinator until the stream ends, as the Python reference's
 * session does (rlfleet/worker/_session.py).
 *
 * Node is single-threaded: the loop steps the envs and handles messages
 * in turn, and yields to the event loop every few milliseconds so gRPC can
 * move bytes and heartbeats go out on time.
 *
 * @module
 */
import { setImmediate as yieldToEventLoop } from 'node:timers/promises';

import grpc from '@grpc/grpc-js';

import { buildEpisodeBatch } from '../batch.js';
import { DEFAULT_CHUNK_BYTES, chunkPayload } from '../chunks.js';
import {
  ConfigError,
  PermissionDeniedError,
  PolicyError,
  ProtocolError,
  RlfleetError,
} from '../errors.js';
import { toSafeInt } from '../int64.js';
import { ErrorKind, PayloadKind, SampleMode, messageType } from '../proto.js';
import { encodeEnvSpec } from '../spaces.js';
import { decodeTensorMap } from '../tensor.js';
import { VecRunner } from './runner.js';
import { TaskBook } from './tasks.js';
import { readTaskUnits } from './units.js';

/** Room left in a message for the envelope around a chunk. */
const ENVELOPE_ALLOWANCE = 64;
/** Yield to the event loop after this much continuous stepping. */
const SLICE_MS = 5;

const resultCodec = messageType('EpisodeResult');
const batchCodec = messageType('EpisodeBatch');

/** The outcome of a session. */
export const Outcome = Object.freeze({ LEFT: 'left', DRAINED: 'drained', LOST: 'lost' });

/** One joined stream: the loop that serves the coordinator. */
export class Session {
  /**
   * @param {import('./remote.js').RemoteWorker} worker
   * @param {import('./connection.js').JoinStream} stream
   * @param {any} welcome
   */
  constructor(worker, stream, welcome) {
    const { config } = worker;
    this.worker = worker;
    this.config = config;
    this.stream = stream;
    this.name = welcome.name || config.name;
    this.endReason = '';
    this.firstStream = BigInt(welcome.first_stream);
    this.runner = new VecRunner({ numEnvs: config.envs, workerNumber: BigInt(welcome.worker_id), name: this.name });
    this.book = new TaskBook(this.runner);
    this.generation = 0;
    this.leaving = false;
    this.nextBatchId = 0;
    const offered = toSafeInt(welcome.max_message_bytes, 'Welcome.max_message_bytes');
    this.maxMessageBytes = Math.min(offered || config.maxMessageBytes, config.maxMessageBytes);
    this.heartbeatMs = 1000 * (config.heartbeatIntervalSeconds ?? (welcome.heartbeat_interval_seconds || 1));
    this.beatSteps = 0;
    this.beatTime = Date.now();
    this.nextBeat = this.beatTime;
    /** @type {number | null} */
    this.oldestFinished = null;
    /** @type {import('./tasks.js').FragmentTask | null} */
    this.windowTask = null;
    config.log(
      'info',
      `joined coordinator ${config.coordinator} as ${this.name} (worker id ${welcome.worker_id}, ` +
        `${config.envs} envs, streams ${welcome.first_stream}..${this.firstStream + BigInt(config.envs - 1)})`,
    );
  }

  /** @returns {Promise<string>} How the session ended (an Outcome). */
  async run() {
    try {
      return await this.loop();
    } catch (error) {
      // A bug here must not kill the process: report it, rejoin fresh.
      this.config.log('error', `worker ${this.name} failed; rejoining: ${error instanceof Error ? error.stack : error}`);
      this.sendError(error);
      this.endReason = `internal error ${error}`;
      this.stream.closeSend();
      this.stream.cancel();
      return Outcome.LOST;
    }
  }

  /** @returns {Promise<string>} */
  async loop() {
    const runner = this.runner;
    let sliceStart = Date.now();
    for (;;) {
      if (this.windowTask === null) {
        const outcome = this.handleQueued();
        if (outcome) {
          return outcome;
        }
      }
      if (!runner.idle) {
        this.stepEpisodes();
      } else if (this.windowTask !== null) {
        this.stepWindow();
      } else if (this.book.fragmentTasks.length > 0 && !this.leaving) {
        this.windowTask = this.book.fragmentTasks[0];
        runner.startWindow(this.windowTask.fragmentLength, this.windowTask.baseSeed, this.firstStream);
      } else {
        this.flush();
        if (this.leaving) {
          return this.close();
        }
        const message = await this.stream.next(this.nextBeat - Date.now());
        sliceStart = Date.now();
        if (message !== null) {
          const outcome = this.handle(message);
          if (outcome) {
            return outcome;
          }
        }
      }
      const now = Date.now();
      if (now >= this.nextBeat) {
        this.heartbeat(now);
      }
      if (!this.stream.writable) {
        await this.stream.waitWritable();
        sliceStart = Date.now();
      } else if (now - sliceStart >= SLICE_MS) {
        await yieldToEventLoop();
        sliceStart = Date.now();
      }
    }
  }

  /** One vector step of the episode tasks, a top-up, and maybe a flush. */
  stepEpisodes() {
    try {
      this.runner.step();
    } catch (error) {
      this.onTaskError(error);
    }
    this.book.feed();
    if (this.runner.finished.length > 0) {
      const now = Date.now();
      this.oldestFinished ??= now;
      if (
        this.runner.idle ||
        now - this.oldestFinished >= this.config.flushSeconds * 1000 ||
        this.runner.finishedSteps >= this.config.flushSteps
      ) {
        this.flush();
      }
    }
  }

  /** One vector step of the fragment window in progress; sends it when complete. */
  stepWindow() {
    const task = /** @type {import('./tasks.js').FragmentTask} */ (this.windowTask);
    let pieces;
    try {
      pieces = this.runner.stepWindow();
    } catch (error) {
      this.windowTask = null;
      this.onTaskError(error);
      return;
    }
    if (pieces === null) {
      return;
    }
    this.windowTask = null;
    this.sendResult(task.taskId, pieces);
    task.roundsLeft -= 1;
    if (task.roundsLeft <= 0 && this.book.fragmentTasks[0] === task) {
      this.book.fragmentTasks.shift();
    }
  }

  /** @returns {string | null} An Outcome if a queued message ended the session. */
  handleQueued() {
    while (this.stream.inbox.length > 0) {
      const outcome = this.handle(this.stream.inbox.shift());
      if (outcome) {
        return outcome;
      }
    }
    return null;
  }

  // ------------------------------------------------ messages from the coordinator

  /**
   * @param {import('./connection.js').Incoming} message
   * @returns {string | null}
   */
  handle(message) {
    if (message.ended) {
      return this.ended(message);
    }
    if (message.wakeup) {
      if (this.worker.leaving && !this.leaving) {
        this.startLeaving(this.worker.leaveReason, true);
      }
      return null;
    }
    switch (message.body) {
      case 'env_update':
        this.onEnvUpdate(message.env_update);
        break;
      case 'agent_update':
        this.onAgentUpdate(message.agent_update);
        break;
      case 'task':
        this.onTask(message.task);
        break;
      case 'cancel':
        this.book.cancel(
          toSafeInt(message.cancel.task_id, 'Cancel.task_id'),
          message.cancel.episode_indices.map((/** @type {unknown} */ i) => toSafeInt(i, 'Cancel.episode_indices')),
        );
        break;
      case 'drain':
        this.config.log('info', `coordinator drains this worker: ${message.drain.reason || 'no reason'}`);
        this.startLeaving(message.drain.reason, false);
        break;
      default:
        this.config.log('warning', `ignored an unexpected ${message.body} message from the coordinator`);
    }
    return null;
  }

  /** @param {any} update */
  onEnvUpdate(update) {
    this.flush(); // finished episodes belong to the old env
    const generation = toSafeInt(update.generation, 'EnvUpdate.generation');
    this.book.dropStale({ envGeneration: generation });
    let spec;
    try {
      if (update.pickled_env_factory?.length) {
        throw new PermissionDeniedError('pickled env factories are not enabled on this worker (Node workers never unpickle); send an env id');
      }
      if (update.env_id.includes(':')) {
        throw new ConfigError(`env id ${JSON.stringify(update.env_id)} names a module to import, which workers refuse from the network`);
      }
      if (update.vectorization) {
        throw new ConfigError(
          `vectorization ${JSON.stringify(update.vectorization)} (native vector envs, env subprocesses) is not implemented by the Node worker, which steps one env per slot in its own process; send the env without vectorization, or use Python workers`,
        );
      }
      spec = this.runner.setEnv({
        envId: update.env_id,
        kwargs: parseJsonObject(update.kwargs_json, 'EnvUpdate.kwargs_json', ConfigError),
        maxEpisodeLength:
          update.max_episode_length === undefined ? null : toSafeInt(update.max_episode_length, 'EnvUpdate.max_episode_length'),
      });
    } catch (error) {
      const refused = error instanceof RlfleetError ? error : new ConfigError(`building env ${update.env_id} raised ${error}`, { cause: error });
      this.config.log('warning', `env update ${generation} refused: ${refused.message}`);
      this.sendError(refused, 0, { env_generation: String(generation) });
      return;
    }
    this.generation = generation;
    this.send({ env_ready: { generation, env_spec: encodeEnvSpec(spec) } });
    this.config.log('info', `env generation ${generation}: ${update.env_id}`);
  }

  /** @param {any} update */
  onAgentUpdate(update) {
    this.flush(); // finished episodes belong to the old version
    const version = toSafeInt(update.version, 'AgentUpdate.version');
    try {
      if (update.pickled_policy?.length) {
        throw new PermissionDeniedError('pickled policies are not enabled on this worker (Node workers never unpickle); send a policy spec and params');
      }
      this.runner.setAgent({
        version,
        policy: update.policy ? { name: update.policy.name, kwargsJson: update.policy.kwargs_json } : null,
        params: decodeTensorMap(update.params, 'AgentUpdate.params'),
      });
    } catch (error) {
      const refused =
        error instanceof PolicyError || error instanceof PermissionDeniedError
          ? error
          : new PolicyError(`agent version ${version} refused: ${error instanceof Error ? error.message : error}`, { cause: error });
      this.config.log('warning', `agent update ${version} refused: ${refused.message}`);
      this.sendError(refused, 0, { agent_version: String(version) });
      return;
    }
    this.book.dropStale({ agentVersion: version });
    this.send({ agent_ready: { version } });
  }

  /** @param {any} task */
  onTask(task) {
    if (this.leaving) {
      return; // sent before our Leaving arrived; the coordinator re-assigns it
    }
    const taskId = toSafeInt(task.task_id, 'Task.task_id');
    const generation = toSafeInt(task.env_generation, 'Task.env_generation');
    const version = toSafeInt(task.agent_version, 'Task.agent_version');
    let problem = null;
    if (generation !== this.generation) {
      problem = `env generation ${generation}, this worker has ${this.generation}`;
    } else if (version !== -1 && version !== this.runner.agentVersion) {
      problem = `agent version ${version}, this worker has ${this.runner.agentVersion}`;
    } else if (![SampleMode.SAMPLE_MODE_STEPS, SampleMode.SAMPLE_MODE_EPISODES, SampleMode.SAMPLE_MODE_FRAGMENTS].includes(task.mode)) {
      problem = `unknown sample mode ${task.mode}`;
    } else if (task.mode === SampleMode.SAMPLE_MODE_FRAGMENTS && task.fragment_length < 1) {
      problem = 'a FRAGMENTS task needs fragment_length >= 1';
    }
    const { units, unreadable } = readTaskUnits(task);
    problem = unreadable || problem;
    if (problem !== null) {
      this.sendError(new ProtocolError(`task ${taskId} asks for ${problem}`), taskId);
      return;
    }
    this.book.add(task, units);
  }

  /**
   * Reports an error that stops the running request and drops its tasks:
   * a policy error concerns every task, an env error the running request.
   *
   * @param {unknown} error
   */
  onTaskError(error) {
    const taskIds = error instanceof PolicyError ? this.book.allTaskIds() : this.book.runningRequest();
    this.config.log('warning', `task error: ${error instanceof Error ? error.message.split('\n')[0] : error}`);
    this.book.drop(taskIds);
    for (const taskId of [...taskIds].sort((a, b) => a - b)) {
      this.sendError(error, taskId);
    }
    if (taskIds.length === 0) {
      this.sendError(error);
    }
  }

  // -------------------------------------------------- messages to the coordinator

  /** Sends every finished episode, one result per task. */
  flush() {
    this.oldestFinished = null;
    if (this.runner.finished.length === 0) {
      return;
    }
    for (const taskId of [...this.book.episodeTasks.keys()]) {
      const segments = this.runner.takeFinished(taskId);
      if (segments.length > 0) {
        this.sendResult(taskId, segments);
      }
    }
    this.runner.dropFinished(); // of tasks cancelled meanwhile
  }

  /**
   * Sends segments as one EpisodeResult, chunked below the message limit.
   *
   * @param {number} taskId
   * @param {import('../batch.js').Segment[]} segments
   */
  sendResult(taskId, segments) {
    const spec = /** @type {import('../spaces.js').EnvSpec} */ (this.runner.envSpec);
    const observationSpace = /** @type {{shape: number[], dtype: string}} */ (spec.observationSpace);
    const payload = batchCodec.serialize(buildEpisodeBatch(segments, observationSpace));
    const indices = segments.map((s) => Number(s.infos.episode_index));
    const meta = {
      task_id: taskId,
      episode_indices: indices,
      lengths: segments.map((s) => s.rewards.length),
      // Updates are applied only after a flush, so one version made them all.
      agent_version: Number(segments[0].infos.agent_version),
      env_generation: this.generation,
    };
    const maxBytes = Math.min(
      DEFAULT_CHUNK_BYTES,
      this.maxMessageBytes - resultCodec.serialize(meta).length - ENVELOPE_ALLOWANCE,
    );
    const chunks = chunkPayload(payload, { kind: PayloadKind.PAYLOAD_KIND_EPISODE_BATCH, maxBytes, batchId: this.nextBatchId });
    this.nextBatchId += 1;
    chunks.forEach((chunk, i) => {
      const envelope = i === 0 ? meta : { task_id: taskId };
      this.send({ result: { ...envelope, chunk } });
    });
    this.book.reported(taskId, indices);
  }

  /** @param {number} now */
  heartbeat(now) {
    const elapsed = (now - this.beatTime) / 1000;
    const steps = this.runner.stepsTotal;
    const rate = elapsed > 0 ? (steps - this.beatSteps) / elapsed : 0;
    this.beatTime = now;
    this.beatSteps = steps;
    this.nextBeat = now + this.heartbeatMs;
    this.send({
      heartbeat: {
        steps_total: steps,
        steps_per_second: rate,
        active_envs: this.runner.activeCount,
        queued_units: this.book.queuedUnits,
      },
    });
  }

  /**
   * Reports an error, naming the task or the update it belongs to (the
   * coordinator charges it to nothing else).
   *
   * @param {unknown} error
   * @param {number} [taskId]
   * @param {{ env_generation?: string, agent_version?: string }} [update] the refused update
   */
  sendError(error, taskId = 0, update = {}) {
    const known = error instanceof RlfleetError;
    /** @type {Record<string, unknown>} */
    const detail = {
      kind: ErrorKind[known ? error.kind : 'ERROR_KIND_INTERNAL'],
      message: error instanceof Error ? error.message : String(error),
      worker: this.name,
      task_id: taskId,
      traceback: (/** @type {any} */ (error)?.remoteTraceback ?? (error instanceof Error ? error.stack : '')) || '',
      exception_type: error instanceof Error ? error.name : typeof error,
    };
    const where = /** @type {any} */ (error);
    if (Number.isInteger(where?.envIndex)) {
      detail.env_index = where.envIndex;
    }
    if (Number.isInteger(where?.step)) {
      detail.step = where.step;
    }
    if (Number.isInteger(where?.episodeIndex)) {
      detail.episode_index = where.episodeIndex;
    }
    Object.assign(detail, update);
    this.send({ error: { detail } });
  }

  /** @param {object} message A plain WorkerMessage. */
  send(message) {
    this.stream.send(message);
  }

  // ----------------------------------------------------------------- leaving

  /**
   * Stops taking work; episodes in flight finish, unstarted units are dropped.
   *
   * @param {string} reason
   * @param {boolean} tell Send Leaving (the worker's own decision).
   */
  startLeaving(reason, tell) {
    this.leaving = true;
    if (tell) {
      this.send({ leaving: { reason } });
    }
    this.book.dropUnstarted();
    this.config.log('info', `leaving (${reason || 'drain'}): finishing ${this.runner.activeCount} episodes in flight`);
  }

  /** @returns {Promise<string>} Ends the stream after the last result was queued. */
  async close() {
    await this.stream.waitWritable();
    this.stream.closeSend();
    if (!(await this.stream.waitClosed(this.config.leaveGraceSeconds * 1000))) {
      this.stream.cancel();
    }
    this.endReason = 'drained by the coordinator';
    return this.worker.leaving ? Outcome.LEFT : Outcome.DRAINED;
  }

  /**
   * @param {import('./connection.js').StreamEnded} ended
   * @returns {string}
   */
  ended(ended) {
    this.endReason = `${grpc.status[ended.code]}: ${ended.details}`;
    if (this.leaving) {
      return this.worker.leaving ? Outcome.LEFT : Outcome.DRAINED;
    }
    return this.worker.leaving ? Outcome.LEFT : Outcome.LOST;
  }
}

/**
 * @param {string} text JSON object text ("" means {}).
 * @param {string} where
 * @param {typeof RlfleetError} ErrorClass
 * @returns {Record<string, unknown>}
 */
function parseJsonObject(text, where, ErrorClass) {
  if (!text) {
    return {};
  }
  let value;
  try {
    value = JSON.parse(text);
  } catch (error) {
    throw new ErrorClass(`${where} is not valid JSON (${error}): ${text.slice(0, 200)}`);
  }
  if (value === null || typeof value !== 'object' || Array.isArray(value)) {
    throw new ErrorClass(`${where} must be a JSON object, got ${text.slice(0, 200)}`);
  }
  return value;
}
