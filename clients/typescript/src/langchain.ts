/**
 * LangChain's chat message history on sessiondb: `SessiondbChatMessageHistory` goes where a
 * `BaseListChatMessageHistory` does (`RunnableWithMessageHistory`, or read and add messages
 * yourself), and the conversation lives in a sessiondb session: searchable, compacted without
 * losing a message, followed on the change feed, shared by every process that talks to the server.
 *
 * Messages are stored as the Python client stores them, so both read one history: each is a
 * sessiondb message whose role is the chat role (`human` → `user`, `ai` → `assistant`, `system`,
 * `tool`, `function`, a `ChatMessage`'s own role) and whose `content` is the message's content;
 * the rest of the message (its type, `chat` for a `ChatMessage`, and the fields that are set:
 * `tool_calls`, `tool_call_id`, `name`, `id`, `additional_kwargs`, `response_metadata`,
 * `usage_metadata`, ...) is kept under the metadata key `langchainMessage`. A message another
 * client wrote reads as the message of its role (`user` human, `assistant` AI, `system`, any other
 * a `ChatMessage`), its text parts joined when it has only `parts`; a compaction's summary reads as
 * an AI message in place of the messages it covers.
 *
 * Moving in: `copyHistory` copies the messages of any other history into a
 * `SessiondbChatMessageHistory` in one write that creates its session, all or nothing; a history
 * the target already holds is skipped, one whose target holds its first messages (copied before
 * the source went on) takes the rest in one write, and one whose target holds other messages is
 * refused (`conflict`), writing nothing.
 * A conversation longer than one request (16 Mi characters of JSON, or the server's
 * `--max-body-bytes`) goes in several writes, each under the one before (`copyConversation`).
 */
import { BaseListChatMessageHistory } from '@langchain/core/chat_history';
import {
  AIMessage,
  type BaseMessage,
  ChatMessage,
  HumanMessage,
  SystemMessage,
  mapStoredMessageToChatMessage,
  type StoredMessage as LangChainStoredMessage,
} from '@langchain/core/messages';

import { Client, type Json, type MessageInput, type StoredMessage } from './client.js';
import { jsonEqual } from './json.js';

export const MESSAGE_KEY = 'langchainMessage';
const ROLE_OF_TYPE: { [type: string]: string } = { human: 'user', ai: 'assistant', system: 'system', tool: 'tool', function: 'function' };

function isSet(value: unknown): boolean {
  if (value === undefined || value === null || value === false) return false;
  if (Array.isArray(value)) return value.length > 0;
  return typeof value !== 'object' || Object.keys(value).length > 0;
}

/** The sessiondb message that stores one LangChain message. */
export function messageOfLangChain(message: BaseMessage): MessageInput {
  const { type, data } = message.toDict();
  const kind = type === 'generic' ? 'chat' : type;
  const kept: { [key: string]: Json } = { type: kind };
  for (const [key, value] of Object.entries(data)) {
    if (key !== 'content' && key !== 'type' && isSet(value)) kept[key] = value as Json;
  }
  const role = ChatMessage.isInstance(message) ? message.role : (ROLE_OF_TYPE[kind] ?? kind);
  return { role, content: message.content as Json, metadata: { [MESSAGE_KEY]: kept } };
}

/** The LangChain message a stored message holds. */
export function langChainOfMessage(message: StoredMessage): BaseMessage {
  const content =
    message.content !== undefined
      ? message.content
      : (message.parts ?? [])
          .filter((p): p is { [key: string]: Json } => p !== null && typeof p === 'object' && !Array.isArray(p) && p.type === 'text')
          .map((p) => String(p.text ?? ''))
          .join('\n');
  const stored = message.metadata?.[MESSAGE_KEY];
  if (stored !== null && typeof stored === 'object' && !Array.isArray(stored) && typeof stored.type === 'string') {
    const { type, ...data } = stored;
    const kind = type === 'chat' ? 'generic' : (type as string);
    return mapStoredMessageToChatMessage({ type: kind, data: { ...data, content } } as unknown as LangChainStoredMessage);
  }
  const text = content as string;
  switch (message.role) {
    case 'user':
      return new HumanMessage({ content: text });
    case 'assistant':
      return new AIMessage({ content: text });
    case 'system':
      return new SystemMessage({ content: text });
    default:
      return new ChatMessage({ role: message.role, content: text });
  }
}

export interface SessiondbChatMessageHistoryOptions {
  client: Client;
  sessionId: string;
}

/**
 * A LangChain chat history kept in the sessiondb session `sessionId`. `getMessages` reads the
 * conversation as the model should see it (compactions applied), oldest first; `addMessages`
 * stores its messages in one write, all or none, under the session's active leaf; `clear`
 * deletes every message and keeps the session.
 */
export class SessiondbChatMessageHistory extends BaseListChatMessageHistory {
  lc_namespace = ['langchain', 'stores', 'message', 'sessiondb'];
  readonly client: Client;
  readonly sessionId: string;

  constructor(options: SessiondbChatMessageHistoryOptions) {
    super();
    this.client = options.client;
    this.sessionId = options.sessionId;
  }

  async getMessages(): Promise<BaseMessage[]> {
    const messages: BaseMessage[] = [];
    for await (const message of this.client.history(this.sessionId)) messages.push(langChainOfMessage(message));
    return messages;
  }

  async addMessage(message: BaseMessage): Promise<void> {
    await this.addMessages([message]);
  }

  async addMessages(messages: BaseMessage[]): Promise<void> {
    if (messages.length > 0) await this.client.appendBatch(this.sessionId, messages.map(messageOfLangChain));
  }

  async clear(): Promise<void> {
    await this.client.clear(this.sessionId);
  }
}

/**
 * Copies the messages `source` holds into `target`: `true` when it wrote; `false` when `source`
 * is empty or `target` already holds its messages (a copy run again; maybe with more after them,
 * the agent having gone on there). An empty `target` takes the messages in one write; one that
 * holds the first of them (a copy made before `source` went on) takes the rest in one write; one
 * that holds other messages is a `conflict` error, and nothing is written. The messages are dated
 * by the copy.
 */
export async function copyHistory(
  source: Pick<BaseListChatMessageHistory, 'getMessages'>,
  target: SessiondbChatMessageHistory,
): Promise<boolean> {
  const stored = (await source.getMessages()).map(messageOfLangChain);
  return target.client.copyConversation(target.sessionId, stored, (held, i) =>
    jsonEqual(messageOfLangChain(langChainOfMessage(held)) as unknown as Json, stored[i] as unknown as Json),
  );
}
