// LangGraph.js's checkpointer specification (@langchain/langgraph-checkpoint-validation) against
// SessiondbSaver; a vitest file (`vitest run test/langgraph.spec.mjs`), as the
// specification is written for vitest. One server for the run, and a fresh prefix (so a fresh
// set of sessions) for every checkpointer the specification asks for. (The package's own CLI,
// `validate-checkpointer`, fails in 1.1.1 before running anything: its published types module
// lacks the initializer schema the CLI imports.)
import { validate } from '@langchain/langgraph-checkpoint-validation';

import { Client } from '../dist/index.js';
import { SessiondbSaver } from '../dist/langgraph.js';
import { serve } from './served.mjs';

let served;
let client;
let created = 0;

validate({
  checkpointerName: 'SessiondbSaver',
  beforeAllTimeout: 30_000,
  async beforeAll() {
    served = await serve();
    client = new Client({ baseUrl: served.url });
  },
  async afterAll() {
    await served.stop();
  },
  createCheckpointer() {
    return new SessiondbSaver({ client, prefix: `validation-${++created}:` });
  },
});
