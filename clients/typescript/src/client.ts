/**
 * A client for the sessiondb HTTP API, with no dependencies: an HTTP/1.1 of its own over Node's
 * sockets with kept connections where Node's modules are there, `fetch` on other runtimes
 * (browsers, workers, edge functions).
 */
import { sha256Hex } from './sha256.js';
import {
  type Answer,
  SendFailure,
  TimeoutError,
  type Transport,
  type TransportKind,
  Unsendable,
  nodeModulesHere,
  openTransport,
} from './transport.js';

export type { TransportKind } from './transport.js';

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
  settings: {
    compactAfter?: number;
    keepRecentTokens?: number;
    tokenizer?: 'heuristic' | 'o200k' | 'cl100k';
    /** Never deleted for being idle. */
    keepWhenIdle?: boolean;
  };
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
  /** Moves with every change of the session's messages, compactions and record. */
  version: number;
}

export interface Page<T> {
  items: T[];
  nextCursor?: string;
  previousCursor?: string;
}

/**
 * One line of `GET …/export`. The first is the session's record (what an import gives a session
 * it creates); the session's context blocks, entries and frozen prompt follow the state.
 */
export type ExportLine =
  | { session: Omit<SessionRecord, 'updatedAt' | 'lastMessageAt' | 'messageCount' | 'leafId' | 'tokenEstimate' | 'contentBytes' | 'version'> }
  | { message: StoredMessage; parentId: string | null; createdAt: number }
  | { compaction: Compaction }
  | { state: { key: string; value: Json } }
  | { block: { label: string; kind: BlockKind; description?: string; maxTokens?: number; content?: string } }
  | { entry: { label: string; key: string; content: string; description?: string } }
  | { prompt: { text: string } }
  /** Opens the namespace templates' part of a dump (see `importTemplates`). */
  | { templates: Record<string, never> };

/**
 * A line `importLines` takes: any line `export` gives, or less of one (a session record with some
 * of its fields, a message with no times of its own: it takes the line's `createdAt`, else now).
 * A message line with `replace: true` rewrites the stored message of its id, as `replaceMessage`
 * does (its parent, seq and createdAt stay), where an import would skip it.
 */
export type ImportLine =
  | ExportLine
  | { session: Partial<Extract<ExportLine, { session: unknown }>['session']> }
  | { message: MessageInput & { id: string; createdAt?: number }; parentId: string | null; createdAt?: number; replace?: boolean };

/**
 * One session's part of `importTogether`: its lines and, optionally, one condition (see there).
 */
export interface ImportPart {
  sessionId: string;
  lines: Iterable<ImportLine>;
  ifLeaf?: string | null;
  ifVersion?: number;
  ifAbsent?: boolean;
}

/** The line of `POST /v1/import` that opens a session's part. */
type IntoLine = { into: Omit<ImportPart, 'lines'> };

/** NDJSON of `lines`. */
function ndjson(lines: Iterable<ImportLine | IntoLine>): string {
  let text = '';
  for (const line of lines) text += JSON.stringify(line) + '\n';
  return text;
}

/** The NDJSON body of an import into several sessions (`Client.importTogether`). */
function importBody(parts: Iterable<ImportPart>): string {
  const lines: (ImportLine | IntoLine)[] = [];
  for (const { sessionId, lines: partLines, ifLeaf, ifVersion, ifAbsent } of parts) {
    const into: IntoLine['into'] = { sessionId };
    if (ifLeaf !== undefined) into.ifLeaf = ifLeaf;
    if (ifVersion !== undefined) into.ifVersion = ifVersion;
    if (ifAbsent) into.ifAbsent = ifAbsent;
    lines.push({ into }, ...partLines);
  }
  return ndjson(lines);
}

export interface Compaction {
  id: string;
  summary: string;
  fromMessageId: string;
  toMessageId: string;
  createdAt: number;
}

/** One row of a path as `GET …/rows` gives it, without the message's content. */
export interface RowStat {
  id: string;
  role: string;
  bytes: number;
  tokenEstimate: number;
}

export interface SearchHit {
  id: string;
  role: string;
  /** The message's indexed text, whole. */
  content: string;
  /**
   * The part of `content` around the words that matched, as pieces alternating between plain
   * text (even positions, possibly empty) and a matched word (odd positions); joined, they read
   * as the excerpt, with `…` where text was left out.
   */
  snippet: string[];
  sessionId: string;
  createdAt: number;
}

/** How search hits are shown besides their filter. */
export interface SearchShape {
  /** Page size (1 to 100; 20 by default). */
  limit?: number;
  /** Most words of each hit's snippet (1 to 100; 16 by default). */
  snippetWords?: number;
}

/**
 * Which messages a search's words match (all of them, or with `match: 'any'` at least one, best
 * first), and which of those it keeps: one role's, those created in a time range.
 */
export interface SearchFilter {
  match?: 'all' | 'any';
  /** Only messages of this role (`user`, `assistant`, …). */
  role?: string;
  /** Only messages created at or after this time (epoch milliseconds). */
  since?: number;
  /** Only messages created before this time (epoch milliseconds). */
  until?: number;
}

export type BlockKind = 'readonly' | 'writable' | 'skill' | 'search';

/** A context block as `GET …/context` lists it (a keyed block's content is its listing). */
export interface Block {
  label: string;
  kind: BlockKind;
  description: string | null;
  maxTokens: number | null;
  content: string;
  tokens: number;
}

/** An entry of a skill or search block. */
export interface ContextEntry {
  key: string;
  content: string;
  description: string | null;
}

/** A tool the session's blocks call for, in the `raw` format (JSON Schema parameters). */
export interface ToolDefinition {
  name: string;
  description: string;
  parameters: { [key: string]: Json };
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

/**
 * A `conflict`: the session a copy writes to holds messages the copy does not begin with.
 * `wroteBefore` says whether parts of a copy written in several writes were stored before another
 * writer changed the session (they stay, a prefix the next copy goes on from).
 */
export class CopyConflict extends SessiondbError {
  constructor(
    sessionId: string,
    readonly wroteBefore: boolean,
  ) {
    super(
      409,
      'conflict',
      `session ${JSON.stringify(sessionId)} holds messages the copy does not begin with; ${wroteBefore ? 'the messages it wrote before stay' : 'nothing was copied'}`,
    );
    this.name = 'CopyConflict';
  }
}

/**
 * What a copy from a framework's own store did: the conversations it wrote (whole, or what came
 * since an earlier copy), and those it skipped, as the target already held all of them (a copy
 * run again) or they held nothing. Each is named as the framework names it.
 */
export interface Copied<Name = string> {
  copied: Name[];
  skipped: Name[];
}

export interface ClientOptions {
  /** `http://127.0.0.1:8787` (what `sessiondb serve` listens on) by default. */
  baseUrl?: string;
  /** Sent as `Authorization: Bearer`; without one, requests are anonymous. */
  apiKey?: string;
  /** How long an answer may keep the client waiting for its next bytes (30 s by default). */
  timeoutMs?: number;
  /**
   * For an `https:` URL, the certificates to trust (PEM) instead of Node's (a private CA, or a
   * self-signed server); Node's `NODE_EXTRA_CA_CERTS` adds to Node's instead. Node's transport
   * only: elsewhere the runtime decides what it trusts.
   */
  ca?: string | Uint8Array | Array<string | Uint8Array>;
  /**
   * `node` (Node's sockets, kept connections; where Node's modules load) or `fetch` (any runtime; it
   * refuses ids `.` and `..`, whose path segments its URL parser resolves, with an
   * `invalid_request` error and nothing sent).
   * {@link Client.defaultTransport} by default.
   */
  transport?: TransportKind;
}

type Query = Record<string, string | number | undefined>;

/**
 * A write's condition on the session's active leaf: absent, none; `null`, the session has no
 * message yet; an id, that message is its active leaf. Checked atomically with the write.
 */
export interface LeafCondition {
  ifLeaf?: string | null;
}

/**
 * An append's condition: `ifLeaf` as in `LeafCondition`, or `ifVersion`, the session's version
 * (`SessionRecord.version`, `versionedHistory`'s, an earlier write's): the session exists and
 * nothing changed it since (an edit too, which moves no leaf). Not both.
 */
export interface WriteCondition extends LeafCondition {
  ifVersion?: number;
}

/** The `ifLeaf` query of a write. */
function leafQuery(condition: LeafCondition): Query {
  return condition.ifLeaf === undefined ? {} : { ifLeaf: condition.ifLeaf ?? '' };
}

/** The `ifLeaf` and `ifVersion` query of an append. */
function conditionQuery(condition: WriteCondition): Query {
  const query = leafQuery(condition);
  if (condition.ifVersion !== undefined) query.ifVersion = condition.ifVersion;
  return query;
}

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

/** The id prefix of a compaction's summary, which reads stand in place of the messages it covers. */
export const COMPACTION_PREFIX = 'compaction_';

/**
 * The most a copy (`Client.copyConversation`) puts in one request, in UTF-16 code units of its
 * JSON: at most 48 MiB of UTF-8, under a server's default `--max-body-bytes` (64 MiB). A longer
 * conversation is copied in several writes.
 */
export const COPY_REQUEST_CHARS = 16 * 1024 * 1024;

/** Whether sessiondb takes `value` as a message id: a usable name without the reserved `compaction_` prefix. */
export function usableId(value: unknown): value is string {
  return usableName(value) && !value.startsWith(COMPACTION_PREFIX);
}

/**
 * `name` as a message id when it is a usable one, else `sha256:` and its SHA-256 (the Python
 * client derives the same).
 */
export function messageIdFor(name: string): string {
  return usableId(name) ? name : `sha256:${sha256Hex(name)}`;
}

/**
 * One identifier naming several strings: each percent-encoded, joined with `/`, so no two lists
 * of parts give the same result (the Python client derives the same).
 */
export function joinedId(...parts: string[]): string {
  return parts.map(quoteSegment).join('/');
}

/** What an adapter remembers only to save a request (the sessions it created) is forgotten all
 * at once past this many entries, so a long-lived process stays bounded. */
export const REMEMBERED = 4096;

/** Adds `id` to ids an adapter remembers only to skip a request (forgotten past `REMEMBERED`). */
export function rememberId(ids: Set<string>, id: string): void {
  if (!ids.has(id) && ids.size >= REMEMBERED) ids.clear();
  ids.add(id);
}

/** `prefix + name`, or `prefix` and a SHA-256 of it when that passes the API's 256 characters. */
export function boundedId(name: string, prefix = ''): string {
  const full = prefix + name;
  if ([...full].length <= MAX_ID_CHARS) return full;
  return `${prefix}sha256-${sha256Hex(full)}`;
}

/**
 * The sessiondb HTTP API. Methods map one to one to the API's routes and resolve to its JSON;
 * routes without a method are reached with {@link Client.request}.
 */
export class Client {
  /**
   * The transport of clients made without one: `node` where Node's modules are there, else
   * `fetch`.
   */
  static defaultTransport: TransportKind = nodeModulesHere() ? 'node' : 'fetch';

  readonly baseUrl: string;
  readonly apiKey: string | undefined;
  readonly timeoutMs: number;
  readonly transportKind: TransportKind;
  private readonly url: URL;
  private readonly transport: Transport;

  constructor(options: ClientOptions = {}) {
    this.baseUrl = (options.baseUrl ?? 'http://127.0.0.1:8787').replace(/\/+$/, '');
    this.apiKey = options.apiKey;
    this.timeoutMs = options.timeoutMs ?? 30_000;
    this.url = new URL(this.baseUrl);
    if (this.url.protocol !== 'http:' && this.url.protocol !== 'https:') {
      throw new TypeError(`baseUrl must be http(s)://host[:port][/path]: ${this.baseUrl}`);
    }
    this.transportKind = options.transport ?? Client.defaultTransport;
    if (options.ca !== undefined && this.transportKind !== 'node') {
      throw new TypeError('`ca` is for Node\'s transport: with `fetch` the runtime decides what it trusts');
    }
    this.transport = openTransport(this.transportKind, this.url, { timeoutMs: this.timeoutMs, ca: options.ca });
  }

  /** Closes the kept connections; the next request opens a new one. */
  close(): void {
    this.transport.close();
  }

  /**
   * The answer to one request, its body not yet read (a 2xx: errors are thrown typed). `body`
   * is sent as JSON; `ndjson`, when given, as NDJSON text instead. A request that failed on a
   * kept connection before any answer is sent again on a new one, unless it is a POST, which
   * the server may have received and applied.
   */
  private async open(
    method: string,
    path: string,
    query?: Query,
    body?: unknown,
    ndjson?: string,
    extraHeaders: Record<string, string> = {},
  ): Promise<Answer> {
    // Node's transport sends the path as it is (no URL parser resolves "." or ".." segments on
    // the way); fetch's refuses such segments.
    let target = this.url.pathname.replace(/\/+$/, '') + path;
    const pairs = Object.entries(query ?? {}).filter(([, v]) => v !== undefined);
    if (pairs.length > 0) {
      target += '?' + new URLSearchParams(pairs.map(([k, v]) => [k, String(v)])).toString();
    }
    const headers: Record<string, string> = { accept: 'application/json', ...extraHeaders };
    let payload: string | undefined;
    if (ndjson !== undefined) {
      headers['content-type'] = 'application/x-ndjson';
      payload = ndjson;
    } else if (body !== undefined) {
      headers['content-type'] = 'application/json';
      payload = JSON.stringify(body);
    }
    if (this.apiKey !== undefined) headers.authorization = `Bearer ${this.apiKey}`;
    for (let attempt = 0; ; attempt += 1) {
      let answer: Answer;
      try {
        answer = await this.transport.send(method, target, headers, payload);
      } catch (failure) {
        if (failure instanceof Unsendable) throw new SessiondbError(undefined, 'invalid_request', failure.message);
        if (!(failure instanceof SendFailure)) throw failure;
        const { reused, error } = failure;
        if (reused && attempt === 0 && method !== 'POST' && !(error instanceof TimeoutError)) continue;
        throw new SessiondbUnavailable(`${method} ${target} on ${this.baseUrl}: ${error.message}`);
      }
      if (answer.status >= 400) throw await errorOf(answer);
      return answer;
    }
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
    const text = await bodyOf(await this.open(method, path, options.query, options.body), `${method} ${path}`);
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

  /**
   * Deletes every session of `userId`, each with everything in it, as erasing what a user left
   * asks; resolves to how many.
   */
  async deleteUserSessions(userId: string): Promise<number> {
    const answer = await this.request<{ deleted: number }>('DELETE', '/v1/sessions', { query: { userId } });
    return answer.deleted;
  }

  /** Every session of the namespace, following the listing's cursors page after page. */
  listSessions(options: {
    userId?: string;
    sort?: 'updatedAt' | 'lastMessageAt' | 'createdAt';
    order?: 'asc' | 'desc';
    pageSize?: number;
  } = {}): AsyncGenerator<SessionRecord> {
    return this.paged<SessionRecord>('/v1/sessions', {
      limit: options.pageSize ?? 100,
      userId: options.userId,
      sort: options.sort,
      order: options.order,
    });
  }

  /** Every item of the cursor listing at `path`, one page at a time as they are taken. */
  private async *paged<T>(path: string, query: Query): AsyncGenerator<T> {
    let after: string | undefined;
    for (;;) {
      const page = await this.request<Page<T>>('GET', path, { query: { ...query, after } });
      yield* page.items;
      after = page.nextCursor;
      if (after === undefined || page.items.length === 0) return;
    }
  }

  /** A new session holding the path to `atMessageId` (with fresh message ids); the source stays. */
  fork(sessionId: string, fork: { atMessageId: string; id?: string; name?: string }): Promise<SessionRecord> {
    return this.request('POST', this.sessionPath(sessionId, 'fork'), { body: fork });
  }

  /**
   * Ends the session (`endReason` `compaction`) and resolves to its continuation, a new session
   * that starts from `summary`.
   */
  split(sessionId: string, split: { summary: string; name?: string }): Promise<SessionRecord> {
    return this.request('POST', this.sessionPath(sessionId, 'split'), { body: split });
  }

  /** Adds what a model call reported to the session's counters; resolves to the session. */
  addUsage(
    sessionId: string,
    usage: { inputTokens?: number; outputTokens?: number; cost?: number },
  ): Promise<SessionRecord> {
    const body = { inputTokens: 0, outputTokens: 0, cost: 0, ...usage };
    return this.request('POST', this.sessionPath(sessionId, 'usage'), { body });
  }

  /**
   * Full-text search across the namespace's sessions (or one user's), best first; only `role`'s
   * messages, or those created from `since` to before `until` (epoch milliseconds), when given.
   */
  searchAll(q: string, options: { userId?: string } & SearchShape & SearchFilter = {}): Promise<SearchHit[]> {
    const { userId, limit, snippetWords, match, role, since, until } = options;
    return this.request('GET', '/v1/search', {
      query: { q, userId, limit, snippetWords, match, role, since, until },
    });
  }

  // -- messages ---------------------------------------------------------------------------

  /**
   * Appends one message. `parent` omitted appends under the active leaf, `null` starts a new
   * root, an id branches under that message. Appending to an unknown session creates it. With
   * `ifLeaf` (an id, or `null` for a session without messages) the append happens only while
   * the session exists with that active leaf, with `ifVersion` only while it is at that
   * version: otherwise a `not_found` or `conflict` error, and nothing written. `version` is the
   * session's once the append committed.
   */
  async append(
    sessionId: string,
    message: MessageInput,
    options: { parent?: string | null } & WriteCondition = {},
  ): Promise<{ inserted: boolean; message: StoredMessage; version?: number }> {
    const query: Query = conditionQuery(options);
    if ('parent' in options) query.parent = options.parent ?? '';
    const written = await this.postWrite<{ inserted: boolean; message: StoredMessage }>(
      this.sessionPath(sessionId, 'messages'),
      query,
      message,
    );
    return { ...written.answer, version: written.version };
  }

  /**
   * Appends messages chained one after another in one write: all are stored or none (`ifLeaf`
   * and `ifVersion` as for `append`).
   */
  async appendBatch(
    sessionId: string,
    messages: MessageInput[],
    options: { parentId?: string } & WriteCondition = {},
  ): Promise<StoredMessage[]> {
    return (await this.appendBatchVersioned(sessionId, messages, options)).messages;
  }

  /** `appendBatch`, with the session's version once the write committed. */
  async appendBatchVersioned(
    sessionId: string,
    messages: MessageInput[],
    options: { parentId?: string } & WriteCondition = {},
  ): Promise<{ messages: StoredMessage[]; version?: number }> {
    const body = { messages, ...(options.parentId === undefined ? {} : { parentId: options.parentId }) };
    const written = await this.postWrite<{ messages: StoredMessage[] }>(
      this.sessionPath(sessionId, 'messages', 'batch'),
      conditionQuery(options),
      body,
    );
    return { messages: written.answer.messages, version: written.version };
  }

  /** POSTs a write: its JSON answer, and the session's version once the write committed. */
  private async postWrite<T>(path: string, query: Query, body: unknown): Promise<{ answer: T; version?: number }> {
    const answer = await this.open('POST', path, query, body);
    const version = answer.header('x-sessiondb-version');
    return {
      answer: JSON.parse(await bodyOf(answer, `POST ${path}`)) as T,
      version: version === undefined ? undefined : Number(version),
    };
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
   * Every message of the active path as stored (no compaction's summary in place of the
   * messages it covers), in `order`, read a page at a time as they are taken.
   */
  iterMessages(
    sessionId: string,
    options: { order?: 'asc' | 'desc'; pageSize?: number } = {},
  ): AsyncGenerator<StoredMessage> {
    return this.paged(this.sessionPath(sessionId, 'messages'), { limit: options.pageSize ?? 100, order: options.order });
  }

  /**
   * The active path as stored, oldest first: one history read when no compaction stands in the
   * path, else pages of `messages`.
   */
  async storedHistory(sessionId: string): Promise<StoredMessage[]> {
    const path: StoredMessage[] = [];
    let compacted = false;
    for await (const message of this.history(sessionId)) {
      compacted = message.id.startsWith(COMPACTION_PREFIX);
      if (compacted) break;
      path.push(message);
    }
    if (!compacted) return path;
    const stored: StoredMessage[] = [];
    for await (const message of this.iterMessages(sessionId)) stored.push(message);
    return stored;
  }

  /**
   * The whole session as the server streams it: its record (`{session}`, what an import gives a
   * session it creates), every message of the tree with its `parentId`
   * (`{message, parentId, createdAt}`), then compactions, state and context.
   */
  export(sessionId: string): AsyncGenerator<ExportLine> {
    return this.lines(this.sessionPath(sessionId, 'export'));
  }

  /**
   * Imports lines as `export` gives them into the session (created if needed), all or nothing;
   * messages whose id the session has are skipped (`ifLeaf` as for `append`).
   */
  importLines(
    sessionId: string,
    lines: Iterable<ImportLine> | AsyncIterable<ImportLine>,
    options: LeafCondition = {},
  ): Promise<{ imported: number; skipped: number }> {
    return this.postLines(this.sessionPath(sessionId, 'import'), lines, leafQuery(options));
  }

  /**
   * Imports into several sessions as one write: every part lands, or (on any error in any part)
   * none. A part's `lines` are as `importLines` takes them, with at most one condition: `ifLeaf`
   * as for `importLines`, `ifVersion` (the session is still at this version, as for
   * `appendBatchVersioned`), or `ifAbsent`, which has the part create its session with these
   * lines (a `conflict` when it exists). Each part of the answer has the `version` it left.
   */
  importTogether(
    parts: Iterable<ImportPart>,
  ): Promise<{
    imported: number;
    skipped: number;
    parts: { sessionId: string; imported: number; skipped: number; version?: number }[];
  }> {
    return this.postText('/v1/import', importBody(parts));
  }

  /**
   * Copies `messages` in as the session's active path, each under the one before, for a copy
   * from another store: `true` when it wrote, `false` when the session already holds them all
   * (and maybe more: the conversation went on there). `same(stored, i)` tells whether a stored
   * message is the `i`-th of `messages` as the caller sees them. A session that does not exist is
   * created with them (and `record`, fields of an import's session line), as is one without
   * messages; one whose stored path is the first of them (an earlier copy, before the source went
   * on) takes the rest under its leaf; one holding anything else is a `conflict` (`CopyConflict`),
   * and nothing is written. `createdAt` dates each message (else the copy's time); `alsoLines`
   * (state, say) go into the session and `alsoParts` (as `importTogether` takes them) into other
   * sessions with the write of the last message. Messages without an id get one (`msg_` and a
   * UUID, the shape of the server's), as an import names each message's parent by id. With
   * nothing to write (no messages, record, lines or parts), `false`.
   *
   * What is to be written goes in one write, all or nothing, unless it is longer than
   * `COPY_REQUEST_CHARS` or the server refuses it as too large (`--max-body-bytes`): then in
   * several, each under the one before and no longer than the last one taken, so a copy cut short
   * leaves the first messages, which the next copy goes on from. Another writer that changes the
   * session between two of them makes the copy a `CopyConflict` whose `wroteBefore` is true: the
   * parts written stay.
   */
  async copyConversation(
    sessionId: string,
    messages: MessageInput[],
    same: (stored: StoredMessage, index: number) => boolean,
    record?: Partial<Extract<ExportLine, { session: unknown }>['session']>,
    { createdAt, alsoLines = [], alsoParts = [] }: { createdAt?: number[]; alsoLines?: ImportLine[]; alsoParts?: ImportPart[] } = {},
  ): Promise<boolean> {
    if (messages.length === 0 && !record && alsoLines.length === 0 && alsoParts.length === 0) return false;
    const withIds = messages.map((m) => ({ ...m, id: m.id || `msg_${globalThis.crypto.randomUUID()}` }));
    let held: StoredMessage[] = [];
    let wrote = false;
    let budget = COPY_REQUEST_CHARS;
    // Each round writes only while the session is as just read, so a write between the read and
    // the import (another copy, say) is read and compared again.
    for (let round = 0; round < 3; round++) {
      const start = held.length;
      let parentId: string | null = start > 0 ? held[start - 1].id : null;
      const head: ImportLine[] = record && parentId === null ? [{ session: record }] : [];
      const encoded: string[] = [];
      for (let i = start; i < withIds.length; i++) {
        encoded.push(JSON.stringify({ message: withIds[i], parentId, createdAt: createdAt?.[i] }) + '\n');
        parentId = withIds[i].id;
      }
      const tail = ndjson(alsoLines) + importBody(alsoParts);
      // Absent, it is created with them, else (it exists) written while it has no message (when
      // there are some to write); with messages, written while its leaf is the one read, as is
      // every later write of this round while its leaf is the one written.
      let conditions: { ifLeaf?: string | null; ifAbsent?: boolean }[] =
        start > 0 ? [{ ifLeaf: held[start - 1].id }] : [{ ifAbsent: true }, ...(withIds.length > 0 ? [{ ifLeaf: null }] : [])];
      let written = 0;
      for (;;) {
        let end = written;
        let size = 0;
        while (end < encoded.length && (end === written || size + encoded[end].length <= budget)) size += encoded[end++].length;
        const last = end === encoded.length;
        const body = encoded.slice(written, end).join('') + (last ? tail : '');
        try {
          if (!(await this.importFirstMet(sessionId, conditions, written === 0 ? head : [], body))) break;
        } catch (error) {
          if (!(error instanceof SessiondbError && error.code === 'payload_too_large' && end - written > 1)) throw error;
          budget = Math.floor(size / 2);
          continue;
        }
        wrote = true;
        if (last) return true;
        written = end;
        conditions = [{ ifLeaf: withIds[start + end - 1].id }];
      }
      held = await this.storedHistory(sessionId);
      if (!held.slice(0, withIds.length).every(same)) break;
      if (held.length >= withIds.length) return wrote;
    }
    throw new CopyConflict(sessionId, wrote);
  }

  /**
   * Imports `lines`, then the NDJSON `encoded` (more of the session's lines, then maybe other
   * parts), under the first of `conditions` the session meets; `false` when it meets none (each a
   * `conflict`).
   */
  private async importFirstMet(
    sessionId: string,
    conditions: { ifLeaf?: string | null; ifAbsent?: boolean }[],
    lines: ImportLine[],
    encoded: string,
  ): Promise<boolean> {
    for (const condition of conditions) {
      try {
        await this.postText('/v1/import', importBody([{ sessionId, lines, ...condition }]) + encoded);
        return true;
      } catch (error) {
        if (!(error instanceof SessiondbError && error.code === 'conflict')) throw error;
      }
    }
    return false;
  }

  /**
   * Imports a templates' part of a dump (an optional `{templates: {}}` line, then block and entry
   * lines) into the namespace's context templates, all or nothing: a block replaces the template
   * of its label, an entry the template entry of its key.
   */
  importTemplates(
    lines: Iterable<ExportLine> | AsyncIterable<ExportLine>,
  ): Promise<{ imported: number; skipped: number }> {
    return this.postLines('/v1/context', lines);
  }

  /** POSTs `lines` as an NDJSON body; the answer's import counts. */
  private async postLines<T = { imported: number; skipped: number }>(
    path: string,
    lines: Iterable<ImportLine> | AsyncIterable<ImportLine>,
    query?: Query,
  ): Promise<T> {
    let text = '';
    for await (const line of lines) text += JSON.stringify(line) + '\n';
    return this.postText(path, text, query);
  }

  /** POSTs `text`, NDJSON, and parses the answer. */
  private async postText<T>(path: string, text: string, query?: Query): Promise<T> {
    const answer = await this.open('POST', path, query, undefined, text);
    return JSON.parse(await bodyOf(answer, `POST ${path}`)) as T;
  }

  /** The JSON lines of an NDJSON answer, read as they arrive; closed when the loop ends. */
  private async *lines<T>(path: string, query?: Query): AsyncGenerator<T> {
    const answer = await this.open('GET', path, query);
    let buffered = '';
    try {
      try {
        for await (const chunk of answer.text()) {
          buffered += chunk;
          let newline: number;
          while ((newline = buffered.indexOf('\n')) >= 0) {
            const line = buffered.slice(0, newline);
            buffered = buffered.slice(newline + 1);
            if (line.trim() !== '') yield JSON.parse(line) as T;
          }
        }
      } catch (failure) {
        if (failure instanceof SyntaxError) throw failure;
        throw new SessiondbUnavailable(`GET ${path} on ${this.baseUrl}: ${(failure as Error).message}`);
      }
      if (buffered.trim() !== '') yield JSON.parse(buffered) as T;
    } finally {
      // A stream left half read is not worth keeping its connection for.
      answer.discard();
    }
  }

  /**
   * The path to `leaf` with compactions applied, in a model API's format: `openai` (Chat
   * Completions messages), `openai-responses` (Responses input items) or `anthropic`
   * (`{system, messages}`); tool calls are always followed by their results.
   */
  modelHistory(
    sessionId: string,
    format: 'openai' | 'openai-responses' | 'anthropic' = 'openai',
    options: { leaf?: string } = {},
  ): Promise<Json> {
    return this.request('GET', this.sessionPath(sessionId, 'history'), { query: { format, leaf: options.leaf } });
  }

  /**
   * The active path with compactions applied, as `history` reads it, with the session's version
   * the read began at (0: no such session). With `unlessVersion`, the version a caller read
   * before, resolves to `null` without transferring the path while the session is still at it
   * (the server answers `304 Not Modified`): what the caller read then is what it would read.
   */
  async versionedHistory(
    sessionId: string,
    options: { unlessVersion?: number } = {},
  ): Promise<{ version: number; messages: StoredMessage[] } | null> {
    const path = this.sessionPath(sessionId, 'history');
    const held: Record<string, string> = {};
    if (options.unlessVersion !== undefined) held['if-none-match'] = `"${options.unlessVersion}"`;
    const answer = await this.open('GET', path, undefined, undefined, undefined, held);
    if (answer.status === 304) {
      await bodyOf(answer, `GET ${path}`);
      return null;
    }
    const tag = answer.header('etag');
    const messages = ndjsonOf(await bodyOf(answer, `GET ${path}`)) as StoredMessage[];
    return { version: tag === undefined ? 0 : Number(tag.replace(/^W\//, '').replace(/"/g, '')), messages };
  }

  /**
   * The longest end of the path to `leaf` whose messages fit in `maxBytes` (the leaf at least),
   * compactions applied, oldest first; `truncated` tells whether older messages were left out,
   * `totalBytes` is the size of the whole path.
   */
  async recentHistory(
    sessionId: string,
    maxBytes: number,
    options: { leaf?: string } = {},
  ): Promise<{ messages: StoredMessage[]; truncated: boolean; totalBytes: number }> {
    const path = this.sessionPath(sessionId, 'history');
    const answer = await this.open('GET', path, { maxBytes, leaf: options.leaf });
    const messages = ndjsonOf(await bodyOf(answer, `GET ${path}`)) as StoredMessage[];
    return {
      messages,
      truncated: answer.header('x-sessiondb-truncated') === 'true',
      totalBytes: Number(answer.header('x-sessiondb-total-bytes') ?? 0),
    };
  }

  /** The children of a message, oldest first. */
  branches(sessionId: string, messageId: string): Promise<StoredMessage[]> {
    return this.request('GET', this.sessionPath(sessionId, 'branches', messageId));
  }

  /** The path to `leaf` (the active leaf by default), root first, as rows without content. */
  rows(sessionId: string, options: { leaf?: string } = {}): Promise<RowStat[]> {
    return this.request('GET', this.sessionPath(sessionId, 'rows'), { query: { leaf: options.leaf } });
  }

  /** Full-text search in the session, best first; filtered as `searchAll`. */
  search(sessionId: string, q: string, options: SearchShape & SearchFilter = {}): Promise<SearchHit[]> {
    const { limit, snippetWords, match, role, since, until } = options;
    return this.request('GET', this.sessionPath(sessionId, 'search'), {
      query: { q, limit, snippetWords, match, role, since, until },
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

  /** The session's compactions, oldest first. */
  compactions(sessionId: string): Promise<Compaction[]> {
    return this.request('GET', this.sessionPath(sessionId, 'compactions'));
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

  // -- change feed ------------------------------------------------------------------------

  /**
   * The change feed as it happens, one `{event, id, data}` per durable write (`event` the
   * change: `append`, `update`, `delete`, ...; `data` decoded): a session's, or with `null` the
   * whole namespace's. To resume, pass the last `id` seen as `lastEventId`: the retained events
   * after it come first, or a `reset` event when it is no longer retained (re-read what you
   * need, then follow). The feed never ends by itself; leave the loop to close it. The server
   * sends a keep-alive every 15 s, so `timeoutMs` must be longer than that.
   */
  async *events(
    sessionId: string | null,
    options: { lastEventId?: string } = {},
  ): AsyncGenerator<{ event: string; id: string | undefined; data: Json }> {
    const path = sessionId === null ? '/v1/events' : this.sessionPath(sessionId, 'events');
    const headers: Record<string, string> = { accept: 'text/event-stream' };
    if (options.lastEventId !== undefined) headers['last-event-id'] = options.lastEventId;
    const answer = await this.open('GET', path, undefined, undefined, undefined, headers);
    let buffered = '';
    let event: { [field: string]: string } = {};
    try {
      for await (const chunk of answer.text()) {
        buffered += chunk;
        let newline: number;
        while ((newline = buffered.indexOf('\n')) >= 0) {
          const line = buffered.slice(0, newline).replace(/\r$/, '');
          buffered = buffered.slice(newline + 1);
          if (line === '') {
            if (event.data !== undefined) {
              yield { event: event.event ?? 'message', id: event.id, data: JSON.parse(event.data) as Json };
            }
            event = {};
          } else if (!line.startsWith(':')) {
            const colon = line.indexOf(':');
            const name = colon < 0 ? line : line.slice(0, colon);
            const value = colon < 0 ? '' : line.slice(colon + 1).replace(/^ /, '');
            event[name] = name === 'data' && event.data !== undefined ? `${event.data}\n${value}` : value;
          }
        }
      }
    } catch (failure) {
      throw new SessiondbUnavailable(`GET ${path} on ${this.baseUrl}: ${(failure as Error).message}`);
    } finally {
      // A feed is never read to its end: its connection cannot serve another request.
      answer.discard();
    }
  }

  // -- context blocks, the prompt and the tools -------------------------------------------
  // A `sessionId` of `null` addresses the namespace's templates, which every session sees (a
  // session writing a template's text gets its own copy).

  private contextPath(sessionId: string | null, ...rest: string[]): string {
    if (sessionId === null) return ['/v1/context', ...rest.map(quoteSegment)].join('/');
    return this.sessionPath(sessionId, 'context', ...rest);
  }

  /** Every block in prompt order. */
  blocks(sessionId: string | null): Promise<Block[]> {
    return this.request('GET', this.contextPath(sessionId));
  }

  /** Defines (or redefines) a block; text beyond `maxTokens` is refused. */
  defineBlock(
    sessionId: string | null,
    label: string,
    block: { kind: Block['kind']; description?: string; maxTokens?: number; content?: string },
  ): Promise<Block> {
    return this.request('PUT', this.contextPath(sessionId, label), { body: block });
  }

  /** Appends text to a writable block (on a line of its own); resolves to the block. */
  appendToBlock(sessionId: string | null, label: string, content: string): Promise<Block> {
    return this.request('POST', this.contextPath(sessionId, label, 'append'), { body: { content } });
  }

  /** Deletes a block with its entries; a missing one is a `not_found` error. */
  async deleteBlock(sessionId: string | null, label: string): Promise<void> {
    await this.request('DELETE', this.contextPath(sessionId, label));
  }

  /** Stores an entry of a skill or search block under `key`. */
  putEntry(
    sessionId: string | null,
    label: string,
    key: string,
    entry: { content: string; description?: string },
  ): Promise<ContextEntry> {
    return this.request('PUT', this.contextPath(sessionId, label, 'entries', key), { body: entry });
  }

  /** One entry (a session's own before its template's); a missing one is `not_found`. */
  getEntry(sessionId: string | null, label: string, key: string): Promise<ContextEntry> {
    return this.request('GET', this.contextPath(sessionId, label, 'entries', key));
  }

  /**
   * Deletes the scope's own entry of `key` (a session's template entry of that key then shows
   * again); a missing one is a `not_found` error.
   */
  async deleteEntry(sessionId: string | null, label: string, key: string): Promise<void> {
    await this.request('DELETE', this.contextPath(sessionId, label, 'entries', key));
  }

  /**
   * Every entry of a skill or search block, by key (a session's own in place of its template's),
   * read a page of 100 at a time.
   */
  async entries(sessionId: string | null, label: string): Promise<ContextEntry[]> {
    const entries: ContextEntry[] = [];
    for await (const entry of this.paged<ContextEntry>(this.contextPath(sessionId, label, 'entries'), { limit: 100 })) {
      entries.push(entry);
    }
    return entries;
  }

  /** The session's system prompt, rendered and frozen on the first call. */
  prompt(sessionId: string): Promise<{ prompt: string; frozenAt: number }> {
    return this.request('GET', this.sessionPath(sessionId, 'prompt'));
  }

  /** Renders the prompt anew from the blocks as they are now and freezes that. */
  refreshPrompt(sessionId: string): Promise<{ prompt: string; frozenAt: number }> {
    return this.request('POST', this.sessionPath(sessionId, 'prompt', 'refresh'));
  }

  /** The tools the session's blocks call for, as raw JSON Schema, OpenAI or Anthropic definitions. */
  tools(sessionId: string): Promise<ToolDefinition[]>;
  tools(sessionId: string, options: { format: 'raw' }): Promise<ToolDefinition[]>;
  tools(sessionId: string, options: { format: 'openai' | 'anthropic' }): Promise<Json[]>;
  tools(sessionId: string, options: { format?: 'raw' | 'openai' | 'anthropic' } = {}): Promise<Json[] | ToolDefinition[]> {
    return this.request('GET', this.sessionPath(sessionId, 'tools'), { query: { format: options.format } });
  }

  /** Runs a tool call the model made; its output (a refusal is an `Error: …` output, not a throw). */
  async runTool(sessionId: string, name: string, args: { [key: string]: Json }): Promise<string> {
    const answer = await this.request<{ output: string }>('POST', this.sessionPath(sessionId, 'tools', name), {
      body: { arguments: args },
    });
    return answer.output;
  }
}

/** The whole body of an answer, as text; a connection that breaks meanwhile is unavailable. */
async function bodyOf(answer: Answer, what: string): Promise<string> {
  try {
    return await answer.all();
  } catch (failure) {
    answer.discard();
    throw new SessiondbUnavailable(`${what}: ${(failure as Error).message}`);
  }
}

/** The JSON values of NDJSON text, one per non-blank line. */
function ndjsonOf(text: string): unknown[] {
  return text
    .split('\n')
    .filter((line) => line.trim() !== '')
    .map((line) => JSON.parse(line) as unknown);
}

async function errorOf(answer: Answer): Promise<SessiondbError> {
  const status = answer.status;
  const text = await bodyOf(answer, `an answer ${status}`);
  try {
    const { error } = JSON.parse(text) as { error: { code: string; message: string } };
    if (typeof error.code === 'string' && typeof error.message === 'string') {
      return new SessiondbError(status, error.code, error.message);
    }
  } catch {
    // Not the API's error shape (a proxy in between, or the HTTP layer's own answer).
  }
  return new SessiondbError(status, 'http_error', text || answer.statusText);
}
