// The client on the other runtimes agents are deployed on: Bun, Deno and Cloudflare Workers
// (workerd, through Miniflare; all from npm, pinned in package.json), each with the transport it
// picks itself and with `fetch`, running client-check.mjs against a real server.
import assert from 'node:assert/strict';
import { execFile } from 'node:child_process';
import { createHash } from 'node:crypto';
import { readdirSync } from 'node:fs';
import { test } from 'node:test';
import { fileURLToPath } from 'node:url';
import { promisify } from 'node:util';

import { Miniflare } from 'miniflare';

import { serve } from './served.mjs';

const run = promisify(execFile);
const bin = (name) => fileURLToPath(new URL(`../node_modules/.bin/${name}`, import.meta.url));
const script = fileURLToPath(new URL('./runtime-check.mjs', import.meta.url));
const RUNTIMES = {
  node: (url, transport) => [process.execPath, [script, url, transport]],
  bun: (url, transport) => [bin('bun'), [script, url, transport]],
  deno: (url, transport) => [bin('deno'), ['run', '--allow-net', '--allow-env', '--allow-read', script, url, transport]],
};

const expected = (transport) => ({
  transport,
  derivedId: `sha256:${createHash('sha256').update('x'.repeat(300)).digest('hex')}`,
  read: 302,
});

for (const [runtime, command] of Object.entries(RUNTIMES)) {
  test(`the client works on ${runtime}, on its own transport and on fetch`, async () => {
    const served = await serve();
    try {
      // Each of these runtimes has Node's `http` (and `process.versions.node`), so Node's transport.
      for (const [transport, picked] of [['default', 'node'], ['fetch', 'fetch']]) {
        const [file, args] = command(served.url, transport);
        const { stdout } = await run(file, args, { env: { ...process.env, NO_COLOR: '1' }, timeout: 60_000 });
        assert.deepEqual(JSON.parse(stdout.trim().split('\n').at(-1)), expected(picked), `${runtime} with ${transport}`);
      }
    } finally {
      await served.stop();
    }
  });
}

test('the client works in a Cloudflare Worker, with and without nodejs_compat, on fetch', async () => {
  const root = fileURLToPath(new URL('..', import.meta.url));
  const modules = ['test/worker-check.mjs', 'test/client-check.mjs', ...readdirSync(`${root}/dist`).filter((f) => f.endsWith('.js')).map((f) => `dist/${f}`)];
  const served = await serve();
  try {
    // A Worker with `nodejs_compat` has `process.versions.node` and a partial `node:http` over
    // fetch, which fails on streamed answers: the client takes fetch there by itself.
    for (const compatibilityFlags of [[], ['nodejs_compat']]) {
      const worker = new Miniflare({
        modulesRoot: root,
        modules: modules.map((path) => ({ type: 'ESModule', path: `${root}/${path}` })),
        compatibilityDate: '2026-07-01',
        compatibilityFlags,
      });
      try {
        for (const transport of ['default', 'fetch']) {
          const answer = await worker.dispatchFetch(`http://worker/?server=${encodeURIComponent(served.url)}&transport=${transport}`);
          assert.deepEqual(await answer.json(), expected('fetch'), `${compatibilityFlags} ${transport}`);
        }
      } finally {
        await worker.dispose();
      }
    }
  } finally {
    await served.stop();
  }
});
