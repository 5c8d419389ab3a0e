#!/usr/bin/env python3
"""Runs the sessiondb benchmark and the peer benchmarks in one go and prints ratios.

Every program prints lines `<label> <mean ms> ms`; this script maps each peer's label to the
matching sessiondb operation and reports `peer ms / sessiondb ms` (above 1: sessiondb is faster).
Usage: bench/compare.py --ours CMD --cf-dir DIR --oa-python PY --peers-dir DIR [--n N]
"""
import argparse
import os
import re
import subprocess
import sys

LINE = re.compile(r"^(?P<label>.+?)\s+(?P<ms>[0-9.]+) ms")

# operation -> label prefix per program section (matched with str.startswith)
OPERATIONS = [
    ("append one message (durable)", {
        "sessiondb": "append one-by-one", "cf": "appendMessage one-by-one",
        "oa-file": "append one-by-one", "oa-adv": "append one-by-one"}),
    ("read the last 50", {
        "sessiondb": "history(newest_first) take 50", "cf": "history({newestFirst}) take 50",
        "oa-file": "get_items(limit=50)", "oa-adv": "get_items(limit=50)"}),
    ("recent window (20 KB)", {
        "sessiondb": "recent_history(20 KB budget)", "cf": "getRecentHistory(20 KB budget)"}),
    ("read the whole path", {
        "sessiondb": "full_history() whole path", "cf": "getHistory() whole path",
        "oa-file": "get_items() whole history", "oa-adv": "get_items() whole history"}),
    ("first search (builds the index)", {
        "sessiondb": "search() first call", "cf": "search() first call"}),
    ("warm search", {
        "sessiondb": "search() warm", "cf": "search() warm",
        "oa-adv": "find_turns_by_content"}),
    ("branch at N/4", {
        "sessiondb": "branch: append with parent", "cf": "branch: append with parentId",
        "oa-adv": "create_branch_from_turn"}),
    ("read the new branch", {
        "sessiondb": "full_history() on new branch", "cf": "getHistory() on new branch"}),
]

PEERS = [("cf", "CF agents Sessions (file)"), ("oa-file", "OpenAI SQLiteSession (file)"),
         ("oa-adv", "OpenAI AdvancedSQLiteSession (file)")]


def sections(output):
    """Splits a program's output into {section header: {label: ms}}."""
    result, current = {}, None
    for line in output.splitlines():
        if line.startswith("--- "):
            current = result.setdefault(line[4:], {})
        elif current is not None and (m := LINE.match(line)):
            current[m["label"].strip()] = float(m["ms"])
    return result


def find(measures, prefix):
    for label, ms in measures.items():
        if label.startswith(prefix):
            return ms
    return None


def run(cmd, cwd=None, env=None):
    print("$", " ".join(cmd), file=sys.stderr)
    done = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True)
    if done.returncode != 0:
        sys.exit(f"{cmd[0]} failed:\n{done.stdout}\n{done.stderr}")
    print(done.stdout, file=sys.stderr)
    return done.stdout


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--ours", required=True, help="path of the sessiondb-bench binary")
    p.add_argument("--cf-dir", required=True, help="folder with node_modules of the CF peer")
    p.add_argument("--oa-python", required=True, help="python with openai-agents installed")
    p.add_argument("--peers-dir", required=True, help="shared/peers (the peer scripts)")
    p.add_argument("--n", type=int, default=10000)
    a = p.parse_args()
    env = dict(os.environ, N=str(a.n))

    measured = {}
    ours_output = run([a.ours, str(a.n)])
    measured["sessiondb"] = next(iter(sections(ours_output).values()))
    script = os.path.join(a.cf_dir, "bench_cf_sessions.mjs")
    with open(os.path.join(a.peers_dir, "bench_cf_sessions.mjs")) as src, open(script, "w") as dst:
        dst.write(src.read())
    cf = sections(run(["node", script], cwd=a.cf_dir, env=env))
    measured["cf"] = next(v for k, v in cf.items() if "file" in k)
    oa = sections(run([a.oa_python, os.path.join(a.peers_dir, "bench_openai.py")], env=env))
    measured["oa-file"] = next(v for k, v in oa.items() if k.startswith("SQLiteSession db=file"))
    measured["oa-adv"] = next(v for k, v in oa.items() if k.startswith("AdvancedSQLiteSession"))

    header = "| operation (N=%d) | sessiondb ms | " % a.n + " | ".join(f"{name} ms (×)" for _, name in PEERS) + " |"
    print(header)
    print("|" + " --- |" * (2 + len(PEERS)))
    for op, labels in OPERATIONS:
        mine = find(measured["sessiondb"], labels["sessiondb"])
        cells = []
        for key, _ in PEERS:
            theirs = find(measured[key], labels[key]) if key in labels else None
            if theirs is None or not mine:
                cells.append("—")
            else:
                cells.append(f"{theirs:.3f} ({theirs / mine:.1f}×)")
        print(f"| {op} | {mine:.3f} | " + " | ".join(cells) + " |")
    print()
    for line in ours_output.splitlines():
        if line.startswith("appends/s"):
            print(line)


if __name__ == "__main__":
    main()
