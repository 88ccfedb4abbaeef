/**
 * One Join stream (worker.proto WorkerService.Join) as an inbox the worker
 * loop reads at its own pace, plus sending with backpressure.
 *
 * @module
 */
import grpc from '@grpc/grpc-js';

/**
 * The stream ended, with the call's final status.
 *
 * @typedef {{ended: true, code: number, details: string}} StreamEnded
 */
/** A nudge with no message (a leave request, a timer). @typedef {{wakeup: true}} Wakeup */
/** @typedef {any | StreamEnded | Wakeup} Incoming */

export class JoinStream {
  /**
   * @param {grpc.Client} client A WorkerService client.
   * @param {grpc.Metadata} metadata Call metadata (authorization).
   */
  constructor(client, metadata) {
    /** @type {Incoming[]} */
    this.inbox = [];
    /** @type {(() => void) | null} */
    this.notify = null;
    /** @type {StreamEnded | null} */
    this.ended = null;
    this.writable = true;
    /** @type {grpc.ClientDuplexStream<any, any>} */
    this.call = /** @type {any} */ (client).Join(metadata);
    this.call.on('data', (/** @type {any} */ message) => this.push(message));
    // Every failure also arrives as 'status'; this listener only keeps a
    // non-OK status from becoming an uncaught 'error' event.
    this.call.on('error', () => {});
    /** @type {(() => void) | null} */
    this.drainWaiter = null;
    this.call.on('status', (/** @type {grpc.StatusObject} */ status) => {
      this.ended = { ended: true, code: status.code, details: status.details };
      this.push(this.ended);
      this.drained();
    });
    this.call.on('drain', () => this.drained());
  }

  /** Releases a waitWritable(). */
  drained() {
    this.writable = true;
    const waiter = this.drainWaiter;
    this.drainWaiter = null;
    waiter?.();
  }

  /** @param {Incoming} item */
  push(item) {
    this.inbox.push(item);
    this.wake();
  }

  /** Wakes a pending next() without a message (it returns a Wakeup). */
  wake() {
    const notify = this.notify;
    this.notify = null;
    notify?.();
  }

  /**
   * The next incoming item, waiting at most `timeoutMs`.
   *
   * @param {number} timeoutMs
   * @returns {Promise<Incoming | null>} null on timeout; a Wakeup if woken.
   */
  async next(timeoutMs) {
    if (this.inbox.length > 0) {
      return this.inbox.shift();
    }
    /** @type {NodeJS.Timeout | undefined} */
    let timer;
    const woken = await new Promise((resolve) => {
      this.notify = () => resolve(true);
      timer = setTimeout(() => resolve(false), Math.max(timeoutMs, 0));
    });
    clearTimeout(timer);
    this.notify = null;
    if (this.inbox.length > 0) {
      return this.inbox.shift();
    }
    return woken ? { wakeup: true } : null;
  }

  /**
   * Queues a message; false when gRPC's send buffer is full (see waitWritable).
   *
   * @param {object} message A plain WorkerMessage.
   * @returns {boolean}
   */
  send(message) {
    if (this.ended) {
      return true; // the loop sees the end in the inbox
    }
    this.writable = this.call.write(message);
    return this.writable;
  }

  /** Waits until the send buffer has room again (or the stream ended). */
  async waitWritable() {
    while (!this.writable && !this.ended) {
      await new Promise((resolve) => {
        this.drainWaiter = () => resolve(undefined);
      });
    }
  }

  /** Closes the worker's side (the coordinator then ends the call). */
  closeSend() {
    if (!this.ended) {
      this.call.end();
    }
  }

  /** Cancels the call. */
  cancel() {
    if (!this.ended) {
      this.call.cancel();
    }
  }

  /**
   * Waits for the call to end.
   *
   * @param {number} timeoutMs
   * @returns {Promise<boolean>} Whether it ended in time.
   */
  async waitClosed(timeoutMs) {
    if (this.ended) {
      return true;
    }
    const deadline = Date.now() + timeoutMs;
    while (!this.ended && Date.now() < deadline) {
      const item = await this.next(deadline - Date.now());
      if (item && !item.ended && !item.wakeup) {
        continue; // messages after our close are moot
      }
    }
    return this.ended !== null;
  }
}
