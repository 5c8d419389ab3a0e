"""Draws bench/compare/chart.png from results.json: for every operation, how many times slower
each peer is than sessiondb (log scale; the line at 1× is parity). Pi's appends, never fsynced,
are set against sessiondb without fsync."""
import json
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

results = json.load(open(sys.argv[1]))
ratios = results["ratios"]  # peer -> op -> peer ms / sessiondb ms (see run.py's `baseline`)
peers = [("cf", "CF agents Sessions"), ("openai", "OpenAI SQLiteSession"),
         ("pi", "Pi SessionManager"), ("langgraph", f"LangGraph SqliteSaver (N={results['langgraph_n']})")]
ops = [("append", "append"), ("last50", "last 50"), ("whole", "whole history"),
       ("search", "search"), ("branch", "branch"), ("branch_read", "read branch"),
       ("compact_read", "read after compaction"), ("reopen_last50", "reopen + last 50"),
       ("concurrent8", "8 writers"), ("concurrent32", "32 writers")]

fig, ax = plt.subplots(figsize=(9, 6.5))
height = 0.8 / len(peers)
for k, (peer, label) in enumerate(peers):
    ys, xs = [], []
    for row, (op, _) in enumerate(ops):
        if op in ratios.get(peer, {}):
            ys.append(row + k * height)
            xs.append(ratios[peer][op])
    ax.barh(ys, xs, height=height, label=label)
ax.set_xscale("log")
ax.axvline(1, color="black", linewidth=1)
ax.set_yticks([row + 0.4 - height / 2 for row in range(len(ops))])
ax.set_yticklabels([title for _, title in ops])
ax.invert_yaxis()
ax.set_xlabel("peer time ÷ sessiondb time (log scale; right of the line: sessiondb is faster)")
ax.set_title(f"sessiondb vs peers, N={results['n']:,} messages ({results['date']})")
ax.legend(loc="lower right", fontsize="small")
fig.tight_layout()
fig.savefig(sys.argv[2], dpi=110)
