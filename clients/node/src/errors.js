/**
 * rlfleet's error classes for JavaScript, mirroring rlfleet/errors.py.
 *
 * Each class names the ErrorKind (updates.proto) a worker reports it as,
 * so a failure inside the Node worker reaches the learner with the same
 * kind a Python worker would give it. Messages say what was wrong, where,
 * and what to do.
 *
 * @module
 */

/** Base class of every error rlfleet raises on purpose. */
export class RlfleetError extends Error {
  /** ErrorKind name this error travels as in an ErrorDetail. */
  static kind = 'ERROR_KIND_INTERNAL';

  /**
   * @param {string} message
   * @param {{cause?: unknown}} [options]
   */
  constructor(message, options) {
    super(message, options);
    this.name = new.target.name;
  }

  /** @returns {string} The ErrorKind name of this error. */
  get kind() {
    return /** @type {typeof RlfleetError} */ (this.constructor).kind;
  }
}

/** Bytes or a decoded message break the wire format (lengths, dtypes, chunks). */
export class WireFormatError extends RlfleetError {
  static kind = 'ERROR_KIND_PROTOCOL';
}

/** A peer broke the protocol (wrong version, unexpected message, ...). */
export class ProtocolError extends RlfleetError {
  static kind = 'ERROR_KIND_PROTOCOL';
}

/** A setting (env kwargs, flag, policy kwargs) is invalid. */
export class ConfigError extends RlfleetError {
  static kind = 'ERROR_KIND_ENV_CONFIG';
}

/** No env is registered under the requested id. */
export class EnvNotFoundError extends ConfigError {
  static kind = 'ERROR_KIND_ENV_NOT_FOUND';
}

/** A policy spec, its parameters or its actions are invalid. */
export class PolicyError extends RlfleetError {
  static kind = 'ERROR_KIND_POLICY';
}

/**
 * Something failed on a worker, or the coordinator reported a worker's
 * failure (gRPC FAILED_PRECONDITION). Carries where it happened.
 */
export class WorkerError extends RlfleetError {
  static kind = 'ERROR_KIND_ENV_CRASHED';

  /**
   * @param {string} message
   * @param {{worker?: string, envIndex?: number, step?: number,
   *          episodeIndex?: number, remoteTraceback?: string, cause?: unknown}} [where]
   */
  constructor(message, where = {}) {
    super(message, { cause: where.cause });
    this.worker = where.worker;
    this.envIndex = where.envIndex;
    this.step = where.step;
    this.episodeIndex = where.episodeIndex;
    this.remoteTraceback = where.remoteTraceback;
  }
}

/** An env raised, or returned something outside its spaces. */
export class EnvError extends WorkerError {
  static kind = 'ERROR_KIND_ENV_CRASHED';
}

/** The coordinator refused a request as malformed (gRPC INVALID_ARGUMENT). */
export class InvalidArgumentError extends RlfleetError {}

/** The coordinator cannot be reached or went away; safe to retry. */
export class UnavailableError extends RlfleetError {}

/** A call ran past its deadline; the message says how many seconds. */
export class RlfleetTimeoutError extends RlfleetError {}

/** No worker joined before the deadline. */
export class NoWorkersError extends RlfleetTimeoutError {
  static kind = 'ERROR_KIND_NO_WORKERS';
}

/** The call carried no valid credentials (gRPC UNAUTHENTICATED). */
export class AuthenticationError extends RlfleetError {}

/** The credentials may not make this call (gRPC PERMISSION_DENIED). */
export class PermissionDeniedError extends RlfleetError {
  static kind = 'ERROR_KIND_PERMISSION';
}

/** A limit was hit: message size, worker count, ... */
export class ResourceExhaustedError extends RlfleetError {
  static kind = 'ERROR_KIND_LIMIT';
}
