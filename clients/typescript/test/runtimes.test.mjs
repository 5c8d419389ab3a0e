// The client on the other runtimes agents are deployed on: Bun and Deno (both from npm, pinned in
// package.json), each with the transport it picks itself and with `fetch`, run through
// runtime-check.mjs against a real server.
import assert from 'node:assert/strict';
import { execFile } from 'node:child_process';
import { createHash } from 'node:crypto';
import { test } from 'node:test';
import { fileURLToPath } from 'node:url';
import { promisify } from 'node:util';

import { serve } from './served.mjs';

const run = promisify(execFile);
const bin = (name) => fileURLToPath(new URL(`../node_modules/.bin/${name}`, import.meta.url));
const script = fileURLToPath(new URL('./runtime-check.mjs', import.meta.url));
const RUNTIMES = {
  node: (url, transport) => [process.execPath, [script, url, transport]],
  bun: (url, transport) => [bin('bun'), [script, url, transport]],
  deno: (url, transport) => [bin('deno'), ['run', '--allow-net', '--allow-env', '--allow-read', script, url, transport]],
};

for (const [runtime, command] of Object.entries(RUNTIMES)) {
  test(`the client works on ${runtime}, on its own transport and on fetch`, async () => {
    const served = await serve();
    try {
      // Each of these runtimes has Node's `http` (and `process.versions.node`), so Node's transport.
      for (const [transport, expected] of [['default', 'node'], ['fetch', 'fetch']]) {
        const [file, args] = command(served.url, transport);
        const { stdout } = await run(file, args, { env: { ...process.env, NO_COLOR: '1' }, timeout: 60_000 });
        assert.deepEqual(JSON.parse(stdout.trim().split('\n').at(-1)), {
          transport: expected,
          derivedId: `sha256:${createHash('sha256').update('x'.repeat(300)).digest('hex')}`,
          read: 302,
        }, `${runtime} with ${transport}`);
      }
    } finally {
      await served.stop();
    }
  });
}
