/** A client for the sessiondb HTTP API (Node 20's `fetch`, no dependencies). */
import { createHash } from 'node:crypto';

export type Json = null | boolean | number | string | Json[] | { [key: string]: Json };

/** A message as it is appended: `parts` (AI SDK UIMessage shape) and/or `content`. */
export interface MessageInput {
  id?: string;
  role: string;
  parts?: Json[];
  content?: Json;
  metadata?: { [key: string]: Json };
}

/** A message as sessiondb stores it. */
export interface StoredMessage extends MessageInput {
  id: string;
  createdAt: number;
  updatedAt?: number;
}

export interface SessionRecord {
  id: string;
  name: string | null;
  parentSessionId: string | null;
  model: string | null;
  source: string | null;
  userId: string | null;
  metadata: { [key: string]: Json };
  settings: { compactAfter?: number; keepRecentTokens?: number };
  createdAt: number;
  updatedAt: number;
  lastMessageAt: number | null;
  endReason: string | null;
  inputTokens: number;
  outputTokens: number;
  cost: number;
  messageCount: number;
  leafId: string | null;
  tokenEstimate: number;
  contentBytes: number;
}

export interface Page<T> {
  items: T[];
  nextCursor?: string;
  previousCursor?: string;
}

/** One line of `GET …/export`. */
export type ExportLine =
  | { message: StoredMessage; parentId: string | null; createdAt: number }
  | { compaction: Compaction }
  | { state: { key: string; value: Json } };

export interface Compaction {
  id: string;
  summary: string;
  fromMessageId: string;
  toMessageId: string;
  createdAt: number;
}

export interface SearchHit {
  id: string;
  role: string;
  content: string;
  sessionId: string;
  createdAt: number;
}

/**
 * An error answer of the server: its HTTP status and the typed error it sent. `code` is one of
 * the API's error codes (`invalid_request`, `not_found`, `conflict`, `quota_exceeded`, ...). A
 * request that never got an answer is a {@link SessiondbUnavailable}.
 */
export class SessiondbError extends Error {
  constructor(
    readonly status: number | undefined,
    readonly code: string,
    message: string,
  ) {
    super(status === undefined ? `${code}: ${message}` : `${status} ${code}: ${message}`);
    this.name = 'SessiondbError';
  }
}

/** The server could not be reached, or the connection broke before an answer. */
export class SessiondbUnavailable extends SessiondbError {
  constructor(message: string) {
    super(undefined, 'unavailable', message);
    this.name = 'SessiondbUnavailable';
  }
}

export interface ClientOptions {
  /** `http://127.0.0.1:8787` (what `sessiondb serve` listens on) by default. */
  baseUrl?: string;
  /** Sent as `Authorization: Bearer`; without one, requests are anonymous. */
  apiKey?: string;
  timeoutMs?: number;
}

type Query = Record<string, string | number | undefined>;

/**
 * Percent-encodes one path segment the way Python's `urllib.parse.quote(s, safe="")` does,
 * so ids derived from names are the same in both clients.
 */
export function quoteSegment(value: string): string {
  return encodeURIComponent(value).replace(
    /[!'()*]/g,
    (c) => `%${c.charCodeAt(0).toString(16).toUpperCase()}`,
  );
}

export const MAX_ID_CHARS = 256;

/** Whether sessiondb takes `value` as a role or an id: 1..256 characters, none of them a control character. */
export function usableName(value: unknown): value is string {
  // eslint-disable-next-line no-control-regex
  return typeof value === 'string' && value.length > 0 && [...value].length <= MAX_ID_CHARS && !/[\u0000-\u001f\u007f-\u009f]/.test(value);
}

/** Whether sessiondb takes `value` as a message id: a usable name without the reserved `compaction_` prefix. */
export function usableId(value: unknown): value is string {
  return usableName(value) && !value.startsWith('compaction_');
}

/**
 * `name` as a message id when it is a usable one, else `sha256:` and its SHA-256 (the Python
 * client derives the same).
 */
export function messageIdFor(name: string): string {
  return usableId(name) ? name : `sha256:${createHash('sha256').update(name, 'utf8').digest('hex')}`;
}

/**
 * One identifier naming several strings: each percent-encoded, joined with `/`, so no two lists
 * of parts give the same result (the Python client derives the same).
 */
export function joinedId(...parts: string[]): string {
  return parts.map(quoteSegment).join('/');
}

/** `prefix + name`, or `prefix` and a SHA-256 of it when that passes the API's 256 characters. */
export function boundedId(name: string, prefix = ''): string {
  const full = prefix + name;
  if ([...full].length <= MAX_ID_CHARS) return full;
  return `${prefix}sha256-${createHash('sha256').update(full, 'utf8').digest('hex')}`;
}

/**
 * The sessiondb HTTP API. Methods map one to one to the API's routes and resolve to its JSON;
 * routes without a method are reached with {@link Client.request}.
 */
export class Client {
  readonly baseUrl: string;
  readonly apiKey: string | undefined;
  readonly timeoutMs: number;

  constructor(options: ClientOptions = {}) {
    this.baseUrl = (options.baseUrl ?? 'http://127.0.0.1:8787').replace(/\/+$/, '');
    this.apiKey = options.apiKey;
    this.timeoutMs = options.timeoutMs ?? 30_000;
  }

  /** `body` is sent as JSON; `ndjson`, when given, as NDJSON text instead. */
  private async open(
    method: string,
    path: string,
    query?: Query,
    body?: unknown,
    ndjson?: string,
  ): Promise<Response> {
    // URL parsers (fetch's included) resolve "." and ".." segments, even percent-encoded, so a
    // request for an id such as ".." would reach another path; it is refused instead.
    if (path.split('/').some((segment) => segment === '.' || segment === '..')) {
      throw new SessiondbError(undefined, 'invalid_request', `the ids "." and ".." cannot be sent through fetch: ${path}`);
    }
    let url = this.baseUrl + path;
    const pairs = Object.entries(query ?? {}).filter(([, v]) => v !== undefined);
    if (pairs.length > 0) {
      url += '?' + new URLSearchParams(pairs.map(([k, v]) => [k, String(v)])).toString();
    }
    const headers: Record<string, string> = { accept: 'application/json' };
    let payload: string | undefined;
    if (ndjson !== undefined) {
      headers['content-type'] = 'application/x-ndjson';
      payload = ndjson;
    } else if (body !== undefined) {
      headers['content-type'] = 'application/json';
      payload = JSON.stringify(body);
    }
    if (this.apiKey !== undefined) headers.authorization = `Bearer ${this.apiKey}`;
    let answer: Response;
    try {
      answer = await fetch(url, {
        method,
        headers,
        body: payload,
        signal: AbortSignal.timeout(this.timeoutMs),
      });
    } catch (failure) {
      const reason = failure instanceof Error ? (failure.cause ?? failure.message) : failure;
      throw new SessiondbUnavailable(`${method} ${url}: ${String(reason)}`);
    }
    if (!answer.ok) throw await errorOf(answer);
    return answer;
  }

  /**
   * Sends one request to `path` (`/v1/...`, segments already encoded) and resolves to the
   * decoded JSON answer, or `undefined` for an empty one (204).
   */
  async request<T = unknown>(
    method: string,
    path: string,
    options: { query?: Query; body?: unknown } = {},
  ): Promise<T> {
    const answer = await this.open(method, path, options.query, options.body);
    const text = await answer.text();
    return (text === '' ? undefined : JSON.parse(text)) as T;
  }

  private sessionPath(sessionId: string, ...rest: string[]): string {
    return ['/v1/sessions', sessionId, ...rest].map((s, i) => (i === 0 ? s : quoteSegment(s))).join('/');
  }

  // -- sessions ---------------------------------------------------------------------------

  /** `POST /v1/sessions`; an existing id is a `conflict` error. */
  createSession(fields: {
    id?: string;
    name?: string;
    parentSessionId?: string;
    model?: string;
    source?: string;
    userId?: string;
    metadata?: { [key: string]: Json };
  } = {}): Promise<SessionRecord> {
    return this.request('POST', '/v1/sessions', { body: fields });
  }

  getSession(sessionId: string): Promise<SessionRecord> {
    return this.request('GET', this.sessionPath(sessionId));
  }

  /** `PATCH`: `metadata` is a shallow merge where `null` deletes a key. */
  updateSession(
    sessionId: string,
    fields: { name?: string; model?: string; metadata?: { [key: string]: Json }; settings?: Json },
  ): Promise<SessionRecord> {
    return this.request('PATCH', this.sessionPath(sessionId), { body: fields });
  }

  /** Deletes the session and all it holds; a missing one is `not_found` unless `missingOk`. */
  async deleteSession(sessionId: string, options: { missingOk?: boolean } = {}): Promise<void> {
    try {
      await this.request('DELETE', this.sessionPath(sessionId));
    } catch (error) {
      if (!(options.missingOk && error instanceof SessiondbError && error.code === 'not_found')) throw error;
    }
  }

  /** Every session of the namespace, following the listing's cursors page after page. */
  async *listSessions(options: {
    userId?: string;
    sort?: 'updatedAt' | 'lastMessageAt' | 'createdAt';
    order?: 'asc' | 'desc';
    pageSize?: number;
  } = {}): AsyncGenerator<SessionRecord> {
    let after: string | undefined;
    for (;;) {
      const page = await this.request<Page<SessionRecord>>('GET', '/v1/sessions', {
        query: {
          limit: options.pageSize ?? 100,
          userId: options.userId,
          sort: options.sort,
          order: options.order,
          after,
        },
      });
      yield* page.items;
      after = page.nextCursor;
      if (after === undefined || page.items.length === 0) return;
    }
  }

  // -- messages ---------------------------------------------------------------------------

  /**
   * Appends one message. `parent` omitted appends under the active leaf, `null` starts a new
   * root, an id branches under that message. Appending to an unknown session creates it.
   */
  append(
    sessionId: string,
    message: MessageInput,
    options: { parent?: string | null } = {},
  ): Promise<{ inserted: boolean; message: StoredMessage }> {
    const query = 'parent' in options ? { parent: options.parent ?? '' } : undefined;
    return this.request('POST', this.sessionPath(sessionId, 'messages'), { query, body: message });
  }

  /** Appends messages chained one after another in one write: all are stored or none. */
  async appendBatch(
    sessionId: string,
    messages: MessageInput[],
    options: { parentId?: string } = {},
  ): Promise<StoredMessage[]> {
    const body = { messages, ...(options.parentId === undefined ? {} : { parentId: options.parentId }) };
    const answer = await this.request<{ messages: StoredMessage[] }>(
      'POST',
      this.sessionPath(sessionId, 'messages', 'batch'),
      { body },
    );
    return answer.messages;
  }

  /** One page of the active path. */
  messages(
    sessionId: string,
    options: { limit?: number; order?: 'asc' | 'desc'; after?: string; before?: string } = {},
  ): Promise<Page<StoredMessage>> {
    return this.request('GET', this.sessionPath(sessionId, 'messages'), { query: { ...options } });
  }

  getMessage(sessionId: string, messageId: string): Promise<StoredMessage> {
    return this.request('GET', this.sessionPath(sessionId, 'messages', messageId));
  }

  /** `PUT`: the whole message; a missing one is a `not_found` error unless `upsert`, which appends it. */
  replaceMessage(
    sessionId: string,
    messageId: string,
    message: MessageInput,
    options: { upsert?: boolean } = {},
  ): Promise<StoredMessage> {
    return this.request('PUT', this.sessionPath(sessionId, 'messages', messageId), {
      query: options.upsert ? { upsert: 'true' } : undefined,
      body: message,
    });
  }

  /** `PATCH`: the given `role`, `parts`, `content`, `metadata` replace. */
  updateMessage(
    sessionId: string,
    messageId: string,
    fields: Partial<Omit<MessageInput, 'id'>>,
  ): Promise<StoredMessage> {
    return this.request('PATCH', this.sessionPath(sessionId, 'messages', messageId), { body: fields });
  }

  /** Deletes one message; its children re-attach to the nearest surviving ancestor. */
  async deleteMessage(sessionId: string, messageId: string): Promise<void> {
    await this.request('DELETE', this.sessionPath(sessionId, 'messages', messageId));
  }

  /**
   * Deletes these messages at once (ids the session lacks are passed over) and resolves to how
   * many were deleted; children re-attach to their nearest surviving ancestor.
   */
  async deleteMessages(sessionId: string, messageIds: Iterable<string>): Promise<number> {
    const answer = await this.request<{ deleted: number }>('POST', this.sessionPath(sessionId, 'messages', 'delete'), {
      body: { ids: [...messageIds] },
    });
    return answer.deleted;
  }

  /** Deletes every message of the session; the session and its metadata stay. */
  async clear(sessionId: string): Promise<void> {
    await this.request('DELETE', this.sessionPath(sessionId, 'messages'));
  }

  /**
   * The path to `leaf` (the active leaf by default) with compactions applied, one message at a
   * time as the server streams it; leaving the loop early closes the stream.
   */
  history(
    sessionId: string,
    options: { order?: 'oldest' | 'newest'; leaf?: string } = {},
  ): AsyncGenerator<StoredMessage> {
    return this.lines(this.sessionPath(sessionId, 'history'), { order: options.order, leaf: options.leaf });
  }

  /**
   * The whole session as the server streams it: every message of the tree with its `parentId`
   * (`{message, parentId, createdAt}`), then compactions and state.
   */
  export(sessionId: string): AsyncGenerator<ExportLine> {
    return this.lines(this.sessionPath(sessionId, 'export'));
  }

  /**
   * Imports lines as `export` gives them into the session (created if needed), all or nothing;
   * messages whose id the session has are skipped.
   */
  async importLines(
    sessionId: string,
    lines: Iterable<ExportLine> | AsyncIterable<ExportLine>,
  ): Promise<{ imported: number; skipped: number }> {
    let text = '';
    for await (const line of lines) text += JSON.stringify(line) + '\n';
    const answer = await this.open('POST', this.sessionPath(sessionId, 'import'), undefined, undefined, text);
    return (await answer.json()) as { imported: number; skipped: number };
  }

  /** The JSON lines of an NDJSON answer, read as they arrive; closed when the loop ends. */
  private async *lines<T>(path: string, query?: Query): AsyncGenerator<T> {
    const answer = await this.open('GET', path, query);
    const reader = answer.body!.getReader();
    const decoder = new TextDecoder();
    let buffered = '';
    try {
      for (;;) {
        const { done, value } = await reader.read();
        buffered += decoder.decode(value, { stream: !done });
        let newline: number;
        while ((newline = buffered.indexOf('\n')) >= 0) {
          const line = buffered.slice(0, newline);
          buffered = buffered.slice(newline + 1);
          if (line.trim() !== '') yield JSON.parse(line) as T;
        }
        if (done) break;
      }
      if (buffered.trim() !== '') yield JSON.parse(buffered) as T;
    } finally {
      await reader.cancel().catch(() => {});
    }
  }

  /** The children of a message, oldest first. */
  branches(sessionId: string, messageId: string): Promise<StoredMessage[]> {
    return this.request('GET', this.sessionPath(sessionId, 'branches', messageId));
  }

  search(sessionId: string, q: string, options: { limit?: number } = {}): Promise<SearchHit[]> {
    return this.request('GET', this.sessionPath(sessionId, 'search'), {
      query: { q, limit: options.limit },
    });
  }

  // -- compaction -------------------------------------------------------------------------

  /** Shows `summary` in place of the messages from one id to the other in history. */
  addCompaction(
    sessionId: string,
    compaction: { summary: string; fromMessageId: string; toMessageId: string },
  ): Promise<Compaction> {
    return this.request('POST', this.sessionPath(sessionId, 'compactions'), { body: compaction });
  }

  /** Runs the server's summarizer; `undefined` when there was nothing to compact. */
  compact(sessionId: string): Promise<Compaction | undefined> {
    return this.request('POST', this.sessionPath(sessionId, 'compact'));
  }

  // -- state ------------------------------------------------------------------------------

  /** The JSON value under `key`; a missing key is a `not_found` error. */
  getState(sessionId: string, key: string): Promise<Json> {
    return this.request('GET', this.sessionPath(sessionId, 'state', key));
  }

  async putState(sessionId: string, key: string, value: Json): Promise<void> {
    await this.request('PUT', this.sessionPath(sessionId, 'state', key), { body: value });
  }

  async deleteState(sessionId: string, key: string): Promise<void> {
    await this.request('DELETE', this.sessionPath(sessionId, 'state', key));
  }

  allState(sessionId: string): Promise<{ [key: string]: Json }> {
    return this.request('GET', this.sessionPath(sessionId, 'state'));
  }
}

async function errorOf(answer: Response): Promise<SessiondbError> {
  const text = await answer.text();
  try {
    const { error } = JSON.parse(text) as { error: { code: string; message: string } };
    if (typeof error.code === 'string' && typeof error.message === 'string') {
      return new SessiondbError(answer.status, error.code, error.message);
    }
  } catch {
    // Not the API's error shape (a proxy in between, or the HTTP layer's own answer).
  }
  return new SessiondbError(answer.status, 'http_error', text || answer.statusText);
}
