/**
 * gRPC statuses of the learner face (learner.proto) as rlfleet errors.
 *
 * A coordinator may attach a serialized rlfleet.v1.ErrorDetail as
 * trailing metadata `rlfleet-error-bin`; when present, its kind picks the
 * error class and its worker, env index and step are kept on the error.
 *
 * @module
 */
import grpc from '@grpc/grpc-js';

import {
  AuthenticationError,
  ConfigError,
  EnvError,
  EnvNotFoundError,
  InvalidArgumentError,
  NoWorkersError,
  PermissionDeniedError,
  PolicyError,
  ProtocolError,
  ResourceExhaustedError,
  RlfleetError,
  RlfleetTimeoutError,
  UnavailableError,
  WorkerError,
} from './errors.js';
import { toSafeInt } from './int64.js';
import { ErrorKind, messageType } from './proto.js';

/** Trailing-metadata key of a serialized ErrorDetail. */
export const ERROR_DETAIL_KEY = 'rlfleet-error-bin';

const detailCodec = messageType('ErrorDetail');

/** @type {Map<number, typeof RlfleetError>} */
const BY_CODE = new Map([
  [grpc.status.INVALID_ARGUMENT, InvalidArgumentError],
  [grpc.status.FAILED_PRECONDITION, WorkerError],
  [grpc.status.UNAVAILABLE, UnavailableError],
  [grpc.status.CANCELLED, UnavailableError],
  [grpc.status.DEADLINE_EXCEEDED, RlfleetTimeoutError],
  [grpc.status.RESOURCE_EXHAUSTED, ResourceExhaustedError],
  [grpc.status.UNAUTHENTICATED, AuthenticationError],
  [grpc.status.PERMISSION_DENIED, PermissionDeniedError],
  [grpc.status.UNIMPLEMENTED, ProtocolError],
]);

/** @type {Map<number, typeof RlfleetError>} */
const BY_KIND = new Map([
  [ErrorKind.ERROR_KIND_ENV_NOT_FOUND, EnvNotFoundError],
  [ErrorKind.ERROR_KIND_ENV_CONFIG, ConfigError],
  [ErrorKind.ERROR_KIND_ENV_CRASHED, EnvError],
  [ErrorKind.ERROR_KIND_NONFINITE, EnvError],
  [ErrorKind.ERROR_KIND_POLICY, PolicyError],
  [ErrorKind.ERROR_KIND_PROTOCOL, ProtocolError],
  [ErrorKind.ERROR_KIND_VERSION, ProtocolError],
  [ErrorKind.ERROR_KIND_PERMISSION, PermissionDeniedError],
  [ErrorKind.ERROR_KIND_NO_WORKERS, NoWorkersError],
  [ErrorKind.ERROR_KIND_LIMIT, ResourceExhaustedError],
]);

/**
 * The rlfleet error for a failed call.
 *
 * @param {Partial<grpc.ServiceError> & {code?: number}} error What grpc-js gave.
 * @param {string} what What was being done, e.g. "Sample on coordinator 127.0.0.1:5".
 * @param {number} [timeoutSeconds] The call's deadline, named when it fired.
 * @returns {RlfleetError}
 */
export function errorFromStatus(error, what, timeoutSeconds) {
  const code = error.code ?? grpc.status.UNKNOWN;
  const details = error.details ?? error.message ?? '';
  const raw = error.metadata?.get(ERROR_DETAIL_KEY)?.[0];
  if (raw instanceof Buffer) {
    let detail = null;
    try {
      detail = detailCodec.deserialize(raw);
    } catch {
      // A garbled detail must not hide the status.
    }
    if (detail) {
      return errorFromDetail(detail, BY_CODE.get(code) ?? WorkerError);
    }
  }
  if (code === grpc.status.DEADLINE_EXCEEDED && timeoutSeconds !== undefined) {
    return new RlfleetTimeoutError(`${what}: no answer within ${timeoutSeconds} seconds`);
  }
  const ErrorClass = BY_CODE.get(code) ?? RlfleetError;
  return new ErrorClass(`${what}: ${details} (${grpc.status[code] ?? code})`);
}

/**
 * The error an ErrorDetail describes.
 *
 * @param {any} detail A decoded rlfleet.v1.ErrorDetail.
 * @param {typeof RlfleetError} fallback Class when the kind has none.
 * @returns {RlfleetError}
 */
export function errorFromDetail(detail, fallback = WorkerError) {
  const ErrorClass = BY_KIND.get(detail.kind) ?? fallback;
  if (ErrorClass === WorkerError || ErrorClass.prototype instanceof WorkerError) {
    const Worker = /** @type {typeof WorkerError} */ (ErrorClass);
    return new Worker(detail.message, {
      worker: detail.worker || undefined,
      envIndex: detail.env_index ?? undefined,
      step: detail.step === undefined ? undefined : toSafeInt(detail.step, 'ErrorDetail.step'),
      episodeIndex:
        detail.episode_index === undefined ? undefined : toSafeInt(detail.episode_index, 'ErrorDetail.episode_index'),
      remoteTraceback: detail.traceback || undefined,
    });
  }
  let text = detail.message;
  if (detail.worker && !text.includes(detail.worker)) {
    text = `${text} (worker ${detail.worker})`;
  }
  if (detail.traceback) {
    text = `${text}\n--- remote traceback ---\n${detail.traceback.trimEnd()}`;
  }
  return new ErrorClass(text);
}
