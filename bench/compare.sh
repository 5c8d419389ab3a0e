#!/usr/bin/env bash
# Measures sessiondb and its peers on the same machine in one run and prints the ratio table.
# Peers are installed from the registries into bench/.peers/ on first use (a few minutes:
# better-sqlite3 compiles SQLite). Usage: bench/compare.sh [N]   (default 10000)
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
root="$(dirname "$here")"
shared="${SESSIONDB_SHARED:-$root/../shared}"
peers="$here/.peers"
n="${1:-10000}"

mkdir -p "$peers/cf"
if [ ! -d "$peers/cf/node_modules/agents" ] || [ ! -d "$peers/cf/node_modules/better-sqlite3" ]; then
  (cd "$peers/cf" && npm init -y >/dev/null &&
   npm install --no-audit --no-fund --ignore-scripts agents@0.32.0 >/dev/null &&
   npm install --no-audit --no-fund better-sqlite3@12 >/dev/null)
fi
if [ ! -x "$peers/oa/bin/python" ]; then
  python3 -m venv "$peers/oa"
  "$peers/oa/bin/pip" install -q 'openai-agents==0.24.0'
fi
(cd "$root" && cargo build --release -q -p sessiondb-bench)
python3 "$here/compare.py" --ours "$root/target/release/sessiondb-bench" --n "$n" \
  --cf-dir "$peers/cf" --oa-python "$peers/oa/bin/python" --peers-dir "$shared/peers"
