// LangChain's chat message history on a real server.
import assert from 'node:assert/strict';
import { test } from 'node:test';

import {
  AIMessage,
  AIMessageChunk,
  ChatMessage,
  FunctionMessage,
  HumanMessage,
  SystemMessage,
  ToolMessage,
} from '@langchain/core/messages';

import { InMemoryChatMessageHistory } from '@langchain/core/chat_history';

import { SessiondbError } from '../dist/index.js';
import { SessiondbChatMessageHistory, copyHistory } from '../dist/langchain.js';
import { all, sharedServer } from './served.mjs';

const shared = sharedServer();
const history = (sessionId) => new SessiondbChatMessageHistory({ client: shared.client, sessionId });

const everyKind = () => [
  new SystemMessage('Answer in one line.'),
  new HumanMessage({ content: 'What is the weather in Rome?', id: 'h1', name: 'ada' }),
  new AIMessage({
    content: '',
    tool_calls: [{ name: 'weather', args: { city: 'Rome' }, id: 'call_1', type: 'tool_call' }],
    usage_metadata: { input_tokens: 12, output_tokens: 5, total_tokens: 17 },
    response_metadata: { model_name: 'm' },
    id: 'run-1',
  }),
  new ToolMessage({ content: 'sunny', tool_call_id: 'call_1', name: 'weather' }),
  new AIMessage({ content: [{ type: 'text', text: 'Sunny in Rome.' }] }),
  new ChatMessage({ role: 'critic', content: 'Too short.' }),
  new FunctionMessage({ name: 'legacy', content: '{}' }),
];

// What a message is made of, for comparison (instances carry lazily built fields).
const shape = (m) => ({
  type: m.getType(),
  content: m.content,
  id: m.id,
  name: m.name,
  role: m.role,
  tool_calls: m.tool_calls,
  tool_call_id: m.tool_call_id,
  usage_metadata: m.usage_metadata,
  response_metadata: m.response_metadata,
});

test('every kind of message comes back as added', async () => {
  const h = history('kinds');
  const added = everyKind();
  await h.addMessages(added.slice(0, 3));
  await h.addMessage(added[3]);
  await h.addMessages(added.slice(4));
  assert.deepEqual((await h.getMessages()).map(shape), added.map(shape));
  // Other clients read ordinary messages: the chat role and the content.
  const stored = await all(shared.client.history('kinds'));
  assert.deepEqual(
    stored.map((m) => m.role),
    ['system', 'user', 'assistant', 'tool', 'assistant', 'critic', 'function'],
  );
  assert.equal(stored[2].metadata.langchainMessage.tool_calls[0].id, 'call_1');
  assert.equal(stored[5].metadata.langchainMessage.type, 'chat', 'stored as the Python client stores it');
  await h.addMessage(new AIMessageChunk({ content: 'streamed' }));
  assert.equal((await h.getMessages()).at(-1).content, 'streamed');
  await h.clear();
  assert.deepEqual(await h.getMessages(), []);
});

test('another history is copied in, then what came since, and one that holds other messages is refused', async () => {
  const source = new InMemoryChatMessageHistory(everyKind());
  const target = history('lc-moved');
  assert.equal(await copyHistory(source, target), true);
  assert.deepEqual((await target.getMessages()).map(shape), everyKind().map(shape));
  const { version } = await shared.client.getSession('lc-moved');
  assert.equal(await copyHistory(source, target), false, 'a second copy writes nothing');
  assert.equal(await copyHistory(new InMemoryChatMessageHistory(), target), false);
  assert.equal((await shared.client.getSession('lc-moved')).version, version);

  // A history that holds the first of the source's messages takes the rest, under them.
  const begun = history('lc-begun');
  await begun.addMessages(everyKind().slice(0, 2));
  const first = (await shared.client.storedHistory('lc-begun')).map((m) => m.id);
  assert.equal(await copyHistory(source, begun), true);
  assert.deepEqual((await begun.getMessages()).map(shape), everyKind().map(shape));
  assert.deepEqual((await shared.client.storedHistory('lc-begun')).slice(0, 2).map((m) => m.id), first);

  const taken = history('lc-taken');
  await taken.addMessages(everyKind().slice(1, 3));
  await assert.rejects(copyHistory(source, taken), (error) => error instanceof SessiondbError && error.code === 'conflict');
  assert.deepEqual((await taken.getMessages()).map(shape), everyKind().slice(1, 3).map(shape));
});

test('messages of other clients and compactions read as chat messages', async () => {
  await shared.client.appendBatch('others', [
    { id: 'q', role: 'user', content: 'first question' },
    { id: 'a', role: 'assistant', parts: [{ type: 'text', text: 'first' }, { type: 'text', text: 'answer' }] },
    { id: 'q2', role: 'user', content: 'second question' },
    { id: 'd', role: 'developer', content: 'be kind' },
  ]);
  const read = await history('others').getMessages();
  assert.deepEqual(
    read.map((m) => [m.getType(), m.content]),
    [['human', 'first question'], ['ai', 'first\nanswer'], ['human', 'second question'], ['generic', 'be kind']],
  );
  await shared.client.addCompaction('others', { summary: 'Asked twice.', fromMessageId: 'q', toMessageId: 'a' });
  const compacted = await history('others').getMessages();
  assert.deepEqual(compacted.map((m) => [m.getType(), m.content]).slice(0, 1), [['ai', 'Asked twice.']]);
  assert.equal(compacted.length, 3);
});
