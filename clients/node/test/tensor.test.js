import assert from 'node:assert/strict';
import { test } from 'node:test';

import { WireFormatError } from '../src/errors.js';
import { DType, messageType } from '../src/proto.js';
import {
  DTYPES,
  decodeTensor,
  decodeTensorMap,
  encodeTensor,
  encodeTensorMap,
  halfToNumber,
  numericValues,
  tensor,
} from '../src/tensor.js';

const Tensor = messageType('Tensor');
const TensorMap = messageType('TensorMap');

test('float32 data is little-endian C order on the wire', () => {
  const message = encodeTensor(tensor('float32', [2], [1.5, -2]));
  assert.equal(message.dtype, DType.DTYPE_FLOAT32);
  assert.deepEqual([...message.data], [0x00, 0x00, 0xc0, 0x3f, 0x00, 0x00, 0x00, 0xc0]);
  const back = decodeTensor(Tensor.deserialize(Tensor.serialize(message)));
  assert.deepEqual(back.shape, [2]);
  assert.deepEqual([...back.data], [1.5, -2]);
});

test('every dtype survives a protobuf round trip', () => {
  const values = { bool: [1, 0, 1, 1, 0, 0] };
  for (const dtype of Object.keys(DTYPES)) {
    const data = values[dtype] ?? [1, 2, 3, 4, 5, 6];
    const sent = tensor(dtype, [2, 3], data);
    const got = decodeTensor(Tensor.deserialize(Tensor.serialize(encodeTensor(sent))));
    assert.equal(got.dtype, dtype);
    assert.deepEqual(got.shape, [2, 3]);
    assert.deepEqual([...got.data], [...sent.data], dtype);
    assert.equal(got.data.constructor, DTYPES[dtype].Array);
  }
});

test('int64 beyond 2**53 and negative values keep every bit', () => {
  const sent = tensor('int64', [2], [2n ** 62n + 1n, -3n]);
  const got = decodeTensor(Tensor.deserialize(Tensor.serialize(encodeTensor(sent))));
  assert.deepEqual([...got.data], [2n ** 62n + 1n, -3n]);
});

test('a scalar has an empty shape and one element; a 0 dimension has no data', () => {
  const scalar = decodeTensor(encodeTensor(tensor('float64', [], [7])));
  assert.deepEqual(scalar.shape, []);
  assert.deepEqual([...scalar.data], [7]);
  const empty = decodeTensor(encodeTensor(tensor('int32', [0, 3], [])));
  assert.equal(empty.data.length, 0);
});

test('unaligned bytes are copied, not viewed', () => {
  const raw = Buffer.alloc(9);
  const bytes = raw.subarray(1); // byteOffset 1: a Float64Array cannot view it
  bytes.writeDoubleLE(0.25, 0);
  const got = decodeTensor({ dtype: DType.DTYPE_FLOAT64, shape: ['1'], data: bytes, codec: 0 });
  assert.deepEqual([...got.data], [0.25]);
});

test('decoding refuses what tensor.proto says a receiver must reject', () => {
  const ok = { dtype: DType.DTYPE_FLOAT32, shape: ['2'], data: Buffer.alloc(8), codec: 0 };
  assert.throws(() => decodeTensor({ ...ok, data: Buffer.alloc(7) }), /7 bytes of data, expected 8 for float32 shape \[2\]/);
  assert.throws(() => decodeTensor({ ...ok, dtype: 0 }), /DTYPE_UNSPECIFIED/);
  assert.throws(() => decodeTensor({ ...ok, dtype: 99 }), /unknown dtype 99/);
  assert.throws(() => decodeTensor({ ...ok, codec: 1 }), /unknown codec 1/);
  assert.throws(() => decodeTensor({ ...ok, shape: ['-2'] }), /invalid dimension -2/);
  assert.throws(
    () => decodeTensor({ dtype: DType.DTYPE_BOOL, shape: ['2'], data: Buffer.from([1, 2]), codec: 0 }),
    /bool tensor holds byte 2 at element 1/,
  );
  assert.throws(() => decodeTensor({ ...ok, shape: [String(2 ** 21), String(2 ** 21)] }), /too large/);
});

test('encoding refuses a typed array of the wrong type or size', () => {
  assert.throws(() => encodeTensor({ dtype: 'float32', shape: [2], data: new Float64Array(2) }), /needs a Float32Array/);
  assert.throws(() => encodeTensor({ dtype: 'float32', shape: [3], data: new Float32Array(2) }), /2 elements for shape \[3\]/);
  assert.throws(() => tensor('complex64', [1], [1]), WireFormatError);
  assert.throws(() => tensor('float32', [2, 2], [1, 2, 3]), /needs 4 values, got 3/);
});

test('tensor maps nest, keep their order and refuse bad keys', () => {
  const tree = { b: tensor('int64', [1], [5]), a: { inner: tensor('float32', [1], [0.5]) } };
  const got = decodeTensorMap(TensorMap.deserialize(TensorMap.serialize(encodeTensorMap(tree))));
  assert.deepEqual(Object.keys(got), ['b', 'a']);
  assert.deepEqual([...got.b.data], [5n]);
  assert.deepEqual([...got.a.inner.data], [0.5]);
  const entry = { key: 'x', tensor: encodeTensor(tensor('uint8', [1], [1])), value: 'tensor' };
  assert.throws(() => decodeTensorMap({ entries: [entry, entry] }), /duplicate key "x"/);
  assert.throws(() => decodeTensorMap({ entries: [{ ...entry, key: '' }] }), /empty key/);
  assert.throws(() => decodeTensorMap({ entries: [{ key: 'y' }] }), /neither a tensor nor a map/);
  assert.throws(() => encodeTensorMap({ '': tensor('uint8', [1], [1]) }), /non-empty/);
});

test('float16 bits decode as IEEE binary16', () => {
  assert.equal(halfToNumber(0x3c00), 1);
  assert.equal(halfToNumber(0xc000), -2);
  assert.equal(halfToNumber(0x0001), 2 ** -24);
  assert.equal(halfToNumber(0x7c00), Infinity);
  assert.ok(Number.isNaN(halfToNumber(0x7e00)));
  assert.deepEqual([...numericValues(tensor('float16', [2], [0x3800, 0x4200]))], [0.5, 3]);
});
