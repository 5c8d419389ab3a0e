// A real `sessiondb serve` on a free loopback port with a data directory of its own. The binary
// is named by SESSIONDB_BIN (the Rust test that runs this suite passes the one cargo built); the
// tests fail, rather than skip, without it. With SESSIONDB_TEST_DATABASES (PostgreSQL connection
// strings, comma-separated) each server claims a database of its own from that list (claims are
// files in the directory SESSIONDB_TEST_CLAIMS, so test processes running at once never share
// one) and serves from it instead of the embedded store.
import { spawn } from 'node:child_process';
import { closeSync, mkdtempSync, openSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { createInterface } from 'node:readline';
import { after, before } from 'node:test';

import { Client } from '../dist/index.js';

function claimDatabase() {
  const listed = process.env.SESSIONDB_TEST_DATABASES;
  if (listed === undefined) return undefined;
  const claims = process.env.SESSIONDB_TEST_CLAIMS;
  if (!claims) throw new Error('SESSIONDB_TEST_DATABASES needs SESSIONDB_TEST_CLAIMS (a directory)');
  for (const [i, url] of listed.split(',').entries()) {
    try {
      closeSync(openSync(join(claims, `claimed-${i}`), 'wx'));
      return url;
    } catch (error) {
      if (error.code !== 'EEXIST') throw error;
    }
  }
  throw new Error('SESSIONDB_TEST_DATABASES has no database left');
}

export async function serve(...args) {
  const binary = process.env.SESSIONDB_BIN;
  if (!binary) throw new Error('SESSIONDB_BIN must name the sessiondb binary to test against');
  const data = mkdtempSync(join(tmpdir(), 'sessiondb-ts-'));
  const database = claimDatabase();
  const storage = database === undefined ? [] : ['--database', database];
  const child = spawn(binary, ['--data', data, 'serve', '--listen', '127.0.0.1:0', ...storage, ...args], {
    stdio: ['ignore', 'ignore', 'pipe'],
    env: { ...process.env, SESSIONDB_LOG: 'warn' },
  });
  const lines = createInterface({ input: child.stderr });
  const url = await new Promise((resolve, reject) => {
    child.on('exit', () => {
      rmSync(data, { recursive: true, force: true });
      reject(new Error('the server exited before listening'));
    });
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
