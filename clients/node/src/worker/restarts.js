/**
 * The env restart budget, as rlfleet/worker/_restarts.py: at most
 * `maxRestarts` rebuilds of crashed envs within any `windowSeconds`, and
 * `maxTotal` over the worker's life. The rate limit stops a worker from
 * spinning on an env that crashes at every reset; the total limit stops
 * an occasional crash from hiding a real bug forever.
 *
 * @module
 */

export class RestartLedger {
  /**
   * @param {{maxRestarts?: number, windowSeconds?: number, maxTotal?: number,
   *          clock?: () => number}} [budget] clock: monotonic seconds (tests inject one).
   */
  constructor({ maxRestarts = 5, windowSeconds = 60, maxTotal = 50, clock = () => performance.now() / 1000 } = {}) {
    this.maxRestarts = maxRestarts;
    this.windowSeconds = windowSeconds;
    this.maxTotal = maxTotal;
    this.clock = clock;
    /** @type {number[]} */
    this.recent = [];
    this.total = 0;
  }

  /** @returns {boolean} True if one more restart is allowed (and counts it). */
  tryRestart() {
    const now = this.clock();
    this.recent = this.recent.filter((time) => time > now - this.windowSeconds);
    if (this.total >= this.maxTotal || this.recent.length >= this.maxRestarts) {
      return false;
    }
    this.recent.push(now);
    this.total += 1;
    return true;
  }

  /** @returns {string} The budget and what is spent, for messages. */
  describe() {
    return (
      `restart budget spent: ${this.total} of ${this.maxTotal} in total, ` +
      `${this.recent.length} of ${this.maxRestarts} per ${this.windowSeconds}s`
    );
  }
}
