// Synchronous calls into an asynchronous worker thread: the main thread
// posts a request on a MessagePort and blocks in Atomics.wait on a shared
// word until the worker has posted its answer, then takes the answer off
// the port with receiveMessageOnPort (its event loop is not running, so a
// listener would never fire). jco's synchronous instantiation calls the
// store's imports synchronously; this is how they reach an asynchronous
// Redis client. The worker side is `serve`.

import { MessageChannel, Worker, receiveMessageOnPort, workerData } from 'node:worker_threads';

/** A call that got no answer in time, or whose worker failed: carries the payload jco lowers. */
export class BridgeError extends Error {
  /** `payload` is the `{tag, val}` error handed to the component. */
  constructor(payload) {
    super(typeof payload.val === 'string' ? payload.val : payload.tag);
    this.name = 'BridgeError';
    // jco's import wrapper hands `payload` to the component as the result's error.
    this.payload = payload;
  }
}

/** The main thread's end: a worker running `moduleUrl`, called synchronously. */
export class SyncWorker {
  /**
   * Start the worker; `data` is passed to it as `workerData.data`, `label`
   * begins the messages of this side's errors. The worker does not keep the
   * process alive.
   */
  constructor(moduleUrl, data, label = 'worker') {
    this.label = label;
    // Word 0: the id of the last request the worker answered.
    this.word = new Int32Array(new SharedArrayBuffer(4));
    const { port1, port2 } = new MessageChannel();
    this.port = port1;
    this.worker = new Worker(moduleUrl, {
      workerData: { port: port2, word: this.word, data },
      transferList: [port2],
    });
    this.worker.unref();
    this.port.unref();
    this.lastId = 0;
    // Whether the worker has answered anything yet (it has started).
    this.answered = false;
  }

  /**
   * Send `request` and block until the worker answers it, at most
   * `timeoutMs`. Returns the answer's value, or throws a BridgeError with
   * the worker's `{tag, val}` error, or an `unavailable` one on timeout.
   */
  call(request, timeoutMs) {
    // Ids stay positive int32s; 0 is "nothing answered yet".
    const id = (this.lastId = (this.lastId % 0x7ffffffe) + 1);
    this.port.postMessage({ id, request });
    const deadline = performance.now() + timeoutMs;
    for (;;) {
      const seen = Atomics.load(this.word, 0);
      if (seen === id) break;
      const left = deadline - performance.now();
      if (left <= 0) {
        throw new BridgeError({ tag: 'unavailable', val: `${this.label}: no answer from the worker thread within ${timeoutMs} ms` });
      }
      // Also woken by a late answer to an earlier request: then look again.
      Atomics.wait(this.word, 0, seen, left);
    }
    this.answered = true;
    // Answers to earlier requests that timed out here are dropped.
    for (;;) {
      const message = receiveMessageOnPort(this.port)?.message;
      if (message === undefined) throw new BridgeError({ tag: 'unavailable', val: `${this.label}: the worker thread answered without a reply` });
      if (message.id !== id) continue;
      if (message.ok) return message.value;
      throw new BridgeError(message.error);
    }
  }

  /** Stop the worker. */
  terminate() {
    this.port.close();
    return this.worker.terminate();
  }
}

/**
 * The worker's end: answer each request with `await handler(request)`. A
 * thrown `{tag, val}` (or an Error with a `payload`) is sent back as the
 * error; anything else thrown becomes `unavailable` with its message.
 */
export function serve(handler) {
  const { port, word } = workerData;
  port.on('message', async ({ id, request }) => {
    let answer;
    try {
      answer = { id, ok: true, value: await handler(request) };
    } catch (e) {
      answer = { id, ok: false, error: toPayload(e) };
    }
    // Post first: once the word says `id`, the answer must be on the port.
    port.postMessage(answer);
    Atomics.store(word, 0, id);
    Atomics.notify(word, 0);
  });
}

function toPayload(e) {
  if (e && typeof e === 'object' && 'payload' in e) return e.payload;
  if (e && typeof e === 'object' && 'tag' in e && !(e instanceof Error)) return e;
  return { tag: 'unavailable', val: `worker: ${e?.message ?? String(e)}` };
}
