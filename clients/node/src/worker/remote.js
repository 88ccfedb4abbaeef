/**
 * The remote worker: a VecRunner driven by a coordinator over one Join
 * stream, with the life cycle of worker.proto and the behaviour of the
 * Python reference (rlfleet/worker/remote.py):
 *
 *   Hello -> Welcome; EnvUpdate -> EnvReady | WorkerError;
 *   AgentUpdate -> AgentReady | WorkerError; Task -> EpisodeResult...;
 *   Cancel; Drain or SIGTERM -> finish episodes in flight, send them,
 *   close the stream. A broken stream is rejoined with exponential backoff
 *   and full jitter, as a new worker with fresh envs and policy.
 *
 * This module is the process's life: connect, rejoin with backoff, leave.
 * One joined stream's work is ./session.js's.
 *
 * @module
 */
import os from 'node:os';

import grpc from '@grpc/grpc-js';

import { ConfigError } from '../errors.js';
import { PROTOCOL_VERSION, services } from '../proto.js';
import { JoinStream } from './connection.js';
import { Outcome, Session } from './session.js';
import { UNIT_COLUMNS_CAPABILITY } from './units.js';

// No "rlfleet.leases": this worker hosts no step-level env leases, so
// coordinators place none on it (protos/rlfleet/v1/leases.proto).
export const CAPABILITIES = Object.freeze(['rlfleet.episodes', 'rlfleet.fragments', UNIT_COLUMNS_CAPABILITY]);
export const IMPLEMENTATION = 'rlfleet-node/0.1.0';

/** Statuses at the handshake that retrying cannot fix: the worker exits 1. */
const FATAL_AT_HANDSHAKE = new Map([
  [grpc.status.FAILED_PRECONDITION, 'protocol version mismatch'],
  [grpc.status.UNAUTHENTICATED, 'not authenticated'],
  [grpc.status.PERMISSION_DENIED, 'permission denied'],
  [grpc.status.UNIMPLEMENTED, 'the address is not an rlfleet coordinator'],
]);

/**
 * @typedef {object} WorkerConfig
 * @property {string} coordinator HOST:PORT.
 * @property {number} [envs] Env slots stepped together (K), default 1.
 * @property {string} [name] The worker's name (made unique by the coordinator).
 * @property {string} [token] Bearer token sent as `authorization` metadata.
 * @property {grpc.ChannelCredentials} [credentials] Default: insecure.
 * @property {number} [heartbeatIntervalSeconds] Default: Welcome's.
 * @property {number} [reconnectBaseSeconds] First backoff step, default 0.1.
 * @property {number} [reconnectMaxSeconds] Backoff cap, default 10.
 * @property {number} [handshakeTimeoutSeconds] Wait for Welcome, default 30.
 * @property {number} [flushSteps] Send finished episodes once they hold this many steps...
 * @property {number} [flushSeconds] ...or the oldest waited this long (default 4096, 0.02).
 * @property {number} [maxMessageBytes] Largest message sent or accepted, default 64 MiB.
 * @property {number} [leaveGraceSeconds] After the last result, how long to wait for the close.
 * @property {(level: string, message: string) => void} [log]
 */

class HandshakeFailed extends Error {
  /**
   * @param {string} message
   * @param {boolean} fatal
   */
  constructor(message, fatal) {
    super(message);
    this.fatal = fatal;
  }
}

/** A worker process's life: connect, work, reconnect, leave. */
export class RemoteWorker {
  /** @param {WorkerConfig} config */
  constructor(config) {
    const match = /^(.+):(\d+)$/.exec(config.coordinator ?? '');
    if (!match) {
      throw new ConfigError(`coordinator address ${JSON.stringify(config.coordinator)} must be HOST:PORT, e.g. 127.0.0.1:50051`);
    }
    const envs = config.envs ?? 1;
    if (!Number.isSafeInteger(envs) || envs < 1) {
      throw new ConfigError(`--envs must be a positive integer, got ${config.envs}`);
    }
    this.config = {
      envs,
      name: os.hostname(),
      reconnectBaseSeconds: 0.1,
      reconnectMaxSeconds: 10,
      handshakeTimeoutSeconds: 30,
      flushSteps: 4096,
      flushSeconds: 0.02,
      maxMessageBytes: 64 * 1024 * 1024,
      leaveGraceSeconds: 5,
      log: defaultLog,
      ...config,
    };
    this.leaveReason = '';
    this.leaving = false;
    /** @type {JoinStream | null} */
    this.stream = null;
    /** @type {(() => void) | null} */
    this.cancelSleep = null;
  }

  /**
   * Makes the worker leave gracefully (SIGTERM): it says Leaving, finishes
   * the episodes it runs, sends them and run() resolves 0.
   *
   * @param {string} [reason]
   */
  requestLeave(reason = 'asked to leave') {
    this.leaveReason = reason;
    this.leaving = true;
    this.stream?.push({ wakeup: true });
    this.cancelSleep?.();
  }

  /**
   * Works until asked to leave.
   *
   * @returns {Promise<number>} The exit code: 0 after leaving, 1 if the
   *   coordinator refused the worker for a reason retrying cannot fix.
   */
  async run() {
    const { config } = this;
    const client = new services.WorkerService(config.coordinator, config.credentials ?? grpc.credentials.createInsecure(), {
      'grpc.max_send_message_length': config.maxMessageBytes,
      'grpc.max_receive_message_length': config.maxMessageBytes,
      'grpc.keepalive_time_ms': 10000,
      'grpc.keepalive_timeout_ms': 5000,
      'grpc.keepalive_permit_without_calls': 1,
    });
    let attempt = 0;
    try {
      while (!this.leaving) {
        let session;
        try {
          session = await this.connect(client);
        } catch (error) {
          if (!(error instanceof HandshakeFailed)) {
            throw error;
          }
          if (error.fatal) {
            config.log('error', `coordinator ${config.coordinator} refused this worker: ${error.message}`);
            return 1;
          }
          attempt += 1;
          await this.backoff(attempt, error.message);
          continue;
        }
        attempt = 0;
        const outcome = await session.run();
        this.stream = null;
        if (outcome === Outcome.LEFT) {
          break;
        }
        attempt += 1;
        await this.backoff(attempt, session.endReason);
      }
    } finally {
      client.close();
    }
    config.log('info', `worker ${config.name} left: ${this.leaveReason || 'done'}`);
    return 0;
  }

  /**
   * Sleeps before reconnecting: exponential backoff with full jitter.
   *
   * @param {number} attempt
   * @param {string} why
   */
  async backoff(attempt, why) {
    const { config } = this;
    const cap = Math.min(config.reconnectMaxSeconds, config.reconnectBaseSeconds * 2 ** (attempt - 1));
    const delay = Math.random() * cap;
    config.log(
      'warning',
      `connection to coordinator ${config.coordinator}: ${why}; reconnecting in ${delay.toFixed(2)} s (attempt ${attempt})`,
    );
    await new Promise((resolve) => {
      const timer = setTimeout(resolve, delay * 1000);
      this.cancelSleep = () => {
        clearTimeout(timer);
        resolve(undefined);
      };
    });
    this.cancelSleep = null;
  }

  /**
   * Opens a Join stream and completes the handshake.
   *
   * @param {grpc.Client} client
   * @returns {Promise<Session>}
   * @throws {HandshakeFailed}
   */
  async connect(client) {
    const { config } = this;
    const metadata = new grpc.Metadata();
    if (config.token) {
      metadata.set('authorization', `Bearer ${config.token}`);
    }
    const stream = new JoinStream(client, metadata);
    this.stream = stream;
    stream.send({
      hello: {
        protocol_version: PROTOCOL_VERSION,
        capabilities: [...CAPABILITIES],
        num_envs: config.envs,
        name: config.name,
        host: os.hostname(),
        pid: process.pid,
        implementation: IMPLEMENTATION,
      },
    });
    const deadline = Date.now() + config.handshakeTimeoutSeconds * 1000;
    for (;;) {
      const message = await stream.next(deadline - Date.now());
      if (message === null) {
        stream.cancel();
        throw new HandshakeFailed(`no Welcome within ${config.handshakeTimeoutSeconds} seconds of Hello`, false);
      }
      if (message.ended) {
        const reason = FATAL_AT_HANDSHAKE.get(message.code);
        const text = `${grpc.status[message.code]}: ${message.details}`;
        throw new HandshakeFailed(reason ? `${reason}: ${text}` : text, reason !== undefined);
      }
      if (message.wakeup) {
        if (this.leaving) {
          stream.cancel();
          throw new HandshakeFailed('left before joining', false);
        }
        continue;
      }
      if (message.body !== 'welcome') {
        stream.cancel();
        throw new HandshakeFailed(`the coordinator sent ${message.body} before Welcome`, false);
      }
      return new Session(this, stream, message.welcome);
    }
  }
}

/**
 * @param {string} level
 * @param {string} message
 */
function defaultLog(level, message) {
  process.stderr.write(`${new Date().toISOString()} ${level.toUpperCase()} rlfleet-node: ${message}\n`);
}
