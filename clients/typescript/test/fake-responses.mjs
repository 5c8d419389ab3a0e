// A local stand-in for the OpenAI Responses API (`POST /v1/responses`, non-streaming): it answers
// with scripted outputs, in order, and records every request body, so a test sees what the Agents
// SDK sent the model. Only the model is faked; the SDK and sessiondb are real.
import { createServer } from 'node:http';

export async function fakeResponses() {
  const requests = [];
  const script = [];
  let ids = 0;
  const server = createServer((req, res) => {
    let raw = '';
    req.on('data', (chunk) => (raw += chunk));
    req.on('end', () => {
      const answer = (status, payload) => {
        res.writeHead(status, { 'content-type': 'application/json' });
        res.end(JSON.stringify(payload));
      };
      if (req.method !== 'POST' || req.url !== '/v1/responses' || script.length === 0) {
        return answer(404, { error: { message: `unexpected ${req.method} ${req.url}` } });
      }
      const body = JSON.parse(raw);
      requests.push(body);
      answer(200, {
        id: `resp_${++ids}`, object: 'response', created_at: 1_700_000_000, status: 'completed',
        model: body.model ?? 'gpt-4o', output: script.shift(), parallel_tool_calls: true,
        tool_choice: 'auto', tools: [], temperature: 1, top_p: 1, error: null,
        incomplete_details: null, instructions: body.instructions ?? null, metadata: {},
        text: { format: { type: 'text' } },
        usage: { input_tokens: 10, output_tokens: 5, total_tokens: 15,
                 input_tokens_details: { cached_tokens: 0 }, output_tokens_details: { reasoning_tokens: 0 } },
      });
    });
  });
  await new Promise((resolve) => server.listen(0, '127.0.0.1', resolve));
  return {
    url: `http://127.0.0.1:${server.address().port}/v1`,
    requests,
    reply(text) {
      script.push([{ type: 'message', id: `msg_fake_${++ids}`, status: 'completed', role: 'assistant',
                     content: [{ type: 'output_text', text, annotations: [] }] }]);
    },
    callTool(name, args, callId) {
      script.push([{ type: 'function_call', id: `fc_fake_${++ids}`, call_id: callId, name,
                     arguments: JSON.stringify(args), status: 'completed' }]);
    },
    close: () => new Promise((resolve) => server.close(resolve)),
  };
}
