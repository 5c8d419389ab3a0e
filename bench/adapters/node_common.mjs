// What the Node parts of the adapter benchmark share: the turns' texts, a folder's size and a
// release `sessiondb serve` of their own.
import { spawn } from 'node:child_process';
import { readdirSync, statSync } from 'node:fs';
import { join } from 'node:path';
import { createInterface } from 'node:readline';

const WORDS = 'alpha beta gamma delta epsilon zeta eta theta iota kappa lambda mu nu xi omicron pi rho sigma tau upsilon'.split(' ');

/** ~200 characters of words, different for every `i`. */
export function text(i) {
  const words = [];
  for (let k = 0; words.join(' ').length < 190; k++) words.push(WORDS[(i * 7 + k * k) % WORDS.length]);
  return `${words.join(' ')} ${i}`;
}

/** The size of the files under `dir`. */
export function dirSize(dir) {
  return readdirSync(dir, { recursive: true })
    .map((name) => statSync(join(dir, name)))
    .filter((stat) => stat.isFile())
    .reduce((sum, stat) => sum + stat.size, 0);
}

/** A release `sessiondb serve` on its own data directory (durable: synchronous=full). */
export async function serve(binary, data) {
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
