#!/usr/bin/env python3
"""Flame graphs of the operations where sessiondb misses a target of the peer comparison.

    python3 bench/profiles/run.py [append-no-fsync|branch-no-fsync|writers8|writers32 ...]

Builds the comparison driver, runs one operation of it under `perf record` (DWARF call graphs)
and draws bench/profiles/<case>.svg with inferno (installed from crates.io into bench/.tools/ on
first use). Prints, per case, the share of on-CPU samples under the frames that explain it: the
excerpt bench/README.md quotes. Needs `perf` (Debian's linux-perf).
"""
import os
import shutil
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
TOOLS = os.path.join(ROOT, "bench", ".tools")
DRIVER = os.path.join(ROOT, "target", "release", "sessiondb-compare")

# name: (title, environment of the driver, whole workload first). `PROFILE` in
# bench/compare.rs: `append` and `concurrent*` repeat 4,000 appends ten times; `branch` runs the
# workload of 10,000 messages and then 3,020 branch appends, the only part recorded.
CASES = {
    "append-no-fsync": ("one appender, SYNC=normal (against Pi's appendFileSync)",
                        {"PROFILE": "append", "SYNC": "normal"}, False),
    "branch-no-fsync": ("branch appends under old messages, SYNC=normal (against Pi)",
                        {"PROFILE": "branch", "SYNC": "normal"}, True),
    "writers8": ("8 writers on their own sessions, durable", {"PROFILE": "concurrent8"}, False),
    "writers32": ("32 writers on their own sessions, durable", {"PROFILE": "concurrent"}, False),
}

# Frames whose inclusive share the excerpt reports, in the order printed.
FRAMES = [
    ("sessiondb_sqlite::write::apply", "applying requests (statements)"),
    ("sessiondb_core::write_rules::Rules<T>::insert::{{closure}}", "  inserting the message"),
    ("sqlite3VdbeHalt", "commit (SQLite)"),
    ("pagerWalFrames", "  WAL frames written by the commit"),
    ("walCheckpoint", "checkpoints"),
    ("__x64_sys_fdatasync", "WAL sync (fdatasync)"),
    ("__x64_sys_fsync", "checkpoint syncs (fsync)"),
    ("__schedule", "thread switches (futex waits and wake-ups)"),
    ("uuid::v7::<impl uuid::Uuid>::new_v7", "generating message ids"),
]


def run(cmd, **kwargs):
    subprocess.run(cmd, check=True, **kwargs)


def ensure_tools():
    path = os.path.join(TOOLS, "bin")
    os.environ["PATH"] = path + os.pathsep + os.environ["PATH"]
    if shutil.which("inferno-flamegraph") is None:
        run(["cargo", "install", "inferno", "--locked", "--root", TOOLS])
    if shutil.which("perf") is None:
        sys.exit("perf is missing (Debian: apt-get install linux-perf)")


def shares(folded):
    """Inclusive share of every frame: a frame counts once per stack however deep it recurs."""
    total, inclusive = 0, {}
    for line in folded.splitlines():
        stack, count = line.rsplit(" ", 1)
        total += int(count)
        for frame in set(stack.split(";")):
            inclusive[frame] = inclusive.get(frame, 0) + int(count)
    return total, inclusive


def profile(name):
    title, env, workload_first = CASES[name]
    with tempfile.TemporaryDirectory() as scratch:
        data = os.path.join(scratch, "perf.data")
        # The branch appends take a fraction of a second: they are sampled more often.
        hz = "4999" if workload_first else "499"
        # The driver is read where it lies right after recording: no copy of it (and of every
        # library it maps) in perf's build-id cache, ~/.debug, which grew by the driver's size
        # per run.
        record = ["perf", "record", "-q", "-N", "-F", hz, "--call-graph", "dwarf,32768",
                  "-o", data]
        if workload_first:
            # Recording starts when the driver reaches the operation (`PERF_CONTROL`).
            control = os.path.join(scratch, "control")
            os.mkfifo(control)
            record += ["--delay=-1", f"--control=fifo:{control}"]
            env = {**env, "PERF_CONTROL": control}
        n = "10000" if workload_first else "100"
        run(record + [DRIVER, "lib", n, ""], env={**os.environ, **env},
            stdout=subprocess.DEVNULL)
        script = subprocess.run(["perf", "script", "-i", data], check=True, capture_output=True)
    folded = subprocess.run(["inferno-collapse-perf"], input=script.stdout, check=True,
                            capture_output=True).stdout
    svg = os.path.join(HERE, f"{name}.svg")
    with open(svg, "wb") as out:
        run(["inferno-flamegraph", "--minwidth", "2", "--title", title], input=folded,
            stdout=out)
    total, inclusive = shares(folded.decode())
    print(f"{name}: {title} ({os.path.relpath(svg, ROOT)})")
    for frame, label in FRAMES:
        print(f"  {100 * inclusive.get(frame, 0) / total:5.1f}%  {label}")


def main():
    names = sys.argv[1:] or list(CASES)
    unknown = [n for n in names if n not in CASES]
    if unknown:
        sys.exit(f"unknown case {unknown}; choose from {list(CASES)}")
    ensure_tools()
    run(["cargo", "build", "--release", "-q", "-p", "sessiondb-bench", "--bin",
         "sessiondb-compare"], cwd=ROOT)
    for name in names:
        profile(name)


if __name__ == "__main__":
    main()
