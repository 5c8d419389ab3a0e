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
 * operators, newest update first; `query` needs an embedding index, which this store does not
 * have, so it is ignored (as `InMemoryStore` without an index ignores it).
 */
import {
  BaseStore,
  type GetOperation,
  type Item,
  type ListNamespacesOperation,
  type MatchCondition,
  type Operation,
  type OperationResults,
  type PutOperation,
  type SearchItem,
  type SearchOperation,
} from '@langchain/langgraph-checkpoint';

import { Client, SessiondbError, boundedId, joinedId, messageIdFor, type Json, type StoredMessage } from './client.js';

export const NAMESPACE_KEY = 'langgraphNamespace';
export const ITEM_KEY = 'storeKey';
const OWNER = 'langgraph-store';

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
}

/** A LangGraph.js `BaseStore` on the sessiondb server behind `client`. */
export class SessiondbStore extends BaseStore {
  readonly client: Client;
  readonly prefix: string;
  private readonly created = new Set<string>();

  constructor(options: SessiondbStoreOptions) {
    super();
    this.client = options.client;
    this.prefix = options.prefix ?? '';
  }

  private sessionOf(namespace: string[]): string {
    return boundedId(joinedId(...namespace), this.prefix);
  }

  private owner(): string {
    return boundedId(OWNER, this.prefix);
  }

  async batch<Op extends Operation[]>(operations: Op): Promise<OperationResults<Op>> {
    const results: unknown[] = [];
    for (const op of operations) {
      if ('namespacePrefix' in op) results.push(await this.searchItems(op));
      else if ('matchConditions' in op) results.push(await this.namespacesFor(op));
      else if ('value' in op) results.push(await this.putItem(op));
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

  private async putItem(op: PutOperation): Promise<void> {
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
      this.created.add(sessionId);
    }
    await this.client.replaceMessage(
      sessionId,
      messageId,
      { role: 'item', content: op.value as Json, metadata: { [ITEM_KEY]: op.key } },
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

  private async searchItems(op: SearchOperation): Promise<SearchItem[]> {
    const prefix = op.namespacePrefix;
    const found: Array<[number, number, Item]> = [];
    for (const namespace of await this.namespaces()) {
      if (!prefix.every((part, i) => namespace[i] === part)) continue;
      let position = 0;
      for await (const line of this.client.export(this.sessionOf(namespace))) {
        position += 1;
        const message = 'message' in line ? line.message : undefined;
        if (message === undefined || message.metadata?.[ITEM_KEY] === undefined) continue;
        const item = this.itemOf(namespace, message);
        if (Object.entries(op.filter ?? {}).every(([k, wanted]) => matchesFilter(item.value[k], wanted))) {
          found.push([message.updatedAt ?? message.createdAt, position, item]);
        }
      }
    }
    found.sort((a, b) => b[0] - a[0] || b[1] - a[1]);
    const offset = op.offset ?? 0;
    return found.slice(offset, offset + (op.limit ?? 10)).map(([, , item]) => item);
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
