#!/usr/bin/env python3
"""sessiondb against the session stores people use today, on one machine, in one run.

    python3 bench/compare/run.py [--n 10000] [--rounds 5] [--no-readme]

Installs the peers into bench/.peers/ (cached: the first run downloads and builds them), builds
the sessiondb driver, measures the disk's fsync time, then runs every store's workload once per
round, in an order that rotates each round so machine noise hits all alike. Reports the median
over rounds of each operation's median, the ratio peer / sessiondb (above 1: sessiondb is
faster), disk use and durability; writes bench/compare/results.json and chart.png and the
section of bench/README.md between its `compare:begin` / `compare:end` markers.
"""
import argparse
import datetime
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
BENCH = os.path.dirname(HERE)
ROOT = os.path.dirname(BENCH)
PEERS = os.path.join(BENCH, ".peers")
DRIVERS = os.path.join(HERE, "drivers")
RESULTS = os.path.join(HERE, "results.json")

# Versions pinned so runs compare like with like.
OPENAI = "openai-agents==0.24.0"
LANGGRAPH = ["langgraph==1.2.22", "langgraph-checkpoint-sqlite==3.1.2", "matplotlib==3.11.2"]
CF = ["agents@0.32.0", "better-sqlite3@12"]
PI = "@mariozechner/pi-coding-agent@0.73.1"
LANGGRAPH_N = 1000  # its storage grows with the square of the conversation

OPS = [
    ("append", "append one message (durable)"),
    ("last50", "read the last 50"),
    ("whole", "read the whole history"),
    ("search_first", "search, first call"),
    ("search", "search one unique word"),
    ("branch", "branch (append under an old message)"),
    ("branch_read", "read the new branch"),
    ("compact", "compact (store a summary)"),
    ("compact_read", "read after compaction"),
    ("reopen_last50", "reopen cold + last 50"),
    ("concurrent8", "8 concurrent writers (ms per append)"),
    ("concurrent32", "32 concurrent writers (ms per append)"),
]


def log(message):
    print(f"[{time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def sh(cmd, cwd=None, env=None, quiet=True):
    done = subprocess.run(cmd, cwd=cwd, env=env, text=True,
                          stdout=subprocess.PIPE if quiet else None,
                          stderr=subprocess.STDOUT if quiet else None)
    if done.returncode != 0:
        sys.exit(f"failed: {' '.join(cmd)}\n{done.stdout or ''}")
    return done.stdout


def venv(name, packages):
    python = os.path.join(PEERS, name, "bin", "python")
    marker = os.path.join(PEERS, name, ".installed")
    wanted = " ".join(packages)
    if not (os.path.exists(marker) and open(marker).read() == wanted):
        log(f"installing {wanted} (PyPI) into bench/.peers/{name}")
        sh([sys.executable, "-m", "venv", os.path.join(PEERS, name)])
        sh([python, "-m", "pip", "install", "-q", *packages])
        open(marker, "w").write(wanted)
    return python


def npm(name, packages):
    folder = os.path.join(PEERS, name)
    marker = os.path.join(folder, ".installed")
    wanted = " ".join(packages)
    if not (os.path.exists(marker) and open(marker).read() == wanted):
        log(f"installing {wanted} (npm) into bench/.peers/{name}")
        os.makedirs(folder, exist_ok=True)
        if not os.path.exists(os.path.join(folder, "package.json")):
            sh(["npm", "init", "-y"], cwd=folder)
        for package in packages:
            # Optional peers of `agents` (AI SDK, MCP, …) are not needed; better-sqlite3 needs
            # its build script.
            scripts = [] if package.startswith("better-sqlite3") else ["--ignore-scripts"]
            sh(["npm", "install", "--no-audit", "--no-fund", *scripts, package], cwd=folder)
        open(marker, "w").write(wanted)
    # Node resolves a module's imports from its real location: copy the drivers next to
    # node_modules.
    for driver in ("workload.mjs", "cf_sessions.mjs", "pi_session.mjs"):
        target = os.path.join(folder, driver)
        if os.path.lexists(target):
            os.remove(target)
        shutil.copyfile(os.path.join(DRIVERS, driver), target)
    return folder


def fsync_ms(samples=200):
    """Median times to write 4 KiB and fsync it, in the directory the drivers write to: appended
    to a file, which grows (its new size is synced too), and rewritten in place, as a SQLite WAL
    is once it has reached its size (it starts over after each checkpoint)."""
    block = os.urandom(4096)

    def median_of(offset):
        times = []
        with tempfile.NamedTemporaryFile() as f:
            for i in range(samples):
                started = time.perf_counter()
                os.pwrite(f.fileno(), block, offset(i))
                os.fsync(f.fileno())
                times.append((time.perf_counter() - started) * 1000)
        return statistics.median(times)

    return median_of(lambda i: i * len(block)), median_of(lambda i: 0)


def machine():
    cpu = next((line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo")
                if line.startswith("model name")), platform.processor())
    mem = next(int(line.split()[1]) for line in open("/proc/meminfo") if line.startswith("MemTotal"))
    return f"{os.cpu_count()} cores ({cpu}), {mem / 2**20:.0f} GiB, Linux {platform.release()}"


def run_store(store):
    """Runs one store's workload; returns ({op: ms}, {size_bytes, durability})."""
    started = time.perf_counter()
    # The store's files go to a folder of this run's, removed afterwards even when the driver
    # died without removing them.
    with tempfile.TemporaryDirectory(prefix="compare-") as scratch:
        env = dict(store.get("env") or os.environ, TMPDIR=scratch)
        done = subprocess.run(store["cmd"], cwd=store.get("cwd"), env=env, text=True,
                              capture_output=True)
    if done.returncode != 0:
        sys.exit(f"{store['name']} failed:\n{done.stdout}\n{done.stderr}")
    ops, info = {}, {}
    for line in done.stdout.splitlines():
        record = json.loads(line)
        if "op" in record:
            ops[record["op"]] = record["ms"]
        else:
            info = record
    log(f"  {store['name']}: {time.perf_counter() - started:.1f} s")
    return ops, info


def fmt_ms(ms):
    return f"{ms:.3f}" if ms < 10 else f"{ms:.1f}" if ms < 1000 else f"{ms:,.0f}"


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--n", type=int, default=10000)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--no-readme", action="store_true", help="leave bench/README.md as it is")
    p.add_argument("--report", action="store_true",
                   help="measure nothing: redo the table, chart and README section from results.json")
    a = p.parse_args()
    began = time.perf_counter()
    if a.report:
        results = json.load(open(RESULTS))
        results["labels"] = labels(results["langgraph_n"])
        results["ratios"] = ratios(results["medians"])
        report(results, os.path.join(PEERS, "lg", "bin", "python"), a.no_readme)
        return

    # The cargo build runs while the peers install (downloads overlap the compile).
    log("building the sessiondb driver (cargo, release) and setting up the peers (cached)")
    build = subprocess.Popen(["cargo", "build", "--release", "-q", "-p", "sessiondb-bench",
                              "--bin", "sessiondb-compare"], cwd=ROOT)
    oa_python = venv("oa", [OPENAI])
    lg_python = venv("lg", LANGGRAPH)
    cf_dir = npm("cf", CF)
    pi_dir = npm("pi", [PI])
    if build.wait() != 0:
        sys.exit("building sessiondb-compare failed")
    log("set up")
    ours = os.path.join(ROOT, "target", "release", "sessiondb-compare")
    fsync, fsync_in_place = fsync_ms()
    log(f"fsync of 4 KiB: median {fsync:.3f} ms appended, {fsync_in_place:.3f} ms in place")

    n, lg_n = a.n, min(LANGGRAPH_N, a.n)
    py_env = dict(os.environ, PYTHONPATH=DRIVERS)
    normal = dict(os.environ, SYNC="normal")
    stores = [
        {"name": "sessiondb", "cmd": [ours, "lib", str(n)]},
        {"name": "sessiondb-http", "cmd": [ours, "http", str(n)]},
        {"name": "sessiondb-normal", "cmd": [ours, "lib", str(n), ""], "env": normal},
        {"name": "sessiondb-1k", "cmd": [ours, "lib", str(lg_n), ""]},
        {"name": "sqlite-floor", "cmd": [ours, "floor", str(n)]},
        {"name": "cf", "cmd": ["node", "cf_sessions.mjs", str(n)], "cwd": cf_dir},
        {"name": "openai", "cmd": [oa_python, os.path.join(DRIVERS, "openai_sqlite.py"), str(n)],
         "env": py_env},
        {"name": "pi", "cmd": ["node", "pi_session.mjs", str(n)], "cwd": pi_dir},
        {"name": "langgraph", "cmd": [lg_python, os.path.join(DRIVERS, "langgraph_sqlite.py"), str(lg_n)],
         "env": py_env},
    ]
    samples = {s["name"]: {} for s in stores}
    infos = {}
    for r in range(a.rounds):
        order = stores[r % len(stores):] + stores[:r % len(stores)]
        log(f"round {r + 1}/{a.rounds}: {', '.join(s['name'] for s in order)}")
        for store in order:
            ops, info = run_store(store)
            for op, ms in ops.items():
                samples[store["name"]].setdefault(op, []).append(ms)
            infos[store["name"]] = info
    medians = {name: {op: statistics.median(v) for op, v in ops.items()} for name, ops in samples.items()}
    results = {"date": datetime.date.today().isoformat(), "machine": machine(), "fsync_ms": fsync,
               "fsync_in_place_ms": fsync_in_place,
               "n": n, "langgraph_n": lg_n, "rounds": a.rounds,
               "labels": labels(lg_n),
               "samples": samples, "medians": medians, "stores": infos}
    results["ratios"] = ratios(medians)
    report(results, lg_python, a.no_readme)
    log(f"done in {(time.perf_counter() - began) / 60:.1f} min")


PEER_NAMES = ["cf", "openai", "pi", "langgraph"]


def labels(lg_n):
    return {"sessiondb": "sessiondb (library)", "sessiondb-http": "sessiondb (HTTP)",
            "sessiondb-normal": "sessiondb (library, no fsync)",
            "sessiondb-1k": f"sessiondb (library, N={lg_n})",
            "sqlite-floor": "bare SQLite commits (`sessiondb-compare floor`)", "cf": "CF agents Sessions",
            "openai": "OpenAI SQLiteSession", "pi": "Pi SessionManager",
            "langgraph": f"LangGraph SqliteSaver (N={lg_n})"}


# Operations that write: compared in the peer's durability mode.
WRITES = ("append", "branch", "compact")


def baseline(peer, op):
    """The sessiondb run a peer's figure is divided by: the same N for LangGraph, and for Pi's
    writes the no-fsync run (Pi never fsyncs, so that is the same durability mode)."""
    if peer == "langgraph":
        return "sessiondb-1k"
    return "sessiondb-normal" if peer == "pi" and op in WRITES else "sessiondb"


def ratios(medians):
    """peer -> op -> peer ms / sessiondb ms, for every operation both measured."""
    out = {}
    for peer in PEER_NAMES:
        for op, _ in OPS:
            ms, ours = medians[peer].get(op), medians[baseline(peer, op)].get(op)
            if ms is not None and ours:
                out.setdefault(peer, {})[op] = ms / ours
    return out


def report(results, lg_python, no_readme):
    """The table, the targets, the chart and the README section, from a results file."""
    medians, infos, label = results["medians"], results["stores"], results["labels"]
    ratio = results["ratios"]
    n, lg_n = results["n"], results["langgraph_n"]
    header = ["operation", "sessiondb (library) ms", "sessiondb (HTTP) ms"] + \
        [f"{label[p]} ms (×)" for p in PEER_NAMES]
    rows = []
    for op, title in OPS:
        row = [title]
        for name in ("sessiondb", "sessiondb-http"):
            ms = medians[name].get(op)
            row.append(fmt_ms(ms) if ms is not None else "—")
        for peer in PEER_NAMES:
            value = ratio.get(peer, {}).get(op)
            mark = "†" if baseline(peer, op) == "sessiondb-normal" else ""
            row.append(f"{fmt_ms(medians[peer][op])} ({value:.1f}×{mark})" if value else "—")
        rows.append(row)
    size_row = ["disk after the workload (MB)"]
    for name in ("sessiondb", "sessiondb-http"):
        size_row.append(f"{infos[name]['size_bytes'] / 1e6:.1f}")
    for peer in PEER_NAMES:
        size, ours_size = infos[peer]["size_bytes"], infos[baseline(peer, "disk")]["size_bytes"]
        size_row.append(f"{size / 1e6:.1f} ({size / ours_size:.1f}×)")
    rows.append(size_row)
    table = "\n".join("| " + " | ".join(r) + " |" for r in
                      [header, ["---"] * len(header)] + rows)

    # The targets of the comparison, each with the figure that decides it.
    targets = []
    for peer in PEER_NAMES:
        for op, title in OPS:
            value = ratio.get(peer, {}).get(op)
            if value is None:
                continue
            need = 10 if op.startswith("concurrent") else 5 if op in ("last50", "whole") else 1
            if baseline(peer, op) == "sessiondb-normal":
                title += " (vs sessiondb without fsync)"
            targets.append({"peer": label[peer], "operation": title, "ratio": round(value, 2),
                            "needed": need, "met": value >= need if need > 1 else value > 1})
    disk = infos["langgraph"]["size_bytes"] / infos["sessiondb-1k"]["size_bytes"]
    targets.append({"peer": label["langgraph"], "operation": f"disk for the same {lg_n}-message conversation",
                    "ratio": round(disk, 1), "needed": 20, "met": disk >= 20})
    missed = [t for t in targets if not t["met"]]
    results["targets"] = targets
    with open(RESULTS, "w") as f:
        json.dump(results, f, indent=1)
    durability = "\n".join(f"- {label[name]}: {info['durability']}" for name, info in infos.items())

    log("drawing the chart")
    sh([lg_python, os.path.join(HERE, "chart.py"), RESULTS, os.path.join(HERE, "chart.png")])
    normal = medians["sessiondb-normal"]
    floor = medians.get("sqlite-floor")
    floor_note = "" if floor is None else f"""
The least a SQLite commit costs here without fsync, on sessiondb's SQLite build with no store
around it (`sessiondb-compare floor`): one row into a rowid table {fmt_ms(floor["floor_row"])} ms, a
row keyed by session and position plus that session's counter {fmt_ms(floor["floor_session"])} ms; Pi's
append {fmt_ms(medians["pi"]["append"])} ms, its branch {fmt_ms(medians["pi"]["branch"])} ms."""
    section = f"""Latest run: {results['date']}, `python3 bench/compare/run.py` (N = {n:,}; LangGraph at
N = {lg_n:,} against sessiondb at the same N), {results['rounds']} rounds, medians. Machine:
{results['machine']}; fsync of 4 KiB on the benchmark's file system: median {results['fsync_ms']:.3f} ms
appended to a file, {results['fsync_in_place_ms']:.3f} ms rewritten in place (as a SQLite WAL is once it has
reached its size).
Ratios are peer ÷ sessiondb (library): above 1, sessiondb is faster; † compares Pi's writes,
which are never fsynced, with sessiondb without fsync (`SYNC=normal`: append
{fmt_ms(normal["append"])}, branch {fmt_ms(normal["branch"])}, compact {fmt_ms(normal["compact"])} ms);
concurrent rows are wall time per append with 8 or 32 writers on their own sessions (peers
without concurrent writers show —).{floor_note}

{table}

Durability each store ran with:
{durability}

Targets: {len(targets) - len(missed)} of {len(targets)} met.
""" + ("".join(f"\n- missed: {t['peer']}, {t['operation']}: {t['ratio']}× (needed "
               f"{'more than 1' if t['needed'] == 1 else str(t['needed']) + '×'})" for t in missed)) + """

![sessiondb against its peers](compare/chart.png)
"""
    print(section)
    if not no_readme:
        path = os.path.join(BENCH, "README.md")
        text = open(path).read()
        begin, end = "<!-- compare:begin -->", "<!-- compare:end -->"
        head, rest = text.split(begin, 1)
        tail = rest.split(end, 1)[1]
        open(path, "w").write(f"{head}{begin}\n{section}\n{end}{tail}")
        log("bench/README.md updated")


if __name__ == "__main__":
    main()
