// One round of the ADK for TypeScript part of the adapter benchmark (run by bench/adapters/run.py
// after it built clients/typescript and installed ADK with its SQLite driver into PEERS): what
// ADK's runner does with its session service each turn, on ADK's `DatabaseSessionService`
// (MikroORM on a SQLite file) and on `SessiondbSessionService` through a release server. Prints
// one JSON line per store: {store, framework, ms: [...per turn], size_bytes}.
//
//     node adk.mjs SERVER_BINARY SCRATCH ORDER TURNS PEERS
//
// Each service runs on its own copy of `@google/adk` 2.0.0: ADK's from PEERS (where its optional
// `@mikro-orm/sqlite` is installed), sessiondb's from the client's own dependencies.
import { createRequire } from 'node:module';
import { join, resolve } from 'node:path';
import { pathToFileURL } from 'node:url';

import { SessiondbSessionService } from '../../clients/typescript/dist/adk.js';
import { eachStore, text } from './node_common.mjs';

/** Read the session, then store the user's message and the agent's answer with the state change
 * its `outputKey` makes (as bench/adapters/driver.py does for ADK in Python). */
async function turns(service, createEvent, count) {
  await service.createSession({ appName: 'bench', userId: 'u', sessionId: 'bench' });
  const ms = [];
  for (let i = 0; i < count; i++) {
    const started = performance.now();
    const session = await service.getSession({ appName: 'bench', userId: 'u', sessionId: 'bench' });
    const question = { role: 'user', parts: [{ text: text(2 * i) }] };
    await service.appendEvent({ session, event: createEvent({ author: 'user', invocationId: `i${i}`, content: question }) });
    const answer = text(2 * i + 1);
    await service.appendEvent({
      session,
      event: createEvent({
        author: 'assistant',
        invocationId: `i${i}`,
        content: { role: 'model', parts: [{ text: answer }] },
        actions: { stateDelta: { last_answer: answer } },
      }),
    });
    ms.push(performance.now() - started);
  }
  return ms;
}

/** `@google/adk` as the package in `folder` resolves it. */
const adkOf = (folder) => import(pathToFileURL(createRequire(join(resolve(folder), 'package.json')).resolve('@google/adk')));

const [binary, scratch, order, count, peers] = process.argv.slice(2);
const ownAdk = await adkOf(peers);
const clientAdk = await adkOf(new URL('../../clients/typescript/', import.meta.url).pathname);
await eachStore(
  { binary, scratch, order, framework: 'adk-ts' },
  async (folder) => {
    const service = new ownAdk.DatabaseSessionService(`sqlite://${join(folder, 'adk.db')}`);
    try {
      return await turns(service, ownAdk.createEvent, Number(count));
    } finally {
      // The service has no close(); its open MikroORM connection would keep Node running.
      await service.orm?.close();
    }
  },
  (client) => turns(new SessiondbSessionService(client), clientAdk.createEvent, Number(count)),
);
