/**
 * LangGraph.js's long-term memory store on sessiondb: `graph.compile({ store: new SessiondbStore({
 * client }) })`.
 *
 * Stored as the Python client stores it, so both read the same items: each namespace is one
 * session (id: the store's prefix, then the namespace's percent-encoded parts joined with `/`, or
 * a SHA-256 of that past 256 characters), recorded for the user `prefix + "langgraph-store"` with
 * the namespace in its metadata under `langgraphNamespace`; each item is one message with the key
 * as its id (`sha256:` and a SHA-256 of the key when it is not a usable id), the value as its content and the
 * key in its metadata under `storeKey`. A put is one request that stores the value or changes it
 * in place, the server keeps the creation time and stamps updates, and a get is one read by id.
 * Searches read the matching namespaces' items and filter them here with LangGraph.js's filter
 * operators, newest update first. With an `index` (`IndexConfig`: `embeddings` and `fields`), a
 * put embeds the texts at the item's fields (or the op's own `index`) and keeps their vectors in
 * the item's metadata under `storeVectors` (path to the float64 values, little-endian, in
 * base64, as the Python client keeps them); a search with a `query` ranks the matching items by
 * the cosine similarity of the query's embedding with their closest vector, as `InMemoryStore`
 * does, with the `score`. Without an index `query` is ignored, as there.
 *
 * Moving in: `copyStore` copies every namespace's items from any other store (`InMemoryStore`,
 * `PostgresStore`, ...) with a put each, embedded by the target's index. Each namespace is
 * compared with the target's before any of its items is written: an item the target holds with
 * the same value is skipped (so a copy run again writes nothing), and a namespace where the target
 * holds an item with another value is refused (`conflict`), writing nothing of it.
 */
import {
  BaseStore,
  type GetOperation,
  type IndexConfig,
  type Item,
  type ListNamespacesOperation,
  type MatchCondition,
  type Operation,
  type OperationResults,
  type PutOperation,
  type SearchItem,
  type SearchOperation,
} from '@langchain/langgraph-checkpoint';

import { base64Of, bytesOf } from './bytes.js';
import { Client, type Copied, SessiondbError, boundedId, joinedId, messageIdFor, rememberId, type Json, type StoredMessage } from './client.js';
import { jsonEqual } from './json.js';

export const NAMESPACE_KEY = 'langgraphNamespace';
export const ITEM_KEY = 'storeKey';
export const VECTORS_KEY = 'storeVectors';
const OWNER = 'langgraph-store';

function encodeVector(vector: number[]): string {
  const bytes = new DataView(new ArrayBuffer(vector.length * 8));
  vector.forEach((value, i) => bytes.setFloat64(i * 8, value, true));
  return base64Of(new Uint8Array(bytes.buffer));
}

function decodeVector(stored: string): number[] {
  const raw = bytesOf(stored);
  const bytes = new DataView(raw.buffer, raw.byteOffset, raw.byteLength);
  return Array.from({ length: raw.byteLength / 8 }, (_, i) => bytes.getFloat64(i * 8, true));
}

/**
 * A field path's tokens: names, `[n]` / `[*]` / `[-1]` indexes, `*` and `{a,b.c}` groups, as
 * LangGraph.js's `InMemoryStore` reads them (its reader is not exported; the one the package
 * exports reads only names and indexes, and nothing at `$`).
 */
function tokenizePath(path: string): string[] {
  const tokens: string[] = [];
  let name = '';
  for (let i = 0; i < path.length; ) {
    const open = path[i];
    if (open === '[' || open === '{') {
      if (name) tokens.push(name);
      name = '';
      const close = open === '[' ? ']' : '}';
      let depth = 0;
      let token = '';
      do {
        if (path[i] === open) depth += 1;
        else if (path[i] === close) depth -= 1;
        token += path[i];
        i += 1;
      } while (i < path.length && depth > 0);
      tokens.push(token);
      continue;
    }
    if (open === '.') {
      if (name) tokens.push(name);
      name = '';
    } else name += open;
    i += 1;
  }
  if (name) tokens.push(name);
  return tokens;
}

/** A leaf's text: strings, numbers and booleans as they print, objects and arrays as JSON. */
function textOf(value: unknown): string[] {
  if (typeof value === 'string' || typeof value === 'number' || typeof value === 'boolean') return [String(value)];
  if (value !== null && typeof value === 'object') return [JSON.stringify(value, null, 2)];
  return [];
}

/** The texts at a tokenized path of `value`, as LangGraph.js's `InMemoryStore` extracts them. */
function textsAt(value: unknown, tokens: string[], at = 0): string[] {
  if (at >= tokens.length) return textOf(value);
  const token = tokens[at];
  const found: string[] = at === 0 && token === '$' ? [JSON.stringify(value, null, 2)] : [];
  const object = value !== null && typeof value === 'object' ? (value as Record<string, unknown>) : undefined;
  if (token.startsWith('[') && token.endsWith(']')) {
    if (!Array.isArray(value)) return [];
    const index = token.slice(1, -1);
    if (index === '*') for (const item of value) found.push(...textsAt(item, tokens, at + 1));
    else {
      let i = parseInt(index, 10);
      if (i < 0) i += value.length;
      if (i >= 0 && i < value.length) found.push(...textsAt(value[i], tokens, at + 1));
    }
  } else if (token.startsWith('{') && token.endsWith('}')) {
    if (object === undefined) return [];
    for (const field of token.slice(1, -1).split(',').map((f) => f.trim())) {
      let current: unknown = object;
      for (const name of tokenizePath(field)) {
        current = current !== null && typeof current === 'object' && name in current
          ? (current as Record<string, unknown>)[name]
          : undefined;
        if (current === undefined) break;
      }
      if (current !== undefined && current !== null) found.push(...textOf(current));
    }
  } else if (token === '*') {
    if (object !== undefined) for (const item of Object.values(object)) found.push(...textsAt(item, tokens, at + 1));
  } else if (object !== undefined && token in object) found.push(...textsAt(object[token], tokens, at + 1));
  return found;
}

function cosine(a: number[], b: number[]): number {
  const dot = b.reduce((sum, value, i) => sum + value * a[i], 0);
  const norms = Math.sqrt(a.reduce((sum, v) => sum + v * v, 0)) * Math.sqrt(b.reduce((sum, v) => sum + v * v, 0));
  return norms ? dot / norms : 0;
}

/** LangGraph.js's filter semantics: operators `$eq $ne $gt $gte $lt $lte $in $nin`, else `===`. */
function matchesFilter(value: unknown, wanted: unknown): boolean {
  const operators = ['$eq', '$ne', '$gt', '$gte', '$lt', '$lte', '$in', '$nin'];
  if (typeof wanted !== 'object' || wanted === null || !Object.keys(wanted).every((k) => operators.includes(k))) {
    return value === wanted;
  }
  return Object.entries(wanted).every(([operator, operand]) => {
    switch (operator) {
      case '$eq': return value === operand;
      case '$ne': return value !== operand;
      case '$gt': return Number(value) > Number(operand);
      case '$gte': return Number(value) >= Number(operand);
      case '$lt': return Number(value) < Number(operand);
      case '$lte': return Number(value) <= Number(operand);
      case '$in': return Array.isArray(operand) && operand.includes(value);
      default: return !Array.isArray(operand) || !operand.includes(value); // $nin
    }
  });
}

/** A `prefix` or `suffix` condition, where `*` matches any one part. */
function namespaceMatches(condition: MatchCondition, namespace: string[]): boolean {
  const { matchType, path } = condition;
  if (path.length > namespace.length) return false;
  const start = matchType === 'prefix' ? 0 : namespace.length - path.length;
  if (matchType !== 'prefix' && matchType !== 'suffix') throw new Error(`unsupported match type ${matchType}`);
  return path.every((part, i) => part === '*' || part === namespace[start + i]);
}

export interface SessiondbStoreOptions {
  client: Client;
  /**
   * Put before every session id and the owner this store writes, to keep its namespaces apart
   * from other sessions of the sessiondb namespace.
   */
  prefix?: string;
  /** Embeddings for semantic search (`query`), and the fields of a value they index. */
  index?: IndexConfig;
}

/** A LangGraph.js `BaseStore` on the sessiondb server behind `client`. */
export class SessiondbStore extends BaseStore {
  readonly client: Client;
  readonly prefix: string;
  readonly index: IndexConfig | undefined;
  private readonly fields: Array<[string, string[]]>;
  private readonly created = new Set<string>();

  constructor(options: SessiondbStoreOptions) {
    super();
    this.client = options.client;
    this.prefix = options.prefix ?? '';
    this.index = options.index;
    this.fields = (options.index?.fields ?? ['$']).map((p) => [p, tokenizePath(p)]);
  }

  /** (path, text) pairs a put indexes; a field holding several texts gives `path.0`, `path.1`, …. */
  private textsOf(op: PutOperation): Array<[string, string]> {
    if (this.index === undefined || op.value === null || op.index === false) return [];
    const fields: Array<[string, string[]]> = op.index === undefined || op.index === null
      ? this.fields
      : op.index.map((ix) => [ix, tokenizePath(ix)]);
    const found: Array<[string, string]> = [];
    for (const [path, field] of fields) {
      const texts = textsAt(op.value, field);
      if (texts.length === 1) found.push([path, texts[0]]);
      else texts.forEach((text, i) => found.push([`${path}.${i}`, text]));
    }
    return found;
  }

  private sessionOf(namespace: string[]): string {
    return boundedId(joinedId(...namespace), this.prefix);
  }

  private owner(): string {
    return boundedId(OWNER, this.prefix);
  }

  async batch<Op extends Operation[]>(operations: Op): Promise<OperationResults<Op>> {
    // Each text and query is embedded once, before any operation runs.
    const indexed = operations.map((op) => ('value' in op ? this.textsOf(op) : []));
    const texts = [...new Set(indexed.flatMap((pairs) => pairs.map(([, text]) => text)))];
    const queries = this.index === undefined
      ? []
      : [...new Set(operations.flatMap((op) => ('namespacePrefix' in op && op.query ? [op.query] : [])))];
    const embeddings = this.index?.embeddings;
    const documents = new Map<string, number[]>();
    if (texts.length > 0 && embeddings) (await embeddings.embedDocuments(texts)).forEach((v, i) => documents.set(texts[i], v));
    const queryVectors = new Map<string, number[]>();
    for (const query of queries) queryVectors.set(query, await embeddings!.embedQuery(query));

    const results: unknown[] = [];
    for (const [i, op] of operations.entries()) {
      if ('namespacePrefix' in op) results.push(await this.searchItems(op, op.query ? queryVectors.get(op.query) : undefined));
      else if ('matchConditions' in op) results.push(await this.namespacesFor(op));
      else if ('value' in op) results.push(await this.putItem(op, indexed[i].map(([path, text]) => [path, documents.get(text)!])));
      else results.push(await this.getItem(op as GetOperation));
    }
    return results as OperationResults<Op>;
  }

  private itemOf(namespace: string[], message: StoredMessage): Item {
    return {
      value: message.content as Record<string, unknown>,
      key: (message.metadata as Record<string, Json>)[ITEM_KEY] as string,
      namespace,
      createdAt: new Date(message.createdAt),
      updatedAt: new Date(message.updatedAt ?? message.createdAt),
    };
  }

  private async getItem(op: GetOperation): Promise<Item | null> {
    try {
      return this.itemOf(op.namespace, await this.client.getMessage(this.sessionOf(op.namespace), messageIdFor(op.key)));
    } catch (error) {
      if (error instanceof SessiondbError && error.code === 'not_found') return null;
      throw error;
    }
  }

  private async putItem(op: PutOperation, vectors: Array<[string, number[]]>): Promise<void> {
    const sessionId = this.sessionOf(op.namespace);
    const messageId = messageIdFor(op.key);
    if (op.value === null) {
      try {
        await this.client.deleteMessage(sessionId, messageId);
      } catch (error) {
        if (!(error instanceof SessiondbError && error.code === 'not_found')) throw error;
      }
      return;
    }
    if (typeof op.value !== 'object' || Array.isArray(op.value)) throw new TypeError('a store value is an object');
    if (!this.created.has(sessionId)) {
      try {
        await this.client.createSession({ id: sessionId, userId: this.owner(), metadata: { [NAMESPACE_KEY]: op.namespace } });
      } catch (error) {
        if (!(error instanceof SessiondbError && error.code === 'conflict')) throw error;
      }
      rememberId(this.created, sessionId);
    }
    const metadata: Record<string, Json> = { [ITEM_KEY]: op.key };
    if (vectors.length > 0) {
      metadata[VECTORS_KEY] = Object.fromEntries(vectors.map(([path, vector]) => [path, encodeVector(vector)]));
    }
    await this.client.replaceMessage(
      sessionId,
      messageId,
      { role: 'item', content: op.value as Json, metadata },
      { upsert: true },
    );
  }

  /** Every namespace holding at least one item. */
  private async namespaces(): Promise<string[][]> {
    const found: string[][] = [];
    for await (const session of this.client.listSessions({ userId: this.owner() })) {
      const stored = session.metadata?.[NAMESPACE_KEY];
      if (Array.isArray(stored) && session.messageCount > 0 && session.id === this.sessionOf(stored as string[])) {
        found.push(stored as string[]);
      }
    }
    return found;
  }

  private async searchItems(op: SearchOperation, query: number[] | undefined): Promise<SearchItem[]> {
    const prefix = op.namespacePrefix;
    const found: Array<{ time: number; position: number; item: Item; vectors: string[] }> = [];
    for (const namespace of await this.namespaces()) {
      if (!prefix.every((part, i) => namespace[i] === part)) continue;
      let position = 0;
      for await (const line of this.client.export(this.sessionOf(namespace))) {
        position += 1;
        const message = 'message' in line ? line.message : undefined;
        if (message === undefined || message.metadata?.[ITEM_KEY] === undefined) continue;
        const item = this.itemOf(namespace, message);
        if (Object.entries(op.filter ?? {}).every(([k, wanted]) => matchesFilter(item.value[k], wanted))) {
          const vectors = Object.values((message.metadata[VECTORS_KEY] ?? {}) as Record<string, string>);
          found.push({ time: message.updatedAt ?? message.createdAt, position, item, vectors });
        }
      }
    }
    found.sort((a, b) => b.time - a.time || b.position - a.position);
    const offset = op.offset ?? 0;
    const limit = op.limit ?? 10;
    if (query === undefined) return found.slice(offset, offset + limit).map(({ item }) => item);
    // As InMemoryStore ranks: an item scores with its closest vector; items without vectors
    // only fill a page that scored items leave short.
    const scored = found
      .filter(({ vectors }) => vectors.length > 0)
      .map(({ item, vectors }) => ({ ...item, score: Math.max(...vectors.map((v) => cosine(query, decodeVector(v)))) }))
      .sort((a, b) => b.score - a.score);
    const kept: SearchItem[] = scored.slice(offset, offset + limit);
    const scoreless = found.filter(({ vectors }) => vectors.length === 0).map(({ item }) => ({ ...item, score: undefined }));
    return kept.concat(scoreless.slice(0, Math.max(0, limit - kept.length)));
  }

  private async namespacesFor(op: ListNamespacesOperation): Promise<string[][]> {
    let namespaces = (await this.namespaces()).filter((ns) => (op.matchConditions ?? []).every((c) => namespaceMatches(c, ns)));
    if (op.maxDepth !== undefined) namespaces = namespaces.map((ns) => ns.slice(0, op.maxDepth));
    const unique = new Map(namespaces.map((ns) => [JSON.stringify(ns), ns]));
    const sorted = [...unique.values()].sort((a, b) => a.join(':').localeCompare(b.join(':')));
    const offset = op.offset ?? 0;
    return sorted.slice(offset, offset + (op.limit ?? sorted.length));
  }
}

/** Items and namespaces read per request of a copy. */
const COPY_PAGE = 100;

/**
 * Copies every item of `source` into `target` (see the module's documentation): the namespaces
 * written, and those skipped as the target held all their items already. Items get the copy's
 * times.
 */
export async function copyStore(source: BaseStore, target: SessiondbStore): Promise<Copied<string[]>> {
  const copied: Copied<string[]> = { copied: [], skipped: [] };
  for (const namespace of await paged((offset) => source.listNamespaces({ limit: COPY_PAGE, offset }))) {
    const items = await itemsOf(source, namespace);
    const held = await itemsOf(target, namespace);
    const differing = [...items].filter(([key, value]) => held.has(key) && !jsonEqual(held.get(key)!, value)).map(([key]) => key);
    if (differing.length > 0) {
      throw new SessiondbError(409, 'conflict', `the namespace ${JSON.stringify(namespace)} holds other values under ${JSON.stringify(differing.sort().slice(0, 5))}; nothing of it was copied`);
    }
    const missing = [...items].filter(([key]) => !held.has(key));
    if (missing.length > 0) {
      await target.batch(missing.map(([key, value]): PutOperation => ({ namespace, key, value: value as Record<string, Json> })));
    }
    (missing.length > 0 ? copied.copied : copied.skipped).push(namespace);
  }
  return copied;
}

/** The values of the items of `namespace` itself, not of those below. */
async function itemsOf(store: BaseStore, namespace: string[]): Promise<Map<string, Json>> {
  const items = await paged((offset) => store.search(namespace, { limit: COPY_PAGE, offset }));
  const own = items.filter((item) => jsonEqual(item.namespace, namespace));
  return new Map(own.map((item) => [item.key, item.value as Json]));
}

/** Everything `page(offset)` gives, page by page until one comes back short. */
async function paged<T>(page: (offset: number) => Promise<T[]>): Promise<T[]> {
  const found: T[] = [];
  for (;;) {
    const batch = await page(found.length);
    found.push(...batch);
    if (batch.length < COPY_PAGE) return found;
  }
}
