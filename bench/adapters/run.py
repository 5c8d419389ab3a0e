#!/usr/bin/env python3
"""Frameworks on their own SQLite stores and on sessiondb, side by side, in one run.

    python3 bench/adapters/run.py [--turns 300] [--invokes 200] [--rounds 3] [--no-readme]

What a user swapping stores wants to know: the OpenAI Agents SDK on its `SQLiteSession` (a file)
against `SessiondbSession`, LangGraph on its `SqliteSaver` against `SessiondbSaver`, and Google's
ADK on its `SqliteSessionService` against `SessiondbSessionService`, LlamaIndex's `Memory` on its
`SQLAlchemyChatStore` (aiosqlite) against `SessiondbChatStore`, Microsoft Agent Framework on its
`FileHistoryProvider` (a JSON Lines file per session, no fsync) against
`SessiondbHistoryProvider`, Strands Agents on its `FileSessionManager` (a JSON file per message, no
fsync) against `SessiondbSessionRepository`, the sessiondb adapters going through the Python client to a release `sessiondb serve` on this
machine (durable, as the SQLite stores are by default); and the AI SDK's chat store on the file
store of its persistence guide (a JSON file per chat, no fsync) against `SessiondbChatStore`
through the TypeScript client (bench/adapters/ai_sdk.mjs, on Node). Per step: one conversation
turn (the runner's read of the history, then storing the turn's input and output; for ADK, its
session read whole and two events stored, the answer with a state change; for LlamaIndex,
`Memory.aget` then `aput_messages` with the turn's two messages; for Agent Framework, the
provider's `get_messages` then `save_messages` with the run's two messages; for Strands, a new
`Agent` restored from its session manager, then a run with a scripted model: the two messages
stored as added and the agent synced; for the AI
SDK, `loadChat` and then `saveChat` with the turn's question and answer added) or one graph
invocation (two nodes, each adding ~200 characters to an accumulating list). ADK for TypeScript
runs the same turn as ADK in Python on its `DatabaseSessionService` (MikroORM's SQLite driver, a
file) against the TypeScript `SessiondbSessionService` (bench/adapters/adk.mjs). Rounds alternate
which store goes first. Writes bench/adapters/results.json and the section of bench/README.md
between its `adapters:begin` / `adapters:end` markers.
"""
import argparse
import datetime
import importlib.util
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
BENCH = os.path.dirname(HERE)
ROOT = os.path.dirname(BENCH)
VENV = os.path.join(BENCH, ".peers", "adapters")
NODE_PEERS = os.path.join(BENCH, ".peers", "adapters-node")
RESULTS = os.path.join(HERE, "results.json")
PACKAGES = ["openai-agents==0.24.0", "langgraph==1.2.22", "langgraph-checkpoint-sqlite==3.1.2",
            "google-adk==2.13.0", "llama-index-core==0.14.25", "agent-framework-core==1.23.0",
            "strands-agents==1.62.0"]
# MikroORM pinned to one 6.x release throughout: 7.x needs Node 22.
NODE_PACKAGES = ["@google/adk@2.0.0", "@mikro-orm/core@6.6.16", "@mikro-orm/knex@6.6.16",
                 "@mikro-orm/reflection@6.6.16", "@mikro-orm/sqlite@6.6.16"]
FRAMEWORKS = {"openai": "OpenAI Agents SDK: one turn (SQLiteSession / SessiondbSession)",
              "langgraph": "LangGraph: one invocation (SqliteSaver / SessiondbSaver)",
              "adk": "Google ADK: one turn (SqliteSessionService / SessiondbSessionService)",
              "llama-index": "LlamaIndex Memory: one turn (SQLAlchemyChatStore on SQLite / SessiondbChatStore)",
              "agent-framework": "Microsoft Agent Framework: one run (FileHistoryProvider / SessiondbHistoryProvider)",
              "strands": "Strands Agents: one request (FileSessionManager / SessiondbSessionRepository)",
              "ai-sdk": "AI SDK: one chat turn (the persistence guide's file store / SessiondbChatStore)",
              "adk-ts": "ADK for TypeScript: one turn (DatabaseSessionService on SQLite / SessiondbSessionService)"}
TYPESCRIPT = os.path.join(ROOT, "clients", "typescript")


def log(message):
    print(f"[{time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def sh(cmd, **kwargs):
    done = subprocess.run(cmd, text=True, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                          **kwargs)
    if done.returncode != 0:
        sys.exit(f"failed: {' '.join(cmd)}\n{done.stdout}")
    return done.stdout


def python_with_packages():
    python = os.path.join(VENV, "bin", "python")
    marker = os.path.join(VENV, ".installed")
    wanted = " ".join(PACKAGES)
    if not (os.path.exists(marker) and open(marker).read() == wanted):
        log(f"installing {wanted} (PyPI) into bench/.peers/adapters")
        sh([sys.executable, "-m", "venv", VENV])
        sh([python, "-m", "pip", "install", "-q", *PACKAGES])
        open(marker, "w").write(wanted)
    return python


def node_with_packages():
    """The folder holding ADK for TypeScript and its SQLite driver (sqlite3 builds natively)."""
    marker = os.path.join(NODE_PEERS, ".installed")
    wanted = " ".join(NODE_PACKAGES)
    if not (os.path.exists(marker) and open(marker).read() == wanted):
        log(f"installing {wanted} (npm) into bench/.peers/adapters-node")
        shutil.rmtree(NODE_PEERS, ignore_errors=True)
        os.makedirs(NODE_PEERS)
        with open(os.path.join(NODE_PEERS, "package.json"), "w") as f:
            json.dump({"name": "adapters-node", "private": True}, f)
        sh(["npm", "install", "--save-exact", "--no-audit", "--no-fund", *NODE_PACKAGES],
           cwd=NODE_PEERS)
        open(marker, "w").write(wanted)
    return NODE_PEERS


def summary(samples):
    """Median of the per-round medians, over all steps and over the last fifth (the longest
    history)."""
    tail = max(1, len(samples[0]) // 5)
    return {"median_ms": statistics.median(statistics.median(s) for s in samples),
            "last_fifth_median_ms": statistics.median(statistics.median(s[-tail:]) for s in samples)}


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--turns", type=int, default=300)
    parser.add_argument("--invokes", type=int, default=200)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--no-readme", action="store_true")
    args = parser.parse_args()
    started = time.time()

    log("building the server (cargo, release)")
    sh(["cargo", "build", "--release", "-q", "-p", "sessiondb-cli"], cwd=ROOT)
    binary = os.path.join(ROOT, "target", "release", "sessiondb")
    python = python_with_packages()
    node_peers = node_with_packages()
    log("building the TypeScript client (npm ci when it has no node_modules, then tsc)")
    if not os.path.exists(os.path.join(TYPESCRIPT, "node_modules", ".bin", "tsc")):
        sh(["npm", "ci", "--no-audit", "--no-fund"], cwd=TYPESCRIPT)
    sh([os.path.join("node_modules", ".bin", "tsc"), "-p", "."], cwd=TYPESCRIPT)
    env = {**os.environ, "PYTHONPATH": os.path.join(ROOT, "clients", "python"),
           "PYTHONDONTWRITEBYTECODE": "1"}

    runs = {}
    for round_no in range(args.rounds):
        order = ["own", "sessiondb"] if round_no % 2 == 0 else ["sessiondb", "own"]
        log(f"round {round_no + 1}/{args.rounds}: {', '.join(order)}")
        scratch = tempfile.mkdtemp(prefix="sessiondb-adapters-")
        try:
            out = sh([python, os.path.join(HERE, "driver.py"), binary, scratch, ",".join(order),
                      str(args.turns), str(args.invokes)], env=env)
            out += sh(["node", os.path.join(HERE, "ai_sdk.mjs"), binary, scratch, ",".join(order),
                       str(args.turns)])
            out += sh(["node", os.path.join(HERE, "adk.mjs"), binary, scratch, ",".join(order),
                       str(args.turns), node_peers])
        finally:
            shutil.rmtree(scratch, ignore_errors=True)
        for line in out.splitlines():
            if line.startswith("{"):
                row = json.loads(line)
                runs.setdefault((row["framework"], row["store"]), []).append(row)

    results = {"date": datetime.date.today().isoformat(), "turns": args.turns,
               "invokes": args.invokes, "rounds": args.rounds, "machine": machine(),
               "frameworks": {}}
    for framework in FRAMEWORKS:
        entry = {}
        for store in ["own", "sessiondb"]:
            rows = runs[(framework, store)]
            entry[store] = {**summary([r["ms"] for r in rows]),
                            "size_bytes": statistics.median(r["size_bytes"] for r in rows)}
        results["frameworks"][framework] = entry
    with open(RESULTS, "w") as f:
        json.dump(results, f, indent=2)
        f.write("\n")
    table = render(results)
    print(table)
    if not args.no_readme:
        write_readme(table)
    log(f"done in {(time.time() - started) / 60:.1f} min")


def machine():
    """The machine as the comparison describes it (bench/compare/run.py's own function)."""
    spec = importlib.util.spec_from_file_location("compare_run", os.path.join(BENCH, "compare", "run.py"))
    compare = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(compare)
    return compare.machine()


def render(results):
    lines = [
        f"Latest run: {results['date']}, `python3 bench/adapters/run.py` ({results['turns']} "
        f"turns, {results['invokes']} invocations, {results['rounds']} rounds, medians). "
        f"Machine: {results['machine']}. Ratio: the framework's own store ÷ sessiondb (above 1, "
        f"sessiondb is faster or smaller).",
        "",
        "| step | own store ms | sessiondb (over HTTP) ms | ratio | own store, longest fifth ms | sessiondb, longest fifth ms | ratio | own store on disk | sessiondb on disk | ratio |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for framework, title in FRAMEWORKS.items():
        own, ours = results["frameworks"][framework]["own"], results["frameworks"][framework]["sessiondb"]
        lines.append(
            f"| {title} | {own['median_ms']:.3f} | {ours['median_ms']:.3f} | "
            f"{own['median_ms'] / ours['median_ms']:.2f}× | {own['last_fifth_median_ms']:.3f} | "
            f"{ours['last_fifth_median_ms']:.3f} | "
            f"{own['last_fifth_median_ms'] / ours['last_fifth_median_ms']:.2f}× | "
            f"{own['size_bytes'] / 1e6:.2f} MB | {ours['size_bytes'] / 1e6:.2f} MB | "
            f"{own['size_bytes'] / ours['size_bytes']:.1f}× |")
    return "\n".join(lines)


def write_readme(table):
    path = os.path.join(BENCH, "README.md")
    text = open(path).read()
    begin, end = "<!-- adapters:begin -->", "<!-- adapters:end -->"
    if begin not in text or end not in text:
        sys.exit(f"{path} has no {begin} … {end} section")
    head, rest = text.split(begin, 1)
    _, tail = rest.split(end, 1)
    with open(path, "w") as f:
        f.write(f"{head}{begin}\n{table}\n{end}{tail}")


if __name__ == "__main__":
    main()
