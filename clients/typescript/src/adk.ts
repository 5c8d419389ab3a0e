/**
 * Google's Agent Development Kit (ADK) for TypeScript on sessiondb: `SessiondbSessionService` is
 * a `BaseSessionService`, so a `Runner` takes it in place of `InMemorySessionService` or
 * `DatabaseSessionService`, and every session, event and state value lives in sessiondb: shared
 * by every process that talks to the server, searchable, and readable by every other client as
 * ordinary messages.
 *
 * Stored as the Python client's `sessiondb.adk` stores them, so both read one session:
 *
 * - An ADK session `(appName, userId, sessionId)` is the sessiondb session
 *   `adk/<app>/<user>/<session>` (each part percent-encoded; a SHA-256 stands in past 256
 *   characters) with `userId` the ADK user and the three names in its metadata (`adkApp`,
 *   `adkUserId`, `adkSessionId`).
 * - An event is a message whose id is the event's id: role `user` when the user wrote it, `tool`
 *   when its content holds only function responses, `assistant` otherwise; its `content` is the
 *   text of its parts, and the whole event in ADK's storage form (snake_case keys, as both ADKs'
 *   database services keep it, the timestamp in seconds; without its parts when they are that one
 *   text) is kept under the metadata key `adkEvent`. A message another client wrote reads as an
 *   event of that role's text (author `user` or `model`).
 * - Session-scoped state is the session's state keys; `app:` keys are the state of the session
 *   `adk-app/<app>`, `user:` keys that of `adk-user/<app>/<user>`, both without their prefix;
 *   `temp:` keys are never stored.
 *
 * Writes. `createSession` creates the session with its initial state, and `appendEvent` stores
 * an event with its state changes, session, app and user scope alike, each in one request
 * (`POST /v1/import` into the three sessions), all or nothing. It goes in
 * only while the session's last stored event is the one this service last read or wrote for that
 * session object (`ifLeaf`). When another writer got there first, the session object is read
 * again (events and state, as ADK's `DatabaseSessionService` refreshes a stale session) and the
 * event goes in after what it missed, so of racing writers every event lands once, one after
 * another. An event whose id the session object already holds replaces the stored one.
 *
 * Memory. `SessiondbMemoryService` is ADK's `BaseMemoryService` (what `load_memory` and
 * `preload_memory` search; a `Runner`'s `memoryService`), as the Python client's: what
 * `addSessionToMemory` is given is kept in sessions of its own, `adk-memory/<app>/<user>/<session>`,
 * recorded for the owner `adk-memory/<app>/<user>` (the names in its metadata under `adkMemory`), each event a message as above and kept once
 * however often its session is added; `searchMemory` finds the owner's messages holding any of
 * the query's words, best first, each read back as the event it stores.
 *
 * Reads. `getSession` reads the session, its events and the three states at once; the events
 * transfer nothing while the session is still as this service last read or wrote it (it holds
 * each session's stored path with the session's version, and a new event from a session object
 * that is up to date with it goes in at that version). With `numRecentEvents` the events are
 * read newest first, a page at a time, only as far as needed.
 * `listSessions` lists the app's sessions (one user's through the server's user index), ordered
 * and paged as ADK's own services do, with the merged state of the sessions on the page.
 *
 * Moving in: `copySessions` copies an app's sessions from any other session service
 * (`DatabaseSessionService`, `InMemorySessionService`, ...) with their events and state, each
 * session in one write (with the app and user state it shows), all or nothing. A session the
 * target already holds with the same events is skipped, so a copy cut short is finished by
 * running it again; one that holds the first of its events (copied before the source went on)
 * takes the events it lacks and the state, in one write; one it holds with other events is
 * refused (`conflict`), writing nothing.
 * A conversation longer than one request (16 Mi characters of JSON, or the server's
 * `--max-body-bytes`) goes in several writes, each under the one before (`copyConversation`).
 */
import { BaseSessionService, State, createEvent, createSession } from '@google/adk';
import type {
  AppendEventRequest,
  BaseMemoryService,
  MemoryEntry,
  SearchMemoryRequest,
  SearchMemoryResponse,
  CreateSessionRequest,
  DeleteSessionRequest,
  Event,
  GetSessionConfig,
  GetSessionRequest,
  ListSessionsRequest,
  ListSessionsResponse,
  Session,
} from '@google/adk';

import {
  COMPACTION_PREFIX,
  Client,
  type Copied,
  CopyConflict,
  type ImportLine,
  type Json,
  type MessageInput,
  SessiondbError,
  type SessionRecord,
  type StoredMessage,
  boundedId,
  joinedId,
  messageIdFor,
} from './client.js';

export const EVENT_KEY = 'adkEvent';
export const APP_KEY = 'adkApp';
export const USER_KEY = 'adkUserId';
export const SESSION_KEY = 'adkSessionId';
/** The metadata key of a memory session: its app, user and session. */
export const MEMORY_KEY = 'adkMemory';
const PAGE_SIZE = 100;
/** How often one append reads a session again after other writers moved it, before giving up. */
const MAX_REFRESHES = 16;
/** Sessions whose stored path a service holds. */
const HELD_SESSIONS = 256;

/** The sessiondb session holding an ADK session. */
export function sessionKey(appName: string, userId: string, sessionId: string): string {
  return boundedId(joinedId('adk', appName, userId, sessionId));
}

/** The sessiondb session whose state is an app's `app:` state. */
export function appStateKey(appName: string): string {
  return boundedId(joinedId('adk-app', appName));
}

/** The sessiondb session whose state is a user's `user:` state in an app. */
export function userStateKey(appName: string, userId: string): string {
  return boundedId(joinedId('adk-user', appName, userId));
}

type JsonObject = { [key: string]: Json };
type Scopes = { app: JsonObject; user: JsonObject; session: JsonObject };
type HeldPath = { version: number; path: StoredMessage[] };

/** `value` as JSON: as `JSON.stringify` gives it, `null` for what it leaves out, else its text. */
function jsonOf(value: unknown): Json {
  try {
    const text = JSON.stringify(value);
    return text === undefined ? null : (JSON.parse(text) as Json);
  } catch {
    return String(value);
  }
}

/** `delta` by scope, prefixes removed and `temp:` keys left out. */
export function splitState(delta: Record<string, unknown>): Scopes {
  const scopes: Scopes = { app: {}, user: {}, session: {} };
  for (const [key, value] of Object.entries(delta)) {
    if (key.startsWith(State.TEMP_PREFIX)) continue;
    if (key.startsWith(State.APP_PREFIX)) scopes.app[key.slice(State.APP_PREFIX.length)] = jsonOf(value);
    else if (key.startsWith(State.USER_PREFIX)) scopes.user[key.slice(State.USER_PREFIX.length)] = jsonOf(value);
    else scopes.session[key] = jsonOf(value);
  }
  return scopes;
}

/** The state an ADK session shows: its own keys, then the app's and user's with prefixes. */
export function mergedState(app: JsonObject, user: JsonObject, session: JsonObject): Record<string, unknown> {
  const state: Record<string, unknown> = { ...session };
  for (const [key, value] of Object.entries(app)) state[State.APP_PREFIX + key] = value;
  for (const [key, value] of Object.entries(user)) state[State.USER_PREFIX + key] = value;
  return state;
}

// ADK's storage form of an event: snake_case keys, except inside the maps whose keys are the
// user's (as `transformToSnakeCaseEvent` and `transformToCamelCaseEvent` keep them).
const VERBATIM_CAMEL = ['actions.stateDelta', 'actions.artifactDelta', 'actions.requestedAuthConfigs',
  'actions.requestedToolConfirmations', 'actions.customMetadata', 'customMetadata',
  'content.parts.functionCall.args', 'content.parts.functionResponse.response', 'output', 'route',
  'actions.agentState'];
const VERBATIM_SNAKE = VERBATIM_CAMEL.map((path) => path.split('.').map(snakeKey).join('.'));

function snakeKey(key: string): string {
  return key.replace(/[A-Z]/g, (letter) => '_' + letter.toLowerCase());
}

function camelKey(key: string): string {
  return key.replace(/_([a-z])/g, (_, letter: string) => letter.toUpperCase());
}

/** `value` with its keys renamed by `rename`, except below the paths in `verbatim` (paths
 * name keys, not array positions). */
function renamed(value: unknown, rename: (key: string) => string, verbatim: string[], path = ''): unknown {
  if (Array.isArray(value)) return value.map((item) => renamed(item, rename, verbatim, path));
  if (value === null || typeof value !== 'object') return value;
  const result: Record<string, unknown> = {};
  for (const [key, item] of Object.entries(value)) {
    const at = path === '' ? key : `${path}.${key}`;
    // A verbatim value is copied too: events read from what the service holds share nothing.
    result[rename(key)] = verbatim.includes(at) ? structuredClone(item) : renamed(item, rename, verbatim, at);
  }
  return result;
}

function partsOf(event: Event): Record<string, unknown>[] {
  return (event.content?.parts ?? []) as Record<string, unknown>[];
}

function textOf(event: Event): string {
  return partsOf(event)
    .filter((part) => typeof part.text === 'string' && part.text !== '' && !part.thought)
    .map((part) => part.text as string)
    .join('\n');
}

function roleOf(event: Event): string {
  if (event.author === 'user') return 'user';
  const parts = partsOf(event);
  return parts.length > 0 && parts.every((part) => part.functionResponse !== undefined) ? 'tool' : 'assistant';
}

function isObject(value: unknown): value is JsonObject {
  return value !== null && typeof value === 'object' && !Array.isArray(value);
}

/** The sessiondb message that stores one ADK event. */
export function messageOfEvent(event: Event): MessageInput & { id: string } {
  const text = textOf(event);
  const whole = jsonOf(renamed(event, snakeKey, VERBATIM_CAMEL)) as JsonObject;
  whole.timestamp = event.timestamp / 1000;
  // As every ADK service stores an event: without the `temp:` keys of its state delta.
  const delta = isObject(whole.actions) ? whole.actions.state_delta : undefined;
  if (isObject(delta)) for (const key of Object.keys(delta)) if (key.startsWith(State.TEMP_PREFIX)) delete delta[key];
  // An event of one text part is its text: kept once, as the message's content.
  const content = whole.content;
  if (text !== '' && isObject(content) && JSON.stringify(content.parts) === JSON.stringify([{ text }])) {
    delete content.parts;
  }
  return { id: messageIdFor(event.id), role: roleOf(event), content: text, metadata: { [EVENT_KEY]: whole } };
}

/** The ADK event a stored message holds (see the module's documentation). */
export function eventOf(message: StoredMessage): Event {
  const stored = message.metadata?.[EVENT_KEY];
  const text = typeof message.content === 'string'
    ? message.content
    : (message.parts ?? [])
        .filter((part): part is JsonObject => isObject(part) && part.type === 'text')
        .map((part) => String(part.text ?? ''))
        .join('\n');
  if (isObject(stored)) {
    let whole = stored;
    if (isObject(whole.content) && !('parts' in whole.content) && text !== '') {
      whole = { ...whole, content: { ...whole.content, parts: [{ text }] } };
    }
    const event = renamed(whole, camelKey, VERBATIM_SNAKE) as Record<string, unknown>;
    return createEvent({ ...event, timestamp: Number(whole.timestamp) * 1000 } as Partial<Event>);
  }
  const role = message.role === 'user' ? 'user' : 'model';
  return createEvent({
    id: message.id,
    invocationId: '',
    author: role,
    content: { role, parts: [{ text }] },
    timestamp: message.createdAt,
  });
}

function stateLines(values: JsonObject): ImportLine[] {
  return Object.entries(values).map(([key, value]) => ({ state: { key, value } }));
}

/** Parts of an `importTogether` that write the app and user state changes in `scopes`, each
 * creating its scope's session when it is new. */
function scopeParts(appName: string, userId: string, scopes: Scopes): { sessionId: string; lines: ImportLine[] }[] {
  const parts = [];
  if (Object.keys(scopes.app).length > 0) {
    const record = { metadata: { [APP_KEY]: appName } };
    parts.push({ sessionId: appStateKey(appName), lines: [{ session: record }, ...stateLines(scopes.app)] });
  }
  if (Object.keys(scopes.user).length > 0) {
    const record = { userId, metadata: { [APP_KEY]: appName, [USER_KEY]: userId } };
    parts.push({ sessionId: userStateKey(appName, userId), lines: [{ session: record }, ...stateLines(scopes.user)] });
  }
  return parts;
}

function isMissing(error: unknown): boolean {
  return error instanceof SessiondbError && error.code === 'not_found';
}

/** ADK sessions in sessiondb, through `client` (see the module's documentation). */
export class SessiondbSessionService extends BaseSessionService {
  readonly client: Client;
  /** The stored leaf each session object was last read or written at (`null`: no events). */
  private readonly leaves = new WeakMap<Session, string | null>();
  /** Per session key, its version and stored path as this service last read or wrote it (never
   * handed out: each read builds events of its own), so a read while the session is still at
   * that version transfers no events; for the `HELD_SESSIONS` used last, least recent first. */
  private readonly held = new Map<string, HeldPath>();

  constructor(client: Client) {
    super();
    this.client = client;
  }

  async createSession({ appName, userId, state, sessionId }: CreateSessionRequest): Promise<Session> {
    const id = sessionId || globalThis.crypto.randomUUID();
    const key = sessionKey(appName, userId, id);
    const scopes = splitState(state ?? {});
    const metadata = { [APP_KEY]: appName, [USER_KEY]: userId, [SESSION_KEY]: id };
    const lines: ImportLine[] = [{ session: { userId, metadata } }, ...stateLines(scopes.session)];
    await this.client.importTogether([{ sessionId: key, lines, ifAbsent: true }, ...scopeParts(appName, userId, scopes)]);
    const [record, app, user] = await Promise.all([
      this.client.getSession(key),
      this.client.allState(appStateKey(appName)),
      this.client.allState(userStateKey(appName, userId)),
    ]);
    const session = createSession({
      id,
      appName,
      userId,
      state: mergedState(app, user, scopes.session),
      events: [],
      lastUpdateTime: record.createdAt,
    });
    this.leaves.set(session, null);
    return session;
  }

  async getSession({ appName, userId, sessionId, config }: GetSessionRequest): Promise<Session | undefined> {
    const key = sessionKey(appName, userId, sessionId);
    let record: SessionRecord;
    try {
      record = await this.client.getSession(key);
    } catch (error) {
      if (isMissing(error)) return undefined;
      throw error;
    }
    const [events, app, user, own] = await Promise.all([
      this.events(key, config),
      this.client.allState(appStateKey(appName)),
      this.client.allState(userStateKey(appName, userId)),
      this.client.allState(key),
    ]);
    const session = createSession({
      id: sessionId,
      appName,
      userId,
      state: mergedState(app, user, own),
      events,
      lastUpdateTime: record.updatedAt,
    });
    this.leaves.set(session, record.leafId ?? null);
    return session;
  }

  async listSessions({ appName, userId, limit, offset, page, order }: ListSessionsRequest): Promise<ListSessionsResponse> {
    const records: SessionRecord[] = [];
    for await (const record of this.client.listSessions({ userId, sort: 'updatedAt', order: 'asc' })) {
      const metadata = record.metadata ?? {};
      if (metadata[APP_KEY] !== appName || typeof metadata[SESSION_KEY] !== 'string') continue;
      if (userId !== undefined && metadata[USER_KEY] !== userId) continue;
      records.push(record);
    }
    const bySessionId = (a: SessionRecord, b: SessionRecord) =>
      String(a.metadata?.[SESSION_KEY]).localeCompare(String(b.metadata?.[SESSION_KEY]));
    if (order === 'asc') records.sort((a, b) => a.updatedAt - b.updatedAt || bySessionId(a, b));
    if (order === 'desc') records.sort((a, b) => b.updatedAt - a.updatedAt || bySessionId(a, b));
    // Paged as ADK's own services page: `page` (1-based, needs `limit`) before `offset`.
    const totalItems = records.length;
    let shown = records;
    let paging = { page: 1, limit: totalItems, totalItems, totalPages: totalItems === 0 ? 0 : 1 };
    if (limit !== undefined) {
      const start = page !== undefined ? (page - 1) * limit : (offset ?? 0);
      shown = records.slice(start, start + limit);
      paging = {
        page: page ?? (limit === 0 ? 1 : Math.floor(start / limit) + 1),
        limit,
        totalItems,
        totalPages: limit === 0 ? 0 : Math.ceil(totalItems / limit),
      };
    } else if (offset) {
      shown = records.slice(offset);
    }
    const app = await this.client.allState(appStateKey(appName));
    const users = new Map<string, Promise<JsonObject>>();
    const sessions = await Promise.all(shown.map(async (record) => {
      const owner = String(record.metadata?.[USER_KEY]);
      if (!users.has(owner)) users.set(owner, this.client.allState(userStateKey(appName, owner)));
      const [user, own] = await Promise.all([users.get(owner)!, this.client.allState(record.id)]);
      return createSession({
        id: String(record.metadata?.[SESSION_KEY]),
        appName,
        userId: owner,
        state: mergedState(app, user, own),
        events: [],
        lastUpdateTime: record.updatedAt,
      });
    }));
    return { sessions, ...paging };
  }

  async deleteSession({ appName, userId, sessionId }: DeleteSessionRequest): Promise<void> {
    const key = sessionKey(appName, userId, sessionId);
    this.held.delete(key);
    await this.client.deleteSession(key, { missingOk: true });
  }

  async appendEvent({ session, event }: AppendEventRequest): Promise<Event> {
    if (event.partial) return event;
    // An event of an id the session object holds replaces that one.
    const replaces = session.events.some((held) => held.id === event.id);
    await this.store(session, event, replaces);
    // The stored event now updates the session object as every service's does (temp keys
    // left out of its state, an event of a known id replaced).
    const appended = await super.appendEvent({ session, event });
    session.lastUpdateTime = event.timestamp;
    // A replaced event stays where it was: the leaf moves only for a new one.
    if (!replaces) this.leaves.set(session, messageIdFor(event.id));
    return appended;
  }

  /** The events `config` asks for, oldest first. */
  private async events(key: string, config: GetSessionConfig | undefined): Promise<Event[]> {
    const wanted = config?.numRecentEvents;
    const after = config?.afterTimestamp;
    // As ADK's own services: no `numRecentEvents` (or 0) reads every event.
    if (!wanted) {
      const events = (await this.storedPath(key)).map(eventOf);
      return after ? events.filter((event) => event.timestamp >= after) : events;
    }
    const newest: Event[] = [];
    for await (const message of this.client.iterMessages(key, { order: 'desc', pageSize: Math.min(PAGE_SIZE, wanted) })) {
      const event = eventOf(message);
      if (after && event.timestamp < after) break;
      newest.push(event);
      if (newest.length === wanted) break;
    }
    return newest.reverse();
  }

  /** The session's stored path, oldest first: what is held while the session is still at its
   * version, else read (and held). */
  private async storedPath(key: string): Promise<StoredMessage[]> {
    const held = this.held.get(key);
    const read = await this.client.versionedHistory(key, { unlessVersion: held?.version });
    if (read === null && held !== undefined) {
      this.hold(key, held);
      return held.path;
    }
    const { version, messages } = read ?? { version: 0, messages: [] };
    this.held.delete(key);
    if (messages.some((message) => message.id.startsWith(COMPACTION_PREFIX))) {
      // A compaction's summary stands in the read path: the stored one is read in pages.
      const stored: StoredMessage[] = [];
      for await (const message of this.client.iterMessages(key)) stored.push(message);
      return stored;
    }
    if (version) this.hold(key, { version, path: messages });
    return messages;
  }

  /** Holds `path` for the session as the one used last, forgetting the least recently used
   * past `HELD_SESSIONS`. */
  private hold(key: string, path: HeldPath): void {
    this.held.delete(key);
    this.held.set(key, path);
    if (this.held.size > HELD_SESSIONS) this.held.delete(this.held.keys().next().value as string);
  }

  /** Stores `event` with its state changes; `replaces`: the session object holds its id. */
  private async store(session: Session, event: Event, replaces: boolean): Promise<void> {
    const key = sessionKey(session.appName, session.userId, session.id);
    const scopes = splitState(event.actions?.stateDelta ?? {});
    const message = messageOfEvent(event);
    const scoped = scopeParts(session.appName, session.userId, scopes);
    const held = this.held.get(key);
    this.held.delete(key);
    const leaf = this.leafOf(session);
    if (held !== undefined && !replaces && leaf !== null && held.path.at(-1)?.id === leaf) {
      // The path held ends where this object does: at the version held, the path after the
      // write is what is held plus this event (an import stores it as given).
      const createdAt = Math.floor(event.timestamp);
      const lines = [{ message, parentId: leaf, createdAt }, ...stateLines(scopes.session)];
      try {
        const answer = await this.client.importTogether([{ sessionId: key, lines, ifVersion: held.version }, ...scoped]);
        const version = answer.parts[0].version;
        if (version !== undefined) this.hold(key, { version, path: [...held.path, { ...message, createdAt }] });
        return;
      } catch (error) {
        const refused = error instanceof SessiondbError && (error.code === 'conflict' || error.code === 'not_found');
        if (!refused) throw error;
      }
    }
    for (let refreshes = 0; ; refreshes++) {
      try {
        // A new event goes under the leaf the object was read at; one the object holds is
        // rewritten where it is stored. Either way the write holds only while that leaf is the
        // session's (so a deleted session stays deleted).
        const leaf = this.leafOf(session);
        const line: ImportLine = { message, parentId: leaf, createdAt: Math.floor(event.timestamp), ...(replaces ? { replace: true } : {}) };
        const lines = [line, ...stateLines(scopes.session)];
        await this.client.importTogether([{ sessionId: key, lines, ifLeaf: leaf }, ...scoped]);
        return;
      } catch (error) {
        const moved = error instanceof SessiondbError && error.code === 'conflict';
        if (!moved || refreshes === MAX_REFRESHES) throw error;
        await this.refresh(session);
      }
    }
  }

  /** What this service last read or wrote for `session`; for a session object it never saw, its
   * last event. */
  private leafOf(session: Session): string | null {
    const leaf = this.leaves.get(session);
    if (leaf !== undefined) return leaf;
    const last = session.events[session.events.length - 1];
    return last === undefined ? null : messageIdFor(last.id);
  }

  /** Reads `session` again into the same object: events, state, update time and leaf. */
  private async refresh(session: Session): Promise<void> {
    const fresh = await this.getSession({ appName: session.appName, userId: session.userId, sessionId: session.id });
    if (fresh === undefined) throw new SessiondbError(404, 'not_found', `the session ${session.id} was deleted`);
    session.events = fresh.events;
    session.state = fresh.state;
    session.lastUpdateTime = fresh.lastUpdateTime;
    this.leaves.set(session, this.leaves.get(fresh) ?? null);
  }
}

/**
 * Copies the app's sessions (one user's, or every user's) from `source` into `target`, least
 * recently updated first, each in one write (see the module's documentation): which were written
 * and which skipped, as `[userId, sessionId]` pairs. Events keep their times; a session
 * deleted from `source` while this runs is left out.
 */
export async function copySessions(
  source: BaseSessionService,
  target: SessiondbSessionService,
  { appName, userId }: { appName: string; userId?: string },
): Promise<Copied<[string, string]>> {
  const { sessions } = await source.listSessions({ appName, userId });
  const copied: Copied<[string, string]> = { copied: [], skipped: [] };
  for (const listed of [...sessions].sort((a, b) => a.lastUpdateTime - b.lastUpdateTime)) {
    const session = await source.getSession({ appName, userId: listed.userId, sessionId: listed.id });
    if (session === undefined) continue;
    const name: [string, string] = [session.userId, session.id];
    (await copySession(session, target) ? copied.copied : copied.skipped).push(name);
  }
  return copied;
}

/**
 * Stores `session` (another service's, whole) as a session that does not exist in `target` yet,
 * as `createSession` and `appendEvent` would have stored it; or, into one that holds the first of
 * its events, the events it lacks with the state: whether it wrote.
 */
async function copySession(session: Session, target: SessiondbSessionService): Promise<boolean> {
  const scopes = splitState(session.state);
  const messages = session.events.map(messageOfEvent);
  const metadata = { [APP_KEY]: session.appName, [USER_KEY]: session.userId, [SESSION_KEY]: session.id };
  try {
    return await target.client.copyConversation(
      sessionKey(session.appName, session.userId, session.id),
      messages,
      (stored, i) => stored.id === messages[i].id,
      { userId: session.userId, metadata },
      {
        createdAt: session.events.map((event) => Math.floor(event.timestamp)),
        alsoLines: stateLines(scopes.session),
        alsoParts: scopeParts(session.appName, session.userId, scopes),
      },
    );
  } catch (error) {
    if (!(error instanceof CopyConflict)) throw error;
    const copied = error.wroteBefore
      ? 'the events it wrote before another writer changed the session stay'
      : 'nothing was copied';
    throw new SessiondbError(
      409,
      'conflict',
      `the session ${JSON.stringify(session.id)} already exists with events the copy does not begin with; ${copied}`,
    );
  }
}

/** The owner (`userId`) of a user's memory sessions in an app. */
export function memoryOwner(appName: string, userId: string): string {
  return boundedId(joinedId('adk-memory', appName, userId));
}

/** The sessiondb session keeping what a session gave a user's memory. */
export function memoryKey(appName: string, userId: string, sessionId: string): string {
  return boundedId(joinedId('adk-memory', appName, userId, sessionId));
}

/** ADK's memory in sessiondb, through `client` (see the module's documentation). */
export class SessiondbMemoryService implements BaseMemoryService {
  constructor(
    readonly client: Client,
    /** Memories a search returns at most. */
    readonly maxResults = 10,
  ) {}

  /** Keeps the session's events that have content, chained in their order, in one write that
   * skips the ones kept before (their ids are the events'). */
  async addSessionToMemory(session: Session): Promise<void> {
    const owner = memoryOwner(session.appName, session.userId);
    // Its own metadata key: the session service lists an app's sessions by `adkApp`.
    const metadata = { [MEMORY_KEY]: { app: session.appName, user: session.userId, session: session.id } };
    const lines: ImportLine[] = [{ session: { userId: owner, metadata } }];
    let parent: string | null = null;
    for (const event of session.events) {
      if (!event.content?.parts?.length) continue;
      const message = messageOfEvent(event);
      lines.push({ message, parentId: parent, createdAt: Math.floor(event.timestamp) });
      parent = message.id;
    }
    if (parent !== null) await this.client.importLines(memoryKey(session.appName, session.userId, session.id), lines);
  }

  async searchMemory({ appName, userId, query }: SearchMemoryRequest): Promise<SearchMemoryResponse> {
    const owner = memoryOwner(appName, userId);
    const hits = await this.client.searchAll(query, { userId: owner, limit: this.maxResults, match: 'any' });
    const memories: MemoryEntry[] = [];
    for (const hit of hits) {
      let message: StoredMessage;
      try {
        message = await this.client.getMessage(hit.sessionId, hit.id);
      } catch (error) {
        if (isMissing(error)) continue; // forgotten since the search
        throw error;
      }
      const event = eventOf(message);
      if (event.content === undefined) continue;
      memories.push({ content: event.content, author: event.author, timestamp: new Date(event.timestamp).toISOString() });
    }
    return { memories };
  }
}
