// The TypeScript half of the check that both clients store alike (run by
// crates/sessiondb-cli/tests/clients.rs between the two steps of the Python half,
// clients/python/tests/interop.py, against one server): reads what the Python half wrote
// (described in IN), then adds its own and describes it in OUT for the Python half to read.
//   node test/interop.mjs URL IN OUT
import assert from 'node:assert/strict';
import { readFileSync, writeFileSync } from 'node:fs';

import { createEvent } from '@google/adk';
import { AIMessage } from '@langchain/core/messages';

import { SessiondbSessionService } from '../dist/adk.js';
import { SessiondbSessionBinding, SessiondbSessionStore } from '../dist/claude-agent-sdk.js';
import { Client } from '../dist/index.js';
import { SessiondbChatMessageHistory } from '../dist/langchain.js';
import { SessiondbStore } from '../dist/langgraph.js';

const [url, given, out] = process.argv.slice(2);
const written = JSON.parse(readFileSync(given, 'utf8'));
const client = new Client({ baseUrl: url });
const prefix = 'interop:';
const key = { projectKey: written.key.project_key, sessionId: written.key.session_id };

// A Claude transcript written from Python loads and lists the same.
const store = new SessiondbSessionStore({ client, prefix });
assert.deepEqual(await store.load(key), written.transcript);
assert.deepEqual((await store.listSessions(key.projectKey)).map((s) => s.sessionId), [key.sessionId]);
const binding = new SessiondbSessionBinding({ client, prefix });
assert.equal(await binding.sessionId('chat-42'), written.binding);

// LangGraph store items written from Python read the same, creation times included.
const items = new SessiondbStore({ client, prefix });
for (const item of written.items) {
  const got = await items.get(item.namespace, item.key);
  assert.deepEqual(got.value, item.value);
  assert.equal(got.createdAt.getTime(), Date.parse(item.createdAt));
}
assert.deepEqual(await items.listNamespaces(), [['memories'], ...written.items.map((i) => i.namespace)].sort((a, b) => a.join(':').localeCompare(b.join(':'))));
assert.equal((await items.search(['users'])).length, 2);

// Memories embedded in Python rank the same here, from the vectors stored with them (only the
// query is embedded, by the same stand-in model).
const embed = (t) => [...'aeiou'].map((v) => t.split(v).length - 1).concat(t.length);
const embeddings = { embedDocuments: async (texts) => texts.map(embed), embedQuery: async (text) => embed(text) };
const memories = new SessiondbStore({ client, prefix, index: { dims: 6, embeddings, fields: ['text'] } });
const ranked = (await memories.search(['memories'], { query: written.query })).map((i) => [i.key, i.score]);
assert.deepEqual(ranked.map(([k]) => k), written.ranked.map(([k]) => k));
ranked.forEach(([, score], i) => assert.ok(Math.abs(score - written.ranked[i][1]) < 1e-12, `${score} ${written.ranked[i][1]}`));

// A LangChain history written from Python reads as the same messages, tool call included.
const chat = new SessiondbChatMessageHistory({ client, sessionId: `${prefix}langchain` });
const messages = await chat.getMessages();
assert.deepEqual(messages.map((m) => [m.getType(), m.content, m.id]), [['human', 'Weather in Rome?', 'h1'], ['ai', '', undefined], ['tool', 'sunny', undefined]]);
assert.deepEqual(messages[1].tool_calls, [{ name: 'weather', args: { city: 'Rome' }, id: 'call_1', type: 'tool_call' }]);
assert.deepEqual(messages[1].usage_metadata, { input_tokens: 3, output_tokens: 2, total_tokens: 5 });
assert.equal(messages[2].tool_call_id, 'call_1');

// An ADK session written from Python reads as the same events and state: timestamps in
// milliseconds here, the function call's arguments as they were.
const adk = new SessiondbSessionService(client);
const adkKey = { appName: `${prefix}adk`, userId: 'ann', sessionId: 's' };
const session = await adk.getSession(adkKey);
assert.deepEqual(
  session.events.map((e) => [e.id, e.invocationId, e.author, e.timestamp, e.content]),
  [
    ['ev1', 'inv1', 'user', 1796000000500, { role: 'user', parts: [{ text: 'Weather in Rome?' }] }],
    ['ev2', 'inv1', 'helper', 1796000001250, { role: 'model', parts: [{ functionCall: { id: 'call_1', name: 'weather', args: { city: 'Rome' } } }] }],
  ],
);
assert.deepEqual(session.events[1].actions.stateDelta, { asked: 'Rome', 'user:city': 'Rome' });
assert.deepEqual(session.state, { lang: 'en', asked: 'Rome', 'user:city': 'Rome' });

// Then this side writes, for the Python half to read.
await chat.addMessage(new AIMessage({ content: 'Sunny in Rome.', id: 'a2' }));
const entries = [{ type: 'user', uuid: 'e3', parentUuid: 'e2', timestamp: '2026-12-04T10:01:00.000Z', message: { role: 'user', content: 'And for search?' } }];
await store.append(key, entries);
const summaries = await store.listSessionSummaries(key.projectKey);
assert.deepEqual(summaries.map((s) => s.sessionId), [key.sessionId], 'refolded from the whole transcript');
const added = [{ namespace: ['users', 'bob'], key: 'from-typescript', value: { by: 'typescript' } }];
for (const item of added) await items.put(item.namespace, item.key, item.value);
const answer = createEvent({ invocationId: 'inv1', author: 'helper', content: { role: 'model', parts: [{ text: 'Sunny in Rome.' }] }, actions: { stateDelta: { answered: true } } });
await adk.appendEvent({ session, event: answer });
writeFileSync(out, JSON.stringify({ entries, binding: await binding.sessionId('chat-7'), items: added, adk: { id: answer.id, timestamp: answer.timestamp } }));
