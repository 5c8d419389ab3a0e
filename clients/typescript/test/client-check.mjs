// The client's work on any runtime (Node, Bun, Deno, a Cloudflare Worker): every kind of
// request and answer against a real server through `client`, and the two adapters that need no
// framework at run time (the AI SDK chat store, the OpenAI Agents session). It imports nothing
// but the client; any failure throws. What it found, to compare across runtimes, is the answer.
import { SessiondbChatStore } from '../dist/ai-sdk.js';
import { SessiondbError, messageIdFor } from '../dist/index.js';
import { SessiondbSession } from '../dist/openai-agents.js';

function check(holds, what) {
  if (!holds) throw new Error(`failed: ${what}`);
}

async function refused(promise, code) {
  try {
    await promise;
  } catch (error) {
    check(error instanceof SessiondbError && error.code === code, `a ${code} error, got ${error}`);
    return;
  }
  throw new Error(`failed: no ${code} error`);
}

export async function checkClient(client) {
  const session = `runtime-${client.transportKind}-${Date.now()}`;
  await client.createSession({ id: session, name: 'on a runtime', metadata: { runtime: 'check' } });
  check((await client.getSession(session)).name === 'on a runtime', 'the session as created');

  // Writes: one message, a large and non-ASCII one, a batch, a branch.
  const first = await client.append(session, { id: 'q1', role: 'user', content: 'What is a B-tree? ✓ 日本語 🎉' });
  check(first.inserted && first.message.id === 'q1', 'an append');
  const large = 'x'.repeat(300_000);
  await client.append(session, { role: 'assistant', content: large });
  const batch = await client.appendBatch(session, Array.from({ length: 300 }, (_, i) => ({ role: 'user', content: `line ${i} apple` })));
  check(batch.length === 300, 'a batch');
  await client.append(session, { id: 'b1', role: 'assistant', content: 'a branch' }, { parent: 'q1' });

  // Reads: the streamed path (many chunks), newest first stopped early, a held version's 304.
  const path = [];
  for await (const message of client.history(session)) path.push(message);
  check(path.length === 2 && path[1].id === 'b1', `the active path is the branch (${path.length})`);
  const through = [];
  for await (const message of client.history(session, { leaf: batch[299].id })) through.push(message);
  check(through.length === 302 && through[1].content === large, `a long path in chunks (${through.length})`);
  check(through[0].content === 'What is a B-tree? ✓ 日本語 🎉', 'text kept exactly');
  let newest = 0;
  for await (const message of client.history(session, { order: 'newest', leaf: batch[299].id })) {
    if (++newest === 3) break;
  }
  const read = await client.versionedHistory(session);
  check(read !== null && read.messages.length === 2, 'a versioned read');
  check((await client.versionedHistory(session, { unlessVersion: read.version })) === null, 'a 304');
  const hits = await client.search(session, 'apple', { limit: 5 });
  check(hits.length === 5, 'a search');

  // Errors are typed; a refused write stores nothing.
  await refused(client.getSession(`${session}-missing`), 'not_found');
  await refused(client.append(session, { role: 'user', content: 'late' }, { ifLeaf: 'q1' }), 'conflict');
  check((await client.getSession(session)).leafId === 'b1', 'nothing written by a refused append');

  // The change feed: an event per write, as it happens.
  const feed = client.events(session);
  const next = feed.next();
  await new Promise((resolve) => setTimeout(resolve, 200));
  await client.append(session, { id: 'fed', role: 'user', content: 'followed' });
  const { value: event } = await next;
  await feed.return(undefined);
  check(event.event === 'append' && event.data.message.id === 'fed' && event.data.storedParentId === 'b1', 'a feed event');

  await client.deleteSession(session);
  await refused(client.getSession(session), 'not_found');

  // The adapters as an edge route uses them: a chat turn saved and loaded, an agent's items.
  const chats = new SessiondbChatStore({ client });
  const chat = await chats.createChat({ title: 'at the edge' });
  const turn = [
    { id: 'u1', role: 'user', parts: [{ type: 'text', text: 'hi' }] },
    { id: 'a1', role: 'assistant', parts: [{ type: 'text', text: 'hello ✓' }] },
  ];
  await chats.saveChat({ chatId: chat, messages: turn });
  check(JSON.stringify(await chats.loadChat(chat)) === JSON.stringify(turn), 'a chat saved and loaded');
  const items = [{ role: 'user', content: 'hi' }, { type: 'function_call', callId: 'c1', name: 'f', arguments: '{}' }];
  const agent = new SessiondbSession({ client, sessionId: `${session}-agent` });
  await agent.addItems(items);
  check(JSON.stringify(await agent.getItems()) === JSON.stringify(items), "an agent's items");
  await client.deleteSession(chat);
  await client.deleteSession(`${session}-agent`);
  return { transport: client.transportKind, derivedId: messageIdFor('x'.repeat(300)), read: through.length };
}
