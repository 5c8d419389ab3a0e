// The client's use of HTTP against a local socket that answers with given bytes: a kept
// connection the server dropped, answers cut short, and paths sent as they are; on Node's
// transport and on fetch's, and the client on a runtime without Node's modules.
import assert from 'node:assert/strict';
import { execFileSync } from 'node:child_process';
import { readFileSync } from 'node:fs';
import { createServer } from 'node:net';
import { test } from 'node:test';

import { Client, SessiondbError, SessiondbUnavailable } from '../dist/index.js';
import { serve } from './served.mjs';

/**
 * Answers each request (read up to its blank line; these carry no body) with the next of
 * `answers`: bytes, or a list of them written a few milliseconds apart (so they arrive apart);
 * `null` closes the connection instead, as does an answer ending in `CLOSE`. Resolves to its
 * URL, the request lines and how many connections it took.
 */
async function canned(answers) {
  const requests = [];
  let connections = 0;
  const server = createServer((socket) => {
    connections += 1;
    let buffered = '';
    socket.on('data', (data) => {
      buffered += data.toString('latin1');
      let end;
      while ((end = buffered.indexOf('\r\n\r\n')) >= 0) {
        requests.push(buffered.slice(0, buffered.indexOf('\r\n')));
        buffered = buffered.slice(end + 4);
        const answer = answers.shift();
        if (answer === null || answer === undefined) {
          socket.destroy();
          return;
        }
        const parts = Array.isArray(answer) ? answer : [answer];
        parts.forEach((part, i) =>
          setTimeout(() => {
            if (part === CLOSE) socket.end();
            else socket.write(part);
          }, 5 * i),
        );
      }
    });
  });
  await new Promise((resolve) => server.listen(0, '127.0.0.1', resolve));
  const close = () => {
    server.close();
    server.closeAllConnections?.();
  };
  return { url: `http://127.0.0.1:${server.address().port}`, requests, close, connections: () => connections };
}

const CLOSE = Symbol('close');

const json = (body) => `HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: ${Buffer.byteLength(body)}\r\n\r\n${body}`;

test('a dropped kept connection resends a read but never a POST', async () => {
  let server = await canned([json('{}'), null, json('{"resent":true}')]);
  let client = new Client({ baseUrl: server.url, timeoutMs: 5000, transport: 'node' });
  await client.request('GET', '/warm');
  assert.deepEqual(await client.request('GET', '/read'), { resent: true });
  assert.deepEqual(server.requests, ['GET /warm HTTP/1.1', 'GET /read HTTP/1.1', 'GET /read HTTP/1.1']);
  client.close();
  server.close();

  server = await canned([json('{}'), null, json('{}')]);
  client = new Client({ baseUrl: server.url, timeoutMs: 5000, transport: 'node' });
  await client.request('GET', '/warm');
  // The POST may have been applied before the connection went: it is not sent again.
  await assert.rejects(client.request('POST', '/append', { body: {} }), SessiondbUnavailable);
  assert.equal(server.requests.length, 2);
  client.close();
  server.close();
});

test('answers cut short are unavailable; paths go as they are', async () => {
  const server = await canned([
    'HTTP/1.1 200 OK\r\ncontent-length: 10\r\n\r\n{"a"',
    json('{}'),
  ]);
  // The server never sends the rest; the client gives up when nothing came for its timeout.
  const client = new Client({ baseUrl: server.url, timeoutMs: 300, transport: 'node' });
  await assert.rejects(client.request('GET', '/cut'), SessiondbUnavailable);
  await client.request('GET', '/v1/sessions/../state/.');
  assert.equal(server.requests.at(-1), 'GET /v1/sessions/../state/. HTTP/1.1');
  client.close();
  server.close();
});

test("Node's transport reads every framing a server or a proxy may answer with", async () => {
  const server = await canned([
    // A head and a chunked body in pieces, with a chunk extension, a split UTF-8 character and
    // trailers; interim answers before it; headers in any case, one repeated.
    [
      'HTTP/1.1 103 Early Hints\r\nlink: </x>\r\n\r\nHTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nX-Sessiondb-Version: 7\r\nx-sessiondb-version: 8\r\n',
      '\r\n5;name=value\r\n{"a":\r\n5\r\n"\xc3',
      '\xa9"}\r\n0\r\ntrailer: yes\r\n\r\n',
    ].map((part) => Buffer.from(part, 'latin1')),
    // No body, then another answer on the same connection.
    'HTTP/1.1 204 No Content\r\n\r\n',
    json('{"kept":true}'),
    // A body that runs to the end of the connection.
    ['HTTP/1.0 200 OK\r\ncontent-type: application/json\r\n\r\n{"until":', '"closed"}', CLOSE],
    json('{"reopened":true}'),
    // A body framed by length whose connection the server says it closes.
    'HTTP/1.1 200 OK\r\nconnection: close\r\ncontent-length: 2\r\n\r\n{}',
    json('{"again":true}'),
    // Bytes after the answer, which nobody asked for: the connection is not used again.
    json('{"extra":1}') + 'HTTP/1.1 408 Request Timeout\r\ncontent-length: 0\r\n\r\n',
    json('{"fresh":true}'),
    ['HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n5\r\n{"a":', CLOSE],
    'not http at all\r\n\r\n',
  ]);
  const client = new Client({ baseUrl: server.url, timeoutMs: 5000, transport: 'node' });
  assert.deepEqual(await client.request('GET', '/chunked'), { a: 'é' });
  assert.equal(await client.request('DELETE', '/nothing'), undefined);
  assert.deepEqual(await client.request('GET', '/kept'), { kept: true });
  assert.equal(server.connections(), 1, 'the connection was kept');
  assert.deepEqual(await client.request('GET', '/until-closed'), { until: 'closed' });
  assert.deepEqual(await client.request('GET', '/reopened'), { reopened: true });
  assert.equal(server.connections(), 2);
  assert.deepEqual(await client.request('GET', '/closing'), {});
  assert.deepEqual(await client.request('GET', '/again'), { again: true });
  assert.equal(server.connections(), 3);
  assert.deepEqual(await client.request('GET', '/extra'), { extra: 1 });
  assert.deepEqual(await client.request('GET', '/fresh'), { fresh: true });
  assert.equal(server.connections(), 4);
  await assert.rejects(client.request('GET', '/cut'), SessiondbUnavailable);
  await assert.rejects(client.request('GET', '/garbled'), (e) => e instanceof SessiondbUnavailable && /status line/.test(e.message));
  // What HTTP cannot carry is refused unsent.
  const keyed = new Client({ baseUrl: server.url, apiKey: 'key\r\nx-injected: yes', transport: 'node' });
  await assert.rejects(keyed.request('GET', '/never'), (e) => e.code === 'invalid_request' && !(e instanceof SessiondbUnavailable));
  assert.equal(server.requests.filter((r) => r.includes('never')).length, 0);
  client.close();
  keyed.close();
  server.close();
});

/**
 * Reads each request's head and body (of its content-length) and answers `{"got": <body bytes>}`
 * once the body is in. `onHead(head)` says what comes first: `continue` answers `100 Continue`
 * (and drops the connection if the body is not all in within half a second), `refuse` answers
 * 413 at once (any body sent after it is counted, never answered), `wait`
 * nothing. Resolves to its URL, the requests (`{head, received}`) and the connections it took.
 */
async function bodyServer(onHead) {
  const requests = [];
  let connections = 0;
  const refusal = '{"error":{"code":"payload_too_large","message":"too long"}}';
  const server = createServer((socket) => {
    connections += 1;
    let buffered = Buffer.alloc(0);
    let due; // the request whose body is being read: { request, length, answered }
    socket.on('data', (data) => {
      buffered = Buffer.concat([buffered, data]);
      for (;;) {
        if (due === undefined) {
          const end = buffered.indexOf('\r\n\r\n');
          if (end < 0) return;
          const head = buffered.toString('latin1', 0, end);
          buffered = buffered.subarray(end + 4);
          const request = { head, received: 0 };
          requests.push(request);
          const action = onHead(head);
          if (action === 'refuse') {
            socket.write(`HTTP/1.1 413 Payload Too Large\r\ncontent-length: ${refusal.length}\r\n\r\n${refusal}`);
          }
          if (action === 'continue') {
            socket.write('HTTP/1.1 100 Continue\r\n\r\n');
            // As a server gives up on a body it asked for that does not come.
            const length = Number(/\r\ncontent-length: (\d+)/i.exec(head)?.[1] ?? 0);
            setTimeout(() => request.received < length && socket.destroy(), 500);
          }
          due = { request, length: Number(/\r\ncontent-length: (\d+)/i.exec(head)?.[1] ?? 0), answered: action === 'refuse' };
        }
        const taken = Math.min(due.length - due.request.received, buffered.length);
        due.request.received += taken;
        buffered = buffered.subarray(taken);
        if (due.request.received < due.length) return;
        if (!due.answered) socket.write(json(`{"got":${due.length}}`));
        due = undefined;
      }
    });
  });
  await new Promise((resolve) => server.listen(0, '127.0.0.1', resolve));
  const close = () => {
    server.close();
    server.closeAllConnections?.();
  };
  return { url: `http://127.0.0.1:${server.address().port}`, requests, close, connections: () => connections };
}

test('a body over 1 MiB is sent once the server asks for it, and never to one that answered first', async () => {
  const big = 'x'.repeat(2 << 20);
  const asks = (head) => /\r\nexpect: 100-continue\r\n/i.test(`${head}\r\n`);
  let server = await bodyServer((head) => (asks(head) ? 'continue' : 'wait'));
  let client = new Client({ baseUrl: server.url, timeoutMs: 5000, transport: 'node' });
  assert.deepEqual(await client.request('POST', '/big', { body: big }), { got: big.length + 2 });
  assert.deepEqual(await client.request('POST', '/small', { body: {} }), { got: 2 });
  assert.deepEqual(server.requests.map((r) => asks(r.head)), [true, false]);
  assert.equal(server.connections(), 1);
  client.close();
  server.close();

  // Refused on its head: the body is not sent, and the connection (still owed it) not used again.
  server = await bodyServer((head) => (asks(head) ? 'refuse' : 'wait'));
  client = new Client({ baseUrl: server.url, timeoutMs: 5000, transport: 'node' });
  await assert.rejects(client.request('POST', '/big', { body: big }), (e) => e instanceof SessiondbError && e.status === 413 && e.code === 'payload_too_large');
  assert.deepEqual(await client.request('POST', '/small', { body: {} }), { got: 2 });
  assert.equal(server.requests[0].received, 0);
  assert.equal(server.connections(), 2);
  client.close();
  server.close();

  // A server that does not answer `Expect` gets the body after a second.
  server = await bodyServer(() => 'wait');
  client = new Client({ baseUrl: server.url, timeoutMs: 5000, transport: 'node' });
  assert.deepEqual(await client.request('POST', '/big', { body: big }), { got: big.length + 2 });
  client.close();
  server.close();
});

test('on fetch, answers cut short are unavailable and dot segments are refused unsent', async () => {
  const server = await canned(['HTTP/1.1 200 OK\r\ncontent-length: 10\r\n\r\n{"a"', json('{"b":1}')]);
  const client = new Client({ baseUrl: server.url, timeoutMs: 300, transport: 'fetch' });
  await assert.rejects(client.request('GET', '/cut'), SessiondbUnavailable);
  assert.deepEqual(await client.request('GET', '/whole'), { b: 1 });
  for (const path of ['/v1/sessions/../state', '/v1/sessions/%2E/state', '/v1/sessions/s/messages/%2e%2E']) {
    await assert.rejects(client.request('GET', path), (e) => e.code === 'invalid_request' && !(e instanceof SessiondbUnavailable) && /as it is/.test(e.message));
  }
  assert.deepEqual(server.requests, ['GET /cut HTTP/1.1', 'GET /whole HTTP/1.1']);
  assert.throws(() => new Client({ baseUrl: server.url, ca: 'pem', transport: 'fetch' }), TypeError);
  client.close();
  server.close();
});

test('where Node is not, the client loads and speaks fetch', async () => {
  const served = await serve();
  try {
    // A runtime without `process` (a browser, a worker) has no Node modules to load.
    const script = `
      const url = process.argv[1];
      delete globalThis.process;
      const { Client } = await import(${JSON.stringify(new URL('../dist/index.js', import.meta.url).href)});
      const client = new Client({ baseUrl: url });
      await client.append('no-node', { role: 'user', content: 'hi' });
      const read = [];
      for await (const message of client.history('no-node')) read.push(message.content);
      console.log(JSON.stringify({ transport: client.transportKind, read }));`;
    const out = execFileSync(process.execPath, ['--input-type=module', '-e', script, served.url], { encoding: 'utf8' });
    assert.deepEqual(JSON.parse(out), { transport: 'fetch', read: ['hi'] });
    // Nor does a bundle for such a runtime meet a Node module: none is imported up front.
    for (const module of ['index', 'client', 'transport', 'sha256', 'ai-sdk', 'openai-agents', 'langchain', 'adk', 'langgraph', 'langgraph-store']) {
      const code = readFileSync(new URL(`../dist/${module}.js`, import.meta.url), 'utf8');
      assert.doesNotMatch(code, /from ['"]node:|require\(/, module);
    }
    const client = new Client({ baseUrl: served.url });
    assert.equal(client.transportKind, Client.defaultTransport);
    await assert.rejects(client.getSession('.'), (e) => e instanceof SessiondbError);
    client.close();
  } finally {
    await served.stop();
  }
});
