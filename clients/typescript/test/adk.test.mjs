// ADK's session service on a real server, driven by ADK's own Runner with a scripted model.
import assert from 'node:assert/strict';
import { test } from 'node:test';

import { BaseLlm, FunctionTool, InMemorySessionService, LlmAgent, Runner, createEvent } from '@google/adk';

import { SessiondbMemoryService, SessiondbSessionService, copySessions, sessionKey } from '../dist/adk.js';
import { Client, SessiondbError } from '../dist/index.js';
import { all, serve, sharedServer } from './served.mjs';

const shared = sharedServer();
let apps = 0;
const freshApp = () => `app-${process.pid}-${++apps}`;

/** Calls the tool `count_visit` once per turn, then answers with the visit's number and how many
 * contents it was shown. */
class ScriptedLlm extends BaseLlm {
  constructor() {
    super({ model: 'scripted' });
  }

  async *generateContentAsync(request) {
    const last = request.contents[request.contents.length - 1];
    const answered = last.parts?.find((p) => p.functionResponse);
    if (answered) {
      const text = `visit ${answered.functionResponse.response.visits}, shown ${request.contents.length} contents`;
      yield { content: { role: 'model', parts: [{ text }] } };
    } else {
      yield { content: { role: 'model', parts: [{ functionCall: { name: 'count_visit', args: {} } }] } };
    }
  }

  async connect() {
    throw new Error('the scripted model has no live connection');
  }
}

/** Counts the user's visits (user state), the app's (app state) and this session's. */
const countVisit = new FunctionTool({
  name: 'count_visit',
  description: 'Counts visits.',
  execute: (_input, context) => {
    const visits = (context.state.get('user:visits') ?? 0) + 1;
    context.state.set('user:visits', visits);
    context.state.set('app:total', (context.state.get('app:total') ?? 0) + 1);
    context.state.set('turns', (context.state.get('turns') ?? 0) + 1);
    context.state.set('temp:scratch', 'never stored');
    return { visits };
  },
});

const agent = () =>
  new LlmAgent({ name: 'counter', model: new ScriptedLlm(), instruction: 'Count visits.', tools: [countVisit], outputKey: 'last_answer' });

async function runTurn(service, appName, userId, sessionId, text) {
  const runner = new Runner({ appName, agent: agent(), sessionService: service });
  return all(runner.runAsync({ userId, sessionId, newMessage: { role: 'user', parts: [{ text }] } }));
}

const textOf = (event) => event.content.parts[0].text;
const userEvent = (text, stateDelta = {}, fields = {}) =>
  createEvent({ author: 'user', invocationId: 'i', content: { role: 'user', parts: [{ text }] }, actions: { stateDelta }, ...fields });
// What an event is, for comparison: as JSON (the signature symbol and unset fields left out).
const plain = (events) => JSON.parse(JSON.stringify(events));

test('a runner keeps its conversation and state across service instances', async () => {
  const app = freshApp();
  const service = new SessiondbSessionService(shared.client);
  await service.createSession({ appName: app, userId: 'ann', sessionId: 's1', state: { lang: 'en' } });
  const first = await runTurn(service, app, 'ann', 's1', 'hello');
  assert.equal(textOf(first.at(-1)), 'visit 1, shown 3 contents');
  // A new service (another process, say) reads everything back and runs on from it.
  const second = await runTurn(new SessiondbSessionService(shared.client), app, 'ann', 's1', 'again');
  assert.equal(textOf(second.at(-1)), 'visit 2, shown 7 contents');

  const session = await service.getSession({ appName: app, userId: 'ann', sessionId: 's1' });
  assert.equal(session.events.length, 8);
  assert.deepEqual(plain(session.events.slice(-3)), plain(second));
  assert.equal(textOf(session.events[0]), 'hello');
  assert.deepEqual(session.state, { lang: 'en', turns: 2, last_answer: 'visit 2, shown 7 contents', 'user:visits': 2, 'app:total': 2 });
  // Other clients read ordinary messages.
  const key = sessionKey(app, 'ann', 's1');
  const stored = await all(shared.client.history(key));
  assert.deepEqual(stored.slice(0, 4).map((m) => m.role), ['user', 'assistant', 'tool', 'assistant']);
  assert.equal(stored[3].content, 'visit 1, shown 3 contents');
  assert.equal(stored[3].metadata.adkEvent.content.parts, undefined, 'an event of one text keeps it once, as the content');
  assert.deepEqual(stored[1].metadata.adkEvent.content.parts[0].function_call.name, 'count_visit', 'stored as ADK stores events');
  assert.equal(stored[0].metadata.adkEvent.timestamp, session.events[0].timestamp / 1000, 'in seconds');
  assert.equal(stored[0].createdAt, Math.floor(session.events[0].timestamp));
  assert.equal((await shared.client.search(key, 'again'))[0].id, session.events[4].id);
});

test('state is scoped to app, user and session', async () => {
  const app = freshApp();
  const service = new SessiondbSessionService(shared.client);
  const get = (userId, sessionId) => service.getSession({ appName: app, userId, sessionId });
  for (const [user, session] of [['ann', 'a1'], ['ann', 'a2'], ['bob', 'b1']]) {
    await service.createSession({ appName: app, userId: user, sessionId: session });
    await runTurn(service, app, user, session, 'hi');
  }
  assert.equal((await get('ann', 'a2')).state['user:visits'], 2);
  assert.equal((await get('ann', 'a2')).state.turns, 1, 'session state stays its own');
  assert.equal((await get('bob', 'b1')).state['user:visits'], 1);
  assert.equal((await get('bob', 'b1')).state['app:total'], 3, 'app state is shared');
  assert.ok(!('temp:scratch' in (await get('ann', 'a1')).state));
  // Initial state goes to its scopes too, as JSON (a date as ISO text, nothing for undefined).
  const created = await service.createSession({
    appName: app,
    userId: 'cy',
    state: { 'app:total': 10, 'user:x': 1, y: 2, 'temp:z': 3, day: new Date('2024-01-02T00:00:00Z'), gone: undefined },
  });
  const expected = { 'app:total': 10, 'user:x': 1, y: 2, day: '2024-01-02T00:00:00.000Z', gone: null };
  assert.deepEqual(created.state, expected);
  assert.deepEqual((await get('cy', created.id)).state, expected);
  assert.equal((await get('bob', 'b1')).state['app:total'], 10);
});

test('listing in ADK pages, deleting, and creating twice', async () => {
  const app = freshApp();
  const service = new SessiondbSessionService(shared.client);
  for (const [user, session] of [['ann', 'x'], ['ann', 'y'], ['bob', 'z']]) {
    await service.createSession({ appName: app, userId: user, sessionId: session, state: { 'user:name': user } });
  }
  await runTurn(service, app, 'ann', 'x', 'hi');
  const ann = await service.listSessions({ appName: app, userId: 'ann', order: 'asc' });
  assert.deepEqual(ann.sessions.map((s) => s.id), ['y', 'x'], 'oldest update first');
  assert.equal(ann.sessions[1].state['user:name'], 'ann');
  assert.deepEqual(ann.sessions[1].events, []);
  assert.deepEqual([ann.page, ann.limit, ann.totalItems, ann.totalPages], [1, 2, 2, 1]);
  const everyone = await service.listSessions({ appName: app, order: 'desc' });
  assert.deepEqual(everyone.sessions.map((s) => `${s.userId}/${s.id}`), ['ann/x', 'bob/z', 'ann/y']);
  const second = await service.listSessions({ appName: app, order: 'desc', limit: 2, page: 2 });
  assert.deepEqual(second.sessions.map((s) => s.id), ['y']);
  assert.deepEqual([second.page, second.limit, second.totalItems, second.totalPages], [2, 2, 3, 2]);
  const offset = await service.listSessions({ appName: app, order: 'desc', limit: 1, offset: 1 });
  assert.deepEqual([offset.sessions.map((s) => s.id), offset.page], [['z'], 2]);
  assert.deepEqual((await service.listSessions({ appName: `${app}-other` })).sessions, []);

  await assert.rejects(service.createSession({ appName: app, userId: 'ann', sessionId: 'x' }), { code: 'conflict' });
  await service.deleteSession({ appName: app, userId: 'ann', sessionId: 'x' });
  await service.deleteSession({ appName: app, userId: 'ann', sessionId: 'x' });
  assert.equal(await service.getSession({ appName: app, userId: 'ann', sessionId: 'x' }), undefined);
  assert.equal(await service.getSession({ appName: app, userId: 'ann', sessionId: 'never' }), undefined);
  await assert.rejects(runTurn(service, app, 'ann', 'x', 'hi'), /Session not found/);
});

test('recent events and events after a time', async () => {
  const app = freshApp();
  const service = new SessiondbSessionService(shared.client);
  const session = await service.createSession({ appName: app, userId: 'ann', sessionId: 't' });
  for (let i = 0; i < 250; i++) {
    await service.appendEvent({ session, event: userEvent(`e${i}`, {}, { author: i % 2 === 0 ? 'user' : 'counter', timestamp: 1_000_000 + i * 1000 }) });
  }
  const texts = async (config) =>
    (await service.getSession({ appName: app, userId: 'ann', sessionId: 't', config })).events.map(textOf);
  assert.equal((await texts(undefined)).length, 250);
  assert.deepEqual(await texts({ numRecentEvents: 3 }), ['e247', 'e248', 'e249']);
  assert.equal((await texts({ numRecentEvents: 0 })).length, 250, 'as ADK reads: 0 is no limit');
  assert.deepEqual(await texts({ afterTimestamp: 1_245_000 }), ['e245', 'e246', 'e247', 'e248', 'e249']);
  assert.deepEqual(await texts({ afterTimestamp: 1_010_000, numRecentEvents: 2 }), ['e248', 'e249']);
  assert.deepEqual(await texts({ afterTimestamp: 1_248_000, numRecentEvents: 20 }), ['e248', 'e249']);
  assert.equal((await texts({ numRecentEvents: 120 })).length, 120);
});

test('a stale session object is read again and its event goes in after what it missed', async () => {
  const app = freshApp();
  const service = new SessiondbSessionService(shared.client);
  const get = () => service.getSession({ appName: app, userId: 'ann', sessionId: 'st' });
  await service.createSession({ appName: app, userId: 'ann', sessionId: 'st' });
  const mine = await get();
  const theirs = await get();
  await service.appendEvent({ session: theirs, event: userEvent('first', { k: 'theirs', other: 1 }) });
  await service.appendEvent({ session: mine, event: userEvent('mine', { k: 'mine' }) });
  assert.deepEqual(mine.events.map(textOf), ['first', 'mine'], 'the object was read again');
  assert.deepEqual(mine.state, { k: 'mine', other: 1 });
  // Racing writers that read the same session: every event lands once, one after another.
  const racers = await Promise.all([0, 1, 2, 3].map(get));
  await Promise.all(racers.map((session, i) => service.appendEvent({ session, event: userEvent(`racer ${i}`, { [`r${i}`]: i }) })));
  const fresh = await get();
  assert.deepEqual(fresh.events.slice(0, 2).map(textOf), ['first', 'mine']);
  assert.deepEqual(fresh.events.slice(2).map(textOf).sort(), ['racer 0', 'racer 1', 'racer 2', 'racer 3']);
  assert.deepEqual(fresh.state, { k: 'mine', other: 1, r0: 0, r1: 1, r2: 2, r3: 3 });
  const rows = await shared.client.rows(sessionKey(app, 'ann', 'st'));
  assert.equal(rows.length, 6, 'one path, no branches');
  // An event the object already holds replaces the stored one; a partial event is never stored.
  const edited = { ...fresh.events[0], content: { role: 'user', parts: [{ text: 'first, edited' }] } };
  await service.appendEvent({ session: fresh, event: edited });
  await service.appendEvent({ session: fresh, event: userEvent('partial', {}, { partial: true }) });
  assert.deepEqual((await get()).events.map(textOf), fresh.events.map(textOf));
  assert.equal(textOf((await get()).events[0]), 'first, edited');
  // Replacing is one write with the event's state: a refused state leaves the event as it was.
  const refused = { ...edited, content: { role: 'user', parts: [{ text: 'edited again' }] }, actions: { stateDelta: { [`user:${'k'.repeat(300)}`]: 1 } } };
  await assert.rejects(service.appendEvent({ session: fresh, event: refused }), { code: 'invalid_request' });
  assert.equal(textOf((await get()).events[0]), 'first, edited');
  // A session that is gone is not found, and an event it held does not bring it back.
  await service.deleteSession({ appName: app, userId: 'ann', sessionId: 'st' });
  await assert.rejects(service.appendEvent({ session: fresh, event: userEvent('third') }), { code: 'not_found' });
  await assert.rejects(service.appendEvent({ session: fresh, event: edited }), { code: 'not_found' });
  assert.equal(await get(), undefined);
});

test('an event whose state is refused stores nothing', async () => {
  const app = freshApp();
  const service = new SessiondbSessionService(shared.client);
  const session = await service.createSession({ appName: app, userId: 'ann', sessionId: 'r' });
  // The user's state key is refused: the event, its session and app state go with it.
  const event = userEvent('hi', { turn: 1, 'app:ok': 1, [`user:${'k'.repeat(300)}`]: 1 });
  await assert.rejects(service.appendEvent({ session, event }), { code: 'invalid_request' });
  const again = await service.getSession({ appName: app, userId: 'ann', sessionId: 'r' });
  assert.deepEqual([again.events, again.state], [[], {}]);
  // So is a session created with such a state: it is not created at all.
  const state = { lang: 'en', [`user:${'k'.repeat(300)}`]: 1 };
  await assert.rejects(service.createSession({ appName: app, userId: 'ann', sessionId: 'r2', state }), { code: 'invalid_request' });
  assert.equal(await service.getSession({ appName: app, userId: 'ann', sessionId: 'r2' }), undefined);
});

test('a compacted session still gives every event', async () => {
  const app = freshApp();
  const service = new SessiondbSessionService(shared.client);
  const session = await service.createSession({ appName: app, userId: 'ann', sessionId: 'c' });
  for (const text of ['one', 'two', 'three']) await service.appendEvent({ session, event: userEvent(text) });
  const key = sessionKey(app, 'ann', 'c');
  await shared.client.addCompaction(key, { summary: 'Counted to two.', fromMessageId: session.events[0].id, toMessageId: session.events[1].id });
  assert.ok((await all(shared.client.history(key)))[0].id.startsWith('compaction_'));
  for (const config of [undefined, { afterTimestamp: 1 }]) {
    const read = await service.getSession({ appName: app, userId: 'ann', sessionId: 'c', config });
    assert.deepEqual(plain(read.events), plain(session.events));
  }
});

/** A service on a client of its own that records the status of each history read. */
function recordingService() {
  const client = new Client({ baseUrl: shared.client.baseUrl });
  const statuses = [];
  const open = client.open.bind(client);
  client.open = async (method, path, ...rest) => {
    const answer = await open(method, path, ...rest);
    if (path.endsWith('/history')) statuses.push(answer.status);
    return answer;
  };
  return { service: new SessiondbSessionService(client), statuses };
}

test('a service holds the paths of the sessions used last', async () => {
  const { service, statuses } = recordingService();
  const appName = freshApp();
  const readAll = async (ids) => {
    for (const sessionId of ids) await service.getSession({ appName, userId: 'ann', sessionId });
  };
  const others = Array.from({ length: 256 }, (_, i) => `other-${i}`);
  for (const sessionId of ['first', ...others]) await service.createSession({ appName, userId: 'ann', sessionId });
  await readAll(['first', ...others.slice(0, 255), 'first']);
  assert.equal(statuses.at(-1), 304, 'held while among the 256 used last');
  await readAll([...others, 'first']);
  assert.equal(statuses.at(-1), 200, 'forgotten after 256 others were used');
});

test('a read after its own writes transfers no events', async () => {
  const { service, statuses } = recordingService();
  const appName = freshApp();
  const where = { appName, userId: 'ann', sessionId: 'h' };
  const readElsewhere = () => new SessiondbSessionService(shared.client).getSession(where);
  await service.createSession(where);
  const first = await runTurn(service, appName, 'ann', 'h', 'hello');
  const second = await runTurn(service, appName, 'ann', 'h', 'again');
  statuses.length = 0;
  const held = await service.getSession(where);
  assert.deepEqual(statuses, [304], 'the session is as this service wrote it');
  assert.deepEqual(plain(held.events), plain((await readElsewhere()).events), 'what it holds is what a read gives');
  assert.deepEqual(plain(held.events.slice(-second.length)), plain(second));
  assert.equal(held.events.length, 2 * (first.length + 1), "with the user's events");
  held.events.at(-1).actions.stateDelta.last_answer = 'changed by the caller';
  held.events[0].content.parts[0].text = 'changed by the caller';
  const again = await service.getSession(where);
  assert.deepEqual(plain(again.events), plain((await readElsewhere()).events), 'each read has its own');

  // Another service's turn: the next read transfers the path, and it stays exact.
  await runTurn(new SessiondbSessionService(shared.client), appName, 'ann', 'h', 'elsewhere');
  statuses.length = 0;
  const moved = await service.getSession(where);
  assert.deepEqual(statuses, [200]);
  assert.deepEqual(plain(moved.events), plain((await readElsewhere()).events));
});

test('messages other clients wrote read as events', async () => {
  const app = freshApp();
  const service = new SessiondbSessionService(shared.client);
  await service.createSession({ appName: app, userId: 'ann', sessionId: 'o' });
  const key = sessionKey(app, 'ann', 'o');
  await shared.client.append(key, { id: 'u', role: 'user', content: 'from elsewhere' });
  await shared.client.append(key, { id: 'a', role: 'assistant', parts: [{ type: 'text', text: 'an answer' }] });
  const { events } = await service.getSession({ appName: app, userId: 'ann', sessionId: 'o' });
  assert.deepEqual(events.map((e) => [e.id, e.author, e.content.role, textOf(e)]), [
    ['u', 'user', 'user', 'from elsewhere'],
    ['a', 'model', 'model', 'an answer'],
  ]);
  // The runner goes on from them.
  const replies = await runTurn(service, app, 'ann', 'o', 'hi');
  assert.equal(textOf(replies.at(-1)), 'visit 1, shown 5 contents');
});

test('copySessions moves an app in with events and every scope of state, once', async () => {
  const app = freshApp();
  const source = new InMemorySessionService();
  await source.createSession({ appName: app, userId: 'ann', sessionId: 'a1', state: { lang: 'en' } });
  await runTurn(source, app, 'ann', 'a1', 'hello');
  await runTurn(source, app, 'ann', 'a1', 'again');
  await source.createSession({ appName: app, userId: 'bo', sessionId: 'b1' });
  await runTurn(source, app, 'bo', 'b1', 'hi');
  await source.createSession({ appName: app, userId: 'bo', sessionId: 'quiet', state: { topic: 'none yet' } });
  const sessions = async (service) => {
    const found = {};
    for (const listed of (await service.listSessions({ appName: app })).sessions) {
      const session = await service.getSession({ appName: app, userId: listed.userId, sessionId: listed.id });
      found[`${listed.userId}/${listed.id}`] = [plain(session.events), session.state];
    }
    return found;
  };

  const target = new SessiondbSessionService(shared.client);
  const copied = await copySessions(source, target, { appName: app });
  assert.deepEqual(copied.copied.map((name) => name.join('/')).sort(), ['ann/a1', 'bo/b1', 'bo/quiet']);
  const expected = await sessions(source);
  assert.deepEqual(await sessions(new SessiondbSessionService(shared.client)), expected);
  assert.equal(expected['ann/a1'][0].length, 8);
  assert.equal(expected['ann/a1'][1]['user:visits'], 2);
  const again = await copySessions(source, target, { appName: app, userId: 'bo' });
  assert.deepEqual(again, { copied: [], skipped: [['bo', 'b1'], ['bo', 'quiet']] });
  // The source went on: a second copy writes only the new events, and the state they changed.
  const first = (await target.getSession({ appName: app, userId: 'bo', sessionId: 'b1' })).events.map((e) => e.id);
  await runTurn(source, app, 'bo', 'b1', 'later');
  assert.deepEqual(await copySessions(source, target, { appName: app, userId: 'bo' }), { copied: [['bo', 'b1']], skipped: [['bo', 'quiet']] });
  const moved = await sessions(new SessiondbSessionService(shared.client));
  assert.deepEqual(moved['bo/b1'], (await sessions(source))['bo/b1']);
  assert.deepEqual(moved['bo/b1'][0].slice(0, first.length).map((e) => e.id), first);
  // A runner goes on from the copy.
  const turn = await runTurn(new SessiondbSessionService(shared.client), app, 'ann', 'a1', 'third');
  assert.equal(textOf(turn.at(-1)), 'visit 3, shown 11 contents');
  // Copied again after that, the session holds the source's events and more: skipped.
  assert.deepEqual(await copySessions(source, target, { appName: app, userId: 'ann' }), { copied: [], skipped: [['ann', 'a1']] });

  // A session held with other events is refused, and stays as it was.
  await source.createSession({ appName: app, userId: 'cy', sessionId: 'c1' });
  await runTurn(source, app, 'cy', 'c1', 'theirs');
  await target.createSession({ appName: app, userId: 'cy', sessionId: 'c1' });
  await runTurn(target, app, 'cy', 'c1', 'mine');
  const before = await sessions(target);
  await assert.rejects(copySessions(source, target, { appName: app, userId: 'cy' }),
    (error) => error instanceof SessiondbError && error.code === 'conflict' && /nothing was copied/.test(error.message));
  assert.deepEqual(await sessions(target), before);
});

test('a copy in parts that another writer races says what stays', async () => {
  // Too small for the session in one request: it goes in parts.
  const served = await serve('--max-body-bytes', '4096');
  const client = new Client({ baseUrl: served.url });
  try {
    const app = freshApp();
    const source = new InMemorySessionService();
    await source.createSession({ appName: app, userId: 'ann', sessionId: 'a1' });
    await runTurn(source, app, 'ann', 'a1', 'hello');
    await runTurn(source, app, 'ann', 'a1', 'again');
    const firstMet = client.importFirstMet;
    let raced;
    client.importFirstMet = async function (sessionId, ...rest) {
      const met = await firstMet.call(this, sessionId, ...rest);
      if (raced === undefined) {
        raced = sessionId;
        await client.append(sessionId, { role: 'user', content: 'meanwhile' });
      }
      return met;
    };
    await assert.rejects(copySessions(source, new SessiondbSessionService(client), { appName: app, userId: 'ann' }),
      (error) => error instanceof SessiondbError && error.code === 'conflict'
        && /the events it wrote before another writer changed the session stay/.test(error.message));
    const held = await client.storedHistory(raced);
    assert.equal(held.at(-1).content, 'meanwhile');
    assert.ok(held.length > 1, `${held.length} messages`);
  } finally {
    client.close();
    await served.stop();
  }
});

test('memory keeps what it is given and finds it by any word', async () => {
  const app = freshApp();
  const memory = new SessiondbMemoryService(shared.client);
  const start = 1_750_000_000_000;
  const said = (author, text, timestamp) =>
    createEvent({ author, invocationId: 'i', timestamp, content: { role: author === 'user' ? 'user' : 'model', parts: [{ text }] } });
  const events = [said('user', 'my cat is called Miso', start), said('helper', 'Miso is a lovely name for a cat', start + 1000),
    createEvent({ author: 'helper', invocationId: 'i', timestamp: start + 2000 })];
  const session = { id: 's1', appName: app, userId: 'ann', state: {}, events, lastUpdateTime: start };
  await memory.addSessionToMemory(session);
  const search = async (userId, query, appName = app) => (await memory.searchMemory({ appName, userId, query })).memories;
  const found = await search('ann', 'what is the name of my cats');
  assert.deepEqual(found.map((m) => m.content.parts[0].text).sort(), ['Miso is a lovely name for a cat', 'my cat is called Miso']);
  const first = found.find((m) => m.author === 'user');
  assert.equal(first.timestamp, '2025-06-15T15:06:40.000Z');
  assert.deepEqual(await search('ann', 'dogs'), []);
  // Added again as it grew: what was kept is not kept twice.
  session.events.push(said('user', 'and a dog named Rex', start + 3000));
  await memory.addSessionToMemory(session);
  assert.equal((await search('ann', 'cat')).length, 2);
  assert.deepEqual((await search('ann', 'dog rex')).map((m) => m.content.parts[0].text), ['and a dog named Rex']);
  // Each user's memory is their own, per app.
  await memory.addSessionToMemory({ ...session, id: 's2', userId: 'bob', events: [said('user', 'my cat is Tom', start)] });
  assert.deepEqual((await search('bob', 'cat')).map((m) => m.content.parts[0].text), ['my cat is Tom']);
  assert.equal((await search('ann', 'cat')).length, 2);
  assert.deepEqual(await search('ann', 'cat', `${app}-other`), []);
  // Memory is not among the app's sessions.
  assert.deepEqual((await new SessiondbSessionService(shared.client).listSessions({ appName: app })).sessions, []);
});
