/**
 * numpy's default generator, bit for bit: SeedSequence -> PCG64 ->
 * Generator.random() / integers() / uniform().
 *
 * The protocol ships per-episode seeds and says (worker.proto EpisodeUnit)
 * "draw the episode's actions from a generator seeded with policy_seed
 * (Python: numpy.random.default_rng(policy_seed))", and gymnasium's
 * `reset(seed)` seeds the same generator. Reproducing it here makes a Node
 * worker draw the same numbers as a Python worker from the same seeds, so
 * its episodes follow the Python ones as long as the floating-point math
 * agrees (it usually does to the last bit; libm differences in sin, cos,
 * exp and tanh may still make rare trajectories diverge: cross-language
 * bit-identity is not promised).
 *
 * References: numpy/random/bit_generator.pyx (SeedSequence),
 * numpy/random/src/pcg64/pcg64.h (PCG64 XSL-RR 128/64),
 * numpy/random/src/distributions/distributions.c (next_double, Lemire).
 * The 128-bit state uses BigInt: one multiplication per draw is cheap next
 * to an env step, and clarity wins here.
 *
 * @module
 */

const MASK32 = 0xffffffff;
const INIT_A = 0x43b0d7e5;
const MULT_A = 0x931e8875;
const INIT_B = 0x8b51f9dd;
const MULT_B = 0x58f38ded;
const MIX_MULT_L = 0xca01f9dd;
const MIX_MULT_R = 0x4973f715;
const XSHIFT = 16;
const POOL_SIZE = 4;

const MASK64 = (1n << 64n) - 1n;
const MASK128 = (1n << 128n) - 1n;
const PCG_MULTIPLIER = (2549297995355413924n << 64n) + 4865540595714422341n;
/** 2**-53: next_double's scale. */
const DOUBLE_UNIT = 1 / 9007199254740992;

/**
 * Splits a non-negative integer into little-endian uint32 words ([0] for 0),
 * as numpy's _int_to_uint32_array.
 *
 * @param {number | bigint} value
 * @returns {number[]}
 */
export function uint32Words(value) {
  let n = BigInt(value);
  if (n < 0n) {
    throw new RangeError(`seeds must be non-negative integers, got ${value}`);
  }
  if (n === 0n) {
    return [0];
  }
  const words = [];
  while (n > 0n) {
    words.push(Number(n & 0xffffffffn));
    n >>= 32n;
  }
  return words;
}

/** numpy.random.SeedSequence, without spawn keys (rlfleet never spawns). */
export class SeedSequence {
  /**
   * @param {number | bigint | Array<number | bigint>} entropy A non-negative
   *   integer or a list of them (each split into uint32 words, concatenated).
   */
  constructor(entropy) {
    const parts = Array.isArray(entropy) ? entropy : [entropy];
    const words = parts.flatMap(uint32Words);
    this.pool = mixEntropy(words);
  }

  /**
   * The generator state numpy's generate_state(nWords, uint32) returns.
   *
   * @param {number} nWords
   * @returns {Uint32Array}
   */
  generateState(nWords) {
    const state = new Uint32Array(nWords);
    let hashConst = INIT_B;
    for (let i = 0; i < nWords; i += 1) {
      let value = (this.pool[i % POOL_SIZE] ^ hashConst) >>> 0;
      hashConst = Math.imul(hashConst, MULT_B) >>> 0;
      value = Math.imul(value, hashConst) >>> 0;
      value = (value ^ (value >>> XSHIFT)) >>> 0;
      state[i] = value;
    }
    return state;
  }

  /**
   * generate_state(nWords, uint64): pairs of uint32 words, low word first.
   *
   * @param {number} nWords
   * @returns {bigint[]}
   */
  generateState64(nWords) {
    const words = this.generateState(2 * nWords);
    return Array.from({ length: nWords }, (_, i) => BigInt(words[2 * i]) | (BigInt(words[2 * i + 1]) << 32n));
  }
}

/**
 * @param {number[]} entropy uint32 words.
 * @returns {Uint32Array} The mixed pool.
 */
function mixEntropy(entropy) {
  const pool = new Uint32Array(POOL_SIZE);
  const hash = { value: INIT_A };
  /** @param {number} input */
  const hashmix = (input) => {
    let value = (input ^ hash.value) >>> 0;
    hash.value = Math.imul(hash.value, MULT_A) >>> 0;
    value = Math.imul(value, hash.value) >>> 0;
    return (value ^ (value >>> XSHIFT)) >>> 0;
  };
  /** @param {number} x @param {number} y */
  const mix = (x, y) => {
    const result = (Math.imul(MIX_MULT_L, x) - Math.imul(MIX_MULT_R, y)) >>> 0;
    return (result ^ (result >>> XSHIFT)) >>> 0;
  };
  for (let i = 0; i < POOL_SIZE; i += 1) {
    pool[i] = hashmix(i < entropy.length ? entropy[i] : 0);
  }
  for (let src = 0; src < POOL_SIZE; src += 1) {
    for (let dst = 0; dst < POOL_SIZE; dst += 1) {
      if (src !== dst) {
        pool[dst] = mix(pool[dst], hashmix(pool[src]));
      }
    }
  }
  for (let src = POOL_SIZE; src < entropy.length; src += 1) {
    for (let dst = 0; dst < POOL_SIZE; dst += 1) {
      pool[dst] = mix(pool[dst], hashmix(entropy[src]));
    }
  }
  return pool;
}

/** numpy.random.Generator(PCG64(seed)): numpy.random.default_rng(seed). */
export class Generator {
  /**
   * @param {number | bigint | Array<number | bigint> | SeedSequence} seed
   */
  constructor(seed) {
    const sequence = seed instanceof SeedSequence ? seed : new SeedSequence(seed);
    const [s0, s1, i0, i1] = sequence.generateState64(4);
    const initState = (s0 << 64n) | s1;
    const initSeq = (i0 << 64n) | i1;
    this.increment = ((initSeq << 1n) | 1n) & MASK128;
    this.state = 0n;
    this.step();
    this.state = (this.state + initState) & MASK128;
    this.step();
    /** @type {number | null} The buffered high half of the last 64-bit draw. */
    this.spare32 = null;
  }

  /** Advances the 128-bit LCG. */
  step() {
    this.state = (this.state * PCG_MULTIPLIER + this.increment) & MASK128;
  }

  /** @returns {bigint} The next 64 random bits (XSL-RR output). */
  nextUint64() {
    this.step();
    const xored = ((this.state >> 64n) ^ this.state) & MASK64;
    const rotation = this.state >> 122n;
    return ((xored >> rotation) | (xored << ((64n - rotation) & 63n))) & MASK64;
  }

  /** @returns {number} The next 32 random bits (half of a 64-bit draw, low half first). */
  nextUint32() {
    if (this.spare32 !== null) {
      const spare = this.spare32;
      this.spare32 = null;
      return spare;
    }
    const bits = this.nextUint64();
    this.spare32 = Number(bits >> 32n);
    return Number(bits & 0xffffffffn);
  }

  /** @returns {number} A double in [0, 1): Generator.random(). */
  random() {
    return Number(this.nextUint64() >> 11n) * DOUBLE_UNIT;
  }

  /**
   * Generator.uniform(low, high) for one value.
   *
   * @param {number} low
   * @param {number} high
   * @returns {number}
   */
  uniform(low, high) {
    return low + (high - low) * this.random();
  }

  /**
   * Generator.integers(n) for one value, 1 <= n <= 2**32: Lemire's
   * unbiased bounded draw on 32-bit words, as numpy does for such ranges.
   *
   * @param {number} n Exclusive upper bound.
   * @returns {number} An integer in [0, n).
   */
  integers(n) {
    if (!Number.isSafeInteger(n) || n < 1 || n > 2 ** 32) {
      throw new RangeError(`integers(n) takes 1 <= n <= 2**32, got ${n}`);
    }
    const range = n - 1;
    if (range === 0) {
      return 0;
    }
    if (range === MASK32) {
      return this.nextUint32();
    }
    const bound = BigInt(n);
    let product = BigInt(this.nextUint32()) * bound;
    let leftover = Number(product & 0xffffffffn);
    if (leftover < n) {
      const threshold = (MASK32 - range) % n;
      while (leftover < threshold) {
        product = BigInt(this.nextUint32()) * bound;
        leftover = Number(product & 0xffffffffn);
      }
    }
    return Number(product >> 32n);
  }
}
