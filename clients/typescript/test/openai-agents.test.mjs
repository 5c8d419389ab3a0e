// The OpenAI Agents SDK session on a real server, with the real SDK (@openai/agents from npm) and
// a local stand-in for the model API.
import assert from 'node:assert/strict';
import { readFileSync, rmSync, writeFileSync } from 'node:fs';
import { dirname, join } from 'node:path';
import { test } from 'node:test';
import { fileURLToPath, pathToFileURL } from 'node:url';

import {
  Agent,
  MemorySession,
  OpenAIResponsesModel,
  run,
  setDefaultOpenAIClient,
  setOpenAIAPI,
  setTracingDisabled,
  tool,
} from '@openai/agents';
import OpenAI from 'openai';
import { z } from 'zod';

import { Client, SessiondbError } from '../dist/index.js';
import { SessiondbSession, copySession } from '../dist/openai-agents.js';
import { fakeResponses } from './fake-openai.mjs';
import { all, sharedServer } from './served.mjs';

setTracingDisabled(true);

// Items of every kind the SDK keeps in a session, in the shapes it produces them.
const ITEMS = [
  { role: 'user', content: 'What is the weather in Paris?' },
  { type: 'message', role: 'user', content: [{ type: 'input_text', text: 'and in Rome?' }] },
  { type: 'reasoning', id: 'rs_1', content: [{ type: 'input_text', text: 'look it up' }] },
  { type: 'function_call', id: 'fc_1', callId: 'call_1', name: 'weather', arguments: '{"city":"Paris"}', status: 'completed' },
  { type: 'function_call_result', name: 'weather', callId: 'call_1', status: 'completed', output: { type: 'text', text: 'sunny, 21 °C' } },
  { type: 'message', id: 'msg_1', role: 'assistant', status: 'completed', content: [{ type: 'output_text', text: 'Sunny in Paris 🌞' }] },
  { role: 'system', content: 'be brief' },
];

const shared = sharedServer();

test('items round trip exactly', async () => {
  const session = new SessiondbSession({ client: shared.client, sessionId: 'round-trip' });
  assert.equal(await session.getSessionId(), 'round-trip');
  await session.addItems(ITEMS.slice(0, 3));
  await session.addItems(ITEMS.slice(3));
  assert.deepEqual(await session.getItems(), ITEMS);
  assert.deepEqual(await session.getItems(2), ITEMS.slice(-2));
  assert.deepEqual(await session.getItems(100), ITEMS);
  assert.deepEqual(await session.getItems(0), []);
  assert.deepEqual(await new SessiondbSession({ client: shared.client, sessionId: 'round-trip', limit: 3 }).getItems(), ITEMS.slice(-3));
});

test('stored messages are ordinary messages', async () => {
  await new SessiondbSession({ client: shared.client, sessionId: 'stored' }).addItems(ITEMS);
  const stored = await all(shared.client.history('stored'));
  assert.deepEqual(stored.map((m) => m.role), ['user', 'user', 'assistant', 'assistant', 'tool', 'assistant', 'system']);
  assert.equal(stored[0].content, 'What is the weather in Paris?');
  assert.equal(stored[0].metadata, undefined, 'a plain message item needs nothing extra');
  assert.deepEqual(stored[5].metadata, { openaiItem: { type: 'message', id: 'msg_1', status: 'completed' } });
  assert.deepEqual(stored[3].metadata, { openaiItem: 'content' });
  assert.deepEqual((await shared.client.search('stored', 'weather')).map((h) => h.content), ['What is the weather in Paris?']);
});

test('pop and clear', async () => {
  const session = new SessiondbSession({ client: shared.client, sessionId: 'pop' });
  assert.equal(await session.popItem(), undefined);
  await session.addItems(ITEMS.slice(0, 4));
  assert.deepEqual(await session.popItem(), ITEMS[3]);
  assert.deepEqual(await session.popItem(), ITEMS[2]);
  assert.deepEqual(await session.getItems(), ITEMS.slice(0, 2));
  await session.addItems([ITEMS[4]]);
  assert.deepEqual(await session.getItems(), [...ITEMS.slice(0, 2), ITEMS[4]]);
  await session.clearSession();
  assert.deepEqual(await session.getItems(), []);
  assert.equal(await session.popItem(), undefined);
});

test("a read after the session's own write transfers nothing until another writer writes", async () => {
  const client = new Client({ baseUrl: shared.client.baseUrl });
  const statuses = [];
  const open = client.open.bind(client);
  client.open = async (method, ...rest) => {
    try {
      const answer = await open(method, ...rest);
      statuses.push(`${method} ${answer.status}`);
      return answer;
    } catch (error) {
      statuses.push(`${method} ${error.status}`);
      throw error;
    }
  };
  const session = new SessiondbSession({ client, sessionId: 'held' });
  await session.addItems(ITEMS.slice(0, 2));
  assert.deepEqual(await session.getItems(), ITEMS.slice(0, 2));
  await session.addItems(ITEMS.slice(2, 4));
  statuses.length = 0;
  const items = await session.getItems();
  assert.deepEqual(items, ITEMS.slice(0, 4));
  assert.deepEqual(statuses, ['GET 304'], 'the session is as this object wrote it');
  items[0].content = 'changed by the caller';
  assert.deepEqual(await session.getItems(), ITEMS.slice(0, 4), 'each read has objects of its own');

  // Another writer's items: the next read transfers the conversation.
  await new SessiondbSession({ client: shared.client, sessionId: 'held' }).addItems([ITEMS[4]]);
  statuses.length = 0;
  assert.deepEqual(await session.getItems(), ITEMS.slice(0, 5));
  assert.deepEqual(statuses, ['GET 200']);

  // A write elsewhere between a read and this object's add: the add, refused at the version
  // read, lands after it anyway, and the next read transfers the conversation.
  await new SessiondbSession({ client: shared.client, sessionId: 'held' }).addItems([ITEMS[5]]);
  statuses.length = 0;
  await session.addItems([ITEMS[6]]);
  assert.deepEqual(statuses, ['POST 409', 'POST 201']);
  statuses.length = 0;
  assert.deepEqual(await session.getItems(), ITEMS);
  assert.deepEqual(statuses, ['GET 200']);
});

test('addItems stores all or nothing', async () => {
  const session = new SessiondbSession({ client: shared.client, sessionId: 'atomic' });
  await session.addItems(ITEMS.slice(0, 1));
  await assert.rejects(session.addItems([ITEMS[1], { role: 'user\u0000', content: 'a NUL in the role' }]),
    (e) => e instanceof SessiondbError && e.code === 'invalid_request');
  assert.deepEqual(await session.getItems(), ITEMS.slice(0, 1));
});

test('compactions show their summary', async () => {
  const session = new SessiondbSession({ client: shared.client, sessionId: 'compacted' });
  await session.addItems(ITEMS);
  const ids = (await all(shared.client.history('compacted'))).map((m) => m.id);
  await shared.client.addCompaction('compacted', { summary: 'Asked about the weather in Paris.', fromMessageId: ids[0], toMessageId: ids[4] });
  assert.deepEqual(await session.getItems(), [{ role: 'assistant', content: 'Asked about the weather in Paris.' }, ...ITEMS.slice(5)]);
});

// The same two runs (a tool call, then a follow-up) against an in-memory session and against
// sessiondb: the model must be sent the same input, and the sessions must hold the same items.
async function twoRuns(session) {
  const modelApi = await fakeResponses();
  try {
    const model = new OpenAIResponsesModel(new OpenAI({ baseURL: modelApi.url, apiKey: 'x' }), 'gpt-4o');
    const calls = [];
    const weather = tool({
      name: 'weather',
      description: 'The weather in a city.',
      parameters: z.object({ city: z.string() }),
      execute: async ({ city }) => {
        calls.push(city);
        return `sunny in ${city}`;
      },
    });
    const agent = new Agent({ name: 'forecaster', instructions: 'Answer briefly.', model, tools: [weather] });
    modelApi.callTool('weather', { city: 'Rome' }, 'call_rome');
    modelApi.reply('It is sunny in Rome.');
    const first = await run(agent, 'Weather in Rome?', { session });
    modelApi.reply('You asked about Rome.');
    const second = await run(agent, 'Which city did I ask about?', { session });
    return { outputs: [first.finalOutput, second.finalOutput], calls, inputs: modelApi.requests.map((r) => r.input), items: await session.getItems() };
  } finally {
    await modelApi.close();
  }
}

test('runs with tool calls keep what an in-memory session keeps', async () => {
  const reference = await twoRuns(new MemorySession());
  const kept = await twoRuns(new SessiondbSession({ client: shared.client, sessionId: 'agent-tools' }));
  assert.deepEqual(kept.outputs, ['It is sunny in Rome.', 'You asked about Rome.']);
  assert.deepEqual(kept.calls, ['Rome']);
  assert.equal(kept.inputs.length, 3);
  const sent = kept.inputs[2];
  assert.deepEqual(sent.map((i) => i.type ?? i.role), ['user', 'function_call', 'function_call_output', 'message', 'user']);
  assert.equal(sent[2].call_id, 'call_rome');
  assert.deepEqual(kept.inputs, reference.inputs, 'the model saw the same conversation');
  assert.deepEqual(kept.items, reference.items, 'the sessions hold the same items');
  const stored = await all(shared.client.history('agent-tools'));
  assert.deepEqual(stored.map((m) => m.role), ['user', 'assistant', 'tool', 'assistant', 'user', 'assistant']);
});

test('copySession moves a conversation in, then what came since, and refuses a session that holds another', async () => {
  const source = new MemorySession({ sessionId: 'moving', initialItems: ITEMS });
  const target = new SessiondbSession({ client: shared.client, sessionId: 'moved-in' });
  assert.equal(await copySession(source, target), true);
  assert.deepEqual(await target.getItems(), ITEMS);
  const { version } = await shared.client.getSession('moved-in');
  assert.equal(await copySession(source, target), false, 'a second copy writes nothing');
  assert.equal((await shared.client.getSession('moved-in')).version, version);
  assert.equal(await copySession(new MemorySession(), target), false);

  // The conversation went on in the source: a second copy writes only the new items.
  const first = (await shared.client.storedHistory('moved-in')).map((m) => m.id);
  await source.addItems([{ role: 'user', content: 'and one more thing' }]);
  assert.equal(await copySession(source, target), true);
  assert.deepEqual(await target.getItems(), await source.getItems());
  assert.deepEqual((await shared.client.storedHistory('moved-in')).slice(0, ITEMS.length).map((m) => m.id), first);

  const taken = new SessiondbSession({ client: shared.client, sessionId: 'moved-taken' });
  await taken.addItems(ITEMS.slice(1, 3));
  await assert.rejects(copySession(source, taken), (error) => error instanceof SessiondbError && error.code === 'conflict');
  assert.deepEqual(await taken.getItems(), ITEMS.slice(1, 3));
});

test("the README's example runs as written", async () => {
  const readme = readFileSync(new URL('../../../README.md', import.meta.url), 'utf8');
  const block = readme.split('<!-- typescript-example -->\n```ts\n')[1].split('```')[0];
  const modelApi = await fakeResponses();
  try {
    // The SDK's default model client points at the stand-in; the example is otherwise as shown,
    // with the package's own name resolved to this build and the test server's address.
    setDefaultOpenAIClient(new OpenAI({ baseURL: modelApi.url, apiKey: 'x' }));
    setOpenAIAPI('responses');
    modelApi.reply('San Francisco.');
    modelApi.reply('California.');
    const module = join(dirname(fileURLToPath(import.meta.url)), `readme-example-${process.pid}.mjs`);
    writeFileSync(module, block
      .replace("from 'sessiondb/openai-agents'", "from '../dist/openai-agents.js'")
      .replace("from 'sessiondb'", "from '../dist/index.js'")
      .replace('http://127.0.0.1:8787', shared.served.url));
    const printed = [];
    const log = console.log;
    console.log = (...args) => printed.push(args.join(' '));
    try {
      await import(pathToFileURL(module).href);
    } finally {
      console.log = log;
      rmSync(module, { force: true });
    }
    assert.deepEqual(printed, ['California.']);
    assert.equal(modelApi.requests[1].input[0].content, 'What city is the Golden Gate Bridge in?');
    const stored = await all(shared.client.history('user-42'));
    assert.deepEqual(stored.map((m) => m.role), ['user', 'assistant', 'user', 'assistant']);
  } finally {
    await modelApi.close();
  }
});
