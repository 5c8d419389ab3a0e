// Context blocks, the prompt and the tools, with the session operations beside them (fork,
// split, usage, namespace search, history in model formats and recent windows), on a server of
// their own: templates reach every session of it.
import assert from 'node:assert/strict';
import { test } from 'node:test';

import { SessiondbError } from '../dist/index.js';
import { all, sharedServer } from './served.mjs';

const shared = sharedServer();

async function rejectsWith(promise, code) {
  await assert.rejects(promise, (error) => {
    assert.ok(error instanceof SessiondbError, `${error}`);
    assert.equal(error.code, code);
    return true;
  });
}

test('blocks, entries, the prompt and the tools', async () => {
  const c = shared.client;
  const soul = await c.defineBlock(null, 'soul', { kind: 'readonly', description: 'Identity', content: 'You are a support agent.' });
  assert.deepEqual(soul, {
    label: 'soul', kind: 'readonly', description: 'Identity', maxTokens: null, content: 'You are a support agent.', tokens: soul.tokens,
  });
  await c.defineBlock(null, 'playbooks', { kind: 'skill', description: 'Playbooks' });
  await c.putEntry(null, 'playbooks', 'late-order', { content: 'Apologise once, then give the date.', description: 'Late orders' });
  await c.defineBlock('chat', 'memory', { kind: 'writable', maxTokens: 50 });
  await c.appendToBlock('chat', 'memory', 'likes tea');
  assert.equal((await c.appendToBlock('chat', 'memory', 'has a dog')).content, 'likes tea\nhas a dog');
  assert.deepEqual((await c.blocks('chat')).map((b) => b.label), ['soul', 'playbooks', 'memory']);
  assert.deepEqual((await c.blocks(null)).map((b) => b.label), ['soul', 'playbooks']);
  await rejectsWith(c.appendToBlock('chat', 'memory', 'word '.repeat(100)), 'invalid_request');
  await rejectsWith(c.appendToBlock('chat', 'soul', 'x'), 'conflict');

  await c.putEntry('chat', 'playbooks', 'late-order', { content: 'Offer a voucher.' });
  assert.equal((await c.getEntry('chat', 'playbooks', 'late-order')).content, 'Offer a voucher.');
  assert.equal((await c.getEntry(null, 'playbooks', 'late-order')).description, 'Late orders');
  await c.putEntry(null, 'playbooks', 'refund', { content: 'Refund within a day.' });
  assert.deepEqual(await c.entries('chat', 'playbooks'), [
    { key: 'late-order', content: 'Offer a voucher.', description: null },
    { key: 'refund', content: 'Refund within a day.', description: null },
  ]);
  await rejectsWith(c.entries(null, 'soul'), 'conflict');
  // More entries than a page holds come back whole, in key order.
  await c.defineBlock('pages', 'notes', { kind: 'search' });
  const keys = Array.from({ length: 130 }, (_, i) => `n${String(i).padStart(3, '0')}`);
  for (const key of [...keys].reverse()) await c.putEntry('pages', 'notes', key, { content: `note ${key}` });
  assert.deepEqual((await c.entries('pages', 'notes')).map((e) => e.key), keys);
  await c.putEntry('chat', 'playbooks', 'refund', { content: 'Refund at once.' });
  await c.deleteEntry('chat', 'playbooks', 'refund');
  assert.equal((await c.getEntry('chat', 'playbooks', 'refund')).content, 'Refund within a day.', "the template's shows again");
  await rejectsWith(c.deleteEntry('chat', 'playbooks', 'refund'), 'not_found');
  await rejectsWith(c.getEntry('chat', 'playbooks', 'nope'), 'not_found');

  const frozen = await c.prompt('chat');
  assert.ok(frozen.prompt.includes('You are a support agent.') && frozen.prompt.includes('likes tea'), frozen.prompt);
  await c.appendToBlock('chat', 'memory', 'moved house');
  assert.deepEqual(await c.prompt('chat'), frozen, 'frozen until refreshed');
  assert.ok((await c.refreshPrompt('chat')).prompt.includes('moved house'));

  const names = (await c.tools('chat')).map((t) => t.name);
  assert.deepEqual(names, ['set_context', 'load_context', 'unload_context', 'session_search']);
  assert.deepEqual((await c.tools('chat', { format: 'openai' })).map((t) => t.function.name), names);
  assert.deepEqual((await c.tools('chat', { format: 'anthropic' })).map((t) => t.name), names);
  assert.equal(await c.runTool('chat', 'load_context', { label: 'playbooks', key: 'refund' }), 'Refund within a day.');
  assert.ok((await c.runTool('chat', 'set_context', { label: 'soul', content: 'x' })).startsWith('Error: '));
  await c.deleteBlock('chat', 'memory');
  await rejectsWith(c.deleteBlock('chat', 'memory'), 'not_found');
  assert.deepEqual((await c.blocks('other')).map((b) => b.label), ['soul', 'playbooks']);

  // A templates' part of a dump imports whole, or not at all.
  const part = [
    { templates: {} },
    { block: { label: 'faq', kind: 'search' } },
    { entry: { label: 'faq', key: 'hours', content: 'Open at nine.' } },
  ];
  await rejectsWith(c.importTemplates([...part, { message: { id: 'm', role: 'user', content: 'x' }, parentId: null, createdAt: 1 }]), 'invalid_request');
  assert.deepEqual((await c.blocks(null)).map((b) => b.label), ['soul', 'playbooks']);
  assert.deepEqual(await c.importTemplates(part), { imported: 2, skipped: 0 });
  assert.deepEqual((await c.entries('other', 'faq')).map((e) => e.content), ['Open at nine.']);
});

test('fork, split, usage and namespace search', async () => {
  const c = shared.client;
  await c.appendBatch('main', [
    { id: 'q', role: 'user', content: 'where is the platypus' },
    { id: 'a', role: 'assistant', content: 'in the river' },
    { id: 'q2', role: 'user', content: 'and the otter' },
  ]);
  const fork = await c.fork('main', { atMessageId: 'a', id: 'fork', name: 'Branch' });
  assert.deepEqual([fork.id, fork.name, fork.parentSessionId], ['fork', 'Branch', 'main']);
  assert.deepEqual((await all(c.history('fork'))).map((m) => m.content), ['where is the platypus', 'in the river']);
  assert.equal((await c.getSession('main')).messageCount, 3, 'the source stays');
  const continued = await c.split('main', { summary: 'Asked about a platypus and an otter.', name: 'Part 2' });
  assert.equal(continued.name, 'Part 2');
  assert.equal((await c.getSession('main')).endReason, 'compaction');
  await c.addUsage('fork', { inputTokens: 10, outputTokens: 4, cost: 0.25 });
  const used = await c.addUsage('fork', { inputTokens: 5 });
  assert.deepEqual([used.inputTokens, used.outputTokens, used.cost], [15, 4, 0.25]);
  const hits = await c.searchAll('platypus');
  assert.deepEqual(new Set(hits.map((h) => h.sessionId)), new Set(['main', 'fork', continued.id]));
  const river = (await c.searchAll('river')).filter((h) => h.sessionId === 'main');
  assert.equal(river.length, 1);
  const ours = (found) => found.filter((h) => ['main', 'fork'].includes(h.sessionId));
  assert.deepEqual(ours(await c.searchAll('river', { role: 'user' })), []);
  const at = river[0].createdAt;
  const kept = await c.search('main', 'river', { role: 'assistant', since: at, until: at + 1 });
  assert.deepEqual(kept.map((h) => h.id), [river[0].id]);
  assert.deepEqual(await c.search('main', 'river', { until: at - 10_000 }), []);
});

test('history in model formats and recent windows', async () => {
  const c = shared.client;
  const hello = 'hello '.repeat(40);
  await c.appendBatch('formats', [
    { role: 'system', content: 'Be brief.' },
    { role: 'user', content: hello },
    { role: 'assistant', content: 'hi' },
  ]);
  assert.deepEqual(await c.modelHistory('formats'), [
    { role: 'system', content: 'Be brief.' },
    { role: 'user', content: hello },
    { role: 'assistant', content: 'hi' },
  ]);
  const anthropic = await c.modelHistory('formats', 'anthropic');
  assert.equal(anthropic.system, 'Be brief.');
  assert.deepEqual(anthropic.messages.map((m) => m.role), ['user', 'assistant']);
  await rejectsWith(c.modelHistory('formats', 'smoke-signals'), 'invalid_request');
  const whole = await c.recentHistory('formats', 1 << 20);
  assert.equal(whole.truncated, false);
  assert.equal(whole.messages.length, 3);
  const recent = await c.recentHistory('formats', 100);
  assert.equal(recent.truncated, true);
  assert.deepEqual(recent.messages.map((m) => m.content), ['hi']);
  assert.equal(recent.totalBytes, whole.totalBytes);
  assert.ok(recent.totalBytes > 240);
});

test('the change feed follows and resumes', async () => {
  const c = shared.client;
  const feed = c.events('followed');
  const firstEvent = feed.next();
  // Appends go on until the feed has one; its subscription starts at some point among them.
  let n = 0;
  let received = false;
  const appending = (async () => {
    while (!received) {
      await c.append('followed', { role: 'user', content: `tick ${n++}` });
      await new Promise((resolve) => setTimeout(resolve, 50));
    }
  })();
  const first = (await firstEvent).value;
  received = true;
  await appending;
  await feed.return(undefined);
  assert.equal(first.event, 'append');
  assert.ok(first.data.message.content.startsWith('tick '), JSON.stringify(first));
  await c.append('followed', { role: 'user', content: 'last' });
  // Resumed after the first event: every later append comes, in order, up to the last.
  const seen = [];
  for await (const event of c.events('followed', { lastEventId: first.id })) {
    seen.push(event.data.message.content);
    if (seen.at(-1) === 'last') break;
  }
  const written = (await all(c.history('followed'))).map((m) => m.content);
  assert.deepEqual(seen, written.slice(written.indexOf(first.data.message.content) + 1));
  for await (const event of c.events(null, { lastEventId: 'not-an-id' })) {
    assert.equal(event.event, 'reset');
    break;
  }
});
