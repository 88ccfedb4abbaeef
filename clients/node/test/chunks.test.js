import assert from 'node:assert/strict';
import { test } from 'node:test';

import { ChunkAssembler, chunkPayload } from '../src/chunks.js';
import { PayloadKind, messageType } from '../src/proto.js';

const BatchChunk = messageType('BatchChunk');
const KIND = PayloadKind.PAYLOAD_KIND_EPISODE_BATCH;

const payload = Buffer.from(Array.from({ length: 10000 }, (_, i) => (i * 7) % 256));

test('every serialized chunk stays within maxBytes and the data add up', () => {
  for (const maxBytes of [64, 100, 1000, 20000]) {
    const chunks = chunkPayload(payload, { kind: KIND, maxBytes, batchId: 300 });
    for (const chunk of chunks) {
      assert.ok(BatchChunk.serialize(chunk).length <= maxBytes, `maxBytes ${maxBytes}`);
      assert.deepEqual([chunk.batch_id, chunk.count, chunk.total_bytes], [300, chunks.length, 10000]);
    }
    assert.deepEqual(Buffer.concat(chunks.map((c) => c.data)), payload);
  }
  assert.equal(chunkPayload(payload, { kind: KIND, maxBytes: 20000 }).length, 1);
  assert.throws(() => chunkPayload(payload, { kind: KIND, maxBytes: 10 }), /no room for data/);
});

test('an empty payload is one empty chunk', () => {
  const [only, ...rest] = chunkPayload(Buffer.alloc(0), { kind: KIND });
  assert.deepEqual([only.count, only.data.length, rest.length], [1, 0, 0]);
});

test('the assembler rebuilds a batch from chunks that crossed the wire', () => {
  const assembler = new ChunkAssembler();
  const chunks = chunkPayload(payload, { kind: KIND, maxBytes: 1000, batchId: 2 }).map((c) =>
    BatchChunk.deserialize(BatchChunk.serialize(c)),
  );
  const results = chunks.map((chunk) => assembler.add(chunk));
  assert.ok(results.slice(0, -1).every((r) => r === null));
  assert.deepEqual(results.at(-1)?.payload, payload);
  assert.equal(results.at(-1)?.kind, KIND);
  assert.equal(assembler.inProgress, false);
});

test('missing, reordered or inconsistent chunks are refused and the partial batch dropped', () => {
  const chunks = chunkPayload(payload, { kind: KIND, maxBytes: 4000, batchId: 5 });
  assert.equal(chunks.length, 3);
  const assembler = new ChunkAssembler();
  assert.throws(() => assembler.add(chunks[1]), /chunk 0 is missing/);
  assembler.add(chunks[0]);
  assert.throws(() => assembler.add(chunks[2]), /chunk 1 of batch 5 missing: got index 2/);
  assert.equal(assembler.inProgress, false);
  assembler.add(chunks[0]);
  assert.throws(() => assembler.add({ ...chunks[1], total_bytes: 9 }), /says total_bytes=9, chunk 0 said 10000/);
  assembler.add(chunks[0]);
  assert.throws(() => assembler.add({ ...chunks[1], batch_id: 6 }), /batch 5 is incomplete/);
  assembler.add(chunks[0]);
  assembler.add(chunks[1]);
  assert.throws(() => assembler.add({ ...chunks[2], data: chunks[2].data.subarray(1) }), /hold 9999 bytes, total_bytes says 10000/);
  assert.throws(() => new ChunkAssembler({ maxTotalBytes: 100 }).add(chunks[0]), /over the limit of 100/);
});
