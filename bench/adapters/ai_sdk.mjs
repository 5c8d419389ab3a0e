// One round of the AI SDK part of the adapter benchmark (run by bench/adapters/run.py, after it
// built clients/typescript): a chat route's store work per turn, `loadChat` and then `saveChat`
// with the turn's question and answer added, on the AI SDK persistence guide's file store and on
// `SessiondbChatStore` through a release server. Prints one JSON line per store:
// {store, framework, ms: [...per turn], size_bytes}.
//
//     node ai_sdk.mjs SERVER_BINARY SCRATCH ORDER TURNS
import { spawn } from 'node:child_process';
import { mkdirSync, readdirSync, statSync } from 'node:fs';
import { readFile, writeFile } from 'node:fs/promises';
import { join } from 'node:path';
import { createInterface } from 'node:readline';

import { SessiondbChatStore } from '../../clients/typescript/dist/ai-sdk.js';
import { Client } from '../../clients/typescript/dist/index.js';

const WORDS = 'alpha beta gamma delta epsilon zeta eta theta iota kappa lambda mu nu xi omicron pi rho sigma tau upsilon'.split(' ');

/** ~200 characters of words, different for every `i`. */
function text(i) {
  const words = [];
  for (let k = 0; words.join(' ').length < 190; k++) words.push(WORDS[(i * 7 + k * k) % WORDS.length]);
  return `${words.join(' ')} ${i}`;
}

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

function dirSize(dir) {
  return readdirSync(dir, { recursive: true })
    .map((name) => statSync(join(dir, name)))
    .filter((stat) => stat.isFile())
    .reduce((sum, stat) => sum + stat.size, 0);
}

/** A release `sessiondb serve` on its own data directory (durable: synchronous=full). */
async function serve(binary, data) {
  const child = spawn(binary, ['--data', data, 'serve', '--listen', '127.0.0.1:0'], {
    stdio: ['ignore', 'ignore', 'pipe'],
    env: { ...process.env, SESSIONDB_LOG: 'warn' },
  });
  const url = await new Promise((resolve, reject) => {
    child.once('exit', () => reject(new Error('the server exited before listening')));
    createInterface({ input: child.stderr }).on('line', (line) => {
      if (line.startsWith('sessiondb listening on ')) resolve(line.slice('sessiondb listening on '.length).trim());
    });
  });
  return {
    url,
    /** Graceful stop (the store checkpoints and closes), then the files' size. */
    async stop() {
      const exited = new Promise((resolve) => child.once('exit', resolve));
      child.kill('SIGTERM');
      await exited;
      return dirSize(data);
    },
  };
}

const [binary, scratch, order, count] = process.argv.slice(2);
for (const store of order.split(',')) {
  const folder = join(scratch, `ai-sdk-${store}`);
  mkdirSync(folder, { recursive: true });
  let ms;
  let size;
  if (store === 'own') {
    ms = await turns(fileStore(folder), Number(count));
    size = dirSize(folder);
  } else {
    const server = await serve(binary, folder);
    const client = new Client({ baseUrl: server.url });
    ms = await turns(new SessiondbChatStore({ client }), Number(count));
    client.close();
    size = await server.stop();
  }
  console.log(JSON.stringify({ store, framework: 'ai-sdk', ms, size_bytes: size }));
}
