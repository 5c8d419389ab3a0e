/**
 * How the client sends requests: Node's `http` with kept connections where Node's modules are
 * there (Node, and runtimes that provide them), and `fetch` everywhere else (browsers, Cloudflare Workers, edge
 * functions) or when asked for. Nothing here imports a Node module up front, so the client
 * loads on any of them.
 */
import type http from 'node:http';

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
 * Whether Node's `http` module is here in full: on Node, Bun and Deno. A Cloudflare Worker with
 * `nodejs_compat` says it is Node too (`process.versions.node`), but its `http` is a partial layer
 * over `fetch` that fails on a streamed answer, so a Worker takes `fetch`.
 */
export function nodeModulesHere(): boolean {
  const runtime = (globalThis as { process?: { versions?: { node?: string } } }).process;
  const worker = (globalThis as { navigator?: { userAgent?: string } }).navigator?.userAgent === 'Cloudflare-Workers';
  return typeof runtime?.versions?.node === 'string' && !worker;
}

export function openTransport(kind: TransportKind, url: URL, options: TransportOptions): Transport {
  return kind === 'node' ? new NodeTransport(url, options) : new FetchTransport(url, options);
}

type HttpModule = typeof http;

/**
 * Loads a Node module by a name no bundler follows (a bundle for a browser or a worker would
 * otherwise try to include it); only called where `nodeModulesHere`.
 */
async function nodeModule(name: string): Promise<HttpModule> {
  const module = await import(/* webpackIgnore: true */ /* @vite-ignore */ name);
  return (module.default ?? module) as HttpModule;
}

interface NodeModules {
  module: HttpModule;
  agent: http.Agent;
}

class NodeTransport implements Transport {
  private loading: Promise<NodeModules> | undefined;
  /** Once loaded: each request then goes out without waiting for a promise first. */
  private loaded: NodeModules | undefined;

  constructor(
    private readonly url: URL,
    private readonly options: TransportOptions,
  ) {}

  private load(): Promise<NodeModules> {
    this.loading ??= nodeModule(this.url.protocol === 'https:' ? 'node:https' : 'node:http').then((module) => {
      // Kept connections: fetch costs about 0.2 ms more per request on a loopback connection.
      const agent = new module.Agent({ keepAlive: true, maxFreeSockets: 8, ca: this.options.ca } as http.AgentOptions);
      this.loaded = { module, agent };
      return this.loaded;
    });
    return this.loading;
  }

  send(method: string, target: string, headers: Record<string, string>, payload: string | undefined): Promise<Answer> {
    if (this.loaded === undefined) return this.load().then(() => this.send(method, target, headers, payload));
    const { module, agent } = this.loaded;
    if (payload !== undefined || ['POST', 'PUT', 'PATCH'].includes(method)) {
      headers['content-length'] = String(Buffer.byteLength(payload ?? ''));
    }
    return new Promise<Answer>((resolve, reject) => {
      const request = module.request(
        {
          agent,
          host: this.url.hostname.replace(/^\[|\]$/g, ''),
          port: this.url.port || undefined,
          method,
          path: target,
          headers,
          timeout: this.options.timeoutMs,
        },
        (answer) => resolve(nodeAnswer(answer)),
      );
      request.on('error', (error) => reject(new SendFailure(request.reusedSocket, error)));
      request.on('timeout', () => request.destroy(new TimeoutError(`no answer within ${this.options.timeoutMs} ms`)));
      request.end(payload);
    });
  }

  close(): void {
    this.loaded?.agent.destroy();
  }
}

function nodeAnswer(answer: http.IncomingMessage): Answer {
  return {
    status: answer.statusCode!,
    statusText: answer.statusMessage ?? '',
    header(name) {
      const value = answer.headers[name.toLowerCase()];
      return Array.isArray(value) ? value.join(', ') : value;
    },
    async *text() {
      answer.setEncoding('utf8');
      for await (const chunk of answer) yield chunk as string;
      if (!answer.complete) throw new Error('the answer was cut short');
    },
    async all() {
      const chunks: Buffer[] = [];
      for await (const chunk of answer) chunks.push(chunk as Buffer);
      if (!answer.complete) throw new Error('the answer was cut short');
      return Buffer.concat(chunks).toString('utf8');
    },
    discard() {
      if (!answer.complete) answer.destroy();
    },
  };
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
