// What the client computes itself so that it runs where Node's modules are not: SHA-256 for
// derived ids and base64 for LangGraph's values, checked against Node's own.
import assert from 'node:assert/strict';
import { execFileSync } from 'node:child_process';
import { createHash, randomBytes } from 'node:crypto';
import { test } from 'node:test';

import { sha256Hex } from '../dist/sha256.js';

test('SHA-256 is Node\'s, at every padding boundary and for any text', () => {
  const texts = ['', 'abc', '日本語 ✓ 🎉', 'x'.repeat(1000)];
  for (let length = 50; length <= 130; length++) texts.push('a'.repeat(length));
  for (const text of texts) {
    assert.equal(sha256Hex(text), createHash('sha256').update(text, 'utf8').digest('hex'), `${text.length} characters`);
  }
});

test('base64 without Node\'s Buffer is Buffer\'s', () => {
  const samples = [0, 1, 2, 3, 4, 100, 100_000].map((size) => randomBytes(size));
  // A runtime without `Buffer` (a browser, a worker) takes the btoa/atob way.
  const script = `
    import { readFileSync } from 'node:fs';
    const samples = JSON.parse(readFileSync(0, 'utf8'));
    delete globalThis.Buffer;
    const { base64Of, bytesOf, concatBytes } = await import(${JSON.stringify(new URL('../dist/bytes.js', import.meta.url).href)});
    const out = samples.map((base64) => {
      const bytes = bytesOf(base64);
      return { again: base64Of(bytes), joined: base64Of(concatBytes([bytes, bytes])) };
    });
    console.log(JSON.stringify(out));`;
  const given = JSON.stringify(samples.map((bytes) => bytes.toString('base64')));
  const out = JSON.parse(execFileSync(process.execPath, ['--input-type=module', '-e', script], { input: given, encoding: 'utf8', maxBuffer: 1 << 24 }));
  samples.forEach((bytes, i) => {
    assert.equal(out[i].again, bytes.toString('base64'), `${bytes.length} bytes`);
    assert.equal(out[i].joined, Buffer.concat([bytes, bytes]).toString('base64'), `${bytes.length} bytes twice`);
  });
});
