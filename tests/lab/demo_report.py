"""Prints which node ran each slot of a job, from the nodes' own journals.

  python3 tests/lab/demo_report.py [--job demo-tick] [--since '2 min ago']

Exits 1 if any slot ran on more than one node.
"""

import argparse
import collections
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from lab import Lab  # noqa: E402


def runs(lab, job, since):
    """Every run log line of the job on every node, as dicts."""
    for node in lab.group("dlock_nodes"):
        out = lab.ssh(node, ["journalctl", "-u", "dlock-%s.service" % job, "-o", "cat", "--no-pager",
                             "--since", since], check=True).stdout
        for line in out.splitlines():
            if line.startswith("{"):
                record = json.loads(line)
                record.setdefault("host", node)
                yield record


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--job", default="demo-tick")
    parser.add_argument("--since", default="1 min ago")
    args = parser.parse_args()
    slots = collections.defaultdict(lambda: {"ran": [], "skipped": [], "other": []})
    for record in runs(Lab(), args.job, args.since):
        if "slot" not in record:
            continue
        entry = slots[record["slot"]]
        if record["result"] in ("success", "failed"):
            entry["ran"].append((record["host"], record.get("fence"), record.get("run_id")))
        elif record["result"] in ("skipped_duplicate", "skipped_locked"):
            entry["skipped"].append(record["host"])
        else:
            entry["other"].append("%s:%s" % (record["host"], record["result"]))
    rows = [("SLOT (UTC)", "RAN ON", "FENCE", "SKIPPED ON (exit 74/73)", "OTHER")]
    twice = 0
    for number in sorted(slots):
        entry = slots[number]
        ran = entry["ran"]
        twice += len(ran) > 1
        run_id = ran[0][2] if ran else None
        rows.append((run_id.split("@")[1] if run_id else "slot %d" % number,
                     ", ".join(run[0] for run in ran) or "-",
                     ", ".join(str(run[1]) for run in ran) or "-",
                     ", ".join(sorted(entry["skipped"])) or "-",
                     ", ".join(entry["other"]) or ""))
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    for row in rows:
        print("  ".join(cell.ljust(width) for cell, width in zip(row, widths)).rstrip())
    print("\n%d slots; %s" % (len(slots), "every slot ran on exactly one node" if not twice and all(
        s["ran"] for s in slots.values()) else "%d slot(s) ran twice" % twice))
    return 1 if twice else 0


if __name__ == "__main__":
    sys.exit(main())
