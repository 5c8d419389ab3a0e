// What the Node parts of the adapter benchmark share: the turns' texts and a round over the
// framework's own store and sessiondb (a release `sessiondb serve` of its own).
import { spawn } from 'node:child_process';
import { mkdirSync, readdirSync, statSync } from 'node:fs';
import { join } from 'node:path';
import { createInterface } from 'node:readline';

import { Client } from '../../clients/typescript/dist/index.js';

const WORDS = 'alpha beta gamma delta epsilon zeta eta theta iota kappa lambda mu nu xi omicron pi rho sigma tau upsilon'.split(' ');

/** ~200 characters of words, different for every `i`. */
export function text(i) {
  const words = [];
  for (let k = 0; words.join(' ').length < 190; k++) words.push(WORDS[(i * 7 + k * k) % WORDS.length]);
  return `${words.join(' ')} ${i}`;
}

/** The size of the files under `dir`. */
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

/**
 * Runs one round of `framework` for each store of `order` (`own`, `sessiondb`) in a folder of
 * its own under `scratch`: `own(folder)` and `sessiondb(client)` each give the per-step times;
 * sessiondb's store is a release server on its folder. Prints one JSON line per store.
 */
export async function eachStore({ binary, scratch, order, framework }, own, sessiondb) {
  for (const store of order.split(',')) {
    const folder = join(scratch, `${framework}-${store}`);
    mkdirSync(folder, { recursive: true });
    let ms;
    let size;
    if (store === 'own') {
      ms = await own(folder);
      size = dirSize(folder);
    } else {
      const server = await serve(binary, folder);
      const client = new Client({ baseUrl: server.url });
      ms = await sessiondb(client);
      client.close();
      size = await server.stop();
    }
    console.log(JSON.stringify({ store, framework, ms, size_bytes: size }));
  }
}
