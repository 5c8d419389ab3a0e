// The AI SDK's chat persistence on a real server, with the real SDK (`ai` and `@ai-sdk/openai`
// from npm) streaming from a local stand-in for the model API, saved in `onFinish` as the SDK's
// persistence guide does.
import assert from 'node:assert/strict';
import { execFile } from 'node:child_process';
import { mkdtempSync, readdirSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { dirname, join } from 'node:path';
import { after, before, test } from 'node:test';
import { fileURLToPath, pathToFileURL } from 'node:url';
import { promisify } from 'node:util';

import { createOpenAI } from '@ai-sdk/openai';
import { convertToModelMessages, createIdGenerator, stepCountIs, streamText, tool, validateUIMessages } from 'ai';
import { z } from 'zod';

import { Client, SessiondbError } from '../dist/index.js';
import { SessiondbChatStore } from '../dist/ai-sdk.js';
import { fakeChatCompletions } from './fake-openai.mjs';
import { all, sharedServer } from './served.mjs';

const shared = sharedServer();
let model;
let fake;
let chats = 0;

before(async () => {
  fake = await fakeChatCompletions();
  model = createOpenAI({ baseURL: fake.url, apiKey: 'test' }).chat('gpt-4o');
});
after(() => fake.close());

const store = () => new SessiondbChatStore({ client: shared.client });

/**
 * A store whose client records each request it sends, as `METHOD path-after-the-session`
 * (`GET session` for the session itself), and the status of each answer.
 */
function countingStore(options = {}) {
  const client = new Client({ baseUrl: shared.client.baseUrl });
  const sent = [];
  const statuses = [];
  const open = client.open.bind(client);
  client.open = async (method, path, ...rest) => {
    sent.push(`${method} ${path.split('/').slice(4).join('/') || 'session'}`);
    try {
      const answer = await open(method, path, ...rest);
      statuses.push(answer.status);
      return answer;
    } catch (error) {
      statuses.push(error.status);
      throw error;
    }
  };
  return { chats: new SessiondbChatStore({ client, ...options }), sent, statuses };
}
const newChat = () => `ai-sdk-chat-${++chats}`;
const user = (id, text) => ({ id, role: 'user', parts: [{ type: 'text', text }] });
// What a message is as JSON: the SDK's objects hold keys set to `undefined`, which JSON leaves out.
const plain = (value) => JSON.parse(JSON.stringify(value));
const texts = (messages) => messages.map((m) => m.parts.filter((p) => p.type === 'text').map((p) => p.text).join(''));

const weather = tool({
  description: 'The weather in a city',
  inputSchema: z.object({ city: z.string() }),
  execute: async ({ city }) => ({ city, forecast: 'sunny, 21 °C' }),
});

/**
 * One request of a chat route: the model answers `messages` (the fake's next scripted replies)
 * and the UI message stream's `onFinish` saves the updated list; resolves to that list once saved.
 */
async function respond(chats, chatId, messages, options = {}) {
  let saved;
  const finished = new Promise((resolve) => (saved = resolve));
  const result = streamText({
    model,
    messages: await convertToModelMessages(messages),
    ...options,
  });
  const response = result.toUIMessageStreamResponse({
    originalMessages: messages,
    generateMessageId: createIdGenerator({ prefix: 'msg', size: 16 }),
    onFinish: ({ messages: updated }) => saved(chats.saveChat({ chatId, messages: updated }).then(() => updated)),
  });
  await response.text();
  return plain(await finished);
}

test('answers streamed by the AI SDK are saved in onFinish and load back exactly', async () => {
  const { chats, sent } = countingStore();
  const chatId = newChat();
  fake.reply('Hello! How can I help?');
  const first = await respond(chats, chatId, [user('u1', 'Hi there')]);
  assert.deepEqual(texts(first), ['Hi there', 'Hello! How can I help?']);
  assert.match(first[1].id, /^msg-/);
  assert.deepEqual(await chats.loadChat(chatId), first);

  // The next request loads the chat, as a route that receives only the new message does.
  fake.reply('Paris is the capital of France.');
  const history = await chats.loadChat(chatId);
  sent.length = 0;
  const second = await respond(chats, chatId, [...history, user('u2', 'Capital of France?')]);
  // The save compared with what the load read and wrote the turn's two messages in one batch,
  // conditioned on the leaf the load saw.
  assert.deepEqual(sent, ['POST messages/batch']);
  const loaded = await chats.loadChat(chatId);
  assert.deepEqual(loaded, second);
  assert.equal(loaded.length, 4);
  assert.deepEqual(await validateUIMessages({ messages: loaded }), loaded);
  const modelMessages = await convertToModelMessages(loaded);
  assert.deepEqual(modelMessages.map((m) => m.role), ['user', 'assistant', 'user', 'assistant']);
  // The model got the whole conversation on the second request.
  assert.equal(fake.requests.at(-1).messages.length, 3);

  const stored = await shared.client.messages(chatId, { limit: 10 });
  assert.equal(stored.items.filter((m) => m.updatedAt !== undefined).length, 0);
});

test('a tool call is stored with its input and output, and the model reads it back', async () => {
  const chats = store();
  const chatId = newChat();
  fake.callTool('weather', { city: 'Paris' }, 'call_1');
  fake.reply('It is sunny in Paris.');
  const saved = await respond(chats, chatId, [user('u1', 'Weather in Paris?')], {
    tools: { weather },
    stopWhen: stepCountIs(2),
  });
  const loaded = await chats.loadChat(chatId);
  assert.deepEqual(loaded, saved);
  const answer = loaded[1];
  const call = answer.parts.find((p) => p.type === 'tool-weather');
  assert.equal(call.state, 'output-available');
  assert.deepEqual(call.input, { city: 'Paris' });
  assert.deepEqual(call.output, { city: 'Paris', forecast: 'sunny, 21 °C' });
  assert.equal(answer.parts.at(-1).text, 'It is sunny in Paris.');
  await validateUIMessages({ messages: loaded, tools: { weather } });
  const modelMessages = await convertToModelMessages(loaded, { tools: { weather } });
  assert.deepEqual(modelMessages.map((m) => m.role), ['user', 'assistant', 'tool', 'assistant']);
});

test('a regenerated answer becomes the chat and the earlier one stays as an alternative', async () => {
  const chats = store();
  const chatId = newChat();
  fake.reply('First answer');
  const [question, first] = await respond(chats, chatId, [user('u1', 'Tell me a joke')]);
  // Regenerating: the route drops the last answer and asks again.
  fake.reply('Second answer');
  const regenerated = await respond(chats, chatId, [question]);
  const second = regenerated[1];
  assert.notEqual(second.id, first.id);
  assert.deepEqual(texts(await chats.loadChat(chatId)), ['Tell me a joke', 'Second answer']);
  assert.deepEqual((await chats.alternatives(chatId, second.id)).map((m) => m.id), [first.id, second.id]);
  assert.deepEqual(await chats.alternatives(chatId, first.id), [first, second]);
  assert.deepEqual(await chats.loadChat(chatId, { leaf: first.id }), [question, first]);
  assert.deepEqual(await chats.alternatives(chatId, 'u1'), [question]);
  await assert.rejects(chats.alternatives(chatId, 'never-stored'), (error) => error.code === 'not_found');

  // Going on from the earlier answer makes that branch the chat again.
  fake.reply('Glad you liked it');
  const resumed = await respond(chats, chatId, [question, first, user('u2', 'Ha, good one')]);
  assert.deepEqual(await chats.loadChat(chatId), resumed);
  assert.deepEqual(texts(resumed), ['Tell me a joke', 'First answer', 'Ha, good one', 'Glad you liked it']);
});

test('an edited question is replaced in place and its new answer branches beside the old one', async () => {
  const chats = store();
  const chatId = newChat();
  fake.reply('A1');
  fake.reply('A2');
  let messages = await respond(chats, chatId, [user('u1', 'Q1')]);
  messages = await respond(chats, chatId, [...messages, user('u2', 'Q2')]);
  const oldAnswer = messages[3];
  // The AI SDK keeps an edited message's id and drops what followed it.
  fake.reply('A2 to the edit');
  const edited = await respond(chats, chatId, [...messages.slice(0, 2), user('u2', 'Q2, edited')]);
  assert.deepEqual(await chats.loadChat(chatId), edited);
  assert.deepEqual(texts(edited), ['Q1', 'A1', 'Q2, edited', 'A2 to the edit']);
  assert.deepEqual((await chats.alternatives(chatId, edited[3].id)).map((m) => m.id), [oldAnswer.id, edited[3].id]);
  const stored = await shared.client.getMessage(chatId, 'u2');
  assert.equal(typeof stored.updatedAt, 'number');
});

test('an answer continued under the same id is replaced, not appended', async () => {
  const { chats, sent } = countingStore();
  const chatId = newChat();
  const answer = { id: 'a1', role: 'assistant', parts: [{ type: 'text', text: 'Let me check.' }] };
  await chats.saveChat({ chatId, messages: [user('u1', 'Q'), answer] });
  const continued = { ...answer, parts: [...answer.parts, { type: 'step-start' }, { type: 'text', text: 'Done.' }] };
  sent.length = 0;
  await chats.saveChat({ chatId, messages: [user('u1', 'Q'), continued] });
  assert.deepEqual(sent, ['PUT messages/a1']);
  assert.deepEqual(await chats.loadChat(chatId), [user('u1', 'Q'), continued]);
  assert.equal((await shared.client.getSession(chatId)).messageCount, 2);
});

test('saving what was loaded writes nothing, OpenAI item ids included', async () => {
  const { chats, sent } = countingStore();
  const chatId = newChat();
  const answer = {
    id: 'a1', role: 'assistant', metadata: { model: 'gpt-4o' },
    parts: [
      { type: 'reasoning', text: 'thinking', providerMetadata: { openai: { itemId: 'rs_1', reasoningEncryptedContent: null } } },
      { type: 'reasoning', text: ' ' },
      { type: 'text', text: 'Answer', state: 'done', providerMetadata: { openai: { itemId: 'msg_1' } } },
    ],
  };
  await chats.saveChat({ chatId, messages: [user('u1', 'Q'), answer] });
  assert.deepEqual(sent, ['GET history', 'POST messages/batch']);
  const loaded = await chats.loadChat(chatId);
  // The server does not keep OpenAI's item ids nor blank reasoning (they break a replay).
  assert.deepEqual(loaded[1].parts, [
    { type: 'reasoning', text: 'thinking' },
    { type: 'text', text: 'Answer', state: 'done' },
  ]);
  const before = await shared.client.getSession(chatId);
  sent.length = 0;
  await chats.saveChat({ chatId, messages: loaded });
  // The client's own copy, ids and blank reasoning still in it, is the same chat too.
  await chats.saveChat({ chatId, messages: [user('u1', 'Q'), answer] });
  assert.deepEqual(sent, ['GET session', 'GET session']);
  const afterwards = await shared.client.getSession(chatId);
  assert.equal(afterwards.updatedAt, before.updatedAt);
  assert.equal(afterwards.messageCount, 2);
  assert.equal((await shared.client.getMessage(chatId, 'a1')).updatedAt, undefined);
});

test("the persistence guide's chat files move in with saveChat, and a second pass writes nothing", async () => {
  // The guide's store: one JSON file per chat, the chat's UIMessages as `saveChat` gave them.
  const directory = mkdtempSync(join(tmpdir(), 'ai-sdk-chats-'));
  try {
    const files = { [newChat()]: [user('u1', 'hi'), { id: 'a1', role: 'assistant', parts: [{ type: 'text', text: 'hello ✓' }] }], [newChat()]: [user('u2', 'only a question')] };
    for (const [id, messages] of Object.entries(files)) writeFileSync(join(directory, `${id}.json`), JSON.stringify(messages, null, 2));
    const moveIn = async (chats) => {
      for (const name of readdirSync(directory)) {
        await chats.saveChat({ chatId: name.replace(/\.json$/, ''), messages: JSON.parse(readFileSync(join(directory, name), 'utf8')) });
      }
    };
    await moveIn(store());
    const versions = {};
    for (const [id, messages] of Object.entries(files)) {
      assert.deepEqual(plain(await store().loadChat(id)), messages);
      versions[id] = (await shared.client.getSession(id)).version;
    }
    await moveIn(store());
    for (const id of Object.keys(files)) assert.equal((await shared.client.getSession(id)).version, versions[id], 'nothing written again');
  } finally {
    rmSync(directory, { recursive: true, force: true });
  }
});

test('messages the store cannot key are refused and nothing is stored', async () => {
  const chats = store();
  const chatId = newChat();
  const cases = [
    [[user('u1', 'Q'), { id: '', role: 'assistant', parts: [] }], /no usable id/],
    [[user('u1', 'Q'), { role: 'assistant', parts: [] }], /no usable id/],
    [[user('u1', 'Q'), user('u1', 'again')], /appears twice/],
    [[user('u1', 'Q'), { id: 't1', role: 'tool', parts: [] }], /role "tool"/],
    [[user('u1', 'Q'), { id: 'a1', role: 'assistant' }], /parts/],
    [[user('x'.repeat(257), 'Q')], /no usable id/],
    ['not a list', /must be an array/],
    [[user('u1', 'Q'), null], /not an object/],
  ];
  for (const [messages, reason] of cases) {
    await assert.rejects(chats.saveChat({ chatId, messages }), (error) => {
      assert.ok(error instanceof SessiondbError);
      assert.equal(error.code, 'invalid_request');
      assert.match(error.message, reason);
      return true;
    });
  }
  assert.deepEqual(await chats.loadChat(chatId), []);
  await assert.rejects(shared.client.getSession(chatId), (error) => error.code === 'not_found');
});

test('chats are created, listed per user, renamed and deleted', async () => {
  const chats = store();
  const userId = `ai-sdk-user-${Date.now()}`;
  const id = await chats.createChat({ title: 'Trip planning', userId, metadata: { pinned: true } });
  const named = await chats.createChat({ id: newChat(), userId });
  await assert.rejects(chats.createChat({ id: named }), (error) => error.code === 'conflict');
  await chats.saveChat({ chatId: id, messages: [user('u1', 'Where to?')] });
  const listed = await all(chats.listChats({ userId }));
  assert.deepEqual(listed.map((c) => c.id), [id, named]);
  assert.equal(listed[0].title, 'Trip planning');
  assert.deepEqual(listed[0].metadata, { pinned: true });
  assert.equal(listed[0].messageCount, 1);
  assert.equal(listed[1].title, null);
  await chats.renameChat(named, 'Renamed');
  assert.equal((await all(chats.listChats({ userId }))).find((c) => c.id === named).title, 'Renamed');
  await assert.rejects(chats.renameChat('ai-sdk-no-such-chat', 'x'), (error) => error.code === 'not_found');
  await chats.deleteChat(id);
  await chats.deleteChat(id);
  assert.deepEqual(await chats.loadChat(id), []);
  assert.deepEqual((await all(chats.listChats({ userId }))).map((c) => c.id), [named]);
  assert.deepEqual(await chats.loadChat('ai-sdk-never-written'), []);
});

test('a compacted chat loads its summary for the model, the stored messages on request', async () => {
  const chats = store();
  const chatId = newChat();
  const messages = [];
  for (let i = 1; i <= 3; i++) {
    messages.push(user(`u${i}`, `question ${i}`), { id: `a${i}`, role: 'assistant', parts: [{ type: 'text', text: `answer ${i}` }] });
  }
  await chats.saveChat({ chatId, messages });
  await shared.client.addCompaction(chatId, { summary: 'Two questions answered.', fromMessageId: 'u1', toMessageId: 'a2' });
  const compacted = await chats.loadChat(chatId);
  assert.deepEqual(texts(compacted), ['Two questions answered.', 'question 3', 'answer 3']);
  assert.equal(compacted[0].role, 'assistant');
  await validateUIMessages({ messages: compacted });
  assert.equal((await convertToModelMessages(compacted)).length, 3);
  assert.deepEqual(await chats.loadChat(chatId, { compacted: false }), messages);
  await assert.rejects(chats.loadChat(chatId, { compacted: false, leaf: 'a1' }), (error) => error.code === 'invalid_request');

  // A route (in another process: nothing remembered) that answers from the compacted chat
  // saves it back: only the new messages are written, after the stored path is read page by
  // page (its history holds the summary).
  const elsewhere = countingStore();
  fake.reply('answer 4');
  const updated = await respond(elsewhere.chats, chatId, [...compacted, user('u4', 'question 4')]);
  assert.deepEqual(elsewhere.sent, ['GET history', 'GET messages', 'POST messages/batch']);
  assert.deepEqual(texts(updated).slice(-2), ['question 4', 'answer 4']);
  const stored = await chats.loadChat(chatId, { compacted: false });
  assert.deepEqual(stored.map((m) => m.id), [...messages.map((m) => m.id), 'u4', updated.at(-1).id]);
  assert.deepEqual((await chats.loadChat(chatId)).map((m) => m.id).slice(1), ['u3', 'a3', 'u4', updated.at(-1).id]);
});

test('a save reads the chat again once another writer moved it, and keeps edits it did not make', async () => {
  const { chats, sent } = countingStore();
  const chatId = newChat();
  const answer = (id, text) => ({ id, role: 'assistant', parts: [{ type: 'text', text }] });
  const first = [user('u1', 'Q1'), answer('a1', 'A1')];
  await chats.saveChat({ chatId, messages: first });

  // Another writer appends: the session's leaf moved, so the save's append is refused, the
  // save reads the chat again and the caller's turn becomes the chat, beside the other
  // writer's message.
  await shared.client.append(chatId, answer('x1', 'from elsewhere'));
  sent.length = 0;
  const second = [...first, user('u2', 'Q2'), answer('a2', 'A2')];
  await chats.saveChat({ chatId, messages: second });
  assert.deepEqual(sent, ['POST messages/batch', 'GET history', 'POST messages/batch']);
  assert.deepEqual(await chats.loadChat(chatId), second);
  assert.deepEqual((await chats.alternatives(chatId, 'u2')).map((m) => m.id), ['x1', 'u2']);

  // Another writer edits an earlier message: the leaf stays, the save compares with what this
  // store last read, and the edit it did not make stays (the append at the version read is
  // refused, and made under the leaf).
  await shared.client.replaceMessage(chatId, 'u1', user('u1', 'Q1, edited elsewhere'));
  sent.length = 0;
  await chats.saveChat({ chatId, messages: [...second, user('u3', 'Q3')] });
  assert.deepEqual(sent, ['POST messages/batch', 'POST messages/batch']);
  assert.deepEqual(texts(await chats.loadChat(chatId)), ['Q1, edited elsewhere', 'A1', 'Q2', 'A2', 'Q3']);

  // A message this store would replace was deleted elsewhere: the save reads the chat again
  // and appends the caller's version where it was.
  const third = [user('t1', 'T1'), answer('t2', 'T2')];
  const another = newChat();
  await chats.saveChat({ chatId: another, messages: third });
  await shared.client.deleteMessage(another, 't2');
  sent.length = 0;
  await chats.saveChat({ chatId: another, messages: [third[0], answer('t2', 'T2, continued')] });
  assert.deepEqual(sent, ['PUT messages/t2', 'GET history', 'POST messages/batch']);
  assert.deepEqual(texts(await chats.loadChat(another)), ['T1', 'T2, continued']);

  // A deleted chat is not compared with what this store remembers of it: a replacement, an
  // append and a look at a chat that a save leaves as it was all find it gone, and the save
  // writes the chat anew.
  const fourth = [...first, user('u6', 'Q6')];
  for (const [messages, requests] of [
    [first, ['PUT messages/u1', 'GET history', 'POST messages/batch']],
    [first, ['GET session', 'GET history', 'POST messages/batch']],
    [fourth, ['POST messages/batch', 'GET history', 'POST messages/batch']],
  ]) {
    await shared.client.deleteSession(chatId);
    sent.length = 0;
    await chats.saveChat({ chatId, messages });
    assert.deepEqual(sent, requests);
    assert.deepEqual(await chats.loadChat(chatId), messages);
  }

  // A chat loaded before it existed is saved without reading it again; one that exists with no
  // messages yet, in one request.
  const fresh = newChat();
  await chats.loadChat(fresh);
  sent.length = 0;
  await chats.saveChat({ chatId: fresh, messages: first });
  assert.deepEqual(sent, ['POST messages/batch', 'POST messages/batch']);
  const empty = await chats.createChat();
  await chats.loadChat(empty);
  sent.length = 0;
  await chats.saveChat({ chatId: empty, messages: first });
  assert.deepEqual(sent, ['POST messages/batch']);
  assert.deepEqual(await chats.loadChat(fresh), first);
  assert.deepEqual(await chats.loadChat(empty), first);

  // Without memory every save reads the chat.
  const { chats: forgetful, sent: read } = countingStore({ memoryChars: 0 });
  await forgetful.loadChat(chatId);
  await forgetful.saveChat({ chatId, messages: [...first, user('u4', 'Q4')] });
  assert.deepEqual(read, ['GET history', 'GET history', 'POST messages/batch']);

  // Memory for one of these chats (~200 and ~135 characters): loading the second drops the first.
  const other = newChat();
  await chats.saveChat({ chatId: other, messages: first });
  const { chats: small, sent: smallSent } = countingStore({ memoryChars: 300 });
  const [a, b] = [await small.loadChat(chatId), await small.loadChat(other)];
  smallSent.length = 0;
  await small.saveChat({ chatId: other, messages: [...b, user('u5', 'Q5')] });
  await small.saveChat({ chatId, messages: [...a, user('u5', 'Q5')] });
  assert.deepEqual(smallSent, ['POST messages/batch', 'GET history', 'POST messages/batch']);
});

test("a load after the store's own save transfers nothing until another writer changes the chat", async () => {
  const { chats, sent, statuses } = countingStore();
  const chatId = newChat();
  const answer = (id, text) => ({ id, role: 'assistant', parts: [{ type: 'text', text }] });
  let messages = [];
  for (let turn = 1; turn <= 3; turn++) {
    assert.deepEqual(await chats.loadChat(chatId), messages);
    messages = [...messages, user(`u${turn}`, `Q${turn}`), answer(`a${turn}`, `A${turn}`)];
    await chats.saveChat({ chatId, messages });
  }
  // The first turns read the chat: it did not exist, then the save of a chat read missing
  // knows no version. From the third on, the load finds the chat as the last save left it.
  assert.deepEqual(sent, [
    'GET history', 'POST messages/batch', 'POST messages/batch',
    'GET history', 'POST messages/batch',
    'GET history', 'POST messages/batch',
  ]);
  assert.deepEqual(statuses.filter((_, i) => sent[i] === 'GET history').slice(1), [200, 304]);

  // Another writer's edit moves no leaf but changes the chat: the load reads it.
  await shared.client.replaceMessage(chatId, 'u1', user('u1', 'Q1, edited elsewhere'));
  sent.length = 0;
  statuses.length = 0;
  const loaded = await chats.loadChat(chatId);
  assert.equal(statuses[0], 200);
  assert.deepEqual(texts(loaded), ['Q1, edited elsewhere', 'A1', 'Q2', 'A2', 'Q3', 'A3']);

  // An edit elsewhere between a load and its save: the append at the loaded version is
  // refused and made under the leaf instead, the edit stays, and the next load reads the chat.
  await shared.client.replaceMessage(chatId, 'a1', answer('a1', 'A1, edited elsewhere'));
  sent.length = 0;
  statuses.length = 0;
  await chats.saveChat({ chatId, messages: [...loaded, user('u4', 'Q4')] });
  assert.deepEqual(sent, ['POST messages/batch', 'POST messages/batch']);
  assert.deepEqual(texts(await chats.loadChat(chatId)), [
    'Q1, edited elsewhere', 'A1, edited elsewhere', 'Q2', 'A2', 'Q3', 'A3', 'Q4',
  ]);
  assert.deepEqual(statuses, [409, 201, 200]);

  // A replacement moves the version to one the store did not see: the next load reads.
  const reread = await chats.loadChat(chatId);
  sent.length = 0;
  statuses.length = 0;
  await chats.saveChat({ chatId, messages: [...reread.slice(0, -1), user('u4', 'Q4, rephrased')] });
  assert.deepEqual(await chats.loadChat(chatId), [...reread.slice(0, -1), user('u4', 'Q4, rephrased')]);
  assert.deepEqual(sent, ['PUT messages/u4', 'GET history']);
  assert.deepEqual(statuses, [200, 200]);
});

test("a chat's stream in progress is kept for resumption and cleared when it ends", async () => {
  const chats = store();
  const chatId = newChat();
  assert.equal(await chats.activeStreamId(chatId), null);
  await chats.setActiveStreamId(chatId, null);
  // A route may start the stream before anything of the chat is stored.
  await chats.setActiveStreamId(chatId, 'stream-0');
  assert.equal(await chats.activeStreamId(chatId), 'stream-0');
  await chats.saveChat({ chatId, messages: [user('u1', 'Q')] });
  await chats.setActiveStreamId(chatId, 'stream-1');
  assert.equal(await chats.activeStreamId(chatId), 'stream-1');
  assert.equal(await new SessiondbChatStore({ client: shared.client }).activeStreamId(chatId), 'stream-1');
  await chats.setActiveStreamId(chatId, 'stream-2');
  assert.equal(await chats.activeStreamId(chatId), 'stream-2');
  await chats.setActiveStreamId(chatId, null);
  assert.equal(await chats.activeStreamId(chatId), null);
  await chats.setActiveStreamId(chatId, null);
  // The stream id is state, not a message.
  assert.deepEqual(texts(await chats.loadChat(chatId)), ['Q']);
});

test("the README's route runs as written", async () => {
  const readme = readFileSync(new URL('../../../README.md', import.meta.url), 'utf8');
  const block = readme.split('<!-- ai-sdk-example -->\n```ts\n')[1].split('```')[0];
  // The route is as shown, with the package's own name resolved to this build and the test
  // server's address; it runs in a process of its own, whose environment points the provider's
  // default instance at the stand-in.
  const here = dirname(fileURLToPath(import.meta.url));
  const module = join(here, `readme-ai-sdk-${process.pid}.mjs`);
  writeFileSync(module, block
    .replace("from 'sessiondb/ai-sdk'", "from '../dist/ai-sdk.js'")
    .replace("from 'sessiondb'", "from '../dist/index.js'")
    .replace('http://127.0.0.1:8787', shared.served.url));
  const chatId = newChat();
  const requests = [user('u1', 'Where is the Golden Gate Bridge?'), user('u2', 'Which state?')]
    .map((message) => JSON.stringify({ id: chatId, message }));
  const driver = `
    const { POST } = await import(${JSON.stringify(pathToFileURL(module).href)});
    for (const body of ${JSON.stringify(requests)}) {
      const response = await POST(new Request('http://localhost/api/chat', { method: 'POST', body }));
      process.stdout.write(await response.text());
    }`;
  fake.reply('San Francisco.');
  fake.reply('California.');
  let streamed;
  try {
    // Not a synchronous spawn: the stand-in for the model answers from this process.
    ({ stdout: streamed } = await promisify(execFile)(process.execPath, ['--input-type=module', '-e', driver], {
      cwd: here,
      env: { ...process.env, OPENAI_BASE_URL: fake.url, OPENAI_API_KEY: 'test' },
      encoding: 'utf8',
      timeout: 60_000,
    }));
  } finally {
    rmSync(module, { force: true });
  }
  assert.match(streamed, /"delta":"San Fra"/);
  assert.deepEqual(texts(await store().loadChat(chatId)),
    ['Where is the Golden Gate Bridge?', 'San Francisco.', 'Which state?', 'California.']);
  assert.equal(fake.requests.at(-1).messages.length, 3);
});
