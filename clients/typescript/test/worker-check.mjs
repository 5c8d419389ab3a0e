// A Cloudflare Worker that runs client-check.mjs against the server its request names
// (`?server=URL&transport=default|fetch`) and answers what it found, or the failure, as JSON.
import { Client } from '../dist/index.js';
import { checkClient } from './client-check.mjs';

export default {
  async fetch(request) {
    const asked = new URL(request.url).searchParams;
    const transport = asked.get('transport');
    const client = new Client(transport === 'default' ? { baseUrl: asked.get('server') } : { baseUrl: asked.get('server'), transport });
    try {
      return Response.json(await checkClient(client));
    } catch (error) {
      return Response.json({ failed: String(error?.stack ?? error) }, { status: 500 });
    } finally {
      client.close();
    }
  },
};
