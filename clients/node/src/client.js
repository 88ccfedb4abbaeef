/**
 * RlfleetClient: a learner's handle on a coordinator (learner.proto), the
 * Node counterpart of rlfleet.client.RemoteSampler.
 *
 *     const client = new RlfleetClient('127.0.0.1:50051');
 *     await client.updateEnv({ envId: 'rlfleet/CartPoleJS-v0' });
 *     const batch = await client.sample({ mode: 'episodes', amount: 8, seed: 0 });
 *     batch.observations.data;   // Float32Array, shape batch.observations.shape
 *     client.close();
 *
 * Every call has a deadline (timeoutSeconds) and fails with rlfleet's
 * typed errors (./errors.js), never a raw gRPC status.
 *
 * @module
 */
import grpc from '@grpc/grpc-js';

import { decodeEpisodeBatch, selectEpisodes } from './batch.js';
import { ChunkAssembler } from './chunks.js';
import { ConfigError, ProtocolError, UnavailableError } from './errors.js';
import { toSafeInt } from './int64.js';
import { SampleMode, messageType, services } from './proto.js';
import { decodeEnvSpec } from './spaces.js';
import { encodeTensorMap, isTensor, tensor } from './tensor.js';
import { errorFromStatus } from './status.js';

/** @typedef {import('./batch.js').EpisodeBatch} EpisodeBatch */
/** @typedef {import('./tensor.js').Tensor} Tensor */

const batchCodec = messageType('EpisodeBatch');

/** Sample modes by name. */
export const MODES = Object.freeze({
  steps: SampleMode.SAMPLE_MODE_STEPS,
  episodes: SampleMode.SAMPLE_MODE_EPISODES,
  fragments: SampleMode.SAMPLE_MODE_FRAGMENTS,
});

/** Keys of episode_infos that order fragments, most significant first. */
const FRAGMENT_ORDER = ['stream', 'episode_index', 'fragment_index'];

/**
 * An agent update: a policy spec, parameters, or both.
 *
 * @typedef {object} AgentUpdate
 * @property {{name: string, kwargs?: Record<string, unknown>}} [policy]
 * @property {Record<string, Tensor | {dtype: string, shape: number[], data: ArrayLike<number>}>} [params]
 */

/**
 * An env update.
 *
 * @typedef {object} EnvUpdate
 * @property {string} envId A registered id, e.g. "rlfleet/CartPoleJS-v0".
 * @property {Record<string, unknown>} [kwargs]
 * @property {number} [maxEpisodeLength]
 */

/**
 * What sample() resolves to: one EpisodeBatch plus the answer's context.
 *
 * @typedef {EpisodeBatch & {
 *   mode: string, requestId: number, agentVersion: number, envGeneration: number,
 *   envSpec: import('./spaces.js').EnvSpec | null, numEpisodes: number, totalSteps: number,
 *   footer: {numEpisodes: number, totalSteps: number, workersUsed: number, reassignedUnits: number}
 * }} SampleBatch
 */

/**
 * @param {AgentUpdate} update
 * @returns {object} A plain rlfleet.v1.AgentUpdate.
 */
export function agentUpdateMessage(update) {
  if (!update || (!update.policy && !update.params)) {
    throw new ConfigError('an agent update needs a policy spec, parameters, or both');
  }
  /** @type {Record<string, unknown>} */
  const message = {};
  if (update.policy) {
    if (typeof update.policy.name !== 'string' || update.policy.name.length === 0) {
      throw new ConfigError(`policy.name must be a non-empty string, got ${JSON.stringify(update.policy.name)}`);
    }
    message.policy = { name: update.policy.name, kwargs_json: JSON.stringify(update.policy.kwargs ?? {}) };
  }
  if (update.params) {
    /** @type {import('./tensor.js').TensorTree} */
    const params = {};
    for (const [name, value] of Object.entries(update.params)) {
      params[name] = isTensor(value) ? value : tensor(value.dtype, value.shape, value.data);
    }
    message.params = encodeTensorMap(params, 'AgentUpdate.params');
  }
  return message;
}

/**
 * @param {EnvUpdate} update
 * @returns {object} A plain rlfleet.v1.EnvUpdate.
 */
export function envUpdateMessage(update) {
  if (!update || typeof update.envId !== 'string' || update.envId.length === 0) {
    throw new ConfigError('an env update needs envId, e.g. {envId: "rlfleet/CartPoleJS-v0"}');
  }
  /** @type {Record<string, unknown>} */
  const message = { env_id: update.envId, kwargs_json: JSON.stringify(update.kwargs ?? {}) };
  if (update.maxEpisodeLength !== undefined) {
    if (!Number.isSafeInteger(update.maxEpisodeLength) || update.maxEpisodeLength < 1) {
      throw new ConfigError(`maxEpisodeLength must be an integer >= 1, got ${update.maxEpisodeLength}`);
    }
    message.max_episode_length = update.maxEpisodeLength;
  }
  return message;
}

export class RlfleetClient {
  /**
   * @param {string} address HOST:PORT of the coordinator.
   * @param {{token?: string, credentials?: grpc.ChannelCredentials, timeoutSeconds?: number,
   *          waitForWorkersSeconds?: number, maxMessageBytes?: number}} [options]
   *   timeoutSeconds: deadline of every call (default 600).
   */
  constructor(address, { token, credentials, timeoutSeconds = 600, waitForWorkersSeconds, maxMessageBytes = 64 * 1024 * 1024 } = {}) {
    if (!(timeoutSeconds > 0)) {
      throw new ConfigError(`timeoutSeconds must be > 0, got ${timeoutSeconds}`);
    }
    this.address = address;
    this.timeoutSeconds = timeoutSeconds;
    this.waitForWorkersSeconds = waitForWorkersSeconds;
    this.metadata = new grpc.Metadata();
    if (token) {
      this.metadata.set('authorization', `Bearer ${token}`);
    }
    /** @type {any} */
    this.stub = new services.LearnerService(address, credentials ?? grpc.credentials.createInsecure(), {
      'grpc.max_send_message_length': maxMessageBytes,
      'grpc.max_receive_message_length': maxMessageBytes,
    });
  }

  /**
   * @param {number | undefined} timeoutSeconds
   * @returns {{deadline: Date}}
   */
  callOptions(timeoutSeconds) {
    return { deadline: new Date(Date.now() + 1000 * (timeoutSeconds ?? this.timeoutSeconds)) };
  }

  /**
   * Samples on the fleet (learner.proto Sample).
   *
   * @param {{mode?: 'steps' | 'episodes' | 'fragments', amount: number, fragmentLength?: number,
   *          seed?: number | bigint, requestIndex?: number, agentUpdate?: AgentUpdate,
   *          envUpdate?: EnvUpdate, itr?: number, waitForWorkersSeconds?: number,
   *          timeoutSeconds?: number}} request
   *   amount: steps (steps, fragments) or episodes (episodes), >= 1.
   * @returns {Promise<SampleBatch>} steps/episodes: episodes 0..numEpisodes-1 in
   *   index order; fragments: every fragment, by (stream, episode, fragment).
   */
  async sample({
    mode = 'episodes',
    amount,
    fragmentLength = 0,
    seed,
    requestIndex = 0,
    agentUpdate,
    envUpdate,
    itr = 0,
    waitForWorkersSeconds,
    timeoutSeconds,
  }) {
    if (!Object.hasOwn(MODES, mode)) {
      throw new ConfigError(`mode must be one of ${Object.keys(MODES).join(', ')}, got ${JSON.stringify(mode)}`);
    }
    if (!Number.isSafeInteger(amount) || amount < 1) {
      throw new ConfigError(`amount must be an integer >= 1, got ${amount}`);
    }
    if (mode === 'fragments' && !(Number.isSafeInteger(fragmentLength) && fragmentLength >= 1)) {
      throw new ConfigError(`fragments need fragmentLength >= 1, got ${fragmentLength}`);
    }
    /** @type {Record<string, unknown>} */
    const request = { mode: MODES[mode], amount, fragment_length: fragmentLength, request_index: requestIndex, itr };
    if (seed !== undefined) {
      request.seed = typeof seed === 'bigint' ? seed.toString() : seed;
    }
    if (agentUpdate) {
      request.agent_update = agentUpdateMessage(agentUpdate);
    }
    if (envUpdate) {
      request.env_update = envUpdateMessage(envUpdate);
    }
    const wait = waitForWorkersSeconds ?? this.waitForWorkersSeconds;
    if (wait !== undefined) {
      request.wait_for_workers_seconds = wait;
    }
    const what = `Sample on coordinator ${this.address}`;
    const timeout = timeoutSeconds ?? this.timeoutSeconds;
    const answer = await this.collect(this.stub.Sample(request, this.metadata, this.callOptions(timeout)), what, timeout);
    return assemble(answer, mode);
  }

  /**
   * @param {any} call A grpc-js server stream of SampleResponse.
   * @param {string} what
   * @param {number} timeout
   * @returns {Promise<{header: any, footer: any, results: Array<{meta: any, batch: EpisodeBatch}>}>}
   */
  collect(call, what, timeout) {
    return new Promise((resolve, reject) => {
      /** @type {Map<string, ChunkAssembler>} */
      const assemblers = new Map();
      /** @type {Map<string, any>} */
      const metas = new Map();
      /** @type {Array<{meta: any, batch: EpisodeBatch}>} */
      const results = [];
      let header = null;
      let footer = null;
      let lastKey = '0';
      /** @param {Error} error */
      const fail = (error) => {
        call.cancel();
        reject(error);
      };
      call.on('data', (/** @type {any} */ message) => {
        try {
          if (message.body === 'header') {
            header = message.header;
          } else if (message.body === 'result') {
            const meta = message.result;
            const chunk = meta.chunk;
            if (!chunk) {
              throw new ProtocolError(`${what}: a result without a batch chunk`);
            }
            // Chunks of one worker's batch are contiguous; other workers' may
            // interleave, so assemble per worker id (carried on chunk 0 at least).
            const key = chunk.index === 0 || meta.worker_id !== '0' ? meta.worker_id : lastKey;
            lastKey = key;
            if (chunk.index === 0) {
              metas.set(key, meta);
            }
            let assembler = assemblers.get(key);
            if (!assembler) {
              assembler = new ChunkAssembler();
              assemblers.set(key, assembler);
            }
            const done = assembler.add(chunk);
            if (done) {
              const first = metas.get(key);
              metas.delete(key);
              const batch = decodeEpisodeBatch(batchCodec.deserialize(done.payload));
              const lengths = Array.from(batch.lengths.data, Number);
              if (lengths.join() !== first.lengths.map(Number).join()) {
                throw new ProtocolError(`${what}: result of task ${first.task_id}: metadata lengths disagree with its batch`);
              }
              results.push({ meta: first, batch });
            }
          } else if (message.body === 'footer') {
            if (header === null) {
              throw new ProtocolError(`${what}: a footer came before any header`);
            }
            footer = message.footer;
          }
        } catch (error) {
          fail(/** @type {Error} */ (error));
        }
      });
      call.on('error', (/** @type {any} */ error) => reject(errorFromStatus(error, what, timeout)));
      call.on('end', () => {
        if (footer === null) {
          reject(new UnavailableError(`${what}: the answer ended before its footer (the coordinator went away?); retry`));
        } else {
          resolve({ header, footer, results });
        }
      });
    });
  }

  /**
   * Pushes a new agent version to every worker (learner.proto UpdateAgent).
   *
   * @param {AgentUpdate} update
   * @param {{timeoutSeconds?: number}} [options]
   * @returns {Promise<{agentVersion: number, envGeneration: number, workersUpdated: number}>}
   */
  async updateAgent(update, { timeoutSeconds } = {}) {
    return ackOf(await this.unary('UpdateAgent', agentUpdateMessage(update), timeoutSeconds));
  }

  /**
   * Switches every worker to a new env (learner.proto UpdateEnv).
   *
   * @param {EnvUpdate} update
   * @param {{timeoutSeconds?: number}} [options]
   * @returns {Promise<{agentVersion: number, envGeneration: number, workersUpdated: number}>}
   */
  async updateEnv(update, { timeoutSeconds } = {}) {
    return ackOf(await this.unary('UpdateEnv', envUpdateMessage(update), timeoutSeconds));
  }

  /**
   * The fleet's state (learner.proto GetStatus), as the decoded message:
   * snake_case fields, 64-bit integers as decimal strings, plus `envSpec`.
   *
   * @param {{timeoutSeconds?: number}} [options]
   * @returns {Promise<any>}
   */
  async status({ timeoutSeconds } = {}) {
    const status = await this.unary('GetStatus', {}, timeoutSeconds);
    return { ...status, envSpec: status.env_spec ? decodeEnvSpec(status.env_spec) : null };
  }

  /**
   * @param {string} method
   * @param {object} request
   * @param {number | undefined} timeoutSeconds
   * @returns {Promise<any>}
   */
  unary(method, request, timeoutSeconds) {
    const timeout = timeoutSeconds ?? this.timeoutSeconds;
    const what = `${method} on coordinator ${this.address}`;
    return new Promise((resolve, reject) => {
      this.stub[method](request, this.metadata, this.callOptions(timeout), (/** @type {any} */ error, /** @type {any} */ reply) => {
        if (error) {
          reject(errorFromStatus(error, what, timeout));
        } else {
          resolve(reply);
        }
      });
    });
  }

  /** Closes the channel. */
  close() {
    this.stub.close();
  }
}

/**
 * @param {any} ack A decoded UpdateAck.
 * @returns {{agentVersion: number, envGeneration: number, workersUpdated: number}}
 */
function ackOf(ack) {
  return {
    agentVersion: toSafeInt(ack.agent_version, 'UpdateAck.agent_version'),
    envGeneration: toSafeInt(ack.env_generation, 'UpdateAck.env_generation'),
    workersUpdated: ack.workers_updated,
  };
}

/**
 * Integer episode_infos column of a batch.
 *
 * @param {EpisodeBatch} batch
 * @param {string} key
 * @returns {number[]}
 */
function infoColumn(batch, key) {
  const value = batch.episodeInfos[key];
  if (!isTensor(value) || value.shape.length !== 1) {
    throw new ProtocolError(`a result's episode_infos lack the (N,) array ${JSON.stringify(key)} the contract requires (batch.proto)`);
  }
  return Array.from(/** @type {ArrayLike<number | bigint>} */ (value.data), Number);
}

/**
 * Orders and filters the results of an answer into one batch.
 *
 * @param {{header: any, footer: any, results: Array<{meta: any, batch: EpisodeBatch}>}} answer
 * @param {string} mode
 * @returns {SampleBatch}
 */
function assemble({ header, footer, results }, mode) {
  const numEpisodes = toSafeInt(footer.num_episodes, 'SampleFooter.num_episodes');
  if (results.length === 0) {
    throw new ProtocolError("the coordinator's answer holds no results");
  }
  const batches = results.map((r) => r.batch);
  /** @type {Array<{at: [number, number], key: number[]}>} */
  const episodes = [];
  const keys = mode === 'fragments' ? FRAGMENT_ORDER : ['episode_index'];
  batches.forEach((batch, b) => {
    const columns = keys.map((key) => infoColumn(batch, key));
    for (let e = 0; e < columns[0].length; e += 1) {
      episodes.push({ at: [b, e], key: columns.map((column) => column[e]) });
    }
  });
  let kept = episodes;
  if (mode !== 'fragments') {
    kept = episodes.filter((episode) => episode.key[0] < numEpisodes);
    kept.sort((a, b) => a.key[0] - b.key[0]);
    const ok = kept.length === numEpisodes && kept.every((episode, i) => episode.key[0] === i);
    if (!ok) {
      throw new ProtocolError(
        `the coordinator's answer should hold episodes 0..${numEpisodes - 1} once each; got [${kept
          .slice(0, 20)
          .map((e) => e.key[0])}]`,
      );
    }
  } else {
    kept.sort((a, b) => a.key[0] - b.key[0] || a.key[1] - b.key[1] || a.key[2] - b.key[2]);
  }
  const batch = selectEpisodes(
    batches,
    kept.map((episode) => episode.at),
  );
  return {
    ...batch,
    mode,
    requestId: toSafeInt(header.request_id, 'SampleHeader.request_id'),
    agentVersion: toSafeInt(header.agent_version, 'SampleHeader.agent_version'),
    envGeneration: toSafeInt(header.env_generation, 'SampleHeader.env_generation'),
    envSpec: header.env_spec ? decodeEnvSpec(header.env_spec) : null,
    numEpisodes: kept.length,
    totalSteps: batch.rewards.shape[0],
    footer: {
      numEpisodes,
      totalSteps: toSafeInt(footer.total_steps, 'SampleFooter.total_steps'),
      workersUsed: footer.workers_used,
      reassignedUnits: footer.reassigned_units,
    },
  };
}


