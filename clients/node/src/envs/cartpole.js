/**
 * CartPole, a port of gymnasium's CartPole-v1 (classic_control/cartpole.py)
 * with identical dynamics: same constants, same Euler integrator, same
 * order of floating-point operations in float64, same termination test,
 * same reward. Observations are the float64 state cast to float32.
 *
 * reset(seed) draws the initial state uniformly in [-0.05, 0.05]^4 from
 * numpy's default generator seeded with `seed` (./random.js), as gymnasium
 * does, so the same seed gives the same initial state as Python.
 *
 * @module
 */
import { ConfigError } from '../errors.js';
import { Generator } from '../random.js';
import { tensor } from '../tensor.js';

const GRAVITY = 9.8;
const MASSCART = 1.0;
const MASSPOLE = 0.1;
const TOTAL_MASS = MASSPOLE + MASSCART;
const LENGTH = 0.5; // half the pole's length
const POLEMASS_LENGTH = MASSPOLE * LENGTH;
const FORCE_MAG = 10.0;
const TAU = 0.02;
/** Angle at which the episode terminates: 12 degrees. */
export const THETA_THRESHOLD_RADIANS = (12 * 2 * Math.PI) / 360;
export const X_THRESHOLD = 2.4;

/** Observation bounds, as gymnasium's float32 Box (infinite velocities). */
const HIGH = Float32Array.of(X_THRESHOLD * 2, Infinity, THETA_THRESHOLD_RADIANS * 2, Infinity);

/** The env's spaces: Box(4,) float32 observations, Discrete(2) actions. */
export function cartPoleSpaces() {
  return {
    observationSpace: /** @type {import('../spaces.js').Space} */ ({
      kind: 'box',
      shape: [4],
      dtype: 'float32',
      low: tensor('float32', [4], HIGH.map((x) => -x)),
      high: tensor('float32', [4], HIGH.slice()),
    }),
    actionSpace: /** @type {import('../spaces.js').Space} */ ({ kind: 'discrete', n: 2, start: 0 }),
  };
}

/** gymnasium's CartPoleEnv, without rendering. */
export class CartPoleEnv {
  /**
   * @param {{sutton_barto_reward?: boolean}} [kwargs] gymnasium's keyword
   *   arguments; `sutton_barto_reward` gives 0 per step and -1 on failure.
   * @throws {ConfigError} For any other keyword or a non-boolean value.
   */
  constructor(kwargs = {}) {
    const unknown = Object.keys(kwargs).filter((key) => key !== 'sutton_barto_reward');
    if (unknown.length > 0) {
      throw new ConfigError(
        `CartPole got unexpected kwargs ${JSON.stringify(unknown)}; it takes only sutton_barto_reward (bool)`,
      );
    }
    const sutton = kwargs.sutton_barto_reward ?? false;
    if (typeof sutton !== 'boolean') {
      throw new ConfigError(`CartPole sutton_barto_reward must be true or false, got ${JSON.stringify(sutton)}`);
    }
    this.suttonBartoReward = sutton;
    const spaces = cartPoleSpaces();
    this.observationSpace = spaces.observationSpace;
    this.actionSpace = spaces.actionSpace;
    /** The float64 state (x, x_dot, theta, theta_dot); public for tests. */
    this.state = new Float64Array(4);
    this.needsReset = true;
  }

  /**
   * Starts an episode.
   *
   * @param {number} seed The episode's env_seed (uint32).
   * @returns {Float32Array} The first observation.
   */
  reset(seed) {
    const rng = new Generator(seed);
    for (let i = 0; i < 4; i += 1) {
      this.state[i] = rng.uniform(-0.05, 0.05);
    }
    this.needsReset = false;
    return Float32Array.from(this.state);
  }

  /**
   * Advances by one time step.
   *
   * @param {number} action 0 pushes left, 1 pushes right.
   * @returns {{observation: Float32Array, reward: number, terminated: boolean, truncated: boolean}}
   * @throws {RangeError} If the action is not 0 or 1, or reset() is due.
   */
  step(action) {
    if (action !== 0 && action !== 1) {
      throw new RangeError(`CartPole action must be 0 or 1, got ${action}`);
    }
    if (this.needsReset) {
      throw new RangeError('CartPole.step called before reset() (or after the episode terminated)');
    }
    let [x, xDot, theta, thetaDot] = this.state;
    const force = action === 1 ? FORCE_MAG : -FORCE_MAG;
    const costheta = Math.cos(theta);
    const sintheta = Math.sin(theta);
    // Same expression order as gymnasium, so float64 rounding matches.
    const temp = (force + POLEMASS_LENGTH * (thetaDot * thetaDot) * sintheta) / TOTAL_MASS;
    const thetaacc =
      (GRAVITY * sintheta - costheta * temp) /
      (LENGTH * (4.0 / 3.0 - (MASSPOLE * (costheta * costheta)) / TOTAL_MASS));
    const xacc = temp - (POLEMASS_LENGTH * thetaacc * costheta) / TOTAL_MASS;
    x += TAU * xDot;
    xDot += TAU * xacc;
    theta += TAU * thetaDot;
    thetaDot += TAU * thetaacc;
    this.state.set([x, xDot, theta, thetaDot]);
    const terminated =
      x < -X_THRESHOLD || x > X_THRESHOLD || theta < -THETA_THRESHOLD_RADIANS || theta > THETA_THRESHOLD_RADIANS;
    this.needsReset = terminated;
    let reward = 1.0;
    if (this.suttonBartoReward) {
      reward = terminated ? -1.0 : 0.0;
    }
    return { observation: Float32Array.from(this.state), reward, terminated, truncated: false };
  }
}
