// One round of the AI SDK part of the adapter benchmark (run by bench/adapters/run.py, after it
// built clients/typescript): a chat route's store work per turn, `loadChat` and then `saveChat`
// with the turn's question and answer added, on the AI SDK persistence guide's file store and on
// `SessiondbChatStore` through a release server. Prints one JSON line per store:
// {store, framework, ms: [...per turn], size_bytes}.
//
//     node ai_sdk.mjs SERVER_BINARY SCRATCH ORDER TURNS
import { readFile, writeFile } from 'node:fs/promises';
import { join } from 'node:path';

import { SessiondbChatStore } from '../../clients/typescript/dist/ai-sdk.js';
import { eachStore, text } from './node_common.mjs';

/** The guide's store: one JSON file per chat, read whole and written whole (no fsync). */
function fileStore(dir) {
  const file = (id) => join(dir, `${id}.json`);
  return {
    async loadChat(id) {
      try {
        return JSON.parse(await readFile(file(id), 'utf8'));
      } catch (error) {
        if (error.code === 'ENOENT') return [];
        throw error;
      }
    },
    async saveChat({ chatId, messages }) {
      await writeFile(file(chatId), JSON.stringify(messages, null, 2));
    },
  };
}

async function turns(chats, count) {
  const ms = [];
  for (let i = 0; i < count; i++) {
    const started = performance.now();
    const messages = await chats.loadChat('bench');
    messages.push(
      { id: `u${i}`, role: 'user', parts: [{ type: 'text', text: text(2 * i) }] },
      { id: `msg-${i}`, role: 'assistant', parts: [{ type: 'step-start' }, { type: 'text', text: text(2 * i + 1), state: 'done' }] },
    );
    await chats.saveChat({ chatId: 'bench', messages });
    ms.push(performance.now() - started);
  }
  return ms;
}

const [binary, scratch, order, count] = process.argv.slice(2);
await eachStore(
  { binary, scratch, order, framework: 'ai-sdk' },
  (folder) => turns(fileStore(folder), Number(count)),
  (client) => turns(new SessiondbChatStore({ client }), Number(count)),
);
