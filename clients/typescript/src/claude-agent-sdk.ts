/**
 * The Claude Agent SDK's `SessionStore` on sessiondb: pass `new SessiondbSessionStore({ client })`
 * as `sessionStore` and Claude Code's transcripts are mirrored into sessiondb and resumed from it.
 *
 * Stored as the Python client stores them, so both read the same transcripts: each key is one
 * session (id: the store's prefix, then the key's percent-encoded parts joined with `/`, or a
 * SHA-256 of that past 256 characters), recorded for the user `prefix + projectKey` with the key
 * in its metadata under `claudeSessionKey`; each entry is one message whose id is the entry's
 * `uuid` (a retried batch is stored once). An entry carrying an API message is stored with that
 * message's role and content (so transcripts are searchable conversations), the rest under
 * `claudeEntry`; other entries are stored whole as `content` with `claudeEntry: "content"`.
 *
 * The summaries `listSessionSummaries` returns (one listing instead of a `load` per session) are
 * kept in the session's metadata under `claudeSummary`: the SDK's fold of every entry, with the
 * id of the last entry folded and how many there were. Appends by several processes may
 * interleave and sessiondb has no compare-and-set, so the fold is checked instead: a summary
 * counts only while its last entry and count are the session's leaf and message count. An append
 * whose stored summary does not match after it is written folds the whole transcript again; a
 * summary that does not match when listed is left out (the SDK then loads that session). The two
 * SDKs' folds need not agree, so each language trusts only the summaries it wrote.
 */
import { createHash, randomUUID } from 'node:crypto';

import type { SessionKey, SessionStore, SessionStoreEntry, SessionSummaryEntry } from '@anthropic-ai/claude-agent-sdk';

import {
  Client,
  SessiondbError,
  boundedId,
  joinedId,
  messageIdFor,
  usableId,
  usableName,
  type Json,
  type MessageInput,
  type SessionRecord,
  type StoredMessage,
} from './client.js';

export const ENTRY_KEY = 'claudeEntry';
export const SESSION_KEY = 'claudeSessionKey';
export const SUMMARY_KEY = 'claudeSummary';
const WHOLE_ENTRY = 'content';
const SUMMARY_SDK = 'typescript';
const BINDINGS = 'claude-bindings';
const UUID = /^[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}$/;

type Entry = { [key: string]: Json };
type StoredKey = { projectKey: string; sessionId: string; subpath?: string };
/** A stored summary: the SDK's fold (`entry`) of `count` messages ending at `through`. */
type StoredSummary = { sdk: string; through: string | null; count: number; entry: SessionSummaryEntry | null };

function summaryOf(session: SessionRecord): StoredSummary | undefined {
  const summary = session.metadata?.[SUMMARY_KEY] as StoredSummary | undefined;
  return summary !== null && typeof summary === 'object' && summary.sdk === SUMMARY_SDK ? summary : undefined;
}

/**
 * Whether the summary folded exactly the session's messages: it ends at the session's leaf and
 * counts as many. (Transcripts are linear: every append goes under the leaf.)
 */
function matches(summary: StoredSummary, session: SessionRecord): boolean {
  return summary.entry !== null && summary.through === session.leafId && summary.count === session.messageCount;
}

/** The sessiondb message that stores one transcript entry. */
export function messageOfEntry(entry: Entry): MessageInput {
  const message: Partial<MessageInput> = {};
  if (usableId(entry.uuid)) message.id = entry.uuid;
  const apiMessage = entry.message;
  if (
    apiMessage !== null &&
    typeof apiMessage === 'object' &&
    !Array.isArray(apiMessage) &&
    usableName(apiMessage.role) &&
    (typeof apiMessage.content === 'string' || Array.isArray(apiMessage.content))
  ) {
    const { content, ...messageRest } = apiMessage;
    return { ...message, role: apiMessage.role, content, metadata: { [ENTRY_KEY]: { ...entry, message: messageRest } } };
  }
  return {
    ...message,
    role: usableName(entry.type) ? entry.type : 'entry',
    content: entry,
    metadata: { [ENTRY_KEY]: WHOLE_ENTRY },
  };
}

/** The transcript entry a stored message holds. */
export function entryOfMessage(message: StoredMessage): SessionStoreEntry {
  const stored = message.metadata?.[ENTRY_KEY];
  if (stored === WHOLE_ENTRY) return message.content as SessionStoreEntry;
  if (stored === null || typeof stored !== 'object' || Array.isArray(stored)) {
    // Written by another client: shown to the SDK as a plain message entry.
    return {
      type: message.role,
      uuid: message.id,
      message: { role: message.role, content: message.content ?? '' },
    };
  }
  const apiMessage = stored.message as Entry;
  return { ...stored, message: { ...apiMessage, content: message.content ?? null } } as unknown as SessionStoreEntry;
}

export interface SessiondbSessionStoreOptions {
  client: Client;
  /**
   * Put before every session id and owner this store writes, to keep its transcripts apart from
   * other conversations of the namespace.
   */
  prefix?: string;
}

/**
 * A Claude Agent SDK session store on the sessiondb server behind `client`. Transcripts longer
 * than the server's `--max-messages-per-session` (10,000 by default) are refused with its
 * `quota_exceeded` error.
 */
export class SessiondbSessionStore implements SessionStore {
  readonly client: Client;
  readonly prefix: string;
  /** The summary this process last stored, by session id. */
  private readonly summaries = new Map<string, StoredSummary>();

  constructor(options: SessiondbSessionStoreOptions) {
    this.client = options.client;
    this.prefix = options.prefix ?? '';
  }

  private sessionIdOf(key: SessionKey): string {
    return boundedId(joinedId(key.projectKey, key.sessionId, ...(key.subpath ? [key.subpath] : [])), this.prefix);
  }

  private owner(projectKey: string): string {
    return boundedId(projectKey, this.prefix);
  }

  /** Every session of the project with its stored key, subagent transcripts included. */
  private async projectSessions(projectKey: string): Promise<Array<[SessionRecord, StoredKey]>> {
    const found: Array<[SessionRecord, StoredKey]> = [];
    for await (const session of this.client.listSessions({ userId: this.owner(projectKey) })) {
      const key = session.metadata?.[SESSION_KEY] as StoredKey | undefined;
      if (key !== null && typeof key === 'object' && key.projectKey === projectKey) found.push([session, key]);
    }
    return found;
  }

  async append(key: SessionKey, entries: SessionStoreEntry[]): Promise<void> {
    if (entries.length === 0) return;
    const sessionId = this.sessionIdOf(key);
    const storedKey: StoredKey = { projectKey: key.projectKey, sessionId: key.sessionId };
    if (key.subpath) storedKey.subpath = key.subpath;
    try {
      await this.client.createSession({
        id: sessionId,
        userId: this.owner(key.projectKey),
        metadata: { [SESSION_KEY]: storedKey },
      });
      if (!key.subpath) this.summaries.set(sessionId, { sdk: SUMMARY_SDK, through: null, count: 0, entry: null });
    } catch (error) {
      if (!(error instanceof SessiondbError && error.code === 'conflict')) throw error;
    }
    const stored = await this.client.appendBatch(sessionId, (entries as Entry[]).map(messageOfEntry));
    if (!key.subpath) await this.fold(key, sessionId, entries, stored[stored.length - 1].id);
  }

  /**
   * Folds the appended entries into the session's stored summary; the whole transcript instead
   * when there is none to fold into, or the result does not match the session.
   */
  private async fold(key: SessionKey, sessionId: string, entries: SessionStoreEntry[], lastId: string): Promise<void> {
    const { foldSessionSummary } = await import('@anthropic-ai/claude-agent-sdk');
    const store = async (summary: StoredSummary): Promise<SessionRecord> =>
      this.client.updateSession(sessionId, { metadata: { [SUMMARY_KEY]: summary as unknown as Json } });
    const prev = this.summaries.get(sessionId) ?? summaryOf(await this.client.getSession(sessionId));
    if (prev !== undefined) {
      const summary: StoredSummary = {
        sdk: SUMMARY_SDK,
        through: lastId,
        count: prev.count + entries.length,
        entry: foldSessionSummary(prev.entry ?? undefined, key, entries),
      };
      if (matches(summary, await store(summary))) {
        this.summaries.set(sessionId, summary);
        return;
      }
    }
    // Interleaved with another append, or a batch partly stored before: fold it all.
    const messages = await this.messagesOf(sessionId);
    const summary: StoredSummary = {
      sdk: SUMMARY_SDK,
      through: messages.length > 0 ? messages[messages.length - 1].id : null,
      count: messages.length,
      entry: foldSessionSummary(undefined, key, messages.map(entryOfMessage)),
    };
    await store(summary);
    this.summaries.set(sessionId, summary);
  }

  async load(key: SessionKey): Promise<SessionStoreEntry[] | null> {
    const sessionId = this.sessionIdOf(key);
    const messages = await this.messagesOf(sessionId);
    if (messages.length === 0 && !(await this.exists(sessionId))) return null;
    return messages.map(entryOfMessage);
  }

  /** The transcript's messages, oldest first. */
  private async messagesOf(sessionId: string): Promise<StoredMessage[]> {
    const messages: StoredMessage[] = [];
    for await (const message of this.client.iterMessages(sessionId)) messages.push(message);
    return messages;
  }

  private async exists(sessionId: string): Promise<boolean> {
    try {
      await this.client.getSession(sessionId);
      return true;
    } catch (error) {
      if (error instanceof SessiondbError && error.code === 'not_found') return false;
      throw error;
    }
  }

  async listSessions(projectKey: string): Promise<Array<{ sessionId: string; mtime: number }>> {
    return (await this.projectSessions(projectKey))
      .filter(([, key]) => !key.subpath)
      .map(([session, key]) => ({ sessionId: key.sessionId, mtime: session.updatedAt }));
  }

  async listSessionSummaries(projectKey: string): Promise<SessionSummaryEntry[]> {
    const found: SessionSummaryEntry[] = [];
    for (const [session, key] of await this.projectSessions(projectKey)) {
      const summary = summaryOf(session);
      if (key.subpath || summary === undefined || !matches(summary, session)) continue;
      // Stamped with the time `listSessions` gives (the same clock): a summary that matches its
      // session is as new as the session.
      found.push({ ...(summary.entry as SessionSummaryEntry), sessionId: key.sessionId, mtime: session.updatedAt });
    }
    return found;
  }

  async listSubkeys(key: { projectKey: string; sessionId: string }): Promise<string[]> {
    return (await this.projectSessions(key.projectKey))
      .filter(([, stored]) => stored.sessionId === key.sessionId && stored.subpath)
      .map(([, stored]) => stored.subpath as string);
  }

  async delete(key: SessionKey): Promise<void> {
    const doomed = [this.sessionIdOf(key)];
    if (!key.subpath) {
      // A main transcript takes its subagents' transcripts with it.
      for (const subpath of await this.listSubkeys(key)) {
        doomed.push(this.sessionIdOf({ ...key, subpath }));
      }
    }
    for (const sessionId of doomed) {
      await this.client.deleteSession(sessionId, { missingOk: true });
    }
  }
}

/**
 * Stable Claude session ids for an application's own conversation ids, stored as the Python
 * client stores them.
 *
 * Claude Code names a session by a UUID (`sessionId` to start one, `resume` to continue it).
 * `sessionId(conversationId)` gives a UUID back as it is, and for any other id the UUID bound to
 * it, binding a new random one the first time; every process sharing the server gets the same. A
 * binding is a message whose id is the conversation id, written by an append, which stores the
 * first binding and gives the stored one back to every later caller, so processes binding one id
 * at once agree. Bindings are spread over 256 sessions (`prefix + "claude-bindings/"` and two hex
 * digits of the id's SHA-256), so the server's per-session message limit (10,000 by default)
 * allows 2.5 million.
 */
export class SessiondbSessionBinding {
  readonly client: Client;
  readonly prefix: string;

  constructor(options: SessiondbSessionStoreOptions) {
    this.client = options.client;
    this.prefix = options.prefix ?? '';
  }

  private where(conversationId: string): [string, string] {
    if (typeof conversationId !== 'string' || conversationId === '') {
      throw new TypeError('a conversation id is a non-empty string');
    }
    const digest = createHash('sha256').update(conversationId, 'utf8').digest('hex');
    return [boundedId(`${BINDINGS}/${digest.slice(0, 2)}`, this.prefix), messageIdFor(conversationId)];
  }

  async sessionId(conversationId: string): Promise<string> {
    if (UUID.test(conversationId)) return conversationId;
    const [session, id] = this.where(conversationId);
    const binding = { id, role: 'binding', content: randomUUID(), metadata: { conversationId } };
    const stored = await this.client.append(session, binding, { parent: null });
    return stored.message.content as string;
  }

  /** Binds the conversation to another session (a fork of its session, say). */
  async rebind(conversationId: string, sessionId: string): Promise<void> {
    if (!UUID.test(sessionId)) throw new TypeError(`a Claude session id is a UUID, not ${JSON.stringify(sessionId)}`);
    if (UUID.test(conversationId)) throw new TypeError('a UUID conversation id is its own session id and has no binding');
    const [session, id] = this.where(conversationId);
    await this.client.replaceMessage(session, id, { role: 'binding', content: sessionId, metadata: { conversationId } }, { upsert: true });
  }
}
