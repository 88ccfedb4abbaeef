/**
 * @rlfleet/node: an rlfleet worker and learner client for Node.js.
 *
 * @module
 */
export { RlfleetClient, MODES, agentUpdateMessage, envUpdateMessage } from './client.js';
export { RemoteWorker, CAPABILITIES, IMPLEMENTATION } from './worker/remote.js';
export { VecRunner } from './worker/runner.js';
export { CartPoleEnv } from './envs/cartpole.js';
export { ENVS, makeEnv } from './envs/registry.js';
export { MLPCategoricalPolicy } from './policies/mlp.js';
export { RandomPolicy } from './policies/random.js';
export { makePolicy, BUILTIN_POLICIES } from './policies/index.js';
export { Generator, SeedSequence } from './random.js';
export { episodeSeeds, streamSeeds } from './seeding.js';
export { DTYPES, tensor, encodeTensor, decodeTensor, encodeTensorMap, decodeTensorMap } from './tensor.js';
export { buildEpisodeBatch, decodeEpisodeBatch, selectEpisodes } from './batch.js';
export { chunkPayload, ChunkAssembler, DEFAULT_CHUNK_BYTES } from './chunks.js';
export { encodeEnvSpec, decodeEnvSpec, encodeSpace, decodeSpace } from './spaces.js';
export { DType, StepType, SampleMode, ErrorKind, PayloadKind, PROTOCOL_VERSION, messageType } from './proto.js';
export * from './errors.js';
