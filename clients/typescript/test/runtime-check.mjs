// runtime-check.mjs URL TRANSPORT: client-check.mjs on the runtime that runs this script (Node,
// Bun, Deno) against the server at URL, through TRANSPORT (`default` for the runtime's own
// choice); prints what it found as one JSON line, and ends with a non-zero status on a failure.
import { Client } from '../dist/index.js';
import { checkClient } from './client-check.mjs';

const [url, transport] = globalThis.Deno?.args ?? globalThis.process.argv.slice(2);
const client = new Client(transport === 'default' ? { baseUrl: url } : { baseUrl: url, transport });
const found = await checkClient(client);
client.close();
console.log(JSON.stringify(found));
