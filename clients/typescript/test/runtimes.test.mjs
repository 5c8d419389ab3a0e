// The client on the other runtimes agents and their pages run on: Bun, Deno, Cloudflare Workers
// (workerd, through Miniflare) and a browser (headless Chromium, driven by puppeteer-core), all
// from npm, pinned in package.json, each with the transport it picks itself (and with `fetch`),
// running client-check.mjs against a real server.
import assert from 'node:assert/strict';
import { execFile } from 'node:child_process';
import { createHash } from 'node:crypto';
import { readdirSync, readFileSync } from 'node:fs';
import { createServer } from 'node:http';
import { extname, join, normalize } from 'node:path';
import { test } from 'node:test';
import { fileURLToPath } from 'node:url';
import { promisify } from 'node:util';

import chromium from '@sparticuz/chromium';
import { Miniflare } from 'miniflare';
import puppeteer from 'puppeteer-core';

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
      // Each of these runtimes has Node's modules (and `process.versions.node`), so Node's transport.
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

/** A page's origin serving the package's files (the client's modules and client-check.mjs) and a
 * page that runs the check against the server `serverUrl()` names and leaves what it found in
 * `window.found`. */
async function pageOrigin(serverUrl) {
  const root = fileURLToPath(new URL('..', import.meta.url));
  const page = () => `<!doctype html><script type="module">
    import { Client } from '/dist/index.js';
    import { checkClient } from '/test/client-check.mjs';
    window.found = await checkClient(new Client({ baseUrl: ${JSON.stringify(serverUrl())} }))
      .catch((error) => ({ failed: String(error?.stack ?? error) }));
  </script>`;
  const origin = createServer((request, answer) => {
    const path = normalize(decodeURIComponent(new URL(request.url, 'http://page').pathname));
    if (path === '/check.html') return answer.writeHead(200, { 'content-type': 'text/html' }).end(page());
    if (!/^\/(dist|test)\/[\w.-]+\.m?js$/.test(path)) return answer.writeHead(404).end();
    answer.writeHead(200, { 'content-type': 'text/javascript' }).end(readFileSync(join(root, path)));
  });
  await new Promise((resolve) => origin.listen(0, '127.0.0.1', resolve));
  return { url: `http://127.0.0.1:${origin.address().port}`, close: () => origin.close() };
}

test('the client works in a browser page of another origin, through CORS, on fetch', async () => {
  // The server allows the page's origin, so the origin comes first.
  let server;
  const origin = await pageOrigin(() => server.url);
  server = await serve('--cors-origin', origin.url);
  // The package's flags for serverless hosts, less those that would let the page past CORS.
  const args = chromium.args.filter((flag) => !['--disable-web-security', '--allow-running-insecure-content'].includes(flag));
  const browser = await puppeteer.launch({ executablePath: await chromium.executablePath(), args, headless: true });
  try {
    const page = await browser.newPage();
    await page.goto(`${origin.url}/check.html`);
    await page.waitForFunction(() => window.found !== undefined, { timeout: 60_000 });
    assert.deepEqual(await page.evaluate(() => window.found), expected('fetch'));
  } finally {
    await browser.close();
    origin.close();
    await server.stop();
  }
});
