// Cloudflare `agents` Sessions on Node: better-sqlite3 (a file in WAL mode) stands in for a
// Durable Object's SQLite storage through a small adapter of the storage API Sessions uses
// (`sql.exec`, `transactionSync`, `get`/`put`). The shared workload; Node runs one writer at a
// time, so there is no concurrent-append figure.
import Database from "better-sqlite3";
import { Sessions } from "agents/sessions";
import { join } from "node:path";
import {
  BRANCHES, LAST_READS, NEEDLE, REOPENS, SEARCHES, WHOLE_READS,
  dirBytes, emit, finish, median, scratchDir, texts, timed, timedMedian,
} from "./workload.mjs";

/** The Durable Object storage surface Sessions needs, over one better-sqlite3 database. */
function storageOver(db) {
  const statements = new Map();
  const changes = db.prepare("SELECT total_changes()").pluck();
  const withWritten = (rows, before) => Object.assign(rows, { rowsWritten: changes.get() - before });
  const kv = new Map();
  return {
    sql: {
      exec(query, ...params) {
        const args = params.map((p) => (p instanceof ArrayBuffer ? Buffer.from(p) : p));
        if (!statements.has(query)) {
          let prepared = null;
          try { prepared = db.prepare(query); } catch (e) {
            if (!String(e).includes("more than one statement")) throw e;
          }
          statements.set(query, prepared);
        }
        const statement = statements.get(query);
        const before = changes.get();
        if (statement === null) { db.exec(query); return withWritten([], before); }
        if (statement.reader) return withWritten(statement.all(...args), before);
        statement.run(...args);
        return withWritten([], before);
      },
    },
    transactionSync: (fn) => db.transaction(fn)(),
    get: async (key) => kv.get(key),
    put: async (key, value) => { kv.set(key, value); },
  };
}

class FileSessions extends Sessions {
  constructor(db) {
    super();
    this.host = { storage: storageOver(db), events: { emit() {} }, ready: async () => {} };
  }
  get lifecycle() { return this.host; }
}

async function open(path) {
  const db = new Database(path);
  db.pragma("journal_mode = WAL");
  // better-sqlite3 is built with SQLITE_DEFAULT_WAL_SYNCHRONOUS=1 (NORMAL: no fsync per commit)
  // for databases it finds in WAL mode; the durable mode is FULL, set explicitly.
  db.pragma("synchronous = FULL");
  const sessions = new FileSessions(db);
  await sessions.onStart();
  return { db, session: sessions.session("bench") };
}

async function last50(session) {
  const page = [];
  for await (const m of session.history({ newestFirst: true })) { page.push(m); if (page.length === 50) break; }
  if (page.length !== 50) throw new Error("short page");
}

const n = Number(process.argv[2]);
const dir = scratchDir("compare-cf-");
const path = join(dir, "sessions.db");
const { db, session } = await open(path);
const appends = [];
let i = 0;
for (const text of texts(n)) {
  const message = { id: `m${i}`, role: i % 2 ? "assistant" : "user", parts: [{ type: "text", text }] };
  appends.push((await timed(() => session.appendMessage(message)))[0]);
  i++;
}
emit("append", median(appends));
emit("last50", await timedMedian(LAST_READS, () => last50(session)));
const whole = async () => { if ((await session.getHistory()).length < n / 8) throw new Error("short"); };
emit("whole", await timedMedian(WHOLE_READS, whole));
emit("search_first", (await timed(() => session.search(NEEDLE, { limit: 10 })))[0]);
emit("search", await timedMedian(SEARCHES, () => session.search(NEEDLE, { limit: 10 })));
const branches = [];
for (let k = 0; k < BRANCHES; k++) {
  const fork = { id: `fork${k}`, role: "user", parts: [{ type: "text", text: "forked question" }] };
  branches.push((await timed(() => session.appendMessage(fork, { parentId: `m${(n >> 2) + k}` })))[0]);
}
emit("branch", median(branches));
emit("branch_read", await timedMedian(WHOLE_READS, whole));
emit("compact", (await timed(() => session.addCompaction("summary of the early turns", "m1", `m${n >> 3}`)))[0]);
emit("compact_read", await timedMedian(WHOLE_READS, whole));
db.close();
const reopens = [];
for (let k = 0; k < REOPENS; k++) {
  const [ms, reopened] = await timed(async () => { const r = await open(path); await last50(r.session); return r; });
  reopens.push(ms);
  reopened.db.close();
}
emit("reopen_last50", median(reopens));
finish(dirBytes(dir), "SQLite WAL, synchronous=FULL (set explicitly), one commit per append");
