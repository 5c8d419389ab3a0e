// The LangGraph.js checkpointer with real graphs on a real server (the specification itself is
// langgraph.spec.mjs, run by vitest).
import assert from 'node:assert/strict';
import { test } from 'node:test';

import { Annotation, Command, END, MemorySaver, START, StateGraph, interrupt } from '@langchain/langgraph';
import { emptyCheckpoint } from '@langchain/langgraph-checkpoint';

import { Client } from '../dist/index.js';
import { MAX_EXTENSION_DEPTH, SessiondbSaver, copyThreads } from '../dist/langgraph.js';
import { sharedServer } from './served.mjs';

const shared = sharedServer();
let savers = 0;
const saver = (prefix = `saver-${++savers}:`) => new SessiondbSaver({ client: shared.client, prefix });

const State = Annotation.Root({
  steps: Annotation({ reducer: (a, b) => a.concat(b), default: () => [] }),
  topic: Annotation(),
});

/** Two nodes after each other; the second asks a human first when `ask`. */
function graph(checkpointer, { ask = false } = {}) {
  return new StateGraph(State)
    .addNode('research', (state) => ({ steps: [`research ${state.topic}`] }))
    .addNode('write', (state) => {
      if (ask && !interrupt({ question: `write about ${state.topic}?` })) return { steps: ['declined'] };
      return { steps: [`write ${state.topic}`] };
    })
    .addEdge(START, 'research')
    .addEdge('research', 'write')
    .addEdge('write', END)
    .compile({ checkpointer });
}

test('a graph continues from another saver', async () => {
  const config = { configurable: { thread_id: 'essay-1' } };
  const first = saver();
  const done = await graph(first).invoke({ topic: 'otters' }, config);
  assert.deepEqual(done.steps, ['research otters', 'write otters']);
  const again = graph(saver(first.prefix));
  assert.deepEqual((await again.getState(config)).values.steps, done.steps);
  const more = await again.invoke({ topic: 'otters', steps: ['revise'] }, config);
  assert.deepEqual(more.steps, ['research otters', 'write otters', 'revise', 'research otters', 'write otters']);
});

test('interrupts survive and resume', async () => {
  const config = { configurable: { thread_id: 'ask-1' } };
  const first = saver();
  const paused = await graph(first, { ask: true }).invoke({ topic: 'bees' }, config);
  assert.deepEqual(paused.__interrupt__[0].value, { question: 'write about bees?' });
  const resumed = await graph(saver(first.prefix), { ask: true }).invoke(new Command({ resume: true }), config);
  assert.deepEqual(resumed.steps, ['research bees', 'write bees']);
});

test('history and a time-travel branch', async () => {
  const config = { configurable: { thread_id: 'travel-1' } };
  const app = graph(saver());
  await app.invoke({ topic: 'owls' }, config);
  const history = [];
  for await (const snapshot of app.getStateHistory(config)) history.push(snapshot);
  assert.deepEqual(history.map((s) => (s.values.steps ?? []).length), [2, 1, 0, 0]);
  const afterResearch = history[1];
  assert.deepEqual(afterResearch.next, ['write']);
  const forked = await app.updateState(afterResearch.config, { topic: 'crows' });
  const replay = await app.invoke(null, forked);
  assert.deepEqual(replay.steps, ['research owls', 'write crows']);
  assert.deepEqual((await app.getState(config)).values.steps, ['research owls', 'write crows']);
  let count = 0;
  for await (const _ of app.getStateHistory(config)) count += 1;
  assert.equal(count, history.length + 2, 'the replay is a branch: the first run stays');
});

test('deleteThread removes the thread and nothing else', async () => {
  const checkpointer = saver();
  await graph(checkpointer).invoke({ topic: 'x' }, { configurable: { thread_id: 'gone' } });
  await graph(checkpointer).invoke({ topic: 'y' }, { configurable: { thread_id: 'kept' } });
  const remembered = (await checkpointer.getTuple({ configurable: { thread_id: 'gone' } })).config;
  await checkpointer.deleteThread('gone');
  assert.equal(await checkpointer.getTuple({ configurable: { thread_id: 'gone' } }), undefined);
  // Nor does a checkpoint the saver remembers come back by its id.
  assert.equal(await checkpointer.getTuple(remembered), undefined);
  assert.equal((await graph(checkpointer).getState({ configurable: { thread_id: 'kept' } })).values.topic, 'y');
});

test('a growing list is stored as what each step added', async () => {
  const config = { configurable: { thread_id: 'grow-1' } };
  const writer = saver();
  const app = graph(writer);
  const line = 'x'.repeat(300);
  const expected = [];
  for (let turn = 0; turn < 40; turn += 1) {
    await app.invoke({ topic: 't', steps: [`${turn} ${line}`] }, config);
    expected.push(`${turn} ${line}`, 'research t', 'write t');
  }
  const [checkpoints] = writer.sessionsOf('grow-1', '');
  const steps = [];
  for await (const entry of shared.client.export(checkpoints)) {
    const value = entry.message?.content.values.steps;
    if (value && value.type !== 'empty') steps.push(value);
  }
  const extended = steps.filter((value) => value.base !== undefined);
  assert.ok(extended.length > steps.length / 2, `most versions are extensions: ${extended.length} of ${steps.length}`);
  assert.ok(extended.every((value) => value.depth <= MAX_EXTENSION_DEPTH));
  assert.ok(steps.length - extended.length > 2, 'chains end in whole values');
  // Whole copies at every version would take the square of the list's length (~3 MB here).
  assert.ok((await shared.client.getSession(checkpoints)).contentBytes < 600_000);

  // Another process (a client and saver of its own) reads the latest state cold: the chain
  // under it comes in one request, not a request per link.
  const other = new Client({ baseUrl: shared.served.url });
  const requests = [];
  const open = other.open.bind(other);
  other.open = (method, path, ...rest) => {
    requests.push(`${method} ${path}`);
    return open(method, path, ...rest);
  };
  const state = await graph(new SessiondbSaver({ client: other, prefix: writer.prefix })).getState(config);
  assert.deepEqual(state.values.steps, expected);
  assert.ok(requests.length <= 5, requests.join('\n'));
  other.close();

  // Every version reads back right in another process with no memory, cold.
  const fresh = graph(new SessiondbSaver({ client: shared.client, prefix: writer.prefix, cacheBytes: 0 }));
  assert.deepEqual((await fresh.getState(config)).values.steps, expected);
  const lengths = new Set();
  for await (const state of fresh.getStateHistory(config)) {
    const then = state.values.steps ?? [];
    assert.deepEqual(then, expected.slice(0, then.length));
    lengths.add(then.length);
  }
  assert.equal(lengths.size, expected.length + 1);
  // The saver that wrote them reads them back from memory as they were.
  assert.deepEqual((await app.getState(config)).values.steps, expected);
});

/**
 * Every checkpoint of a thread, every namespace, as comparable values. A value of a channel
 * without a version is left out: `MemorySaver` keeps the empty values LangGraph hands over, a
 * checkpointer that stores the versioned ones (ours, `SqliteSaver`) does not, and LangGraph
 * restores either as an empty channel.
 */
async function checkpointsOf(checkpointer, threadId) {
  const found = [];
  for await (const t of checkpointer.list({ configurable: { thread_id: threadId } })) {
    const writes = [...(t.pendingWrites ?? [])].sort((a, b) => JSON.stringify(a).localeCompare(JSON.stringify(b)));
    const versioned = Object.entries(t.checkpoint.channel_values).filter(([channel]) => channel in t.checkpoint.channel_versions);
    const checkpoint = { ...t.checkpoint, channel_values: Object.fromEntries(versioned) };
    found.push([t.config, checkpoint, t.metadata, t.parentConfig, writes]);
  }
  const key = ([config, checkpoint]) => `${config.configurable.checkpoint_ns}\n${checkpoint.id}`;
  return found.sort((a, b) => key(a).localeCompare(key(b)));
}

test('copyThreads moves threads in with branches, interrupts and namespaces, then only what came since', async () => {
  const source = new MemorySaver();
  const travel = { configurable: { thread_id: 'travel' } };
  const app = graph(source);
  await app.invoke({ topic: 'owls' }, travel);
  const history = [];
  for await (const snapshot of app.getStateHistory(travel)) history.push(snapshot);
  await app.invoke(null, await app.updateState(history[1].config, { topic: 'crows' }));
  const asked = { configurable: { thread_id: 'asked' } };
  await graph(source, { ask: true }).invoke({ topic: 'bees' }, asked);
  await source.put({ configurable: { thread_id: 'nested', checkpoint_ns: 'inner:1' } }, emptyCheckpoint(),
    { source: 'input', step: -1, parents: {} }, {});

  const target = saver();
  const copied = await copyThreads(source, target);
  assert.deepEqual(copied.copied.sort(), ['asked', 'nested', 'travel']);
  for (const threadId of ['travel', 'asked', 'nested']) {
    const expected = await checkpointsOf(source, threadId);
    assert.deepEqual(await checkpointsOf(target, threadId), expected);
    // Another process reads the same from the server alone.
    assert.deepEqual(await checkpointsOf(new SessiondbSaver({ client: shared.client, prefix: target.prefix, cacheBytes: 0 }), threadId), expected);
  }
  assert.equal((await checkpointsOf(target, 'travel')).length, 6);
  const resumed = await graph(target, { ask: true }).invoke(new Command({ resume: true }), asked);
  assert.deepEqual(resumed.steps, ['research bees', 'write bees']);

  await graph(source).invoke({ topic: 'owls', steps: ['revise'] }, travel);
  const again = await copyThreads(source, target, ['travel', 'nested']);
  assert.deepEqual(again, { copied: ['travel'], skipped: ['nested'] });
  assert.deepEqual(await checkpointsOf(target, 'travel'), await checkpointsOf(source, 'travel'));
});

test('a thread whose versions are strings goes on in that form', () => {
  const next = saver().getNextVersion('00000000000000000000000000000041.0.5');
  assert.match(String(next), /^00000000000000000000000000000042\.[0-9.]{16,}$/);
  assert.equal(saver().getNextVersion(3), 4);
  assert.equal(saver().getNextVersion(undefined), 1);
});
