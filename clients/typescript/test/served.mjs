// A real `sessiondb serve` on a free loopback port with a data directory of its own. The binary
// is named by SESSIONDB_BIN (the Rust test that runs this suite passes the one cargo built); the
// tests fail, rather than skip, without it.
import { spawn } from 'node:child_process';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { createInterface } from 'node:readline';
import { after, before } from 'node:test';

import { Client } from '../dist/index.js';

export async function serve(...args) {
  const binary = process.env.SESSIONDB_BIN;
  if (!binary) throw new Error('SESSIONDB_BIN must name the sessiondb binary to test against');
  const data = mkdtempSync(join(tmpdir(), 'sessiondb-ts-'));
  const child = spawn(binary, ['--data', data, 'serve', '--listen', '127.0.0.1:0', ...args], {
    stdio: ['ignore', 'ignore', 'pipe'],
    env: { ...process.env, SESSIONDB_LOG: 'warn' },
  });
  const lines = createInterface({ input: child.stderr });
  const url = await new Promise((resolve, reject) => {
    child.on('exit', () => reject(new Error('the server exited before listening')));
    lines.on('line', (line) => {
      if (line.startsWith('sessiondb listening on ')) resolve(line.slice('sessiondb listening on '.length).trim());
    });
  });
  return {
    url,
    async stop() {
      const exited = new Promise((resolve) => child.once('exit', resolve));
      child.kill('SIGKILL');
      await exited;
      rmSync(data, { recursive: true, force: true });
    },
  };
}

/**
 * One server for the whole test file, and a client of it: `shared.client` once `before` ran.
 */
export function sharedServer() {
  const shared = {};
  before(async () => {
    shared.served = await serve();
    shared.client = new Client({ baseUrl: shared.served.url });
  });
  after(() => shared.served.stop());
  return shared;
}

/** Everything an async iterable yields. */
export async function all(iterable) {
  const out = [];
  for await (const x of iterable) out.push(x);
  return out;
}
