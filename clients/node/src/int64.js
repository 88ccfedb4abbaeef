/**
 * int64/uint64 fields arrive as decimal strings (see ./proto.js). These
 * helpers turn them into Numbers only where that is exact, and say which
 * field was out of range otherwise: episode indices, versions and ids fit
 * comfortably in 2**53, but a silently rounded one would break the
 * protocol's bookkeeping.
 *
 * @module
 */
import { WireFormatError } from './errors.js';

/**
 * An integer field as a Number, checked exact.
 *
 * @param {unknown} value A decimal string, number, bigint or Long-like.
 * @param {string} where The field, for the error message.
 * @returns {number}
 * @throws {WireFormatError} If the value is not an integer or is beyond 2**53.
 */
export function toSafeInt(value, where) {
  const big = toBigInt(value, where);
  const number = Number(big);
  if (!Number.isSafeInteger(number)) {
    throw new WireFormatError(
      `${where}: ${big} is beyond 2**53 and cannot be a JavaScript number here`,
    );
  }
  return number;
}

/**
 * An integer field as a BigInt.
 *
 * @param {unknown} value A decimal string, number, bigint or Long-like.
 * @param {string} where The field, for the error message.
 * @returns {bigint}
 * @throws {WireFormatError} If the value is not an integer.
 */
export function toBigInt(value, where) {
  if (typeof value === 'bigint') {
    return value;
  }
  if (typeof value === 'number') {
    if (!Number.isInteger(value)) {
      throw new WireFormatError(`${where}: expected an integer, got ${value}`);
    }
    return BigInt(value);
  }
  if (typeof value === 'string' && /^-?\d+$/.test(value)) {
    return BigInt(value);
  }
  if (value !== null && typeof value === 'object' && 'low' in value && 'high' in value) {
    return toBigInt(String(value), where);
  }
  throw new WireFormatError(`${where}: expected an integer, got ${JSON.stringify(value)}`);
}

/**
 * A value for an int64/uint64 field: safe Numbers stay Numbers, anything
 * larger travels as a decimal string (protobufjs takes both).
 *
 * @param {number | bigint} value
 * @returns {number | string}
 */
export function toWireInt(value) {
  if (typeof value === 'bigint') {
    const number = Number(value);
    return Number.isSafeInteger(number) ? number : value.toString();
  }
  return value;
}
