/**
 * The rlfleet v1 contract, loaded from protos/rlfleet/v1 at run time.
 *
 * No generated code: @grpc/proto-loader reads the .proto files that the
 * Python side is generated from, so both sides always speak the same
 * contract. Loader options, and why:
 *   keepCase  field names exactly as in the .proto files (snake_case);
 *   longs     String: int64/uint64 arrive as decimal strings, converted
 *             explicitly by ./int64.js (a Number silently loses bits past
 *             2**53, which a seed or id may need);
 *   enums     Number: compared against the tables below;
 *   defaults  scalars and repeated fields are always present;
 *   oneofs    a virtual field names the member set (`body: 'hello'`), and
 *             proto3 `optional` fields are simply absent when unset.
 * Bytes fields are Buffers.
 *
 * @module
 */
import { existsSync } from 'node:fs';
import path from 'node:path';
import { fileURLToPath } from 'node:url';

import grpc from '@grpc/grpc-js';
import protoLoader from '@grpc/proto-loader';

const HERE = path.dirname(fileURLToPath(import.meta.url));

/** Where the .proto files are: $RLFLEET_PROTOS, else the repository's protos/. */
export function protosDir() {
  /** @type {string[]} */
  const candidates = [process.env.RLFLEET_PROTOS ?? '', path.resolve(HERE, '..', '..', '..', 'protos')].filter(
    (dir) => dir.length > 0,
  );
  for (const dir of candidates) {
    if (existsSync(path.join(dir, 'rlfleet', 'v1', 'worker.proto'))) {
      return dir;
    }
  }
  throw new Error(
    `cannot find rlfleet/v1/worker.proto under ${candidates.join(' or ')}; ` +
      'set RLFLEET_PROTOS to the directory holding rlfleet/v1/*.proto',
  );
}

export const LOADER_OPTIONS = Object.freeze({
  keepCase: true,
  longs: String,
  enums: Number,
  defaults: true,
  oneofs: true,
});

const definition = protoLoader.loadSync(['rlfleet/v1/worker.proto', 'rlfleet/v1/learner.proto'], {
  ...LOADER_OPTIONS,
  includeDirs: [protosDir()],
});
const loaded = /** @type {any} */ (grpc.loadPackageDefinition(definition));

/** Service client constructors (grpc-js), keyed by service name. */
export const services = {
  /** @type {typeof grpc.Client} */
  WorkerService: loaded.rlfleet.v1.WorkerService,
  /** @type {typeof grpc.Client} */
  LearnerService: loaded.rlfleet.v1.LearnerService,
};

/**
 * @typedef {object} MessageCodec
 * @property {(value: object) => Buffer} serialize Encodes a plain object.
 * @property {(bytes: Buffer) => any} deserialize Decodes to a plain object.
 */

/**
 * The codec of one message type of package rlfleet.v1.
 *
 * @param {string} name Message name without the package, e.g. "EpisodeBatch".
 * @returns {MessageCodec}
 */
export function messageType(name) {
  const entry = /** @type {any} */ (definition[`rlfleet.v1.${name}`]);
  if (!entry || typeof entry.serialize !== 'function') {
    throw new Error(`rlfleet.v1.${name} is not a message of the loaded protos`);
  }
  return { serialize: entry.serialize, deserialize: entry.deserialize };
}

/**
 * The values of one enum, name -> number, read from the .proto files.
 *
 * @param {string} name Enum name without the package, e.g. "DType".
 * @returns {Readonly<Record<string, number>>}
 */
function enumValues(name) {
  const entry = /** @type {any} */ (definition[`rlfleet.v1.${name}`]);
  if (!entry || !entry.type || !Array.isArray(entry.type.value)) {
    throw new Error(`rlfleet.v1.${name} is not an enum of the loaded protos`);
  }
  /** @type {Record<string, number>} */
  const values = {};
  for (const { name: key, number } of entry.type.value) {
    values[key] = number;
  }
  return Object.freeze(values);
}

export const DType = enumValues('DType');
export const Codec = enumValues('Codec');
export const StepType = enumValues('StepType');
export const PayloadKind = enumValues('PayloadKind');
export const ErrorKind = enumValues('ErrorKind');
export const SampleMode = enumValues('SampleMode');
export const ProtocolVersion = enumValues('ProtocolVersion');

/** The protocol version this package speaks (worker.proto ProtocolVersion). */
export const PROTOCOL_VERSION = ProtocolVersion.PROTOCOL_VERSION_1;
