/**
 * How the client sends requests: an HTTP/1.1 of its own over Node's sockets (`node:net`,
 * `node:tls`) with kept connections where Node's modules are there (Node, Bun, Deno), and
 * `fetch` everywhere else (browsers, Cloudflare Workers, edge functions) or when asked for.
 * Nothing here imports a Node module up front, so the client loads on any of them.
 *
 * Why not `node:http`: its request and answer objects, streams and agent cost about 0.1 ms a
 * request on a loopback connection, half of a small request's time, and sessiondb's answers
 * need none of it: a status line, a few headers, then a body framed by `Content-Length` or
 * chunked (the Python client reads them the same way).
 */
import type net from 'node:net';
import type tls from 'node:tls';

export type TransportKind = 'node' | 'fetch';

/** One answer, its body not yet read. */
export interface Answer {
  readonly status: number;
  readonly statusText: string;
  header(name: string): string | undefined;
  /**
   * The body as text, chunk by chunk as it arrives; throws when the connection breaks or the
   * answer ends short of what its framing announced.
   */
  text(): AsyncIterable<string>;
  /** The whole body as text (`text()` joined, in fewer steps); throws as `text()` does. */
  all(): Promise<string>;
  /** Lets go of an answer not read to its end (its connection cannot serve another request). */
  discard(): void;
}

/** A request that got no answer; `reused`: it went out on a kept connection. */
export class SendFailure extends Error {
  constructor(
    readonly reused: boolean,
    readonly error: Error,
  ) {
    super(error.message);
  }
}

export class TimeoutError extends Error {}

/** A request this transport cannot send as asked; nothing was sent. */
export class Unsendable extends Error {}

export interface Transport {
  /**
   * Sends one request (`target`: path and query, as they are); rejects with a `SendFailure`
   * (or an `Unsendable`, before sending anything).
   */
  send(method: string, target: string, headers: Record<string, string>, payload: string | undefined): Promise<Answer>;
  close(): void;
}

export interface TransportOptions {
  /** How long an answer may keep the client waiting for its next bytes. */
  timeoutMs: number;
  /** Certificates to trust for `https:` (Node's transport only). */
  ca?: string | Uint8Array | Array<string | Uint8Array>;
}

/**
 * Whether Node's modules are here in full: on Node, Bun and Deno. A Cloudflare Worker with
 * `nodejs_compat` says it is Node too (`process.versions.node`), but its `node:` modules are a
 * partial layer over `fetch` (its `http` failed on a streamed answer), so a Worker takes `fetch`.
 */
export function nodeModulesHere(): boolean {
  const runtime = (globalThis as { process?: { versions?: { node?: string } } }).process;
  const worker = (globalThis as { navigator?: { userAgent?: string } }).navigator?.userAgent === 'Cloudflare-Workers';
  return typeof runtime?.versions?.node === 'string' && !worker;
}

export function openTransport(kind: TransportKind, url: URL, options: TransportOptions): Transport {
  return kind === 'node' ? new SocketTransport(url, options) : new FetchTransport(url, options);
}

/**
 * Loads a Node module by a name no bundler follows (a bundle for a browser or a worker would
 * otherwise try to include it); only called where `nodeModulesHere`.
 */
async function nodeModule<T>(name: string): Promise<T> {
  const module = await import(/* webpackIgnore: true */ /* @vite-ignore */ name);
  return (module.default ?? module) as T;
}

/** Idle connections kept for the next requests; more are closed when they come back. */
const MAX_IDLE = 8;
/** Longest answer head read; a longer one is not an answer of this API. */
const MAX_HEAD = 64 * 1024;
/** Unread answer bytes past which the socket stops reading until the reader catches up. */
const HIGH_WATER = 1 << 20;
/**
 * A body longer than this is sent once the server asks for it (`Expect: 100-continue`): one it
 * refuses (over its limit, say) is answered without being sent. Node destroys a socket whose
 * write fails, with the answer that came before unread, so a body sent whole to a server that
 * answered and closed would end in `EPIPE`, not in its answer.
 */
const ASK_BEFORE_BYTES = 1 << 20;
/** How long a request that asked waits for the server's answer before sending its body anyway. */
const CONTINUE_WITHIN_MS = 1000;
/** What Node's `http` refuses in a header value or a request target: control characters. */
const UNSENDABLE = /[^\t\x20-\x7e\x80-\xff]/;

type Connect = (options: net.NetConnectOpts & tls.ConnectionOptions) => net.Socket;

class SocketTransport implements Transport {
  private connect: Connect | undefined;
  private loading: Promise<Connect> | undefined;
  private readonly idle: Connection[] = [];

  constructor(
    private readonly url: URL,
    private readonly options: TransportOptions,
  ) {}

  private load(): Promise<Connect> {
    const secure = this.url.protocol === 'https:';
    this.loading ??= nodeModule<typeof net | typeof tls>(secure ? 'node:tls' : 'node:net').then((module) => {
      this.connect = module.connect as Connect;
      return this.connect;
    });
    return this.loading;
  }

  send(method: string, target: string, headers: Record<string, string>, payload: string | undefined): Promise<Answer> {
    if (this.connect === undefined) return this.load().then(() => this.send(method, target, headers, payload));
    let head = `${method} ${target} HTTP/1.1\r\nhost: ${this.url.host}\r\n`;
    let unsendable = UNSENDABLE.test(target);
    for (const [name, value] of Object.entries(headers)) {
      unsendable ||= UNSENDABLE.test(value);
      head += `${name}: ${value}\r\n`;
    }
    if (unsendable) {
      return Promise.reject(new Unsendable('a header or the path holds a control character, which HTTP cannot carry'));
    }
    const length = payload === undefined ? 0 : Buffer.byteLength(payload);
    if (payload !== undefined || ['POST', 'PUT', 'PATCH'].includes(method)) head += `content-length: ${length}\r\n`;
    const asks = length > ASK_BEFORE_BYTES;
    if (asks) head += 'expect: 100-continue\r\n';
    let kept: Connection | undefined;
    while ((kept = this.idle.pop()) !== undefined && kept.unusable) kept.destroy();
    const reused = kept !== undefined;
    const connection = kept?.reuse() ?? new Connection(this.open(), this.options.timeoutMs, (done) => this.release(done));
    const exchange = asks ? connection.exchange(`${head}\r\n`, false, payload) : connection.exchange(`${head}\r\n${payload ?? ''}`, method === 'HEAD');
    return exchange.catch((error: Error) => {
      throw new SendFailure(reused, error);
    });
  }

  private open(): net.Socket {
    const host = this.url.hostname.replace(/^\[|\]$/g, '');
    const secure = this.url.protocol === 'https:';
    const port = Number(this.url.port) || (secure ? 443 : 80);
    const named = secure && !/^[\d.]+$|:/.test(host);
    const socket = this.connect!({
      host,
      port,
      ca: this.options.ca as tls.ConnectionOptions['ca'],
      servername: named ? host : undefined,
      ALPNProtocols: secure ? ['http/1.1'] : undefined,
    });
    socket.setNoDelay(true);
    return socket;
  }

  /** A connection whose answer was read to its end, for the next request. */
  private release(connection: Connection): void {
    if (this.idle.length < MAX_IDLE) this.idle.push(connection);
    else connection.destroy();
  }

  close(): void {
    for (const connection of this.idle.splice(0)) connection.destroy();
  }
}

/**
 * One connection: a request at a time, its answer parsed from the bytes as they arrive. Between
 * requests nothing is due from the server, so a kept connection that received anything (its
 * end, an error, or bytes) is not used again.
 */
class Connection {
  /** Bytes received and not yet taken, from `at`. */
  private buffer: Buffer = Buffer.alloc(0);
  private at = 0;
  private ended = false;
  private failure: Error | undefined;
  private wake: (() => void) | undefined;
  /** The request in flight has been handed to the socket whole (a later one may follow it). */
  private written = false;

  constructor(
    private readonly socket: net.Socket,
    timeoutMs: number,
    private readonly release: (connection: Connection) => void,
  ) {
    socket.on('data', (data: Buffer) => {
      this.buffer = this.at === this.buffer.length ? data : Buffer.concat([this.buffer.subarray(this.at), data]);
      this.at = 0;
      if (this.buffer.length > HIGH_WATER) socket.pause();
      this.notify();
    });
    const ended = () => {
      this.ended = true;
      this.notify();
    };
    socket.on('end', ended);
    socket.on('close', ended);
    socket.on('error', (error: Error) => {
      this.failure ??= error;
      this.notify();
    });
    // Counts from the request or the latest bytes; a kept connection idle that long is closed.
    socket.setTimeout(timeoutMs);
    socket.on('timeout', () => socket.destroy(new TimeoutError(`no answer within ${timeoutMs} ms`)));
  }

  /** A kept connection, for another request. */
  reuse(): this {
    this.socket.ref();
    return this;
  }

  /** It cannot serve another request: it ended, broke, or holds bytes nobody asked for. */
  get unusable(): boolean {
    return this.ended || this.failure !== undefined || this.unread > 0;
  }

  destroy(): void {
    this.socket.destroy();
  }

  private notify(): void {
    const wake = this.wake;
    this.wake = undefined;
    wake?.();
  }

  /**
   * Waits for more bytes (or the end); throws what broke the connection, or that it ended
   * before `due` came. Bytes that came before it broke are taken first: a server may answer
   * before it has read a request's whole body (one over its limit) and close the connection,
   * which then fails the request's writing.
   */
  private async more(due: string): Promise<void> {
    if (this.failure !== undefined) throw this.failure;
    if (this.ended) throw new Error(`the connection closed before ${due}`);
    if (this.socket.isPaused()) this.socket.resume();
    await new Promise<void>((resolve) => (this.wake = resolve));
  }

  private get unread(): number {
    return this.buffer.length - this.at;
  }

  /** Takes up to `most` unread bytes. */
  private take(most: number): Buffer {
    const taken = this.buffer.subarray(this.at, this.at + most);
    this.at += taken.length;
    return taken;
  }

  /** Takes a line ending in CRLF (without it), waiting for it. */
  private async line(what: string): Promise<string> {
    for (;;) {
      const end = this.buffer.indexOf('\r\n', this.at);
      if (end >= 0) {
        const line = this.buffer.toString('latin1', this.at, end);
        this.at = end + 2;
        return line;
      }
      if (this.unread > MAX_HEAD) throw new Error(`${what} longer than ${MAX_HEAD} bytes`);
      await this.more(what);
    }
  }

  /**
   * Sends `request` and reads its answer's head. `held`: a body that follows once the server
   * asks for it (`100 Continue`) or has not answered within `CONTINUE_WITHIN_MS`; answered
   * before, it is never sent, and the connection is not used again.
   */
  async exchange(request: string, head: boolean, held?: string): Promise<Answer> {
    this.written = false;
    const sent = () => (this.written = true);
    if (held === undefined) {
      this.socket.write(request, sent);
      return this.answerHead(head);
    }
    this.socket.write(request);
    const sendHeld = () => {
      clearTimeout(timer);
      if (held !== undefined) this.socket.write(held, sent);
      held = undefined;
    };
    const timer = setTimeout(sendHeld, CONTINUE_WITHIN_MS);
    try {
      return await this.answerHead(head, sendHeld);
    } finally {
      clearTimeout(timer);
    }
  }

  /** The head of the answer to the request sent; `asked` is called on a `100 Continue`. */
  private async answerHead(head: boolean, asked?: () => void): Promise<Answer> {
    for (;;) {
      // The head is parsed once it is all here (on a loopback connection, with the first bytes).
      let end: number;
      while ((end = this.buffer.indexOf('\r\n\r\n', this.at)) < 0) {
        if (this.unread > MAX_HEAD) throw new Error(`an answer head longer than ${MAX_HEAD} bytes`);
        await this.more('an answer');
      }
      const [status, ...lines] = this.buffer.toString('latin1', this.at, end).split('\r\n');
      this.at = end + 4;
      const match = /^HTTP\/1\.\d (\d{3})(?: (.*))?$/.exec(status);
      if (match === null) throw new Error(`not an HTTP/1.1 status line: ${JSON.stringify(status.slice(0, 80))}`);
      const headers = new Map<string, string>();
      for (const line of lines) {
        const colon = line.indexOf(':');
        if (colon <= 0) throw new Error(`not an HTTP header: ${JSON.stringify(line.slice(0, 80))}`);
        const name = line.slice(0, colon).trim().toLowerCase();
        const value = line.slice(colon + 1).trim();
        headers.set(name, headers.has(name) ? `${headers.get(name)}, ${value}` : value);
      }
      const code = Number(match[1]);
      // An interim answer (`100 Continue`, `103 Early Hints`) comes before the one asked for.
      if (code === 100) asked?.();
      if (code >= 100 && code < 200) continue;
      return this.answer(code, match[2] ?? '', headers, head || code === 204 || code === 304);
    }
  }

  private answer(status: number, statusText: string, headers: Map<string, string>, empty: boolean): Answer {
    const chunked = !empty && /\bchunked\b/i.test(headers.get('transfer-encoding') ?? '');
    const announced = headers.get('content-length');
    const length = empty ? 0 : chunked || announced === undefined || !/^\d+$/.test(announced) ? undefined : Number(announced);
    // Without a length or chunks the body runs to the end of the connection.
    const reusable = (chunked || length !== undefined) && !/\bclose\b/i.test(headers.get('connection') ?? '');
    let complete = false;
    const connection = this;
    const finish = () => {
      complete = true;
      if (reusable && connection.written && !connection.unusable) {
        // Kept, it does not keep the process alive; `reuse` takes it back.
        connection.socket.unref();
        connection.release(connection);
      } else {
        connection.destroy();
      }
    };
    async function* blocks(): AsyncGenerator<Buffer> {
      if (chunked) {
        for (;;) {
          const sizeLine = await connection.line('a chunk size');
          const digits = sizeLine.split(';', 1)[0].trim();
          const size = parseInt(digits, 16);
          if (!/^[\da-f]+$/i.test(digits) || !Number.isSafeInteger(size)) {
            throw new Error(`a chunk size was due, not ${JSON.stringify(sizeLine.slice(0, 80))}`);
          }
          if (size === 0) {
            while ((await connection.line('a trailer')) !== '') {}
            break;
          }
          yield* connection.bytes(size);
          if ((await connection.line('the end of a chunk')) !== '') throw new Error('a chunk ran past its size');
        }
      } else if (length !== undefined) {
        yield* connection.bytes(length);
      } else {
        for (;;) {
          if (connection.unread > 0) yield connection.take(connection.unread);
          else if (connection.ended && connection.failure === undefined) break;
          else await connection.more('its end');
        }
      }
      finish();
    }
    return {
      status,
      statusText,
      header: (name) => headers.get(name.toLowerCase()),
      async *text() {
        const decoder = new TextDecoder();
        for await (const block of blocks()) yield decoder.decode(block, { stream: true });
        const rest = decoder.decode();
        if (rest !== '') yield rest;
      },
      async all() {
        if (length !== undefined && connection.unread >= length && !complete) {
          // Usually all there by now, with the head.
          const body = connection.take(length).toString('utf8');
          finish();
          return body;
        }
        const parts: Buffer[] = [];
        for await (const block of blocks()) parts.push(block);
        return (parts.length === 1 ? parts[0] : Buffer.concat(parts)).toString('utf8');
      },
      discard() {
        if (!complete) {
          complete = true;
          connection.destroy();
        }
      },
    };
  }

  /** Yields the next `count` bytes as they arrive. */
  private async *bytes(count: number): AsyncGenerator<Buffer> {
    while (count > 0) {
      if (this.unread === 0) {
        await this.more(`the answer's last ${count} bytes`);
        continue;
      }
      const block = this.take(count);
      count -= block.length;
      yield block;
    }
  }
}

/**
 * `fetch`. Its URL parser resolves `.` and `..` path segments (percent-encoded too), so a
 * request naming a session or message `.` or `..` would reach another route: such a request
 * is refused before it is sent. The runtime keeps its own connections, so `reused` is never
 * known, and a failed request is never sent again.
 */
class FetchTransport implements Transport {
  private readonly origin: string;

  constructor(
    url: URL,
    private readonly options: TransportOptions,
  ) {
    this.origin = url.origin;
  }

  async send(method: string, target: string, headers: Record<string, string>, payload: string | undefined): Promise<Answer> {
    const path = target.split('?', 1)[0];
    if (path.split('/').some((segment) => /^(\.|%2e){1,2}$/i.test(segment))) {
      throw new Unsendable(`fetch cannot send the path ${path} as it is (it resolves "." and ".." segments)`);
    }
    const timeoutMs = this.options.timeoutMs;
    const aborts = new AbortController();
    let timer: ReturnType<typeof setTimeout> | undefined;
    // The timeout counts from the request or the latest bytes, as Node's socket timeout does,
    // so a change feed that keeps sending is never cut.
    const waitAgain = () => {
      clearTimeout(timer);
      timer = setTimeout(() => aborts.abort(new TimeoutError(`no answer within ${timeoutMs} ms`)), timeoutMs);
    };
    waitAgain();
    let response: Response;
    try {
      response = await fetch(this.origin + target, { method, headers, body: payload, signal: aborts.signal, redirect: 'manual' });
    } catch (failure) {
      clearTimeout(timer);
      throw new SendFailure(false, aborts.signal.aborted ? (aborts.signal.reason as Error) : causeOf(failure));
    }
    waitAgain();
    let ended = false;
    const end = () => {
      ended = true;
      clearTimeout(timer);
    };
    const answer: Answer = {
      status: response.status,
      statusText: response.statusText,
      header: (name) => response.headers.get(name) ?? undefined,
      async *text() {
        if (response.body === null) return end();
        const reader = response.body.getReader();
        const decoder = new TextDecoder();
        try {
          for (;;) {
            const { done, value } = await reader.read();
            if (done) break;
            waitAgain();
            yield decoder.decode(value, { stream: true });
          }
        } catch (failure) {
          throw aborts.signal.aborted ? (aborts.signal.reason as Error) : causeOf(failure);
        } finally {
          clearTimeout(timer);
        }
        end();
        const rest = decoder.decode();
        if (rest !== '') yield rest;
      },
      async all() {
        let text = '';
        for await (const chunk of answer.text()) text += chunk;
        return text;
      },
      discard() {
        if (!ended) {
          end();
          aborts.abort();
        }
      },
    };
    return answer;
  }

  close(): void {}
}

/** The network error under fetch's generic `TypeError: fetch failed`. */
function causeOf(failure: unknown): Error {
  const error = failure as Error & { cause?: unknown };
  return error.cause instanceof Error ? new Error(`${error.message}: ${error.cause.message}`) : error;
}
