// A local stand-in for the OpenAI Chat Completions API in streaming mode (`POST
// /v1/chat/completions` with `stream: true`, answered as server-sent `chat.completion.chunk`
// events ending in `data: [DONE]`): it answers with scripted replies, in order, and records
// every request body. Only the model is faked; the AI SDK and sessiondb are real.
import { createServer } from 'node:http';

export async function fakeChatCompletions() {
  const requests = [];
  const script = [];
  let ids = 0;
  const server = createServer((req, res) => {
    let raw = '';
    req.on('data', (chunk) => (raw += chunk));
    req.on('end', () => {
      const body = raw === '' ? {} : JSON.parse(raw);
      if (req.method !== 'POST' || req.url !== '/v1/chat/completions' || !body.stream || script.length === 0) {
        res.writeHead(404, { 'content-type': 'application/json' });
        return res.end(JSON.stringify({ error: { message: `unexpected ${req.method} ${req.url}` } }));
      }
      requests.push(body);
      const id = `chatcmpl_${++ids}`;
      const chunk = (delta, finishReason = null, extra = {}) =>
        `data: ${JSON.stringify({
          id, object: 'chat.completion.chunk', created: 1_700_000_000, model: body.model,
          choices: [{ index: 0, delta, finish_reason: finishReason }], ...extra,
        })}\n\n`;
      res.writeHead(200, { 'content-type': 'text/event-stream' });
      const reply = script.shift();
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
  });
  await new Promise((resolve) => server.listen(0, '127.0.0.1', resolve));
  return {
    url: `http://127.0.0.1:${server.address().port}/v1`,
    requests,
    reply(text) {
      script.push({ text });
    },
    callTool(name, args, callId) {
      script.push({ name, args, callId });
    },
    close: () => new Promise((resolve) => server.close(resolve)),
  };
}
