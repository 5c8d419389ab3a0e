"""The shared workload pieces of the Python drivers: the text generator every driver (Rust,
Python, Node) implements identically, medians, scratch folders, and the JSON-lines output."""
import atexit
import json
import os
import shutil
import statistics
import sys
import tempfile
import time

WORDS = ("alpha beta gamma delta epsilon zeta eta theta iota kappa lambda mu nu xi omicron "
         "pi rho sigma tau").split()
NEEDLE = "needletoken"
LAST_READS = 200
WHOLE_READS = 5
SEARCHES = 50
BRANCHES = 20
REOPENS = 3
CONCURRENT_APPENDS = 4000


def texts(n):
    """30 words picked by seed = (seed * 1103515245 + 12345) mod 2**31 (word seed*19 >> 31),
    then ` msg{i}`, and the needle in message n // 2."""
    seed = 42
    for i in range(n):
        words = []
        for _ in range(30):
            seed = (seed * 1103515245 + 12345) % (1 << 31)
            words.append(WORDS[(seed * len(WORDS)) >> 31])
        words.append(f"msg{i}")
        if i == n // 2:
            words.append(NEEDLE)
        yield " ".join(words)


def emit(op, ms):
    print(json.dumps({"op": op, "ms": ms}), flush=True)


def finish(size_bytes, durability):
    print(json.dumps({"size_bytes": size_bytes, "durability": durability}), flush=True)


def timed(f):
    started = time.perf_counter()
    value = f()
    return (time.perf_counter() - started) * 1000, value


async def timed_async(awaitable):
    started = time.perf_counter()
    value = await awaitable
    return (time.perf_counter() - started) * 1000, value


def median(samples):
    return statistics.median(samples)


def scratch_dir(prefix):
    """A new folder for the store's files, removed when the driver exits (a LangGraph run
    leaves about 0.5 GB)."""
    path = tempfile.mkdtemp(prefix=prefix)
    atexit.register(shutil.rmtree, path, ignore_errors=True)
    return path


def dir_bytes(path):
    return sum(os.path.getsize(os.path.join(path, f)) for f in os.listdir(path)
               if os.path.isfile(os.path.join(path, f)))


def progress(message):
    print(message, file=sys.stderr, flush=True)
