// The client's use of HTTP against a local socket that answers with given bytes: a kept
// connection the server dropped, answers cut short, and paths sent as they are.
import assert from 'node:assert/strict';
import { createServer } from 'node:net';
import { test } from 'node:test';

import { Client, SessiondbUnavailable } from '../dist/index.js';

/**
 * Answers each request (read up to its blank line; these carry no body) with the next of
 * `answers`; `null` closes the connection instead. Resolves to its URL and the request lines.
 */
async function canned(answers) {
  const requests = [];
  const server = createServer((socket) => {
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
        socket.write(answer);
      }
    });
  });
  await new Promise((resolve) => server.listen(0, '127.0.0.1', resolve));
  return { url: `http://127.0.0.1:${server.address().port}`, requests, close: () => server.close() };
}

const json = (body) => `HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: ${Buffer.byteLength(body)}\r\n\r\n${body}`;

test('a dropped kept connection resends a read but never a POST', async () => {
  let server = await canned([json('{}'), null, json('{"resent":true}')]);
  let client = new Client({ baseUrl: server.url, timeoutMs: 5000 });
  await client.request('GET', '/warm');
  assert.deepEqual(await client.request('GET', '/read'), { resent: true });
  assert.deepEqual(server.requests, ['GET /warm HTTP/1.1', 'GET /read HTTP/1.1', 'GET /read HTTP/1.1']);
  client.close();
  server.close();

  server = await canned([json('{}'), null, json('{}')]);
  client = new Client({ baseUrl: server.url, timeoutMs: 5000 });
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
  const client = new Client({ baseUrl: server.url, timeoutMs: 300 });
  await assert.rejects(client.request('GET', '/cut'), SessiondbUnavailable);
  await client.request('GET', '/v1/sessions/../state/.');
  assert.equal(server.requests.at(-1), 'GET /v1/sessions/../state/. HTTP/1.1');
  client.close();
  server.close();
});
