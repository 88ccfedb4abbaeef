#!/usr/bin/env node
/**
 * rlfleet-node-worker: joins an rlfleet coordinator as a worker running the
 * Node envs (rlfleet/CartPoleJS-v0) with the built-in policies.
 *
 *   rlfleet-node-worker --coordinator HOST:PORT [--envs K] [--name NAME]
 *
 * Exits 0 after SIGTERM/SIGINT (leaving gracefully), 1 when the coordinator
 * refuses the worker for good (protocol version, credentials), 2 on bad
 * arguments.
 */
import { readFileSync } from 'node:fs';
import os from 'node:os';
import { parseArgs } from 'node:util';

import grpc from '@grpc/grpc-js';

import { RemoteWorker } from '../src/worker/remote.js';

const USAGE = `usage: rlfleet-node-worker --coordinator HOST:PORT [options]

options:
  --coordinator HOST:PORT   the coordinator's worker address (required)
  --envs K                  env slots stepped together (default 1)
  --name NAME               worker name (default $RLFLEET_WORKER_NAME, $POD_NAME or the host name)
  --token TOKEN             bearer token (default $RLFLEET_WORKER_TOKEN)
  --tls-ca FILE             dial with TLS, trusting this CA bundle
  --tls-cert FILE           client certificate for mutual TLS (with --tls-key)
  --tls-key FILE            client private key for mutual TLS
  --heartbeat-interval S    seconds between heartbeats (default: the coordinator's)
  --reconnect-max S         cap of the reconnect backoff (default 10)
  --quiet                   log warnings and errors only
  -h, --help                show this help`;

/** @param {string} message */
function usageError(message) {
  process.stderr.write(`rlfleet-node-worker: ${message}\n\n${USAGE}\n`);
  process.exit(2);
}

/**
 * @param {string | undefined} text
 * @param {string} flag
 * @param {(x: number) => boolean} ok
 * @returns {number | undefined}
 */
function number(text, flag, ok) {
  if (text === undefined) {
    return undefined;
  }
  const value = Number(text);
  if (!Number.isFinite(value) || !ok(value)) {
    usageError(`${flag} got ${JSON.stringify(text)}`);
  }
  return value;
}

let parsed;
try {
  parsed = parseArgs({
    options: {
      coordinator: { type: 'string' },
      envs: { type: 'string', default: '1' },
      name: { type: 'string' },
      token: { type: 'string' },
      'tls-ca': { type: 'string' },
      'tls-cert': { type: 'string' },
      'tls-key': { type: 'string' },
      'heartbeat-interval': { type: 'string' },
      'reconnect-max': { type: 'string' },
      quiet: { type: 'boolean', default: false },
      help: { type: 'boolean', short: 'h', default: false },
    },
    strict: true,
  });
} catch (error) {
  usageError(error instanceof Error ? error.message : String(error));
}
const { values } = /** @type {NonNullable<typeof parsed>} */ (parsed);
if (values.help) {
  process.stdout.write(`${USAGE}\n`);
  process.exit(0);
}
if (!values.coordinator) {
  usageError('--coordinator HOST:PORT is required');
}
const envs = /** @type {number} */ (number(values.envs, '--envs (a positive integer)', (x) => Number.isInteger(x) && x >= 1));
if (Boolean(values['tls-cert']) !== Boolean(values['tls-key'])) {
  usageError('--tls-cert and --tls-key go together');
}
/** @param {string | undefined} file */
const read = (file) => (file ? readFileSync(file) : null);
const credentials = values['tls-ca']
  ? grpc.credentials.createSsl(read(values['tls-ca']), read(values['tls-key']), read(values['tls-cert']))
  : undefined;

const quiet = values.quiet;
const worker = new RemoteWorker({
  coordinator: /** @type {string} */ (values.coordinator),
  envs,
  name: values.name || process.env.RLFLEET_WORKER_NAME || process.env.POD_NAME || os.hostname(),
  token: values.token || process.env.RLFLEET_WORKER_TOKEN || undefined,
  credentials,
  heartbeatIntervalSeconds: number(values['heartbeat-interval'], '--heartbeat-interval (seconds > 0)', (x) => x > 0),
  reconnectMaxSeconds: number(values['reconnect-max'], '--reconnect-max (seconds > 0)', (x) => x > 0) ?? 10,
  log: (level, message) => {
    if (!quiet || level === 'warning' || level === 'error') {
      process.stderr.write(`${new Date().toISOString()} ${level.toUpperCase()} rlfleet-node-worker: ${message}\n`);
    }
  },
});

let signals = 0;
for (const signal of /** @type {const} */ (['SIGTERM', 'SIGINT'])) {
  process.on(signal, () => {
    signals += 1;
    if (signals > 1) {
      process.exit(1); // a second signal: stop now
    }
    worker.requestLeave(signal);
  });
}

process.exitCode = await worker.run();
