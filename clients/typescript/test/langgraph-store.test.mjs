// The LangGraph.js store on a real server: the same random operations on LangGraph.js's own
// InMemoryStore and on sessiondb give the same answers, and a graph keeps memories in it.
import assert from 'node:assert/strict';
import { test } from 'node:test';
import { crc32 } from 'node:zlib';

import { Annotation, END, START, StateGraph } from '@langchain/langgraph';
import { InMemoryStore } from '@langchain/langgraph-checkpoint';

import { SessiondbStore, copyStore } from '../dist/langgraph.js';
import { SessiondbError, messageIdFor } from '../dist/index.js';
import { sharedServer } from './served.mjs';

const shared = sharedServer();
let stores = 0;
const fresh = () => new SessiondbStore({ client: shared.client, prefix: `store-${++stores}:` });

const NAMESPACES = [['users', 'ada'], ['users', 'bob'], ['users', 'ada', 'notes'], ['team'], ['team', 'x y/z', 'ü']];
const KEYS = ['pref', 'food', 'a/b', 'x'.repeat(300), 'tab\there', 'compaction_1', '100%'];
const FILTERS = [
  undefined, { kind: 'fact' }, { n: { $gte: 3 } }, { n: { $lt: 2 }, kind: 'todo' }, { kind: { $in: ['fact', 'todo'] } },
  { kind: { $nin: ['fact'] } }, { kind: { $ne: 'fact' } }, { n: { $gt: 1, $lte: 4 } }, { missing: null },
];

/** A small seeded generator, so a failure replays. */
function random(seed) {
  let state = seed;
  const next = () => ((state = (state * 1103515245 + 12345) % 2147483648) / 2147483648);
  return { next, pick: (list) => list[Math.floor(next() * list.length)], int: (n) => Math.floor(next() * (n + 1)) };
}

const found = (items) => items.map((i) => JSON.stringify([i.namespace, i.key, i.value])).sort();

test('answers as LangGraph.js InMemoryStore does', async () => {
  const rng = random(7);
  const ours = fresh();
  const theirs = new InMemoryStore();
  const alive = new Map();
  for (let step = 0; step < 300; step += 1) {
    const namespace = rng.pick(NAMESPACES);
    const key = rng.pick(KEYS);
    const roll = rng.next();
    const at = JSON.stringify(namespace);
    if (roll < 0.45) {
      const value = { n: rng.int(5), kind: rng.pick(['fact', 'todo', null]), tags: rng.pick([['a'], []]) };
      await ours.put(namespace, key, value);
      await theirs.put(namespace, key, value);
      if (!alive.has(at)) alive.set(at, [namespace, new Set()]);
      alive.get(at)[1].add(key);
    } else if (roll < 0.6) {
      await ours.delete(namespace, key);
      await theirs.delete(namespace, key);
      alive.get(at)?.[1].delete(key);
    } else if (roll < 0.8) {
      const mine = await ours.get(namespace, key);
      const expected = await theirs.get(namespace, key);
      assert.equal(mine === null, expected === null, `step ${step}`);
      if (expected !== null) {
        assert.deepEqual([mine.namespace, mine.key, mine.value], [expected.namespace, expected.key, expected.value]);
      }
    } else if (roll < 0.93) {
      const prefix = rng.pick([[], ['users'], ['users', 'ada'], ['team'], ['none']]);
      const filter = rng.pick(FILTERS);
      assert.deepEqual(
        found(await ours.search(prefix, { filter, limit: 1000 })),
        found(await theirs.search(prefix, { filter, limit: 1000 })),
        `step ${step}: ${JSON.stringify([prefix, filter])}`,
      );
    } else {
      const condition = rng.pick([undefined, { matchType: 'prefix', path: ['users'] }, { matchType: 'prefix', path: ['users', '*', 'notes'] },
        { matchType: 'suffix', path: ['ada'] }, { matchType: 'suffix', path: ['*'] }]);
      const maxDepth = rng.pick([undefined, 1, 2]);
      const limit = 1 + rng.int(4);
      const offset = rng.int(2);
      const op = { matchConditions: condition ? [condition] : undefined, maxDepth, limit, offset };
      // Namespaces holding items, as LangGraph's SQL stores list them (InMemoryStore also lists
      // namespaces that were emptied).
      const holding = [...alive.values()].filter(([ns, keys]) => keys.size > 0 && (!condition || theirs.doesMatch(condition, ns)))
        .map(([ns]) => (maxDepth ? ns.slice(0, maxDepth) : ns));
      const unique = [...new Map(holding.map((ns) => [JSON.stringify(ns), ns])).values()]
        .sort((a, b) => a.join(':').localeCompare(b.join(':')));
      assert.deepEqual((await ours.batch([op]))[0], unique.slice(offset, offset + limit), `step ${step}`);
    }
  }
});

test('searches give the newest update first and keep creation times', async () => {
  const store = fresh();
  for (const key of ['a', 'b', 'c']) {
    await store.put(['docs'], key, { v: key });
    await new Promise((resolve) => setTimeout(resolve, 5));
  }
  const { createdAt } = await store.get(['docs'], 'a');
  await store.put(['docs'], 'a', { v: 'a2' });
  assert.deepEqual((await store.search(['docs'])).map((i) => i.key), ['a', 'c', 'b']);
  assert.deepEqual((await store.search(['docs'], { limit: 1, offset: 1 })).map((i) => i.key), ['c']);
  const again = await store.get(['docs'], 'a');
  assert.deepEqual([again.value, again.createdAt], [{ v: 'a2' }, createdAt]);
  assert.ok(again.updatedAt > createdAt);
  const other = new SessiondbStore({ client: shared.client, prefix: store.prefix }); // another process
  assert.deepEqual((await other.get(['docs'], 'a')).value, { v: 'a2' });
  assert.deepEqual(await other.listNamespaces(), [['docs']]);
  // Stored as the Python client stores them (the ids below are the Python client's).
  assert.equal(messageIdFor('tab\there'), 'sha256:5b8765931ded06ac39c11c47f83f7457636af4780d72900c1a0131f4ccb96c85');
  assert.equal(messageIdFor('compaction_1'), 'sha256:77ce103db304a16cbed105b346cf52ded52b2787ed06943ba7f556e1f48ddd1b');
  await store.put(['team', 'x y/z', 'ü'], 'k', { v: 1 });
  assert.equal((await shared.client.getMessage(`${store.prefix}team/x%20y%2Fz/%C3%BC`, 'k')).content.v, 1);
});

test('a graph keeps memories across threads', async () => {
  const State = Annotation.Root({ user: Annotation(), said: Annotation(), recalled: Annotation() });
  const remember = async (state, config) => {
    const namespace = ['memories', state.user];
    const store = config.store;
    await store.put(namespace, `m${(await store.search(namespace)).length}`, { text: state.said });
    return { recalled: (await store.search(namespace, { limit: 100 })).map((i) => i.value.text).sort() };
  };
  const builder = new StateGraph(State).addNode('remember', remember).addEdge(START, 'remember').addEdge('remember', END);
  const store = fresh();
  const app = builder.compile({ store });
  await app.invoke({ user: 'ada', said: 'likes tea' }, { configurable: { thread_id: 't1' } });
  const out = await app.invoke({ user: 'ada', said: 'has a cat' }, { configurable: { thread_id: 't2' } });
  assert.deepEqual(out.recalled, ['has a cat', 'likes tea']);
  const other = builder.compile({ store: new SessiondbStore({ client: shared.client, prefix: store.prefix }) });
  assert.deepEqual((await other.invoke({ user: 'bob', said: 'plays go' }, { configurable: { thread_id: 't3' } })).recalled, ['plays go']);
  assert.deepEqual(await store.listNamespaces({ prefix: ['memories'] }), [['memories', 'ada'], ['memories', 'bob']]);
});

const WORDS = ['tea', 'cat', 'go', 'rain', 'bike', 'jazz', 'map', 'salt'];
const sentence = (rng) => Array.from({ length: 1 + rng.int(3) }, () => rng.pick(WORDS)).join(' ');
/** A deterministic stand-in for a model: word counts, and a checksum so texts never tie. */
const embedText = (text) => [...WORDS.map((w) => text.split(' ').filter((t) => t === w).length), crc32(text) / 2 ** 32];
const embeddings = {
  embedDocuments: async (texts) => texts.map(embedText),
  embedQuery: async (text) => embedText(text),
};

test('ranks by meaning as LangGraph.js InMemoryStore does', async () => {
  const rng = random(11);
  const index = { dims: WORDS.length + 1, embeddings, fields: ['text', 'notes[*]'] };
  const ours = new SessiondbStore({ client: shared.client, prefix: `store-${++stores}:`, index });
  const theirs = new InMemoryStore({ index });
  const namespaces = [['docs', 'a'], ['docs', 'b'], ['other']];
  // LangGraph.js's InMemoryStore never drops an item's vectors, not even when the item is
  // deleted, so a key put again would rank by its old texts there: each put takes a new key.
  const stored = [];
  for (let step = 0; step < 120; step += 1) {
    const roll = rng.next();
    if (roll < 0.5) {
      const namespace = rng.pick(namespaces);
      const key = `k${step}`;
      stored.push([namespace, key]);
      const value = { text: `${sentence(rng)} #${step}`, title: `${rng.pick(WORDS)} ${step}`, n: rng.int(3) };
      if (rng.next() < 0.3) value.notes = [`${sentence(rng)} #${step}a`, `${sentence(rng)} #${step}b`];
      if (rng.next() < 0.2) delete value.text;
      const fields = rng.pick([undefined, undefined, ['title'], ['notes[0]']]);
      await ours.put(namespace, key, value, fields);
      await theirs.put(namespace, key, value, fields);
    } else if (roll < 0.6 && stored.length > 0) {
      const [namespace, key] = stored.splice(rng.int(stored.length - 1), 1)[0];
      await ours.delete(namespace, key);
      await theirs.delete(namespace, key);
    } else {
      const prefix = rng.pick([[], ['docs'], ['docs', 'b'], ['other']]);
      const options = { query: sentence(rng), filter: rng.pick([undefined, { n: { $gte: 1 } }]), limit: 1 + rng.int(7), offset: rng.int(3) };
      const mine = await ours.search(prefix, options);
      const expected = await theirs.search(prefix, options);
      const scored = expected.filter((i) => i.score !== undefined);
      assert.deepEqual(
        mine.filter((i) => i.score !== undefined).map((i) => [i.namespace, i.key]),
        scored.map((i) => [i.namespace, i.key]),
        `step ${step}`,
      );
      mine.slice(0, scored.length).forEach((item, i) => assert.ok(Math.abs(item.score - scored[i].score) < 1e-9));
      // Items without vectors fill a short page, each store taking them in its own order.
      assert.equal(mine.length, expected.length, `step ${step}`);
    }
  }
  // Another store on the same server, with the same index, ranks from the stored vectors.
  const other = new SessiondbStore({ client: shared.client, prefix: ours.prefix, index });
  const ranked = async (store) => (await store.search(['docs'], { query: 'tea cat' })).map((i) => [i.key, i.score]);
  assert.deepEqual(await ranked(other), await ranked(ours));
});

test('a put replaces the vectors of the value it replaces', async () => {
  const store = new SessiondbStore({ client: shared.client, prefix: `store-${++stores}:`, index: { dims: WORDS.length + 1, embeddings } });
  await store.put(['n'], 'indexed', { text: 'tea' });
  await store.put(['n'], 'plain', { text: 'tea' }, false);
  await store.put(['n'], 'again', { text: 'tea' });
  await store.put(['n'], 'again', { text: 'cat' }, false);
  const ranked = (await store.search(['n'], { query: 'tea' })).map((i) => [i.key, i.score !== undefined]);
  assert.deepEqual(ranked[0], ['indexed', true]);
  assert.deepEqual(ranked.slice(1).sort(), [['again', false], ['plain', false]]);
});

test('copyStore moves a store in once and refuses a namespace holding another value', async () => {
  const rng = random(5);
  const source = new InMemoryStore();
  for (const namespace of NAMESPACES) {
    for (const key of KEYS) await source.put(namespace, key, { n: rng.int(5), text: sentence(rng) });
  }
  for (let i = 0; i < 130; i += 1) await source.put(['bulk'], `item-${i}`, { i, text: sentence(rng) }); // more than a page
  const everything = async (store) => {
    const found = [];
    for (const namespace of await store.listNamespaces({ limit: 1000 })) {
      for (const item of await store.search(namespace, { limit: 1000 })) {
        if (item.namespace.join('\u0000') === namespace.join('\u0000')) found.push([namespace, item.key, item.value]);
      }
    }
    return found.sort((a, b) => JSON.stringify(a).localeCompare(JSON.stringify(b)));
  };

  const prefix = `store-${++stores}:`;
  const index = { dims: WORDS.length + 1, embeddings, fields: ['text'] };
  const target = new SessiondbStore({ client: shared.client, prefix, index });
  const copied = await copyStore(source, target);
  assert.equal(copied.copied.length, NAMESPACES.length + 1);
  assert.deepEqual(await everything(target), await everything(source));
  const [best] = await target.search(['bulk'], { query: 'jazz jazz jazz', limit: 1 });
  assert.ok(best.score !== undefined && best.value.text.includes('jazz'), 'the target index embedded what it was given');

  const again = await copyStore(source, new SessiondbStore({ client: shared.client, prefix }));
  assert.deepEqual([again.copied.length, again.skipped.length], [0, NAMESPACES.length + 1]);
  await source.put(['team'], 'new', { text: 'added since' });
  assert.deepEqual((await copyStore(source, target)).copied, [['team']]);

  await target.put(['users', 'bob'], 'pref', { changed: 'here' });
  await source.put(['users', 'bob'], 'more', { text: 'not copied' });
  await assert.rejects(copyStore(source, target), (error) => error instanceof SessiondbError && error.code === 'conflict');
  assert.equal(await target.get(['users', 'bob'], 'more'), null);
});
