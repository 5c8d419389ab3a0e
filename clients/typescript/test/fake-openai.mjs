// Local stand-ins for the OpenAI API: they answer with scripted replies, in order, and record
// every request body, so a test sees what the SDK sent the model. Only the model is faked; the
// SDKs and sessiondb are real.
import { createServer } from 'node:http';

/**
 * A server on a free loopback port that answers `POST /v1/<route>` from `script` with
 * `answer(body, next, res)` (`next` the script's next entry) while the script lasts, and
 * anything else with a 404.
 */
async function scripted(route, answer) {
  const requests = [];
  const script = [];
  const server = createServer((req, res) => {
    let raw = '';
    req.on('data', (chunk) => (raw += chunk));
    req.on('end', () => {
      if (req.method !== 'POST' || req.url !== `/v1/${route}` || script.length === 0) {
        res.writeHead(404, { 'content-type': 'application/json' });
        return res.end(JSON.stringify({ error: { message: `unexpected ${req.method} ${req.url}` } }));
      }
      const body = JSON.parse(raw);
      requests.push(body);
      answer(body, script.shift(), res);
    });
  });
  await new Promise((resolve) => server.listen(0, '127.0.0.1', resolve));
  return {
    url: `http://127.0.0.1:${server.address().port}/v1`,
    requests,
    script,
    close: () => new Promise((resolve) => server.close(resolve)),
  };
}

/** The Responses API (`POST /v1/responses`), not streaming: each reply is one response's output. */
export async function fakeResponses() {
  let ids = 0;
  const fake = await scripted('responses', (body, output, res) => {
    res.writeHead(200, { 'content-type': 'application/json' });
    res.end(JSON.stringify({
      id: `resp_${++ids}`, object: 'response', created_at: 1_700_000_000, status: 'completed',
      model: body.model ?? 'gpt-4o', output, parallel_tool_calls: true,
      tool_choice: 'auto', tools: [], temperature: 1, top_p: 1, error: null,
      incomplete_details: null, instructions: body.instructions ?? null, metadata: {},
      text: { format: { type: 'text' } },
      usage: { input_tokens: 10, output_tokens: 5, total_tokens: 15,
               input_tokens_details: { cached_tokens: 0 }, output_tokens_details: { reasoning_tokens: 0 } },
    }));
  });
  return {
    ...fake,
    reply(text) {
      fake.script.push([{ type: 'message', id: `msg_fake_${++ids}`, status: 'completed', role: 'assistant',
                          content: [{ type: 'output_text', text, annotations: [] }] }]);
    },
    callTool(name, args, callId) {
      fake.script.push([{ type: 'function_call', id: `fc_fake_${++ids}`, call_id: callId, name,
                          arguments: JSON.stringify(args), status: 'completed' }]);
    },
  };
}

/**
 * The Chat Completions API streaming (`POST /v1/chat/completions` with `stream: true`): each
 * reply is sent as server-sent `chat.completion.chunk` events ending in `data: [DONE]`.
 */
export async function fakeChatCompletions() {
  let ids = 0;
  const fake = await scripted('chat/completions', (body, reply, res) => {
    const id = `chatcmpl_${++ids}`;
    const chunk = (delta, finishReason = null, extra = {}) =>
      `data: ${JSON.stringify({
        id, object: 'chat.completion.chunk', created: 1_700_000_000, model: body.model,
        choices: [{ index: 0, delta, finish_reason: finishReason }], ...extra,
      })}\n\n`;
    res.writeHead(200, { 'content-type': 'text/event-stream' });
    res.write(chunk({ role: 'assistant', content: '' }));
    if (reply.text !== undefined) {
      // Two deltas, so the SDK assembles the text as it would from a real stream.
      const half = Math.ceil(reply.text.length / 2);
      res.write(chunk({ content: reply.text.slice(0, half) }));
      res.write(chunk({ content: reply.text.slice(half) }));
    } else {
      res.write(chunk({
        tool_calls: [{ index: 0, id: reply.callId, type: 'function',
                       function: { name: reply.name, arguments: JSON.stringify(reply.args) } }],
      }));
    }
    res.write(chunk({}, reply.text !== undefined ? 'stop' : 'tool_calls', {
      usage: { prompt_tokens: 10, completion_tokens: 5, total_tokens: 15 },
    }));
    res.end('data: [DONE]\n\n');
  });
  return {
    ...fake,
    reply(text) {
      fake.script.push({ text });
    },
    callTool(name, args, callId) {
      fake.script.push({ name, args, callId });
    },
  };
}
