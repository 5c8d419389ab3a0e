// The shared workload pieces of the Node drivers (see workload.py: the same generator, counts
// output and scratch folders).
import { mkdtempSync, readdirSync, rmSync, statSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";

const WORDS = "alpha beta gamma delta epsilon zeta eta theta iota kappa lambda mu nu xi omicron pi rho sigma tau".split(" ");
export const NEEDLE = "needletoken";
export const LAST_READS = 200, WHOLE_READS = 5, SEARCHES = 50, BRANCHES = 20, REOPENS = 3;

// 30 words picked by seed = (seed * 1103515245 + 12345) mod 2^31 (word seed*19 >> 31, exact in
// BigInt), then ` msg{i}`, and the needle in message n/2.
export function* texts(n) {
  let seed = 42n;
  for (let i = 0; i < n; i++) {
    const words = [];
    for (let w = 0; w < 30; w++) {
      seed = (seed * 1103515245n + 12345n) % 2147483648n;
      words.push(WORDS[Number((seed * 19n) >> 31n)]);
    }
    words.push(`msg${i}`);
    if (i === Math.floor(n / 2)) words.push(NEEDLE);
    yield words.join(" ");
  }
}

export const emit = (op, ms) => console.log(JSON.stringify({ op, ms }));
export const finish = (size_bytes, durability) => console.log(JSON.stringify({ size_bytes, durability }));

export function median(samples) {
  const s = [...samples].sort((a, b) => a - b);
  const mid = s.length >> 1;
  return s.length % 2 ? s[mid] : (s[mid - 1] + s[mid]) / 2;
}

export async function timed(f) {
  const started = performance.now();
  const value = await f();
  return [performance.now() - started, value];
}

export async function timedMedian(times, f) {
  const samples = [];
  for (let k = 0; k < times; k++) samples.push((await timed(f))[0]);
  return median(samples);
}

export const dirBytes = (dir) =>
  readdirSync(dir).map((f) => statSync(join(dir, f))).filter((s) => s.isFile()).reduce((a, s) => a + s.size, 0);

// A new folder for the store's files, removed when the driver exits.
export function scratchDir(prefix) {
  const dir = mkdtempSync(join(tmpdir(), prefix));
  process.on("exit", () => rmSync(dir, { recursive: true, force: true }));
  return dir;
}
