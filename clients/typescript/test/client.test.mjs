// The HTTP client against a real server.
import assert from 'node:assert/strict';
import { readFileSync } from 'node:fs';
import { createServer } from 'node:net';
import { fileURLToPath } from 'node:url';
import { test } from 'node:test';

import { Client, CopyConflict, REMEMBERED, SessiondbError, SessiondbUnavailable, rememberId } from '../dist/index.js';
import { all, serve, sharedServer } from './served.mjs';

const shared = sharedServer();

async function rejectsWith(promise, status, code) {
  await assert.rejects(promise, (error) => {
    assert.ok(error instanceof SessiondbError, `${error}`);
    assert.equal(error.status, status);
    assert.equal(error.code, code);
    return true;
  });
}

test('messages round trip and page', async () => {
  const first = await shared.client.append('pages', { role: 'user', content: 'hello there' });
  assert.equal(first.inserted, true);
  const again = await shared.client.append('pages', { id: first.message.id, role: 'user', content: 'x' });
  assert.equal(again.inserted, false, 'an existing id is not appended twice');
  await shared.client.appendBatch('pages', [0, 1, 2, 3, 4].map((i) => ({ role: 'assistant', content: `reply ${i}` })));
  const page = await shared.client.messages('pages', { limit: 4 });
  assert.deepEqual(page.items.map((m) => m.content), ['hello there', 'reply 0', 'reply 1', 'reply 2']);
  const rest = await shared.client.messages('pages', { limit: 4, after: page.nextCursor });
  assert.deepEqual(rest.items.map((m) => m.content), ['reply 3', 'reply 4']);
  const newest = await all(shared.client.history('pages', { order: 'newest' }));
  assert.deepEqual(newest.map((m) => m.content), ['reply 4', 'reply 3', 'reply 2', 'reply 1', 'reply 0', 'hello there']);
  assert.equal((await shared.client.getMessage('pages', first.message.id)).content, 'hello there');
  assert.equal((await shared.client.getSession('pages')).messageCount, 6);
});

test('history streams long conversations and stops early', async () => {
  const text = 'ü'.repeat(3000); // multi-byte characters across the stream's chunks
  await shared.client.appendBatch('long', Array.from({ length: 300 }, (_, i) => ({ role: 'user', content: `${i} ${text}` })));
  const read = await all(shared.client.history('long'));
  assert.equal(read.length, 300);
  assert.ok(read.every((m, i) => m.content === `${i} ${text}`));
  let taken = 0;
  for await (const m of shared.client.history('long', { order: 'newest' })) {
    assert.equal(m.content, `${299 - taken} ${text}`);
    if (++taken === 3) break;
  }
  assert.equal((await shared.client.getSession('long')).messageCount, 300, 'the server still answers');
});

test('import of an export and deletes of many', async () => {
  const c = shared.client;
  await c.append('orig', { id: 'a', role: 'user', content: 'first' });
  await c.append('orig', { id: 'b', role: 'assistant', content: 'second' });
  await c.append('orig', { id: 'c', role: 'assistant', content: 'other' }, { parent: 'a' });
  await c.putState('orig', 'k', [1]);
  assert.deepEqual(await c.importLines('copy', c.export('orig')), { imported: 4, skipped: 0 });
  const [copied, original] = [await all(c.export('copy')), await all(c.export('orig'))];
  assert.deepEqual([copied[0].session.id, original[0].session.id], ['copy', 'orig']);
  copied[0].session.id = 'orig';
  assert.deepEqual(copied, original, "the copy has the original's lines, its record included");
  assert.deepEqual(await c.importLines('copy', c.export('orig')), { imported: 1, skipped: 3 });
  const invalid = [{ message: { id: 'x', role: 'user', content: 'x' } }, { message: { role: '' } }];
  await rejectsWith(c.importLines('copy2', invalid), 400, 'invalid_request');
  assert.deepEqual((await c.messages('copy2')).items, []);
  assert.equal(await c.deleteMessages('copy', ['b', 'c', 'missing']), 2);
  assert.deepEqual((await all(c.history('copy'))).map((m) => m.id), ['a']);
});

test('a copy writes what the session lacks of a conversation, and refuses anything else', async () => {
  const c = shared.client;
  const chat = [
    { role: 'user', content: 'hi' },
    { id: 'given', role: 'assistant', content: 'hello' },
    { role: 'user', content: 'and then?' },
  ];
  // As the adapters compare: by what a message says, whatever its id.
  const copy = (sessionId, messages, record) =>
    c.copyConversation(sessionId, messages, (stored, i) => stored.role === messages[i].role && stored.content === messages[i].content, record);
  const ids = async (sessionId) => (await c.storedHistory(sessionId)).map((m) => m.id);

  assert.equal(await copy('cc-fresh', []), false);
  assert.equal(await copy('cc-fresh', chat.slice(0, 2), { name: 'moved' }), true);
  const first = await ids('cc-fresh');
  assert.match(first[0], /^msg_/);
  assert.equal(first[1], 'given');
  assert.equal((await c.getSession('cc-fresh')).name, 'moved');
  let { version } = await c.getSession('cc-fresh');
  assert.equal(await copy('cc-fresh', chat.slice(0, 2)), false, 'the same again');
  assert.equal(await copy('cc-fresh', chat.slice(0, 1)), false, 'a conversation the session holds more of');
  assert.equal((await c.getSession('cc-fresh')).version, version);
  // The conversation went on: only what came since is written, under the copied leaf.
  assert.equal(await copy('cc-fresh', chat), true);
  assert.deepEqual((await ids('cc-fresh')).slice(0, 2), first);
  assert.deepEqual((await c.storedHistory('cc-fresh')).map((m) => m.content), ['hi', 'hello', 'and then?']);
  ({ version } = await c.getSession('cc-fresh'));
  for (const other of [[{ role: 'user', content: 'hello?' }, ...chat.slice(1)], [...chat.slice(0, 2), { role: 'user', content: 'or else?' }]]) {
    const refused = await copy('cc-fresh', other).catch((error) => error);
    assert.ok(refused instanceof CopyConflict && !refused.wroteBefore, String(refused));
  }
  assert.equal((await c.getSession('cc-fresh')).version, version);
  // A session that exists without messages takes them; a bad message fails the whole copy.
  await c.createSession({ id: 'cc-made' });
  assert.equal(await copy('cc-made', chat.slice(0, 1)), true);
  await rejectsWith(copy('cc-made', [chat[0], { role: '' }]), 400, 'invalid_request');
  await rejectsWith(copy('cc-refused', [chat[0], { role: '' }]), 400, 'invalid_request');
  assert.deepEqual((await c.storedHistory('cc-made')).map((m) => m.content), ['hi']);
  await rejectsWith(c.getSession('cc-refused'), 404, 'not_found');
});

test('a conversation longer than a request is copied in several writes', async () => {
  const served = await serve('--max-body-bytes', '65536');
  const c = new Client({ baseUrl: served.url });
  try {
    const chat = Array.from({ length: 100 }, (_, i) => ({ role: i % 2 ? 'assistant' : 'user', content: `${i}: ${'x'.repeat(2000)}` }));
    const copy = (sessionId, messages, options) =>
      c.copyConversation(sessionId, messages, (stored, i) => stored.content === messages[i].content, { name: 'long' }, options);
    const contents = async (sessionId) => (await c.storedHistory(sessionId)).map((m) => m.content);
    // About 120 KB: refused whole as too large, then taken in halves.
    assert.equal(await copy('long', chat.slice(0, 60), { alsoLines: [{ state: { key: 'k', value: 1 } }] }), true);
    const first = await c.storedHistory('long');
    assert.deepEqual(first.map((m) => m.content), chat.slice(0, 60).map((m) => m.content));
    assert.equal((await c.getSession('long')).name, 'long');
    assert.equal(await c.getState('long', 'k'), 1);
    assert.equal(await copy('long', chat.slice(0, 60)), false);
    // The rest of a conversation that went on, again in parts, under the copied leaf.
    assert.equal(await copy('long', chat), true);
    const after = await c.storedHistory('long');
    assert.deepEqual(after.slice(0, 60).map((m) => m.id), first.map((m) => m.id));
    assert.deepEqual(after.map((m) => m.content), chat.map((m) => m.content));
    // Another writer between two parts: the copy stops there, and says the parts stay.
    const firstMet = c.importFirstMet;
    c.importFirstMet = async function (sessionId, ...rest) {
      const met = await firstMet.call(this, sessionId, ...rest);
      if (sessionId === 'raced' && !(await c.storedHistory('raced')).some((m) => m.content === 'meanwhile')) {
        await c.append('raced', { role: 'user', content: 'meanwhile' });
      }
      return met;
    };
    const raced = await copy('raced', chat).catch((error) => error);
    c.importFirstMet = firstMet;
    assert.ok(raced instanceof CopyConflict && raced.wroteBefore, String(raced));
    assert.match(raced.message, /the messages it wrote before stay/);
    const stored = await contents('raced');
    assert.ok(stored.length > 1 && stored.length < chat.length, `${stored.length} messages`);
    assert.deepEqual(stored, [...chat.slice(0, stored.length - 1).map((m) => m.content), 'meanwhile']);
    // A message over the limit is refused as too large, after the writes before it.
    await rejectsWith(copy('alone', [chat[0], { role: 'user', content: 'y'.repeat(70_000) }]), 413, 'payload_too_large');
    assert.deepEqual(await contents('alone'), [chat[0].content]);
  } finally {
    c.close();
    await served.stop();
  }
});

test('writes conditioned on the leaf', async () => {
  const c = shared.client;
  await rejectsWith(c.append('cond', { id: 'a', role: 'user', content: 'x' }, { ifLeaf: null }), 404, 'not_found');
  await c.createSession({ id: 'cond' });
  await c.append('cond', { id: 'a', role: 'user', content: 'x' }, { ifLeaf: null });
  await c.appendBatch('cond', [{ id: 'b', role: 'assistant', content: 'y' }], { ifLeaf: 'a' });
  const state = [{ state: { key: 'k', value: 1 } }];
  await rejectsWith(c.append('cond', { id: 'c', role: 'user', content: 'z' }, { ifLeaf: 'a' }), 409, 'conflict');
  await rejectsWith(c.appendBatch('cond', [{ id: 'c', role: 'user', content: 'z' }], { ifLeaf: null }), 409, 'conflict');
  await rejectsWith(c.importLines('cond', state, { ifLeaf: 'a' }), 409, 'conflict');
  assert.deepEqual((await all(c.history('cond'))).map((m) => m.id), ['a', 'b']);
  assert.deepEqual(await c.allState('cond'), {});
  await c.importLines('cond', state, { ifLeaf: 'b' });
  assert.deepEqual(await c.allState('cond'), { k: 1 });
  // Several sessions in one write: all parts, or none when one is refused.
  const other = { sessionId: 'cond-other', lines: [{ state: { key: 'n', value: 2 } }] };
  await rejectsWith(c.importTogether([other, { sessionId: 'cond', ifLeaf: 'a', lines: state }]), 409, 'conflict');
  assert.deepEqual(await c.allState('cond-other'), {});
  const reply = { message: { id: 'c', role: 'user', content: 'z' }, parentId: 'b' };
  const together = await c.importTogether([other, { sessionId: 'cond', ifLeaf: 'b', lines: [reply] }]);
  assert.deepEqual(together, {
    imported: 2,
    skipped: 0,
    parts: [
      { sessionId: 'cond-other', imported: 1, skipped: 0, version: (await c.getSession('cond-other')).version },
      { sessionId: 'cond', imported: 1, skipped: 0, version: (await c.getSession('cond')).version },
    ],
  });
  assert.deepEqual(await c.allState('cond-other'), { n: 2 });
  assert.equal((await c.getSession('cond')).leafId, 'c');
  // Or its session still at a version: each part answers the version it left.
  const at = together.parts[1].version;
  const part = { sessionId: 'cond', ifVersion: at, lines: [{ state: { key: 'k', value: 4 } }] };
  assert.ok((await c.importTogether([part])).parts[0].version > at);
  await rejectsWith(c.importTogether([part]), 409, 'conflict');
  assert.equal(await c.getState('cond', 'k'), 4);
  // A part may instead require its session not to exist yet.
  const fresh = { sessionId: 'cond-new', ifAbsent: true, lines: [{ session: { name: 'fresh' } }] };
  await c.importTogether([fresh]);
  assert.equal((await c.getSession('cond-new')).name, 'fresh');
  await rejectsWith(c.importTogether([fresh]), 409, 'conflict');
});

test('versions tag reads and condition appends', async () => {
  const c = shared.client;
  assert.deepEqual(await c.versionedHistory('vers'), { version: 0, messages: [] });
  await rejectsWith(c.append('vers', { id: 'a', role: 'user', content: 'x' }, { ifVersion: 1 }), 404, 'not_found');
  const first = await c.append('vers', { id: 'a', role: 'user', content: 'x' });
  assert.equal((await c.getSession('vers')).version, first.version);
  assert.deepEqual(await c.versionedHistory('vers'), { version: first.version, messages: [first.message] });
  assert.equal(await c.versionedHistory('vers', { unlessVersion: first.version }), null);
  const second = await c.append('vers', { id: 'b', role: 'user', content: 'y' }, { ifVersion: first.version });
  assert.ok(second.version > first.version);
  await rejectsWith(c.appendBatch('vers', [{ id: 'c', role: 'user', content: 'z' }], { ifVersion: first.version }), 409, 'conflict');
  const read = await c.versionedHistory('vers', { unlessVersion: first.version });
  assert.deepEqual([read.version, read.messages.map((m) => m.id)], [second.version, ['a', 'b']]);
});

test('branches, edits, deletes and search', async () => {
  const root = (await shared.client.append('tree', { role: 'user', content: 'which zebra is fastest' })).message;
  const a = (await shared.client.append('tree', { role: 'assistant', content: 'first answer' })).message;
  const b = (await shared.client.append('tree', { role: 'assistant', content: 'second answer' }, { parent: root.id })).message;
  assert.deepEqual((await all(shared.client.history('tree'))).map((m) => m.content), ['which zebra is fastest', 'second answer']);
  assert.deepEqual((await all(shared.client.history('tree', { leaf: a.id }))).map((m) => m.content), ['which zebra is fastest', 'first answer']);
  await shared.client.updateMessage('tree', b.id, { content: 'edited answer' });
  assert.equal((await shared.client.getMessage('tree', b.id)).content, 'edited answer');
  assert.deepEqual((await shared.client.search('tree', 'zebra')).map((h) => h.id), [root.id]);
  const [hit] = await shared.client.search('tree', 'zebras', { snippetWords: 2 });
  assert.deepEqual([hit.sessionId, hit.content, hit.snippet], ['tree', 'which zebra is fastest', ['…', 'zebra', ' is…']]);
  assert.deepEqual(await shared.client.search('tree', 'which horse'), []);
  assert.deepEqual((await shared.client.search('tree', 'which horse', { match: 'any' })).map((h) => h.id), [root.id]);
  await shared.client.deleteMessage('tree', b.id);
  await rejectsWith(shared.client.getMessage('tree', b.id), 404, 'not_found');
  await shared.client.append('tree', { role: 'user', content: 'another root' }, { parent: null });
  assert.deepEqual((await all(shared.client.history('tree'))).map((m) => m.content), ['another root']);
  await shared.client.clear('tree');
  assert.deepEqual(await all(shared.client.history('tree')), []);
});

test('branches, export and whole-message replacement', async () => {
  const root = (await shared.client.append('tree2', { id: 'q', role: 'user', content: 'question' })).message;
  await shared.client.append('tree2', { id: 'r1', role: 'assistant', content: 'one' });
  await shared.client.append('tree2', { id: 'r2', role: 'assistant', content: 'two' }, { parent: root.id });
  assert.deepEqual((await shared.client.branches('tree2', 'q')).map((m) => m.id), ['r1', 'r2']);
  assert.deepEqual((await shared.client.rows('tree2')).map((r) => [r.id, r.role]), [['q', 'user'], ['r2', 'assistant']]);
  const toFirst = await shared.client.rows('tree2', { leaf: 'r1' });
  assert.deepEqual(toFirst.map((r) => r.id), ['q', 'r1']);
  assert.equal(toFirst[1].bytes, '{"id":"r1","role":"assistant","content":"one"}'.length);
  await shared.client.putState('tree2', 'k', 1);
  const lines = await all(shared.client.export('tree2'));
  assert.deepEqual(lines.filter((l) => l.message).map((l) => [l.message.id, l.parentId]), [['q', null], ['r1', 'q'], ['r2', 'q']]);
  assert.deepEqual(lines.filter((l) => l.state).map((l) => l.state), [{ key: 'k', value: 1 }]);
  await shared.client.replaceMessage('tree2', 'r1', { role: 'assistant', content: 'one, again' });
  assert.equal((await shared.client.getMessage('tree2', 'r1')).content, 'one, again');
  await rejectsWith(shared.client.replaceMessage('tree2', 'nope', { role: 'user', content: 'x' }), 404, 'not_found');
  await shared.client.replaceMessage('tree2', 'nope', { role: 'user', content: 'x' }, { upsert: true });
  assert.equal((await shared.client.getMessage('tree2', 'nope')).content, 'x');
});

test('identifiers are single path segments', async () => {
  // fetch's URL parser resolves dot segments: on it those two ids are refused, unsent.
  const dots = ['.', '..'];
  const sendable = shared.client.transportKind === 'node' ? dots : [];
  for (const sid of ['a/b', 'what?x=1', '100% sure', '日本語 ✓', ...sendable, '...', '#frag', "it's (odd)!*"]) {
    await shared.client.append(sid, { role: 'user', content: sid });
    assert.equal((await shared.client.getSession(sid)).id, sid);
    assert.deepEqual((await all(shared.client.history(sid))).map((m) => m.content), [sid]);
    await shared.client.putState(sid, 'k/ey', { v: sid });
    assert.deepEqual(await shared.client.getState(sid, 'k/ey'), { v: sid });
  }
  // The dots are ids like any other (no URL parser resolves them on the way).
  assert.deepEqual(await all(shared.client.history('messages')), [], 'nothing reached a session the dots would name');
  if (sendable.length === 0) {
    for (const sid of dots) await rejectsWith(shared.client.getSession(sid), undefined, 'invalid_request');
  }
});

test('sessions, state and compaction', async () => {
  assert.equal((await shared.client.createSession({ id: 'listed-1', name: 'one', userId: 'ada' })).name, 'one');
  await rejectsWith(shared.client.createSession({ id: 'listed-1' }), 409, 'conflict');
  for (let i = 2; i <= 5; i++) await shared.client.createSession({ id: `listed-${i}`, userId: 'ada' });
  const listed = await all(shared.client.listSessions({ userId: 'ada', pageSize: 2 }));
  assert.deepEqual(listed.map((s) => s.id).sort(), ['listed-1', 'listed-2', 'listed-3', 'listed-4', 'listed-5']);
  assert.deepEqual((await shared.client.updateSession('listed-1', { metadata: { topic: 'x' } })).metadata, { topic: 'x' });

  await rejectsWith(shared.client.getState('listed-1', 'missing'), 404, 'not_found');
  await shared.client.putState('listed-1', 'plan', [1, { step: 'two' }]);
  await shared.client.putState('listed-1', 'nothing', null);
  assert.deepEqual(await shared.client.allState('listed-1'), { plan: [1, { step: 'two' }], nothing: null });
  await shared.client.deleteState('listed-1', 'plan');
  assert.deepEqual(await shared.client.allState('listed-1'), { nothing: null });

  const ids = [];
  for (let i = 0; i < 4; i++) ids.push((await shared.client.append('listed-1', { role: 'user', content: `turn ${i}` })).message.id);
  const added = await shared.client.addCompaction('listed-1', { summary: 'turns zero and one', fromMessageId: ids[0], toMessageId: ids[1] });
  assert.deepEqual(await shared.client.compactions('listed-1'), [added]);
  const shown = await all(shared.client.history('listed-1'));
  assert.deepEqual(shown.map((m) => m.content ?? m.parts[0].text), ['turns zero and one', 'turn 2', 'turn 3']);
  await shared.client.deleteSession('listed-1');
  await rejectsWith(shared.client.getSession('listed-1'), 404, 'not_found');
});

test('a user\'s sessions are deleted', async () => {
  for (let i = 0; i < 3; i++) await shared.client.createSession({ id: `erased-${i}`, userId: 'erased user' });
  await shared.client.createSession({ id: 'kept-0', userId: 'kept user' });
  assert.equal(await shared.client.deleteUserSessions('erased user'), 3);
  assert.deepEqual(await all(shared.client.listSessions({ userId: 'erased user' })), []);
  assert.deepEqual((await all(shared.client.listSessions({ userId: 'kept user' }))).map((s) => s.id), ['kept-0']);
  assert.equal(await shared.client.deleteUserSessions('erased user'), 0);
  await rejectsWith(shared.client.deleteUserSessions(''), 400, 'invalid_request');
});

test('errors are typed', async () => {
  await rejectsWith(shared.client.messages('any', { limit: 1000 }), 400, 'invalid_request');
  await assert.rejects(shared.client.append('any', { content: 'no role' }), (e) => e.code === 'invalid_request' && /role/.test(e.message));
  await rejectsWith(shared.client.append('x'.repeat(300), { role: 'user', content: 'id too long' }), 400, 'invalid_request');
});

test('an unreachable server is its own error', async () => {
  const port = await new Promise((resolve) => {
    const probe = createServer().listen(0, '127.0.0.1', () => {
      const { port } = probe.address();
      probe.close(() => resolve(port));
    });
  });
  await assert.rejects(new Client({ baseUrl: `http://127.0.0.1:${port}` }).getSession('x'), (e) => {
    assert.ok(e instanceof SessiondbUnavailable);
    assert.equal(e.code, 'unavailable');
    assert.equal(e.status, undefined);
    return true;
  });
});

test('a kept connection the server closed is not used again', async () => {
  const served = await serve('--request-head-timeout', '1s');
  try {
    const client = new Client({ baseUrl: served.url });
    await client.append('idle', { role: 'user', content: 'before' });
    // The server closes a connection that sends no request for 1 s.
    await new Promise((resolve) => setTimeout(resolve, 1500));
    // An append is never sent twice, so it must not go out on the closed connection.
    assert.equal((await client.append('idle', { role: 'user', content: 'after' })).inserted, true);
    assert.equal((await client.getSession('idle')).messageCount, 2);
    client.close();
  } finally {
    await served.stop();
  }
});

test('https with the certificates it is given to trust', async () => {
  const certs = new URL('../../../crates/sessiondb-server/tests/tls/', import.meta.url);
  const file = (name) => fileURLToPath(new URL(name, certs));
  const served = await serve('--tls-cert', file('first-cert.pem'), '--tls-key', file('first-key.pem'));
  try {
    assert.ok(served.url.startsWith('https://'), served.url);
    const untrusted = new Client({ baseUrl: served.url, timeoutMs: 5_000 });
    await assert.rejects(untrusted.getSession('tls'), (e) => e instanceof SessiondbUnavailable);
    untrusted.close();
    const client = new Client({ baseUrl: served.url, ca: readFileSync(file('first-cert.pem')), transport: 'node' });
    await client.append('tls', { role: 'user', content: 'over TLS' });
    assert.deepEqual((await all(client.history('tls'))).map((m) => m.content), ['over TLS']);
    client.close();
  } finally {
    await served.stop();
  }
});

test('api keys keep namespaces apart', async () => {
  const keyed = await serve('--api-key', 'k1=team-a', '--api-key', 'k2=team-b');
  try {
    const a = new Client({ baseUrl: keyed.url, apiKey: 'k1' });
    const b = new Client({ baseUrl: keyed.url, apiKey: 'k2' });
    await a.append('shared-name', { role: 'user', content: 'for team a' });
    assert.deepEqual(await all(b.history('shared-name')), [], 'a key never sees another namespace');
    await rejectsWith(new Client({ baseUrl: keyed.url }).getSession('shared-name'), 401, 'unauthorized');
    await rejectsWith(new Client({ baseUrl: keyed.url, apiKey: 'wrong' }).getSession('shared-name'), 401, 'unauthorized');
  } finally {
    await keyed.stop();
  }
});

test('what adapters remember to skip requests stays bounded', () => {
  const ids = new Set();
  for (let i = 0; i < REMEMBERED; i++) rememberId(ids, `id-${i}`);
  rememberId(ids, 'id-0');
  assert.equal(ids.size, REMEMBERED, 'an id remembered already is not a new entry');
  rememberId(ids, 'one more');
  assert.deepEqual([...ids], ['one more']);
});
