// The Pi coding agent's `SessionManager`: a JSONL file per session, appended with
// appendFileSync (no fsync). The shared workload: the last 50 are a slice of the built context
// (there is no cheaper read), no search, one writer.
import { SessionManager } from "@mariozechner/pi-coding-agent";
import { BRANCHES, LAST_READS, REOPENS, WHOLE_READS, dirBytes, emit, finish, median, scratchDir, texts, timed, timedMedian } from "./workload.mjs";

const usage = { input: 0, output: 0, cacheRead: 0, cacheWrite: 0, totalTokens: 0,
  cost: { input: 0, output: 0, cacheRead: 0, cacheWrite: 0, total: 0 } };
const message = (i, text) => i % 2 === 0
  ? { role: "user", content: text, timestamp: Date.now() }
  : { role: "assistant", content: [{ type: "text", text }], api: "none", provider: "none", model: "none",
      usage, stopReason: "stop", timestamp: Date.now() };

const n = Number(process.argv[2]);
const dir = scratchDir("compare-pi-");
const manager = SessionManager.create(dir, dir);
const ids = [];
const appends = [];
let i = 0;
for (const text of texts(n)) {
  const m = message(i++, text);
  const [ms, id] = await timed(() => manager.appendMessage(m));
  appends.push(ms);
  ids.push(id);
}
emit("append", median(appends));
const last50 = (sm) => { if (sm.buildSessionContext().messages.slice(-50).length !== 50) throw new Error("short"); };
emit("last50", await timedMedian(LAST_READS, () => last50(manager)));
const whole = () => { if (manager.buildSessionContext().messages.length < 1) throw new Error("empty"); };
emit("whole", await timedMedian(WHOLE_READS, whole));
const branches = [];
for (let k = 0; k < BRANCHES; k++) {
  branches.push((await timed(() => {
    manager.branch(ids[(n >> 2) + k]);
    manager.appendMessage({ role: "user", content: "forked question", timestamp: Date.now() });
  }))[0]);
}
emit("branch", median(branches));
emit("branch_read", await timedMedian(WHOLE_READS, whole));
// Pi compacts by recording a summary and the first entry kept; the earliest kept on this branch.
emit("compact", (await timed(() => manager.appendCompaction("summary of the early turns", ids[n >> 3], 12345)))[0]);
emit("compact_read", await timedMedian(WHOLE_READS, whole));
const file = manager.getSessionFile();
const reopens = [];
for (let k = 0; k < REOPENS; k++) reopens.push((await timed(() => last50(SessionManager.open(file, dir))))[0]);
emit("reopen_last50", median(reopens));
finish(dirBytes(dir), "JSONL, appendFileSync per entry, never fsynced (not durable on power loss)");
