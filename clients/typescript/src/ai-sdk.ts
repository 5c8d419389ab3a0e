/**
 * The AI SDK's chat persistence on sessiondb: `createChat`, `loadChat` and `saveChat` as the
 * AI SDK's message persistence guide has them, for `useChat` and
 * `toUIMessageStreamResponse({ originalMessages, generateMessageId, onFinish })`.
 *
 * A chat is a session and a `UIMessage` is a message, stored as it is (sessiondb's message
 * model is the UIMessage shape), so search, compaction, the converters and every other client
 * read the chat too. `saveChat` stores what changed: new messages in one write, changed ones
 * replaced; a regenerated answer or an edit's new answer becomes a branch beside the answer it
 * replaces, which stays readable (`alternatives`, `loadChat({ leaf })`).
 */
import type { UIMessage } from 'ai';

import {
  Client,
  COMPACTION_PREFIX,
  type Json,
  type LeafCondition,
  type MessageInput,
  SessiondbError,
  type StoredMessage,
  usableId,
  type WriteCondition,
} from './client.js';
import { jsonEqual } from './json.js';

/** Roles a `UIMessage` has; stored messages of other roles (other clients' tool rows) are left out on load. */
const UI_ROLES = new Set(['system', 'user', 'assistant']);
/** The state key holding a chat's resumable stream id. */
export const ACTIVE_STREAM_KEY = 'aiSdkActiveStreamId';

export interface SessiondbChatStoreOptions {
  client: Client;
  /**
   * How many characters of chats the store keeps in memory (16 M by default; 0 keeps none):
   * what it last read or wrote of each chat's active path, so that a save after a load need not
   * read the chat again, nor a load after a save while nothing else changed the chat.
   */
  memoryChars?: number;
}

/**
 * A chat's active path: its ids in order, the JSON of each (without the store's times), and
 * the chat's version it is the path at, when known.
 */
interface ChatPath {
  ids: string[];
  bodies: Map<string, string>;
  version?: number;
}

/** A path as this store last read or wrote it, and the characters it holds in memory. */
interface SeenPath extends ChatPath {
  chars: number;
}

export interface ChatSummary {
  id: string;
  title: string | null;
  userId: string | null;
  metadata: { [key: string]: Json };
  createdAt: number;
  updatedAt: number;
  /** Messages on the chat's active path. */
  messageCount: number;
}

export interface LoadChatOptions {
  /** The path to this message instead of the active one (an earlier regeneration, say). */
  leaf?: string;
  /**
   * `false` reads the messages exactly as stored; `true` (the default) reads them as a model
   * should see them: a compaction's summary (an assistant message) in place of the messages it
   * covers. The two differ only once the chat has been compacted.
   */
  compacted?: boolean;
}

/**
 * Chats in sessiondb for the AI SDK. Message ids are the `UIMessage` ids, so every message to
 * save needs one: pass `generateMessageId` (e.g. `createIdGenerator()`) to
 * `toUIMessageStreamResponse`, as the AI SDK's persistence guide does.
 */
export class SessiondbChatStore<MESSAGE extends UIMessage = UIMessage> {
  readonly client: Client;
  private readonly memoryChars: number;
  /** Chats' paths by chat id, least recently used first. */
  private readonly seen = new Map<string, SeenPath>();
  private seenChars = 0;

  constructor(options: SessiondbChatStoreOptions) {
    this.client = options.client;
    this.memoryChars = options.memoryChars ?? 16 << 20;
  }

  /** Creates an empty chat and resolves to its id (a `conflict` error if `id` is taken). */
  async createChat(options: {
    id?: string;
    title?: string;
    userId?: string;
    metadata?: { [key: string]: Json };
  } = {}): Promise<string> {
    const { title, ...rest } = options;
    const session = await this.client.createSession({ ...rest, ...(title === undefined ? {} : { name: title }) });
    return session.id;
  }

  /**
   * The chat's messages, oldest first; an unknown chat has none. The active path is read only
   * when the chat changed since this store last read or wrote it: otherwise the server says so
   * (`304`) and the messages come from memory.
   */
  async loadChat(chatId: string, options: LoadChatOptions = {}): Promise<MESSAGE[]> {
    let stored: StoredMessage[] = [];
    let version = 0;
    if (options.compacted === false) {
      if (options.leaf !== undefined) {
        throw invalid('`leaf` reads a path with compactions applied; it takes no `compacted: false`');
      }
      stored = await this.client.storedHistory(chatId);
    } else if (options.leaf !== undefined) {
      for await (const message of this.client.history(chatId, { leaf: options.leaf })) stored.push(message);
    } else {
      const seen = this.seen.get(chatId);
      const read = await this.client.versionedHistory(chatId, { unlessVersion: seen?.version });
      if (read === null && seen !== undefined) {
        this.remember(chatId, seen);
        return uiMessagesOf(seen.ids.map((id) => JSON.parse(seen.bodies.get(id) as string) as StoredMessage));
      }
      ({ messages: stored, version } = read ?? { messages: [], version: 0 });
    }
    // The active path as stored (no summary standing in it) is what the next save compares with.
    if (options.leaf === undefined && !stored.some(isSummary)) {
      this.remember(chatId, { ...chatPath(stored), version: version || undefined });
    }
    return uiMessagesOf(stored);
  }

  /**
   * Stores `messages` as the chat's conversation (the chat is created if needed). Messages the
   * chat has on its active path are replaced where their content differs (an answer continued
   * after a tool result, an edited question), compared with the chat as this store last read or
   * wrote it; from the first message it lacks on, the rest are appended in one write, all or
   * none, after the message before it, so a regenerated answer or the answer to an edit's new
   * question becomes the active branch and the one it replaces stays beside it. That write is
   * conditioned on the chat's active leaf being still the one this store saw (a save with
   * nothing to append looks at the chat once instead): when another writer appended, branched
   * or cut it, or deleted the chat, nothing is written and the save compares with the chat as
   * stored. A turn's save right after its load is thus one request, and the check and the write
   * one step. An edit elsewhere moves no leaf: the save leaves it in place unless the caller
   * changed the same message. Nothing is deleted: stored messages missing from `messages` stay
   * where they are. Compaction summaries in `messages` (from a compacted `loadChat`) are passed
   * over.
   */
  async saveChat({ chatId, messages }: { chatId: string; messages: MESSAGE[] }): Promise<void> {
    const given = checkedMessages(messages);
    const seen = this.seen.get(chatId);
    if (seen !== undefined) {
      try {
        if (await this.saveOnto(chatId, given, seen, { ifLeaf: seen.ids.at(-1) ?? null })) return;
      } catch (error) {
        const moved = error instanceof SessiondbError && (error.code === 'conflict' || error.code === 'not_found');
        if (!moved) throw error;
        // Remembered empty and not there: the chat is as remembered, with nothing to read (and
        // no version: the write creates it).
        if (seen.ids.length === 0 && error.code === 'not_found') {
          await this.saveOnto(chatId, given, { ...seen, version: undefined }, {});
          return;
        }
      }
      this.forget(chatId);
    }
    await this.saveOnto(chatId, given, chatPath(await this.client.storedHistory(chatId)), {});
  }

  /**
   * Saves `given` onto `path`, the chat's active path as this store knows it. With `ifLeaf`
   * (`path` is what this store remembers) the save happens only while the chat still ends
   * there: the append carries the condition (a `conflict` or `not_found` error when it no
   * longer holds), and a save with nothing to write looks at the session once, resolving to
   * false when the chat moved. A replacement is by id and needs no condition. When `path`
   * knows its version the append is tried at that version first, so that the path it leaves
   * is known to be the chat's at the version it answers (another writer's edit, which moves no
   * leaf, makes it the leaf's condition again).
   */
  private async saveOnto(chatId: string, given: UIMessage[], path: ChatPath, condition: LeafCondition): Promise<boolean> {
    let version = path.version;
    let known = 0;
    let replaced = false;
    for (const message of given) {
      const body = path.bodies.get(message.id);
      if (body === undefined) break;
      if (!sameContent(message, body)) {
        path.bodies.set(message.id, await this.replace(chatId, message));
        replaced = true;
      }
      known++;
    }
    // A replacement moved the version, to one this store did not see.
    if (replaced) version = undefined;
    if (known === given.length) {
      if (condition.ifLeaf !== undefined && !replaced) {
        const now = await this.endsAsRemembered(chatId, path);
        if (now === false) return false;
        if (now.version !== version) version = undefined;
      }
      this.remember(chatId, { ...path, version });
      return true;
    }
    const tail = given.slice(known);
    const parentId = known === 0 ? '' : given[known - 1].id;
    const append = (only: WriteCondition) =>
      this.client.appendBatchVersioned(chatId, tail.map(messageInputOf), { parentId, ...only });
    let written: { messages: StoredMessage[]; version?: number };
    try {
      written = await append(version === undefined ? condition : { ifVersion: version });
    } catch (error) {
      if (version === undefined || !(error instanceof SessiondbError && error.code === 'conflict')) throw error;
      version = undefined;
      written = await append(condition);
    }
    const answered = written.messages;
    // The chat's version once this save is done, when nothing else wrote it in between.
    let after = version === undefined ? undefined : written.version;
    const ids = path.ids.slice(0, path.ids.indexOf(parentId) + 1);
    const bodies = new Map(ids.map((id) => [id, path.bodies.get(id) as string]));
    for (const [i, stored] of answered.entries()) {
      // A message of the tail may exist off the active path (the caller went back to an
      // earlier branch): the batch keeps the stored one, so it is compared as the path's are.
      const body = bodyOf(stored);
      ids.push(stored.id);
      if (sameContent(tail[i], body)) {
        bodies.set(stored.id, body);
      } else {
        bodies.set(stored.id, await this.replace(chatId, tail[i]));
        after = undefined;
      }
    }
    // New messages of one write share its time; when the tail met stored ones, where the active
    // path now runs is the server's to say, and the next save reads it.
    const appendedAt = answered[answered.length - 1].createdAt;
    if (answered.every((stored) => stored.createdAt === appendedAt)) this.remember(chatId, { ids, bodies, version: after });
    else this.forget(chatId);
    return true;
  }

  /**
   * Whether the chat still has the leaf and length of `path` (a write elsewhere that appended,
   * branched or deleted moves one of them; an edit does not): `false` when it moved, else the
   * chat's version (none for a chat that does not exist). An empty path is a chat with no
   * messages or none at all.
   */
  private async endsAsRemembered(chatId: string, path: ChatPath): Promise<{ version?: number } | false> {
    const session = await this.client.getSession(chatId).catch((error) => {
      if (error instanceof SessiondbError && error.code === 'not_found') return undefined;
      throw error;
    });
    if (session === undefined) return path.ids.length === 0 ? {} : false;
    const same = (session.leafId ?? undefined) === path.ids.at(-1) && session.messageCount === path.ids.length;
    return same ? { version: session.version } : false;
  }

  /** Chats newest first (by last update), all of them or one user's. */
  async *listChats(options: { userId?: string } = {}): AsyncGenerator<ChatSummary> {
    for await (const session of this.client.listSessions({ userId: options.userId, sort: 'updatedAt', order: 'desc' })) {
      yield {
        id: session.id,
        title: session.name,
        userId: session.userId,
        metadata: session.metadata,
        createdAt: session.createdAt,
        updatedAt: session.updatedAt,
        messageCount: session.messageCount,
      };
    }
  }

  /**
   * The id of the chat's stream in progress, for the AI SDK's stream resumption (`useChat({
   * resume: true })` and `resumable-stream`): what the GET route resumes, `null` when none.
   */
  async activeStreamId(chatId: string): Promise<string | null> {
    try {
      const value = await this.client.getState(chatId, ACTIVE_STREAM_KEY);
      return typeof value === 'string' ? value : null;
    } catch (error) {
      if (error instanceof SessiondbError && error.code === 'not_found') return null;
      throw error;
    }
  }

  /**
   * Sets the chat's stream in progress (when the POST route starts one), or clears it (`null`,
   * when the stream is finished). The id is kept in the chat's state (`aiSdkActiveStreamId`).
   */
  async setActiveStreamId(chatId: string, streamId: string | null): Promise<void> {
    if (streamId !== null) return this.client.putState(chatId, ACTIVE_STREAM_KEY, streamId);
    try {
      await this.client.deleteState(chatId, ACTIVE_STREAM_KEY);
    } catch (error) {
      if (!(error instanceof SessiondbError && error.code === 'not_found')) throw error;
    }
  }

  /** Gives the chat a title (a `not_found` error for an unknown chat). */
  async renameChat(chatId: string, title: string): Promise<void> {
    await this.client.updateSession(chatId, { name: title });
  }

  /** Deletes the chat and everything it holds; an unknown chat is not an error. */
  async deleteChat(chatId: string): Promise<void> {
    this.forget(chatId);
    await this.client.deleteSession(chatId, { missingOk: true });
  }

  /**
   * The versions of a message, oldest first: it and its siblings, the messages stored under the
   * same parent (earlier regenerations of an answer, the answers before an edit), for a UI's
   * "‹ 2 / 3 ›" (a chat's first message has no siblings listed: itself alone).
   * `loadChat(chatId, { leaf })` reads the conversation through one of them.
   */
  async alternatives(chatId: string, messageId: string): Promise<MESSAGE[]> {
    const path = await this.client.rows(chatId, { leaf: messageId });
    if (path.length < 2) return [uiMessageOf(await this.client.getMessage(chatId, messageId)) as MESSAGE];
    const siblings = await this.client.branches(chatId, path[path.length - 2].id);
    return siblings.filter((m) => UI_ROLES.has(m.role)).map((m) => uiMessageOf(m) as MESSAGE);
  }

  /** Replaces the stored message with `message`; resolves to the stored JSON (without times). */
  private async replace(chatId: string, message: UIMessage): Promise<string> {
    return bodyOf(await this.client.replaceMessage(chatId, message.id, messageInputOf(message)));
  }

  /** Keeps this path as the chat's, the most recently used, within the memory's bound. */
  private remember(chatId: string, path: ChatPath): void {
    this.forget(chatId);
    let chars = 0;
    for (const [id, body] of path.bodies) chars += id.length + body.length;
    if (chars > this.memoryChars) return;
    this.seen.set(chatId, { ids: path.ids, bodies: path.bodies, version: path.version, chars });
    this.seenChars += chars;
    for (const [oldest, dropped] of this.seen) {
      if (this.seenChars <= this.memoryChars) break;
      this.seen.delete(oldest);
      this.seenChars -= dropped.chars;
    }
  }

  private forget(chatId: string): void {
    const dropped = this.seen.get(chatId);
    if (dropped === undefined) return;
    this.seen.delete(chatId);
    this.seenChars -= dropped.chars;
  }
}

function isSummary(message: { id?: unknown }): boolean {
  return typeof message.id === 'string' && message.id.startsWith(COMPACTION_PREFIX);
}

function invalid(message: string): SessiondbError {
  return new SessiondbError(undefined, 'invalid_request', message);
}

/**
 * The messages to save, checked: each a UIMessage with an id sessiondb takes, no id twice. A
 * compaction's summary (in a chat loaded compacted) is the store's own and is left out.
 */
function checkedMessages<M extends UIMessage>(messages: M[]): M[] {
  if (!Array.isArray(messages)) throw invalid('`messages` must be an array of UIMessages');
  const seen = new Set<string>();
  for (const [i, message] of messages.entries()) {
    if (message === null || typeof message !== 'object') throw invalid(`message ${i} is not an object`);
    if (isSummary(message)) continue;
    if (!usableId(message.id)) {
      throw invalid(
        `message ${i} has no usable id (${JSON.stringify(message.id)}): ids are 1 to 256 characters without ` +
          'control characters or the `compaction_` prefix; give the stream a `generateMessageId`',
      );
    }
    if (seen.has(message.id)) throw invalid(`message id ${JSON.stringify(message.id)} appears twice`);
    seen.add(message.id);
    if (!UI_ROLES.has(message.role)) throw invalid(`message ${i} has role ${JSON.stringify(message.role)}`);
    if (!Array.isArray(message.parts)) throw invalid(`message ${i} has no \`parts\` array`);
  }
  return messages.filter((m) => !isSummary(m));
}

/** The message sessiondb stores for a UIMessage: its fields as they are. */
function messageInputOf(message: UIMessage): MessageInput {
  return message as unknown as MessageInput;
}

/** The UIMessages of a path: its messages of the roles a UIMessage has. */
function uiMessagesOf<MESSAGE extends UIMessage>(stored: StoredMessage[]): MESSAGE[] {
  return stored.filter((m) => UI_ROLES.has(m.role)).map((m) => uiMessageOf(m) as MESSAGE);
}

/** The UIMessage of a stored message: without the store's times; text content as a text part. */
function uiMessageOf(stored: StoredMessage): UIMessage {
  const { createdAt: _created, updatedAt: _updated, content, ...fields } = stored;
  const message = fields as unknown as UIMessage;
  if (message.parts === undefined) {
    message.parts = typeof content === 'string' ? [{ type: 'text', text: content }] : [];
  }
  return message;
}

/** The path of stored messages, root first, as a save compares with it. */
function chatPath(stored: StoredMessage[]): ChatPath {
  return { ids: stored.map((m) => m.id), bodies: new Map(stored.map((m) => [m.id, bodyOf(m)])) };
}

/** A stored message's JSON without the store's times. */
function bodyOf(stored: StoredMessage): string {
  const { createdAt: _created, updatedAt: _updated, ...fields } = stored;
  return JSON.stringify(fields);
}

/**
 * Whether the stored message whose JSON (without the store's times) is `body` holds what
 * `message` would store: equal JSON once `message` is cleaned as the server cleans a write (OpenAI's
 * `itemId` and `reasoningEncryptedContent` provider metadata and blank reasoning parts are not
 * stored), so a message read back and saved again is not rewritten.
 */
function sameContent(message: UIMessage, body: string): boolean {
  // The common case first: the message as it was read back, keys in the stored order.
  return JSON.stringify(message) === body || jsonEqual(storedForm(message), JSON.parse(body) as Json);
}

function storedForm(message: UIMessage): Json {
  const copy = JSON.parse(JSON.stringify(message)) as { [key: string]: Json };
  delete copy.createdAt;
  delete copy.updatedAt;
  if (Array.isArray(copy.parts)) {
    copy.parts = copy.parts.filter((part) => {
      if (part === null || typeof part !== 'object' || Array.isArray(part)) return true;
      for (const key of ['providerMetadata', 'callProviderMetadata']) withoutEphemeralMetadata(part, key);
      return !isBlankReasoning(part);
    });
  }
  return copy;
}

function withoutEphemeralMetadata(part: { [key: string]: Json }, key: string): void {
  const meta = part[key];
  if (meta === null || typeof meta !== 'object' || Array.isArray(meta)) return;
  const openai = meta.openai;
  if (openai !== null && typeof openai === 'object' && !Array.isArray(openai)) {
    delete openai.itemId;
    delete openai.reasoningEncryptedContent;
    if (Object.keys(openai).length === 0) delete meta.openai;
  }
  if (Object.keys(meta).length === 0) delete part[key];
}

function isBlankReasoning(part: { [key: string]: Json }): boolean {
  if (part.type !== 'reasoning') return false;
  const blank = typeof part.text !== 'string' || part.text.trim() === '';
  const meta = part.providerMetadata;
  const hasMetadata = meta !== null && typeof meta === 'object' && !Array.isArray(meta) && Object.keys(meta).length > 0;
  return blank && !hasMetadata;
}
