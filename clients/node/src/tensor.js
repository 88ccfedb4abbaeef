/**
 * Tensors and tensor maps (tensor.proto) as JavaScript typed arrays.
 *
 * A tensor is `{dtype, shape, data}`: `dtype` a numpy-style name
 * ("float32", "int64", ...), `shape` an array of Numbers and `data` a typed
 * array of prod(shape) elements in C order (row-major, last index fastest).
 * On the wire every element is little-endian; on a little-endian host (all
 * mainstream ones) decoding views the received bytes without a copy when
 * they are aligned, as numpy's `frombuffer` does on the Python side.
 *
 * Typed array per dtype: bool and uint8 -> Uint8Array (bool holds 0 or 1),
 * int64 -> BigInt64Array, uint64 -> BigUint64Array, float16 ->
 * Uint16Array holding the raw IEEE binary16 bits (JavaScript has no
 * float16 arithmetic type before Node 24).
 *
 * @module
 */
import { endianness } from 'node:os';

import { WireFormatError } from './errors.js';
import { toSafeInt } from './int64.js';
import { Codec, DType } from './proto.js';

/**
 * @typedef {Uint8Array | Int8Array | Int16Array | Int32Array | BigInt64Array
 *   | Uint16Array | Uint32Array | BigUint64Array | Float32Array | Float64Array} TypedArray
 */

/**
 * @typedef {object} Tensor
 * @property {string} dtype numpy-style dtype name, a key of DTYPES.
 * @property {number[]} shape Dimensions; [] for a scalar.
 * @property {TypedArray} data prod(shape) elements, C order.
 */

/**
 * A decoded TensorMap: names to tensors or nested maps, in wire order
 * (JavaScript objects list integer-like keys first; rlfleet's keys are not).
 *
 * @typedef {{[key: string]: Tensor | TensorTree}} TensorTree
 */

/**
 * @typedef {object} DTypeInfo
 * @property {number} code The DType enum value.
 * @property {number} itemsize Bytes per element.
 * @property {new (buffer: ArrayBufferLike, byteOffset?: number, length?: number) => TypedArray} Array
 *   Its typed array class.
 */

/** @type {Readonly<Record<string, DTypeInfo>>} */
export const DTYPES = Object.freeze({
  bool: { code: DType.DTYPE_BOOL, itemsize: 1, Array: Uint8Array },
  int8: { code: DType.DTYPE_INT8, itemsize: 1, Array: Int8Array },
  int16: { code: DType.DTYPE_INT16, itemsize: 2, Array: Int16Array },
  int32: { code: DType.DTYPE_INT32, itemsize: 4, Array: Int32Array },
  int64: { code: DType.DTYPE_INT64, itemsize: 8, Array: BigInt64Array },
  uint8: { code: DType.DTYPE_UINT8, itemsize: 1, Array: Uint8Array },
  uint16: { code: DType.DTYPE_UINT16, itemsize: 2, Array: Uint16Array },
  uint32: { code: DType.DTYPE_UINT32, itemsize: 4, Array: Uint32Array },
  uint64: { code: DType.DTYPE_UINT64, itemsize: 8, Array: BigUint64Array },
  float16: { code: DType.DTYPE_FLOAT16, itemsize: 2, Array: Uint16Array },
  float32: { code: DType.DTYPE_FLOAT32, itemsize: 4, Array: Float32Array },
  float64: { code: DType.DTYPE_FLOAT64, itemsize: 8, Array: Float64Array },
});

/** dtype name by DType enum value. */
const NAMES = new Map(Object.entries(DTYPES).map(([name, info]) => [info.code, name]));

/** Most dimensions a tensor may have (as rlfleet.wire). */
export const MAX_NDIM = 32;
/** Most elements a decoded tensor may have; checked before allocating. */
export const MAX_ELEMENTS = 2 ** 40;

const LITTLE_ENDIAN_HOST = endianness() === 'LE';

/**
 * The DTypeInfo of a dtype name.
 *
 * @param {string} dtype
 * @param {string} [where]
 * @returns {DTypeInfo}
 * @throws {WireFormatError} For a name tensor.proto has no DType for.
 */
export function dtypeInfo(dtype, where = 'tensor') {
  const info = Object.hasOwn(DTYPES, dtype) ? DTYPES[dtype] : undefined;
  if (!info) {
    throw new WireFormatError(
      `${where}: unknown dtype ${JSON.stringify(dtype)}; use one of ${Object.keys(DTYPES).join(', ')}`,
    );
  }
  return info;
}

/**
 * Number of elements of a shape, after checking every dimension.
 *
 * @param {readonly number[]} shape
 * @param {string} where
 * @returns {number}
 * @throws {WireFormatError} For too many dimensions, a negative or
 *   non-integer dimension, or more than MAX_ELEMENTS elements.
 */
export function elementCount(shape, where) {
  if (shape.length > MAX_NDIM) {
    throw new WireFormatError(`${where}: ${shape.length} dimensions, at most ${MAX_NDIM} are supported`);
  }
  let count = 1;
  for (const dim of shape) {
    if (!Number.isSafeInteger(dim) || dim < 0) {
      throw new WireFormatError(`${where}: invalid dimension ${dim} in shape [${shape}]`);
    }
    count *= dim;
    if (count > MAX_ELEMENTS) {
      throw new WireFormatError(`${where}: shape [${shape}] is too large (more than 2**40 elements)`);
    }
  }
  return count;
}

/**
 * Builds a tensor from any array-like of numbers (or bigints for 64-bit
 * integer dtypes), checking its size against the shape.
 *
 * @param {string} dtype numpy-style dtype name.
 * @param {readonly number[]} shape
 * @param {ArrayLike<number | bigint> | TypedArray} values prod(shape) values, C order.
 * @returns {Tensor}
 * @throws {WireFormatError} If the dtype is unknown or the sizes disagree.
 */
export function tensor(dtype, shape, values) {
  const info = dtypeInfo(dtype);
  const count = elementCount(shape, `${dtype} tensor`);
  if (values.length !== count) {
    throw new WireFormatError(
      `${dtype} tensor of shape [${shape}] needs ${count} values, got ${values.length}`,
    );
  }
  /** @type {TypedArray} */
  let data;
  if (values instanceof info.Array) {
    data = /** @type {TypedArray} */ (values);
  } else if (info.Array === BigInt64Array || info.Array === BigUint64Array) {
    const big = /** @type {typeof BigInt64Array} */ (info.Array);
    data = big.from(Array.from(values, (value) => BigInt(value)));
  } else {
    const plain = /** @type {typeof Float64Array} */ (info.Array);
    data = plain.from(Array.from(values, Number));
  }
  return { dtype, shape: [...shape], data };
}

/**
 * Encodes a tensor as a plain rlfleet.v1.Tensor object for protobuf.
 *
 * @param {Tensor} value
 * @param {string} [where] Names the tensor in errors.
 * @returns {{dtype: number, shape: number[], data: Buffer, codec: number}}
 * @throws {WireFormatError} If the dtype is unknown, the typed array is not
 *   the dtype's, or its length is not prod(shape).
 */
export function encodeTensor(value, where = 'tensor') {
  if (!value || typeof value !== 'object' || !('data' in value) || !('shape' in value)) {
    throw new WireFormatError(`${where}: expected {dtype, shape, data}, got ${typeof value}`);
  }
  const info = dtypeInfo(value.dtype, where);
  const count = elementCount(value.shape, where);
  if (!(value.data instanceof info.Array)) {
    throw new WireFormatError(
      `${where}: dtype ${value.dtype} needs a ${info.Array.name}, got ${value.data?.constructor?.name}`,
    );
  }
  if (value.data.length !== count) {
    throw new WireFormatError(
      `${where}: ${value.data.length} elements for shape [${value.shape}] (needs ${count})`,
    );
  }
  const bytes = Buffer.from(value.data.buffer, value.data.byteOffset, value.data.byteLength);
  return {
    dtype: info.code,
    shape: [...value.shape],
    data: LITTLE_ENDIAN_HOST ? bytes : swapBytes(bytes, info.itemsize),
    codec: Codec.CODEC_NONE,
  };
}

/**
 * Decodes a rlfleet.v1.Tensor, checking it as tensor.proto requires.
 *
 * @param {any} message The decoded protobuf object.
 * @param {string} [where] Names the tensor in errors.
 * @returns {Tensor}
 * @throws {WireFormatError} For an unknown dtype or codec, a bad shape, a
 *   data length other than prod(shape) * itemsize, or a bool that is not 0/1.
 */
export function decodeTensor(message, where = 'tensor') {
  if (!message || typeof message !== 'object') {
    throw new WireFormatError(`${where}: missing tensor`);
  }
  const dtype = NAMES.get(message.dtype);
  if (dtype === undefined) {
    const what = message.dtype === 0 ? 'no dtype (DTYPE_UNSPECIFIED)' : `unknown dtype ${message.dtype}`;
    throw new WireFormatError(`${where}: ${what}; protocol v1 knows DType values 1..12`);
  }
  if ((message.codec ?? 0) !== Codec.CODEC_NONE) {
    throw new WireFormatError(`${where}: unknown codec ${message.codec}; protocol v1 only has CODEC_NONE (0)`);
  }
  const info = DTYPES[dtype];
  const shape = (message.shape ?? []).map(
    (/** @type {unknown} */ dim, /** @type {number} */ i) => toSafeInt(dim, `${where}.shape[${i}]`),
  );
  const count = elementCount(shape, where);
  /** @type {Buffer} */
  const bytes = message.data ?? Buffer.alloc(0);
  const expected = count * info.itemsize;
  if (bytes.length !== expected) {
    throw new WireFormatError(
      `${where}: ${bytes.length} bytes of data, expected ${expected} for ${dtype} shape [${shape}]`,
    );
  }
  const data = viewAs(bytes, info);
  if (dtype === 'bool') {
    const bad = /** @type {Uint8Array} */ (data).findIndex((byte) => byte > 1);
    if (bad >= 0) {
      throw new WireFormatError(
        `${where}: bool tensor holds byte ${data[bad]} at element ${bad}; bools must be 0 or 1`,
      );
    }
  }
  return { dtype, shape, data };
}

/**
 * The bytes as a typed array: a view when aligned on a little-endian host,
 * else a (byte-swapped) copy.
 *
 * @param {Buffer} bytes
 * @param {DTypeInfo} info
 * @returns {TypedArray}
 */
function viewAs(bytes, info) {
  const length = bytes.length / info.itemsize;
  if (LITTLE_ENDIAN_HOST && bytes.byteOffset % info.itemsize === 0) {
    return new info.Array(bytes.buffer, bytes.byteOffset, length);
  }
  const copy = new Uint8Array(bytes);
  const ordered = LITTLE_ENDIAN_HOST ? copy : swapBytes(copy, info.itemsize);
  return new info.Array(ordered.buffer, ordered.byteOffset, length);
}

/**
 * A copy with the bytes of every itemsize-byte element reversed.
 *
 * @param {Uint8Array} bytes
 * @param {number} itemsize
 * @returns {Buffer}
 */
export function swapBytes(bytes, itemsize) {
  const out = Buffer.alloc(bytes.length);
  for (let start = 0; start < bytes.length; start += itemsize) {
    for (let k = 0; k < itemsize; k += 1) {
      out[start + k] = bytes[start + itemsize - 1 - k];
    }
  }
  return out;
}

/**
 * Whether a value is a tensor (rather than a nested map).
 *
 * @param {unknown} value
 * @returns {value is Tensor}
 */
export function isTensor(value) {
  return (
    value !== null &&
    typeof value === 'object' &&
    'dtype' in value &&
    'shape' in value &&
    'data' in value &&
    ArrayBuffer.isView(value.data)
  );
}

/**
 * Encodes a (nested) object of tensors as a plain rlfleet.v1.TensorMap.
 *
 * @param {TensorTree} tree Keys in insertion order become entries in order.
 * @param {string} [where] Names the map in errors.
 * @returns {{entries: object[]}}
 * @throws {WireFormatError} For an empty key or a value that is neither a
 *   tensor nor an object of tensors.
 */
export function encodeTensorMap(tree, where = 'TensorMap') {
  if (!tree || typeof tree !== 'object' || Array.isArray(tree)) {
    throw new WireFormatError(`${where}: expected an object of tensors, got ${typeof tree}`);
  }
  const entries = Object.entries(tree).map(([key, value]) => {
    const path = `${where}[${JSON.stringify(key)}]`;
    if (key.length === 0) {
      throw new WireFormatError(`${where}: keys must be non-empty`);
    }
    if (isTensor(value)) {
      return { key, tensor: encodeTensor(value, path) };
    }
    return { key, map: encodeTensorMap(/** @type {TensorTree} */ (value), path) };
  });
  return { entries };
}

/**
 * Decodes a rlfleet.v1.TensorMap into a (nested) object of tensors.
 *
 * @param {any} message The decoded protobuf object (or null: empty map).
 * @param {string} [where] Names the map in errors.
 * @returns {TensorTree}
 * @throws {WireFormatError} For an empty or duplicate key, an entry with
 *   neither a tensor nor a map, or a bad tensor.
 */
export function decodeTensorMap(message, where = 'TensorMap') {
  /** @type {TensorTree} */
  const tree = {};
  for (const entry of message?.entries ?? []) {
    const key = entry.key ?? '';
    if (key.length === 0) {
      throw new WireFormatError(`${where}: an entry has an empty key; keys must be non-empty`);
    }
    if (Object.hasOwn(tree, key)) {
      throw new WireFormatError(`${where}: duplicate key ${JSON.stringify(key)}; keys must be unique`);
    }
    const path = `${where}[${JSON.stringify(key)}]`;
    if (entry.value === 'tensor' || (entry.tensor && entry.value === undefined)) {
      tree[key] = decodeTensor(entry.tensor, path);
    } else if (entry.value === 'map' || entry.map) {
      tree[key] = decodeTensorMap(entry.map, path);
    } else {
      throw new WireFormatError(`${path}: the entry has neither a tensor nor a map`);
    }
  }
  return tree;
}

/**
 * IEEE 754 binary16 bits to a Number.
 *
 * @param {number} bits
 * @returns {number}
 */
export function halfToNumber(bits) {
  const sign = bits & 0x8000 ? -1 : 1;
  const exponent = (bits >> 10) & 0x1f;
  const fraction = bits & 0x3ff;
  if (exponent === 0) {
    return sign * fraction * 2 ** -24;
  }
  if (exponent === 0x1f) {
    return fraction ? Number.NaN : sign * Infinity;
  }
  return sign * (1 + fraction / 1024) * 2 ** (exponent - 15);
}

/**
 * The elements of a numeric tensor as Numbers (64-bit integers beyond 2**53
 * round, as numpy's cast to float does; float16 bits are decoded).
 *
 * @param {Tensor} value
 * @returns {Float64Array}
 */
export function numericValues(value) {
  if (value.dtype === 'float16') {
    return Float64Array.from(/** @type {Uint16Array} */ (value.data), halfToNumber);
  }
  if (value.data instanceof BigInt64Array || value.data instanceof BigUint64Array) {
    return Float64Array.from(value.data, Number);
  }
  return Float64Array.from(/** @type {ArrayLike<number>} */ (value.data));
}
