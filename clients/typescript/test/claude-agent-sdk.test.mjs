// The Claude Agent SDK session store on a real server: the store contract the SDK documents,
// checked case by case, and the SDK's own store helpers (@anthropic-ai/claude-agent-sdk from npm)
// over a transcript as Claude Code writes it.
import assert from 'node:assert/strict';
import { randomUUID } from 'node:crypto';
import { mkdirSync, mkdtempSync, realpathSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { test } from 'node:test';

import * as claude from '@anthropic-ai/claude-agent-sdk';

import { SessiondbSessionBinding, SessiondbSessionStore } from '../dist/claude-agent-sdk.js';
import { sharedServer } from './served.mjs';

const SESSION = '4f1c2a9e-7b3d-4c5e-9a8b-1d2e3f4a5b6c';
const KEY = { projectKey: 'proj', sessionId: 'sess' };
const e = (fields) => ({ type: 'x', ...fields });

const shared = sharedServer();
let stores = 0;

/** A store of its own (a fresh prefix), as each contract wants. */
const fresh = () => new SessiondbSessionStore({ client: shared.client, prefix: `store-${++stores}:` });

test('append then load gives the entries back in order; unknown keys load null', async () => {
  let store = fresh();
  await store.append(KEY, [e({ uuid: 'b', n: 1 }), e({ uuid: 'a', n: 2 })]);
  assert.deepEqual(await store.load(KEY), [e({ uuid: 'b', n: 1 }), e({ uuid: 'a', n: 2 })]);
  assert.equal(await store.load({ projectKey: 'proj', sessionId: 'nope' }), null);
  assert.equal(await store.load({ ...KEY, subpath: 'nope' }), null);

  store = fresh();
  await store.append(KEY, [e({ uuid: 'z', n: 1 })]);
  await store.append(KEY, [e({ uuid: 'a', n: 2 }), e({ uuid: 'm', n: 3 })]);
  await store.append(KEY, []);
  await store.append(KEY, [e({ uuid: 'b', n: 4 }), e({ n: 5 }), e({ n: 5 })]);
  await store.append(KEY, [e({ uuid: 'a', n: 2 })]); // a retried entry is stored once
  assert.deepEqual(await store.load(KEY), [
    e({ uuid: 'z', n: 1 }), e({ uuid: 'a', n: 2 }), e({ uuid: 'm', n: 3 }), e({ uuid: 'b', n: 4 }), e({ n: 5 }), e({ n: 5 }),
  ]);
});

test('subpaths and projects are stored apart, and listings keep to them', async () => {
  const store = fresh();
  const sub1 = { ...KEY, subpath: 'subagents/agent-1' };
  const sub2 = { ...KEY, subpath: 'subagents/agent-2' };
  await store.append(KEY, [e({ uuid: 'm' })]);
  await store.append(sub1, [e({ uuid: 's1' })]);
  await store.append(sub2, [e({ uuid: 's2' })]);
  await store.append({ projectKey: 'proj', sessionId: 'other', subpath: 'subagents/agent-x' }, [e({ n: 1 })]);
  await store.append({ projectKey: 'other-proj', sessionId: 'sess' }, [e({ from: 'other' })]);
  assert.deepEqual(await store.load(KEY), [e({ uuid: 'm' })]);
  assert.deepEqual(await store.load(sub1), [e({ uuid: 's1' })]);
  assert.deepEqual(await store.load({ projectKey: 'other-proj', sessionId: 'sess' }), [e({ from: 'other' })]);
  const listed = await store.listSessions('proj');
  assert.deepEqual(listed.map((s) => s.sessionId), ['sess'], 'subagent transcripts are not sessions');
  assert.ok(listed.every((s) => Number.isInteger(s.mtime) && s.mtime > 1e12), 'mtime is epoch milliseconds');
  assert.deepEqual(await store.listSessions('never-appended'), []);
  assert.deepEqual((await store.listSubkeys(KEY)).sort(), ['subagents/agent-1', 'subagents/agent-2']);
  assert.deepEqual(await store.listSubkeys({ projectKey: 'proj', sessionId: 'never' }), []);

  await store.delete(sub1);
  assert.equal(await store.load(sub1), null);
  assert.deepEqual(await store.listSubkeys(KEY), ['subagents/agent-2']);
  await store.delete(KEY);
  assert.equal(await store.load(KEY), null);
  assert.equal(await store.load(sub2), null, 'deleting a transcript deletes its subagents');
  assert.deepEqual(await store.listSubkeys(KEY), []);
  assert.deepEqual(await store.listSessions('proj'), []);
  assert.equal((await store.load({ projectKey: 'proj', sessionId: 'other', subpath: 'subagents/agent-x' })).length, 1);
  assert.equal((await store.load({ projectKey: 'other-proj', sessionId: 'sess' })).length, 1);
  await store.delete({ projectKey: 'proj', sessionId: 'never-written' });
});

test('keys that would collide or overflow an id stay apart', async () => {
  const store = fresh();
  const keys = [
    { projectKey: '-' + 'very-long-path-'.repeat(20), sessionId: SESSION },
    { projectKey: 'a/b', sessionId: 'c' },
    { projectKey: 'a', sessionId: 'b/c' },
    { projectKey: 'a', sessionId: 'b', subpath: 'c' },
    { projectKey: "it's", sessionId: '(odd)!*' },
  ];
  for (const [n, key] of keys.entries()) await store.append(key, [e({ uuid: `u${n}`, n })]);
  for (const [n, key] of keys.entries()) assert.deepEqual(await store.load(key), [e({ uuid: `u${n}`, n })]);
  assert.deepEqual((await store.listSessions(keys[0].projectKey)).map((s) => s.sessionId), [SESSION]);
  assert.deepEqual((await store.listSessions('a')).map((s) => s.sessionId), ['b/c']);
  // The same id as the Python client derives for this key (urllib.parse.quote, safe="").
  assert.equal((await shared.client.getSession(`${store.prefix}it%27s/%28odd%29%21%2A`)).userId, `${store.prefix}it's`);
});

test('summaries list in one call and stay true when appends interleave', async () => {
  const first = fresh();
  const second = new SessiondbSessionStore({ client: shared.client, prefix: first.prefix }); // another process
  const key = { projectKey: '-repo', sessionId: SESSION };
  const entries = transcript('/repo');
  const expected = async (upto) => {
    const { updatedAt } = await shared.client.getSession(`${first.prefix}-repo/${SESSION}`);
    return [{ ...claude.foldSessionSummary(undefined, key, entries.slice(0, upto)), mtime: updatedAt }];
  };
  await first.append(key, entries.slice(0, 2));
  assert.deepEqual(await first.listSessionSummaries('-repo'), await expected(2));
  await second.append(key, entries.slice(2, 3)); // folds onto what the first stored
  assert.deepEqual(await second.listSessionSummaries('-repo'), await expected(3));
  await first.append(key, entries.slice(3, 4)); // its own last summary is stale: folds it all
  assert.deepEqual(await second.listSessionSummaries('-repo'), await expected(4));
  await second.append(key, entries.slice(2, 5)); // a retried batch, partly stored before
  assert.deepEqual(await first.listSessionSummaries('-repo'), await expected(5));
  // A summary an append left behind (here: one written without the fold) is not listed; the SDK
  // then loads that session.
  await shared.client.appendBatch(`${first.prefix}-repo/${SESSION}`, [{ role: 'user', content: 'typed elsewhere' }]);
  assert.deepEqual(await first.listSessionSummaries('-repo'), []);
  assert.deepEqual((await first.listSessions('-repo')).map((s) => s.sessionId), [SESSION]);
  await first.append({ ...key, subpath: 'subagents/agent-1' }, [e({ uuid: 's1' })]);
  assert.deepEqual(await first.listSessionSummaries('-repo'), []);
  assert.deepEqual(await first.listSessionSummaries('-elsewhere'), []);
});

test('bindings give every process one session id per conversation', async () => {
  const prefix = `binding-${++stores}:`;
  const bindings = Array.from({ length: 8 }, () => new SessiondbSessionBinding({ client: shared.client, prefix }));
  const sessions = [];
  for (const conversation of ['chat-1', 'chat-2', 'tab\there', 'x'.repeat(300)]) {
    // Eight processes binding one conversation at once agree on its session.
    const bound = new Set(await Promise.all(bindings.map((b) => b.sessionId(conversation))));
    assert.equal(bound.size, 1, conversation);
    sessions.push(...bound);
  }
  assert.equal(new Set(sessions).size, 4);
  assert.ok(sessions.every((s) => /^[0-9a-f-]{36}$/.test(s)));
  assert.equal(await bindings[0].sessionId('chat-1'), sessions[0]);
  assert.equal(await bindings[0].sessionId(SESSION), SESSION, 'a UUID is its own id');
  // Stored where the Python client looks: chat-1's SHA-256 begins with ea.
  assert.equal((await shared.client.getMessage(`${prefix}claude-bindings/ea`, 'chat-1')).content, sessions[0]);
  const fork = randomUUID(); // rebinding (to a fork, say) moves every process to it
  await bindings[1].rebind('chat-1', fork);
  assert.equal(await bindings[2].sessionId('chat-1'), fork);
  await assert.rejects(bindings[0].rebind('chat-1', 'not-a-uuid'), TypeError);
  await assert.rejects(bindings[0].rebind(SESSION, fork), TypeError);
  await assert.rejects(bindings[0].sessionId(''), TypeError);
});

function transcript(cwd) {
  const common = { isSidechain: false, userType: 'external', cwd, sessionId: SESSION, version: '2.0.14', gitBranch: 'main' };
  const usage = { input_tokens: 120, output_tokens: 40 };
  const uuid = (n) => `11111111-0000-4000-8000-00000000000${n}`;
  return [
    { ...common, parentUuid: null, type: 'user', uuid: uuid(1), timestamp: '2026-12-01T10:00:00.000Z',
      message: { role: 'user', content: 'Why does the tokenizer test fail?' } },
    { ...common, parentUuid: uuid(1), type: 'assistant', uuid: uuid(2), timestamp: '2026-12-01T10:00:03.000Z', requestId: 'req_1',
      message: { id: 'msg_01', type: 'message', role: 'assistant', model: 'claude-sonnet-4-5', stop_reason: 'tool_use', usage,
                 content: [{ type: 'thinking', thinking: 'Read the test first.', signature: 'c2ln' },
                           { type: 'tool_use', id: 'toolu_01', name: 'Read', input: { file_path: `${cwd}/tests/tokenizer.rs` } }] } },
    { ...common, parentUuid: uuid(2), type: 'user', uuid: uuid(3), timestamp: '2026-12-01T10:00:04.000Z',
      message: { role: 'user', content: [{ type: 'tool_result', tool_use_id: 'toolu_01', content: 'assert_eq!(tokens("naïve café"), 2);' }] } },
    { ...common, parentUuid: uuid(3), type: 'assistant', uuid: uuid(4), timestamp: '2026-12-01T10:00:09.000Z', requestId: 'req_2',
      message: { id: 'msg_02', type: 'message', role: 'assistant', model: 'claude-sonnet-4-5', stop_reason: 'end_turn', usage,
                 content: [{ type: 'text', text: 'The splitter counts the combining diaeresis as a word.' }] } },
    { type: 'custom-title', customTitle: 'Tokenizer diaeresis', sessionId: SESSION },
  ];
}

test("the SDK's store helpers read what the CLI wrote", async () => {
  const config = mkdtempSync(join(tmpdir(), 'claude-config-'));
  const cwd = realpathSync(mkdtempSync(join(tmpdir(), 'claude-project-')));
  const previous = process.env.CLAUDE_CONFIG_DIR;
  process.env.CLAUDE_CONFIG_DIR = config;
  try {
    const project = join(config, 'projects', cwd.replace(/[^a-zA-Z0-9]/g, '-'));
    mkdirSync(project, { recursive: true });
    writeFileSync(join(project, `${SESSION}.jsonl`), transcript(cwd).map((x) => JSON.stringify(x) + '\n').join(''));
    const local = await claude.getSessionMessages(SESSION, { dir: cwd });
    assert.equal(local.length, 4);

    const sessionStore = fresh();
    await claude.importSessionToStore(SESSION, sessionStore, { dir: cwd });
    assert.deepEqual(await claude.getSessionMessages(SESSION, { dir: cwd, sessionStore }), local);
    // Listed from the stored summaries alone: no transcript is loaded.
    const listWithoutLoading = async () => {
      const load = sessionStore.load;
      sessionStore.load = () => assert.fail('a transcript was loaded to list sessions');
      try {
        return await claude.listSessions({ dir: cwd, sessionStore });
      } finally {
        sessionStore.load = load;
      }
    };
    const listed = await listWithoutLoading();
    assert.deepEqual(listed.map((s) => [s.sessionId, s.customTitle]), [[SESSION, 'Tokenizer diaeresis']]);

    await claude.renameSession(SESSION, 'Renamed', { dir: cwd, sessionStore });
    assert.equal((await claude.getSessionInfo(SESSION, { dir: cwd, sessionStore })).customTitle, 'Renamed');
    assert.deepEqual((await listWithoutLoading()).map((s) => s.customTitle), ['Renamed']);

    const fork = await claude.forkSession(SESSION, { dir: cwd, sessionStore, upToMessageId: '11111111-0000-4000-8000-000000000002' });
    const forked = await claude.getSessionMessages(fork.sessionId, { dir: cwd, sessionStore });
    assert.equal(forked.length, 2);
    assert.deepEqual(forked[0].message, local[0].message);

    await claude.deleteSession(SESSION, { dir: cwd, sessionStore });
    assert.deepEqual((await claude.listSessions({ dir: cwd, sessionStore })).map((s) => s.sessionId), [fork.sessionId]);

    const hits = await shared.client.search(`${sessionStore.prefix}${project.split('/').pop()}/${fork.sessionId}`, 'tokenizer');
    assert.equal(hits.length, 1, 'a transcript is a searchable conversation');
  } finally {
    if (previous === undefined) delete process.env.CLAUDE_CONFIG_DIR;
    else process.env.CLAUDE_CONFIG_DIR = previous;
    rmSync(config, { recursive: true, force: true });
    rmSync(cwd, { recursive: true, force: true });
  }
});
