/**
 * Chunking (batch.proto BatchChunk): a serialized batch cut into pieces
 * small enough for one message, and the reassembly on the other side.
 *
 * @module
 */
import { WireFormatError } from './errors.js';
import { toSafeInt } from './int64.js';

/** Default most bytes of one serialized BatchChunk: 1-4 MiB messages stream fastest. */
export const DEFAULT_CHUNK_BYTES = 1 << 20;

/**
 * Bytes of the varint encoding of a non-negative integer.
 *
 * @param {number} value
 * @returns {number}
 */
export function varintSize(value) {
  let size = 1;
  let rest = value;
  while (rest >= 128) {
    rest = Math.floor(rest / 128);
    size += 1;
  }
  return size;
}

/**
 * @typedef {object} Chunk
 * @property {number} batch_id
 * @property {number} index
 * @property {number} count
 * @property {number} total_bytes
 * @property {number} kind PayloadKind.
 * @property {Buffer} data
 */

/**
 * Cuts a payload into chunks whose serialized BatchChunk is at most
 * `maxBytes` each. Chunk data are views of `payload` (no copies).
 *
 * @param {Buffer} payload The serialized batch.
 * @param {{kind: number, maxBytes?: number, batchId?: number}} options
 * @returns {Chunk[]} In order; one (possibly empty) chunk for an empty payload.
 * @throws {RangeError} If maxBytes leaves no room for data after the header.
 */
export function chunkPayload(payload, { kind, maxBytes = DEFAULT_CHUNK_BYTES, batchId = 0 }) {
  const total = payload.length;
  // Bound the header with the largest count first, then tighten with the
  // count that bound gives: a smaller count never needs more room.
  let count = Math.max(total, 1);
  let room = 0;
  for (let pass = 0; pass < 2; pass += 1) {
    const header =
      [batchId, count - 1, count, total, kind].reduce((sum, value) => sum + 1 + varintSize(value), 0) +
      1 +
      varintSize(maxBytes);
    room = maxBytes - header;
    if (room < 1) {
      throw new RangeError(
        `a chunk limit of ${maxBytes} bytes leaves no room for data after the ${header}-byte header; use a few KiB at least`,
      );
    }
    count = Math.max(Math.ceil(total / room), 1);
  }
  return Array.from({ length: count }, (_, index) => ({
    batch_id: batchId,
    index,
    count,
    total_bytes: total,
    kind,
    data: payload.subarray(index * room, Math.min((index + 1) * room, total)),
  }));
}

/**
 * Reassembles the chunks of one sender, one batch at a time, as
 * batch.proto requires: in order, agreeing on batch_id, count, total_bytes
 * and kind, adding up to total_bytes. Any violation drops the partial batch.
 */
export class ChunkAssembler {
  /** @param {{maxTotalBytes?: number}} [options] Largest batch accepted. */
  constructor({ maxTotalBytes = Infinity } = {}) {
    this.maxTotalBytes = maxTotalBytes;
    /** @type {{batchId: string, count: number, total: number, kind: number} | null} */
    this.first = null;
    /** @type {Buffer[]} */
    this.parts = [];
    this.filled = 0;
    this.nextIndex = 0;
  }

  /** Drops a partial batch. */
  reset() {
    this.first = null;
    this.parts = [];
    this.filled = 0;
    this.nextIndex = 0;
  }

  /** @returns {boolean} Whether a batch is partly received. */
  get inProgress() {
    return this.first !== null;
  }

  /**
   * Takes the next chunk (a decoded BatchChunk message).
   *
   * @param {any} chunk
   * @returns {{payload: Buffer, kind: number} | null} The whole batch when
   *   this chunk completes it, else null.
   * @throws {WireFormatError} For an out-of-order or inconsistent chunk.
   */
  add(chunk) {
    try {
      return this.addChecked(chunk);
    } catch (error) {
      this.reset();
      throw error;
    }
  }

  /**
   * @param {any} chunk
   * @returns {{payload: Buffer, kind: number} | null}
   */
  addChecked(chunk) {
    const batchId = String(chunk.batch_id);
    const index = chunk.index;
    const count = chunk.count;
    const total = toSafeInt(chunk.total_bytes, 'BatchChunk.total_bytes');
    let first = this.first;
    if (first === null) {
      if (index !== 0) {
        throw new WireFormatError(`chunk ${index} of batch ${batchId} arrived first: chunk 0 is missing`);
      }
      if (count < 1) {
        throw new WireFormatError(`batch ${batchId}: count must be >= 1, got ${count}`);
      }
      if (total > this.maxTotalBytes) {
        throw new WireFormatError(`batch ${batchId} is ${total} bytes, over the limit of ${this.maxTotalBytes}`);
      }
      first = { batchId, count, total, kind: chunk.kind };
      this.first = first;
    } else {
      if (batchId !== first.batchId) {
        throw new WireFormatError(
          `batch ${first.batchId} is incomplete (${this.nextIndex} of ${first.count} chunks arrived) ` +
            `but chunk ${index} of batch ${batchId} came next`,
        );
      }
      if (index !== this.nextIndex) {
        throw new WireFormatError(`chunk ${this.nextIndex} of batch ${batchId} missing: got index ${index}`);
      }
      for (const [name, mine, theirs] of /** @type {const} */ ([
        ['count', count, first.count],
        ['total_bytes', total, first.total],
        ['kind', chunk.kind, first.kind],
      ])) {
        if (mine !== theirs) {
          throw new WireFormatError(`chunk ${index} of batch ${batchId} says ${name}=${mine}, chunk 0 said ${theirs}`);
        }
      }
    }
    this.filled += chunk.data.length;
    if (this.filled > first.total) {
      throw new WireFormatError(`chunks 0..${index} of batch ${batchId} hold ${this.filled} bytes, more than its total_bytes ${first.total}`);
    }
    this.parts.push(chunk.data);
    this.nextIndex = index + 1;
    if (index < first.count - 1) {
      return null;
    }
    if (this.filled !== first.total) {
      throw new WireFormatError(`batch ${batchId}: its ${first.count} chunk(s) hold ${this.filled} bytes, total_bytes says ${first.total}`);
    }
    const payload = this.parts.length === 1 ? this.parts[0] : Buffer.concat(this.parts, first.total);
    const kind = first.kind;
    this.reset();
    return { payload, kind };
  }
}
