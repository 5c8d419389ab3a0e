/**
 * LangGraph.js's checkpointer on sessiondb: `graph.compile({ checkpointer: new SessiondbSaver({
 * client }) })`. The same layout as the Python client's `SessiondbSaver`:
 *
 * - each (`thread_id`, `checkpoint_ns`) is a checkpoint session, whose message tree is the
 *   checkpoint tree (each checkpoint appended under its parent, so a replay is a branch and the
 *   newest checkpoint is the active leaf), and a side session (`…/writes`) holding pending writes
 *   as messages under a root message named after their checkpoint;
 * - a checkpoint message holds the checkpoint without its channel values, its metadata, the
 *   parent's id, the values of the channels it changed (`newVersions`) and for every channel the
 *   id of the checkpoint holding its value at this version, so a value is stored once, by the
 *   checkpoint that changed it;
 * - a value that extends the channel's previous one (an array LangGraph appended to, such as a
 *   message history) is stored as what was added after the previous value's items, with the
 *   previous value's holder and version; a chain of these ends in a whole value at most
 *   `MAX_EXTENSION_DEPTH` links below, so a growing history takes space in proportion to its
 *   length rather than its square;
 * - both sessions are recorded for the user `prefix + thread_id`, which `deleteThread` lists.
 *
 * A checkpoint is one append, stored whole or not at all. Checkpoint messages never change, so
 * the saver keeps recently written and read ones in memory and asks the server only for what it
 * lacks, and keeps the serialised values it wrote or rebuilt, which a value extending them needs.
 *
 * Moving in: `copyThreads` copies threads from any other checkpointer (`MemorySaver`,
 * `SqliteSaver`, `PostgresSaver`, ...): every namespace's checkpoints, oldest first, each with its
 * metadata, parent and pending writes, as the graph had put them here. Each checkpoint is one
 * write after its pending writes, so a copy cut short leaves whole checkpoints and is finished by
 * running it again; a namespace whose newest checkpoint the target has is skipped.
 */
import type { RunnableConfig } from '@langchain/core/runnables';
import {
  BaseCheckpointSaver,
  TASKS,
  WRITES_IDX_MAP,
  compareWritesSortKeys,
  getCheckpointId,
  maxChannelVersion,
  writesSortKey,
  type ChannelVersions,
  type Checkpoint,
  type CheckpointListOptions,
  type CheckpointMetadata,
  type CheckpointTuple,
  type PendingWrite,
  type SerializerProtocol,
} from '@langchain/langgraph-checkpoint';

import { base64Of, bytesOf, concatBytes, samePrefix } from './bytes.js';
import { Client, type Copied, SessiondbError, boundedId, joinedId, rememberId, type Json, type StoredMessage } from './client.js';

export const THREAD_KEY = 'langgraphThread';

type Stored = { type: string; data?: string };
type Version = string | number;
/**
 * A stored channel value: whole (`data`), or an extension of the value `base` names (its holder
 * and version), which is `head + base[span[0]..span[1]] + data` and has `depth` links below it.
 */
type Value = Stored & { version: Version; base?: [string, Version]; head?: string; span?: [number, number]; depth?: number };
/** A serialised value the saver wrote or rebuilt. */
type Known = { version: Version; type: string; bytes: Uint8Array; depth: number };
/** What a checkpoint message holds. */
type Content = {
  checkpoint: Stored;
  metadata: Stored;
  parentCheckpointId: string | null;
  values: Record<string, Value>;
  holders: Record<string, [string, string | number]>;
};
type WritesContent = { taskId: string; taskPath: string; writes: Array<[number, string, Stored]> };

const NO_CONTENT: Pick<Content, 'values' | 'holders'> = { values: {}, holders: {} };

/** Links of extensions at most between a value and the whole one it is rebuilt from. */
export const MAX_EXTENSION_DEPTH = 16;
/** Values smaller than this are stored whole: each link costs a cold read one more message. */
export const MIN_EXTENDED_BYTES = 1024;
/** Checkpoints a cold read takes up a path at most, in one request, for the links of chains. */
const PREFETCHED_CHECKPOINTS = 4 * MAX_EXTENSION_DEPTH;
const OPENING_BRACKET = 0x5b;
const CLOSING_BRACKET = 0x5d;
const COMMA = 0x2c;

/**
 * How JSON array `next` extends JSON array `previous` (both as the serde writes them, without
 * spaces): the bytes after `previous`'s items, so that `next` is `previous` without its closing
 * bracket followed by them. Undefined unless `next` begins with exactly `previous`'s items (a
 * reducer that added nothing gives an equal array, and the bytes after are its closing bracket).
 */
function extension(previous: Uint8Array, next: Uint8Array): Uint8Array | undefined {
  const kept = previous.length - 1;
  if (previous[0] !== OPENING_BRACKET || previous[kept] !== CLOSING_BRACKET || next.length < previous.length) {
    return undefined;
  }
  const follows = next.length === previous.length ? CLOSING_BRACKET : COMMA;
  if (next[kept] !== follows || !samePrefix(next, previous, kept)) {
    return undefined;
  }
  return next.subarray(kept);
}

/** A memory key: a checkpoint's (session, id), or a value's (session, holder, channel). */
const memoryKey = (...parts: string[]): string => parts.join('\n');

/** Entries by key, least recently used dropped first once their sizes pass a byte budget. */
class Memory<T> {
  private held = 0;
  private readonly entries = new Map<string, { value: T; size: number }>();

  constructor(private readonly budget: number) {}

  get(key: string): T | undefined {
    const entry = this.entries.get(key);
    if (entry === undefined) return undefined;
    this.entries.delete(key);
    this.entries.set(key, entry);
    return entry.value;
  }

  put(key: string, value: T, size: number): void {
    const replaced = this.entries.get(key);
    if (replaced !== undefined) {
      this.entries.delete(key);
      this.held -= replaced.size;
    }
    this.entries.set(key, { value, size });
    this.held += size;
    for (const [oldest, entry] of this.entries) {
      if (this.held <= this.budget) break;
      this.entries.delete(oldest);
      this.held -= entry.size;
    }
  }
}

export interface SessiondbSaverOptions {
  client: Client;
  /** Put before every session id and owner the saver writes. */
  prefix?: string;
  serde?: SerializerProtocol;
  /** Memory for recently written and read checkpoints, in bytes of their values (32 MiB). */
  cacheBytes?: number;
}

/**
 * A LangGraph.js checkpointer keeping threads on the sessiondb server behind `client`. Each
 * checkpoint and each `putWrites` call is a message, so a thread holds at most the server's
 * `--max-messages-per-session` of them (10,000 by default) per namespace.
 */
export class SessiondbSaver extends BaseCheckpointSaver<number | string> {
  readonly client: Client;
  readonly prefix: string;
  /** Checkpoint contents by session and id, and serialised values by session, holder and channel. */
  private readonly contents: Memory<Content>;
  private readonly values: Memory<Known>;
  private readonly created = new Set<string>();

  constructor(options: SessiondbSaverOptions) {
    super(options.serde);
    this.client = options.client;
    this.prefix = options.prefix ?? '';
    const budget = options.cacheBytes ?? 32 << 20;
    this.contents = new Memory(Math.floor(budget / 2));
    this.values = new Memory(Math.floor(budget / 2));
  }

  /**
   * Integers, LangGraph's default; a thread copied from a checkpointer with versions of the form
   * `<32-digit counter>.<random>` goes on in that form, as LangGraph compares a thread's versions
   * with each other.
   */
  getNextVersion(current: number | string | undefined): number | string {
    if (typeof current !== 'string') return typeof current === 'number' ? current + 1 : 1;
    const next = Number.parseInt(current.split('.')[0], 10) + 1;
    return `${String(next).padStart(32, '0')}.${String(Math.random()).padStart(16, '0')}`;
  }

  /** The checkpoint session and the side session of a thread's namespace. */
  private sessionsOf(threadId: string, checkpointNs: string): [string, string] {
    const base = joinedId(threadId, checkpointNs);
    return [boundedId(base, this.prefix), boundedId(`${base}/writes`, this.prefix)];
  }

  private owner(threadId: string): string {
    return boundedId(threadId, this.prefix);
  }

  /** Creates the namespace's sessions with their owner the first time this saver writes there. */
  private async ensureSessions(threadId: string, checkpointNs: string): Promise<[string, string]> {
    const sessions = this.sessionsOf(threadId, checkpointNs);
    for (const id of sessions) {
      if (this.created.has(id)) continue;
      try {
        await this.client.createSession({
          id,
          userId: this.owner(threadId),
          metadata: { [THREAD_KEY]: { threadId, checkpointNs } },
        });
      } catch (error) {
        if (!(error instanceof SessiondbError && error.code === 'conflict')) throw error;
      }
      rememberId(this.created, id);
    }
    return sessions;
  }

  private async encode(value: unknown): Promise<Stored> {
    const [type, bytes] = await this.serde.dumpsTyped(value);
    return { type, data: base64Of(bytes) };
  }

  private async decode(stored: Stored): Promise<unknown> {
    return this.serde.loadsTyped(stored.type, bytesOf(stored.data ?? ''));
  }

  async put(
    config: RunnableConfig,
    checkpoint: Checkpoint,
    metadata: CheckpointMetadata,
    newVersions: ChannelVersions,
  ): Promise<RunnableConfig> {
    const threadId = config.configurable?.thread_id as string | undefined;
    if (threadId === undefined) throw new Error('a checkpoint needs `configurable.thread_id`');
    const checkpointNs = (config.configurable?.checkpoint_ns as string | undefined) ?? '';
    const parentId = (config.configurable?.checkpoint_id as string | undefined) ?? null;
    const [checkpoints] = await this.ensureSessions(threadId, checkpointNs);

    const inherited = parentId ? (await this.content(checkpoints, parentId)).holders : {};
    const values: Record<string, Value> = {};
    for (const [channel, version] of Object.entries(newVersions)) {
      values[channel] = channel in checkpoint.channel_values
        ? this.stored(checkpoints, checkpoint.id, channel, version,
          await this.serde.dumpsTyped((checkpoint.channel_values as Record<string, unknown>)[channel]),
          inherited[channel])
        : { version, type: 'empty' };
    }
    const holders: Content['holders'] = {};
    for (const [channel, version] of Object.entries(checkpoint.channel_versions)) {
      if (channel in values) holders[channel] = [checkpoint.id, version];
      else if (channel in inherited) holders[channel] = inherited[channel];
    }
    const { channel_values: _values, ...skeleton } = checkpoint;
    const content: Content = {
      checkpoint: await this.encode(skeleton),
      metadata: await this.encode(metadata),
      parentCheckpointId: parentId,
      values,
      holders,
    };
    await this.client.append(
      checkpoints,
      { id: checkpoint.id, role: 'checkpoint', content: content as unknown as Json },
      { parent: parentId },
    );
    this.remember(checkpoints, checkpoint.id, content);
    return { configurable: { thread_id: threadId, checkpoint_ns: checkpointNs, checkpoint_id: checkpoint.id } };
  }

  /**
   * A channel's new value as its checkpoint stores it: as an extension of the channel's
   * `previous` value (holder and version) when the saver has that value in memory, the new one
   * extends it and its chain is short enough; else whole.
   */
  private stored(
    checkpoints: string,
    checkpointId: string,
    channel: string,
    version: Version,
    [type, bytes]: [string, Uint8Array],
    previous: [string, Version] | undefined,
  ): Value {
    const base = previous && this.values.get(memoryKey(checkpoints, previous[0], channel));
    const added = base && base.version === previous[1] && base.type === type && type === 'json'
      && base.bytes.length >= MIN_EXTENDED_BYTES && base.depth < MAX_EXTENSION_DEPTH
      ? extension(base.bytes, bytes)
      : undefined;
    const depth = added && base ? base.depth + 1 : 0;
    this.values.put(memoryKey(checkpoints, checkpointId, channel), { version, type, bytes, depth }, bytes.length);
    if (added === undefined || previous === undefined || base === undefined) {
      return { version, type, data: base64Of(bytes) };
    }
    return {
      version,
      type,
      base: previous,
      head: '',
      span: [0, base.bytes.length - 1],
      depth,
      data: base64Of(added),
    };
  }

  private remember(checkpoints: string, id: string, content: Content): void {
    const size = Object.values(content.values).reduce((sum, v) => sum + (v.data?.length ?? 0), 512);
    this.contents.put(memoryKey(checkpoints, id), content, size);
  }

  /**
   * The serialised value `channel` had at `version`, held by checkpoint `holder` (whose content
   * `contentOf` gives): stored whole, or rebuilt from the values its extensions lead down to.
   * Undefined when the channel was empty then or nothing holds it.
   */
  private async value(
    checkpoints: string,
    contentOf: (id: string) => Promise<Pick<Content, 'values'>>,
    holder: string,
    channel: string,
    version: Version,
  ): Promise<[string, Uint8Array] | undefined> {
    const key = memoryKey(checkpoints, holder, channel);
    const known = this.values.get(key);
    if (known !== undefined && known.version === version) return [known.type, known.bytes];
    const stored = (await contentOf(holder)).values[channel];
    if (stored === undefined || stored.version !== version || stored.type === 'empty') return undefined;
    let bytes = bytesOf(stored.data ?? '');
    if (stored.base !== undefined) {
      const [baseHolder, baseVersion] = stored.base;
      const below = await this.value(checkpoints, contentOf, baseHolder, channel, baseVersion);
      if (below === undefined) {
        throw new Error(`the value of ${JSON.stringify(channel)} in checkpoint ${holder} extends one of checkpoint ${baseHolder} that is not stored`);
      }
      const [start, end] = stored.span ?? [0, 0];
      bytes = concatBytes([bytesOf(stored.head ?? ''), below[1].subarray(start, end), bytes]);
    }
    this.values.put(key, { version, type: stored.type, bytes, depth: stored.depth ?? 0 }, bytes.length);
    return [stored.type, bytes];
  }

  async putWrites(config: RunnableConfig, writes: PendingWrite[], taskId: string, taskPath = ''): Promise<void> {
    const threadId = config.configurable?.thread_id as string | undefined;
    const checkpointId = config.configurable?.checkpoint_id as string | undefined;
    if (threadId === undefined || !checkpointId) {
      throw new Error('pending writes need `configurable.thread_id` and `configurable.checkpoint_id`');
    }
    if (writes.length === 0) return;
    const [, side] = await this.ensureSessions(threadId, (config.configurable?.checkpoint_ns as string | undefined) ?? '');
    const indexed: WritesContent['writes'] = [];
    for (const [i, [channel, value]] of writes.entries()) {
      indexed.push([WRITES_IDX_MAP[channel] ?? i, channel, await this.encode(value)]);
    }
    const message = {
      id: boundedId(`${checkpointId}:${taskId}:${indexed[0][0]}`),
      role: 'writes',
      content: { taskId, taskPath, writes: indexed } as unknown as Json,
    };
    if (indexed.every(([, channel]) => channel in WRITES_IDX_MAP)) {
      // Special channels (an error, an interrupt) replace what the task wrote before.
      try {
        await this.client.replaceMessage(side, message.id, message);
        return;
      } catch (error) {
        if (!(error instanceof SessiondbError && error.code === 'not_found')) throw error;
      }
    }
    const anchor = { id: boundedId(checkpointId), role: 'checkpoint', content: { checkpointId } };
    await this.client.appendBatch(side, [anchor, message], { parentId: '' });
  }

  async deleteThread(threadId: string): Promise<void> {
    // The root namespace's sessions by name too: if another process deleted the thread while
    // this saver went on writing, they exist without an owner.
    const namespaces = new Set(['', ...(await this.namespaces({ configurable: { thread_id: threadId } })).map(([, ns]) => ns)]);
    const doomed = [...namespaces].flatMap((ns) => this.sessionsOf(threadId, ns));
    for (const id of doomed) {
      await this.client.deleteSession(id, { missingOk: true });
      this.created.delete(id);
    }
  }

  /** A checkpoint message's content, from memory when the saver has it. */
  private async content(checkpoints: string, id: string): Promise<Partial<Content> & Pick<Content, 'values' | 'holders'>> {
    const held = this.contents.get(memoryKey(checkpoints, id));
    if (held !== undefined) return held;
    try {
      const content = (await this.client.getMessage(checkpoints, id)).content as unknown as Content;
      this.remember(checkpoints, id, content);
      return content;
    } catch (error) {
      if (error instanceof SessiondbError && error.code === 'not_found') return NO_CONTENT;
      throw error;
    }
  }

  async getTuple(config: RunnableConfig): Promise<CheckpointTuple | undefined> {
    const threadId = config.configurable?.thread_id as string | undefined;
    if (threadId === undefined) return undefined;
    const checkpointNs = (config.configurable?.checkpoint_ns as string | undefined) ?? '';
    const [checkpoints] = this.sessionsOf(threadId, checkpointNs);
    const wanted = getCheckpointId(config);
    // The checkpoint itself always comes from the server, even when remembered: it may have been
    // deleted since (by this process or another).
    let message: StoredMessage | undefined;
    if (wanted) {
      try {
        message = await this.client.getMessage(checkpoints, wanted);
      } catch (error) {
        if (error instanceof SessiondbError && error.code === 'not_found') return undefined;
        throw error;
      }
    } else {
      [message] = (await this.client.messages(checkpoints, { limit: 1, order: 'desc' })).items;
      if (message === undefined) return undefined;
    }
    const content = message.content as unknown as Content;
    this.remember(checkpoints, message.id, content);
    await this.prefetchChains(checkpoints, message.id, content);
    return this.tuple(threadId, checkpointNs, content, (holder) => this.content(checkpoints, holder));
  }

  /**
   * When values of a checkpoint extend values this saver does not have in memory (a process
   * that did not write them), reads the checkpoints up its path in one request, newest first,
   * until each of those chains reaches a whole value, so rebuilding them asks for no link on its
   * own. The links are the checkpoint's ancestors.
   */
  private async prefetchChains(checkpoints: string, checkpointId: string, content: Content): Promise<void> {
    const chains = new Set<string>();
    for (const [channel, stored] of Object.entries(content.values)) {
      if (stored.base === undefined) continue;
      const known = this.values.get(memoryKey(checkpoints, stored.base[0], channel));
      if (known === undefined || known.version !== stored.base[1]) chains.add(channel);
    }
    if (chains.size === 0) return;
    let read = 0;
    try {
      for await (const message of this.client.history(checkpoints, { order: 'newest', leaf: checkpointId })) {
        if (read++ >= PREFETCHED_CHECKPOINTS) break;
        if (message.role !== 'checkpoint') continue;
        const held = message.content as unknown as Content;
        this.remember(checkpoints, message.id, held);
        for (const channel of chains) {
          const stored = held.values[channel];
          if (stored !== undefined && stored.base === undefined) chains.delete(channel);
        }
        if (chains.size === 0) break;
      }
    } catch (error) {
      // Deleted meanwhile: the links are asked for one at a time.
      if (!(error instanceof SessiondbError && error.code === 'not_found')) throw error;
    }
  }

  private async tuple(
    threadId: string,
    checkpointNs: string,
    content: Content,
    holderContent: (id: string) => Promise<Pick<Content, 'values'>>,
  ): Promise<CheckpointTuple> {
    const [checkpoints, side] = this.sessionsOf(threadId, checkpointNs);
    const checkpoint = (await this.decode(content.checkpoint)) as Checkpoint;
    const contentOf = async (holder: string) => (holder === checkpoint.id ? content : holderContent(holder));
    const values: Record<string, unknown> = {};
    for (const [channel, [holder, version]] of Object.entries(content.holders)) {
      const value = await this.value(checkpoints, contentOf, holder, channel, version);
      if (value !== undefined) values[channel] = await this.serde.loadsTyped(...value);
    }
    checkpoint.channel_values = values;
    if (checkpoint.v < 4 && content.parentCheckpointId) {
      // Checkpoints of format 1-3 kept pending sends as the parent's writes to TASKS; the
      // current format has them as a channel, which LangGraph's savers fill in on read.
      const sends = (await this.pendingWrites(side, content.parentCheckpointId))
        .filter(([, channel]) => channel === TASKS)
        .map(([, , value]) => value);
      checkpoint.channel_values[TASKS] = sends;
      const versions = Object.values(checkpoint.channel_versions);
      checkpoint.channel_versions[TASKS] =
        versions.length > 0 ? maxChannelVersion(...versions) : this.getNextVersion(undefined);
    }

    const configOf = (checkpointId: string): RunnableConfig => ({
      configurable: { thread_id: threadId, checkpoint_ns: checkpointNs, checkpoint_id: checkpointId },
    });
    return {
      config: configOf(checkpoint.id),
      checkpoint,
      metadata: (await this.decode(content.metadata)) as CheckpointMetadata,
      parentConfig: content.parentCheckpointId ? configOf(content.parentCheckpointId) : undefined,
      pendingWrites: await this.pendingWrites(side, checkpoint.id),
    };
  }

  /** A checkpoint's pending writes in LangGraph's order (task path, task, index). */
  private async pendingWrites(side: string, checkpointId: string): Promise<Array<[string, string, unknown]>> {
    const pending: Array<{ key: ReturnType<typeof writesSortKey>; write: [string, string, unknown] }> = [];
    for (const message of await this.writesOf(side, checkpointId)) {
      const { taskId, taskPath, writes } = message.content as unknown as WritesContent;
      for (const [idx, channel, value] of writes) {
        pending.push({ key: writesSortKey(taskPath, taskId, idx), write: [taskId, channel, await this.decode(value)] });
      }
    }
    pending.sort((a, b) => compareWritesSortKeys(a.key, b.key));
    return pending.map((p) => p.write);
  }

  private async writesOf(side: string, checkpointId: string) {
    try {
      return await this.client.branches(side, boundedId(checkpointId));
    } catch (error) {
      if (error instanceof SessiondbError && error.code === 'not_found') return [];
      throw error;
    }
  }

  /**
   * Checkpoints newest first: of one thread or of every thread (no `thread_id`), in one
   * namespace or in every namespace (no `checkpoint_ns`).
   */
  async *list(config: RunnableConfig, options: CheckpointListOptions = {}): AsyncGenerator<CheckpointTuple> {
    const { before, filter } = options;
    let { limit } = options;
    const beforeId = before?.configurable?.checkpoint_id as string | undefined;
    const wantedId = config.configurable?.checkpoint_id as string | undefined;
    const found: Array<{ id: string; threadId: string; checkpointNs: string; content: Content; contents: Map<string, Content> }> = [];
    for (const [threadId, checkpointNs] of await this.namespaces(config)) {
      const [checkpoints] = this.sessionsOf(threadId, checkpointNs);
      // The whole namespace is read anyway, so older checkpoints' values come from it.
      const contents = new Map<string, Content>();
      try {
        for await (const line of this.client.export(checkpoints)) {
          if ('message' in line && line.message.role === 'checkpoint') {
            contents.set(line.message.id, line.message.content as unknown as Content);
          }
        }
      } catch (error) {
        if (!(error instanceof SessiondbError && error.code === 'not_found')) throw error;
      }
      for (const [id, content] of contents) {
        if (wantedId && id !== wantedId) continue;
        if (beforeId && id >= beforeId) continue;
        found.push({ id, threadId, checkpointNs, content, contents });
      }
    }
    found.sort((a, b) => (a.id < b.id ? 1 : a.id > b.id ? -1 : 0));
    for (const { threadId, checkpointNs, content, contents } of found) {
      if (limit !== undefined && limit <= 0) return;
      if (filter) {
        const metadata = (await this.decode(content.metadata)) as Record<string, unknown>;
        if (!Object.entries(filter).every(([key, value]) => metadata[key] === value)) continue;
      }
      if (limit !== undefined) limit -= 1;
      yield await this.tuple(threadId, checkpointNs, content, async (holder) => contents.get(holder) ?? NO_CONTENT);
    }
  }

  private async namespaces(config: RunnableConfig): Promise<Array<[string, string]>> {
    const threadId = config.configurable?.thread_id as string | undefined;
    const checkpointNs = config.configurable?.checkpoint_ns as string | undefined;
    if (threadId !== undefined && checkpointNs !== undefined) return [[threadId, checkpointNs]];
    const found: Array<[string, string]> = [];
    const listing = this.client.listSessions(threadId === undefined ? {} : { userId: this.owner(threadId) });
    for await (const session of listing) {
      const stored = session.metadata?.[THREAD_KEY] as { threadId?: string; checkpointNs?: string } | undefined;
      if (stored?.threadId === undefined || session.id.endsWith('/writes')) continue;
      if (threadId !== undefined && stored.threadId !== threadId) continue;
      if (checkpointNs !== undefined && stored.checkpointNs !== checkpointNs) continue;
      if (!session.id.startsWith(this.prefix)) continue;
      found.push([stored.threadId, stored.checkpointNs ?? '']);
    }
    return found;
  }
}

/**
 * Copies threads (these, or every thread `source.list({})` gives, which reads every checkpoint
 * of `source` once to find them) from `source` into `target` (see the module's documentation):
 * the thread ids copied, and those skipped as the target had each of their namespaces' newest
 * checkpoint.
 */
export async function copyThreads(
  source: BaseCheckpointSaver<number | string>,
  target: SessiondbSaver,
  threadIds?: Iterable<string>,
): Promise<Copied> {
  let ids = threadIds === undefined ? undefined : [...threadIds];
  if (ids === undefined) {
    const found = new Set<string>();
    for await (const tuple of source.list({})) found.add(tuple.config.configurable?.thread_id as string);
    ids = [...found];
  }
  const copied: Copied = { copied: [], skipped: [] };
  for (const threadId of ids) {
    const namespaces = new Map<string, CheckpointTuple[]>();
    for await (const tuple of source.list({ configurable: { thread_id: threadId } })) {
      const checkpointNs = (tuple.config.configurable?.checkpoint_ns as string | undefined) ?? '';
      if (namespaces.has(checkpointNs)) namespaces.get(checkpointNs)!.push(tuple);
      else namespaces.set(checkpointNs, [tuple]);
    }
    let wrote = false;
    for (const [checkpointNs, tuples] of namespaces) {
      tuples.sort((a, b) => (a.checkpoint.id < b.checkpoint.id ? -1 : a.checkpoint.id > b.checkpoint.id ? 1 : 0));
      const newest = { configurable: { thread_id: threadId, checkpoint_ns: checkpointNs, checkpoint_id: tuples[tuples.length - 1].checkpoint.id } };
      if (await target.getTuple(newest)) continue;
      const versions = new Map(tuples.map((tuple) => [tuple.checkpoint.id, tuple.checkpoint.channel_versions]));
      for (const tuple of tuples) await copyCheckpoint(target, tuple, versions);
      wrote = true;
    }
    (wrote ? copied.copied : copied.skipped).push(threadId);
  }
  return copied;
}

/**
 * Puts one checkpoint of another checkpointer into `target`, its pending writes first: with the
 * channels whose version differs from its parent's (all of them when the parent is not among
 * `versions`, the copied checkpoints' channel versions) as the new ones.
 */
async function copyCheckpoint(target: SessiondbSaver, tuple: CheckpointTuple, versions: Map<string, ChannelVersions>): Promise<void> {
  const thread = {
    thread_id: tuple.config.configurable?.thread_id as string,
    checkpoint_ns: (tuple.config.configurable?.checkpoint_ns as string | undefined) ?? '',
  };
  const config = { configurable: { ...thread, checkpoint_id: tuple.checkpoint.id } };
  const byTask = new Map<string, PendingWrite[]>();
  for (const [taskId, channel, value] of tuple.pendingWrites ?? []) {
    // Each special write was a call of its own, replacing what the task wrote before.
    if (channel in WRITES_IDX_MAP) await target.putWrites(config, [[channel, value]], taskId);
    else if (byTask.has(taskId)) byTask.get(taskId)!.push([channel, value]);
    else byTask.set(taskId, [[channel, value]]);
  }
  for (const [taskId, writes] of byTask) await target.putWrites(config, writes, taskId);

  const parent = tuple.parentConfig?.configurable?.checkpoint_id as string | undefined;
  const before = (parent && versions.get(parent)) || {};
  const changed = Object.fromEntries(
    Object.entries(tuple.checkpoint.channel_versions).filter(([channel, version]) => before[channel] !== version),
  );
  await target.put({ configurable: parent ? { ...thread, checkpoint_id: parent } : thread }, tuple.checkpoint, tuple.metadata as CheckpointMetadata, changed);
}

export { SessiondbStore, type SessiondbStoreOptions, copyStore } from './langgraph-store.js';
