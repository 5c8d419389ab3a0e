// A real `sessiondb serve` on a free loopback port with a data directory of its own. The binary
// is named by SESSIONDB_BIN (the Rust test that runs this suite passes the one cargo built); the
// tests fail, rather than skip, without it.
import { spawn } from 'node:child_process';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { createInterface } from 'node:readline';

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
