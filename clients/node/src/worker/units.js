/**
 * A Task's episode units, whichever of its two forms they came in
 * (worker.proto Task.units and Task.unit_columns), as rlfleet/wire/join.py
 * reads them. With the capability "rlfleet.unit-columns" the coordinator
 * sends three packed little-endian columns instead of one EpisodeUnit
 * message per unit: a refill of hundreds of units then decodes without a
 * message object per unit.
 *
 * @module
 */
import { WireFormatError } from '../errors.js';
import { toSafeInt } from '../int64.js';

/** The Hello capability under which the coordinator sends columns. */
export const UNIT_COLUMNS_CAPABILITY = 'rlfleet.unit-columns';

/**
 * @typedef {object} UnitRow
 * @property {number} episodeIndex
 * @property {number} envSeed
 * @property {number} policySeed
 */

/** 2**32: the weight of an int64's high word. */
const HIGH_WORD = 0x1_0000_0000;
/** High words at or above this make an index beyond Number.MAX_SAFE_INTEGER (2**53 - 1). */
const SAFE_HIGH_LIMIT = 0x20_0000;

/**
 * The units of a Task message or, if they cannot be read, why: a worker
 * refuses such a task by its id (WorkerError ERROR_KIND_PROTOCOL) and the
 * stream goes on.
 *
 * @param {any} task A decoded Task.
 * @returns {{units: UnitRow[], unreadable: string}} ``unreadable`` is ""
 *   when the units decoded.
 */
export function readTaskUnits(task) {
  try {
    return { units: taskUnits(task), unreadable: '' };
  } catch (error) {
    if (!(error instanceof WireFormatError)) {
      throw error;
    }
    return { units: [], unreadable: `units it cannot decode (${error.message})` };
  }
}

/**
 * The units of a Task message, in the order it lists them.
 *
 * @param {any} task A decoded Task (see ../proto.js: bytes are Buffers,
 *   an absent message field is null).
 * @returns {UnitRow[]}
 * @throws {WireFormatError} If the task carries both forms, its columns
 *   are malformed, or an episode index is negative or beyond 2**53 (a
 *   JavaScript number would round it).
 */
export function taskUnits(task) {
  if (task.unit_columns == null) {
    return task.units.map((/** @type {any} */ unit) => ({
      episodeIndex: toSafeInt(unit.episode_index, 'EpisodeUnit.episode_index'),
      envSeed: unit.env_seed,
      policySeed: unit.policy_seed,
    }));
  }
  if (task.units.length > 0) {
    throw new WireFormatError(`Task ${task.task_id} carries both units and unit_columns; a coordinator sends one`);
  }
  return decodeUnitColumns(task.unit_columns);
}

/**
 * The units of an EpisodeUnitColumns message: episode_indices N int64,
 * env_seeds and policy_seeds N uint32 each, all little-endian.
 *
 * @param {{episode_indices: Uint8Array, env_seeds: Uint8Array, policy_seeds: Uint8Array}} columns
 * @returns {UnitRow[]}
 * @throws {WireFormatError} If a column is not a whole number of values,
 *   the columns differ in length, or an episode index is negative or
 *   beyond 2**53, naming the column and the unit.
 */
export function decodeUnitColumns(columns) {
  const indices = columnView(columns.episode_indices, 'episode_indices', 8);
  const envSeeds = columnView(columns.env_seeds, 'env_seeds', 4);
  const policySeeds = columnView(columns.policy_seeds, 'policy_seeds', 4);
  const count = indices.byteLength / 8;
  if (envSeeds.byteLength / 4 !== count || policySeeds.byteLength / 4 !== count) {
    const counts = { episode_indices: count, env_seeds: envSeeds.byteLength / 4, policy_seeds: policySeeds.byteLength / 4 };
    throw new WireFormatError(`Task.unit_columns' columns differ in length: ${JSON.stringify(counts)}`);
  }
  /** @type {UnitRow[]} */
  const units = new Array(count);
  for (let k = 0; k < count; k += 1) {
    // Two 32-bit words, not getBigInt64: as exact, without a BigInt per unit.
    const low = indices.getUint32(8 * k, true);
    const high = indices.getInt32(8 * k + 4, true);
    if (high < 0 || high >= SAFE_HIGH_LIMIT) {
      const value = indices.getBigInt64(8 * k, true);
      const why = high < 0 ? 'is negative' : 'is beyond 2**53 and cannot be a JavaScript number here';
      throw new WireFormatError(`Task.unit_columns.episode_indices[${k}]: ${value} ${why}`);
    }
    units[k] = {
      episodeIndex: high * HIGH_WORD + low,
      envSeed: envSeeds.getUint32(4 * k, true),
      policySeed: policySeeds.getUint32(4 * k, true),
    };
  }
  return units;
}

/**
 * A DataView over a column's bytes (a Buffer may start at any offset of a
 * shared pool, so no aligned typed array).
 *
 * @param {Uint8Array} bytes
 * @param {string} name
 * @param {number} size Bytes per value.
 * @returns {DataView}
 */
function columnView(bytes, name, size) {
  if (bytes.byteLength % size !== 0) {
    throw new WireFormatError(
      `Task.unit_columns.${name} holds ${bytes.byteLength} bytes, not a whole number of ${size}-byte values`,
    );
  }
  return new DataView(bytes.buffer, bytes.byteOffset, bytes.byteLength);
}
