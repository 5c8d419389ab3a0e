/**
 * The OpenAI Agents SDK's `Session` on sessiondb: `run(agent, input, { session })` loads and
 * saves the conversation through a sessiondb server.
 *
 * Items are stored as the Python client stores them, so both read one conversation: an item with
 * a `role` and `content` (a message) is a message with that role and content (search, the
 * converters, compaction and a UI read it like any other), its other fields under the metadata
 * key `openaiItem`; any other item (a function call, its result, reasoning, ...) is stored whole
 * as `content`, with `openaiItem: "content"`, under the role `tool` for results (`*_output` and
 * `*_result` types) and `assistant` otherwise. `getItems` gives every item back as it was added,
 * with compactions applied (a summary reads as `{role: "assistant", content}` in place of what it
 * covers); a message another client wrote reads as `{role, content}`.
 *
 * Moving in: `copySession` copies the conversation of any SDK session (`MemorySession`, a
 * session of your own, ...: anything with `getItems`) into a `SessiondbSession` in one write that
 * creates it, all or nothing; one the target already holds is skipped, one whose target holds its
 * first items (copied before the source went on) takes the rest in one write, and one whose
 * target holds other items is refused (`conflict`), writing nothing.
 * A conversation longer than one request (16 Mi characters of JSON, or the server's
 * `--max-body-bytes`) goes in several writes, each under the one before (`copyConversation`).
 */
import type { AgentInputItem, Session } from '@openai/agents';

import { Client, type Json, type MessageInput, SessiondbError, type StoredMessage } from './client.js';
import { jsonEqual } from './json.js';

export const ITEM_KEY = 'openaiItem';
const WHOLE_ITEM = 'content';

type Item = { [key: string]: Json };

/** The sessiondb message that stores one SDK item. */
export function messageOfItem(item: Item): MessageInput {
  const { role, content, ...rest } = item;
  if (typeof role === 'string' && role !== '' && content !== undefined && content !== null) {
    const message: MessageInput = { role, content };
    if (Object.keys(rest).length > 0) message.metadata = { [ITEM_KEY]: rest };
    return message;
  }
  const kind = item.type;
  const isResult = typeof kind === 'string' && (kind.endsWith('_output') || kind.endsWith('_result'));
  return { role: isResult ? 'tool' : 'assistant', content: item, metadata: { [ITEM_KEY]: WHOLE_ITEM } };
}

/** The SDK item a stored message holds. */
export function itemOfMessage(message: StoredMessage): Item {
  const stored = message.metadata?.[ITEM_KEY];
  if (stored === WHOLE_ITEM) return message.content as Item;
  const item: Item = stored !== null && typeof stored === 'object' && !Array.isArray(stored) ? { ...stored } : {};
  item.role = message.role;
  if (message.content !== undefined) {
    item.content = message.content;
  } else {
    item.content = (message.parts ?? [])
      .filter((p): p is Item => p !== null && typeof p === 'object' && !Array.isArray(p) && p.type === 'text')
      .map((p) => String(p.text ?? ''))
      .join('\n');
  }
  return item;
}

export interface SessiondbSessionOptions {
  client: Client;
  sessionId: string;
  /** Bounds `getItems()` when it is called without a limit. */
  limit?: number;
}

/**
 * An OpenAI Agents SDK session kept in the sessiondb session `sessionId`. `addItems` stores its
 * items in one write, all or none; `popItem` deletes the newest stored message.
 *
 * The session keeps the items it last read or wrote with the session's version then, so a
 * `getItems` after its own `addItems`, with nothing else written meanwhile, transfers no
 * history: the server answers that the session is still at that version (`304`).
 */
export class SessiondbSession implements Session {
  readonly client: Client;
  readonly sessionId: string;
  readonly limit: number | undefined;
  /**
   * The version and the items (each as JSON text, so each read hands out objects of its own)
   * of the whole conversation as this object last read or wrote it.
   */
  private held: { version: number; items: string[] } | undefined;

  constructor(options: SessiondbSessionOptions) {
    this.client = options.client;
    this.sessionId = options.sessionId;
    this.limit = options.limit;
  }

  async getSessionId(): Promise<string> {
    return this.sessionId;
  }

  async getItems(limit?: number): Promise<AgentInputItem[]> {
    const bound = limit ?? this.limit;
    const items: Item[] = [];
    if (bound === undefined) {
      const held = this.held;
      const read = await this.client.versionedHistory(this.sessionId, { unlessVersion: held?.version });
      if (read === null && held !== undefined) return JSON.parse(`[${held.items.join(',')}]`) as AgentInputItem[];
      for (const message of read?.messages ?? []) items.push(itemOfMessage(message));
      this.held = read?.version ? { version: read.version, items: items.map((item) => JSON.stringify(item)) } : undefined;
      return items as unknown as AgentInputItem[];
    }
    if (bound <= 0) return [];
    for await (const message of this.client.history(this.sessionId, { order: 'newest' })) {
      items.push(itemOfMessage(message));
      if (items.length === bound) break;
    }
    return items.reverse() as unknown as AgentInputItem[];
  }

  async addItems(items: AgentInputItem[]): Promise<void> {
    if (items.length === 0) return;
    const messages = (items as unknown as Item[]).map(messageOfItem);
    const held = this.held;
    this.held = undefined;
    if (held !== undefined) {
      // At the version read: what this object holds plus these is then the conversation.
      try {
        const written = await this.client.appendBatchVersioned(this.sessionId, messages, { ifVersion: held.version });
        if (written.version !== undefined) {
          const added = written.messages.map((message) => JSON.stringify(itemOfMessage(message)));
          this.held = { version: written.version, items: [...held.items, ...added] };
        }
        return;
      } catch (error) {
        if (!(error instanceof SessiondbError && ['conflict', 'not_found'].includes(error.code))) throw error;
      }
    }
    await this.client.appendBatch(this.sessionId, messages);
  }

  async popItem(): Promise<AgentInputItem | undefined> {
    this.held = undefined;
    const [newest] = (await this.client.messages(this.sessionId, { limit: 1, order: 'desc' })).items;
    if (newest === undefined) return undefined;
    await this.client.deleteMessage(this.sessionId, newest.id);
    return itemOfMessage(newest) as unknown as AgentInputItem;
  }

  async clearSession(): Promise<void> {
    this.held = undefined;
    await this.client.clear(this.sessionId);
  }
}

/**
 * Copies the conversation `source` (any SDK session) holds into `target`: `true` when it wrote;
 * `false` when `source` is empty or `target` already holds its items (a copy run again; maybe
 * with more after them, the agent having gone on there). An empty `target` takes the items in
 * one write; one that holds the first of them (a copy made before `source` went on) takes the
 * rest in one write; one that holds other items is a `conflict` error, and nothing is written.
 * The messages are dated by the copy.
 */
export async function copySession(source: Pick<Session, 'getItems'>, target: SessiondbSession): Promise<boolean> {
  const items = (await source.getItems()) as unknown as Item[];
  return target.client.copyConversation(target.sessionId, items.map(messageOfItem), (stored, i) =>
    jsonEqual(itemOfMessage(stored), items[i]),
  );
}
