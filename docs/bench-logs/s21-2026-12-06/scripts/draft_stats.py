"""Per run of a draftlens database: how many drafted ids it stored and how many distinct (a random
drafter that drafts one token everywhere shows up as 1), and for pairs A:B the share of
draft ids equal in chunks of the same prompt and length (how often two backends drafted alike).
usage: python3 draft_stats.py DB [A:B ...]"""
import sqlite3
import struct
import sys


def chunks(c, run):
    rows = c.execute("select prompt_index, seq, draft_ids from record_chunk where run_id=? order by seq", (run,))
    return [(p, struct.unpack(f"<{len(b) // 4}I", b)) for p, _, b in rows]


c = sqlite3.connect(sys.argv[1])
for run, name in c.execute("select id, name from run order by id").fetchall():
    ids = [x for _, ch in chunks(c, run) for x in ch]
    print(f"run {run} {name}: {len(ids)} draft ids, {len(set(ids))} distinct")
for pair in sys.argv[2:]:
    a, b = (int(x) for x in pair.split(":"))
    same = total = 0
    for (pa, ca), (pb, cb) in zip(chunks(c, a), chunks(c, b)):
        if pa == pb and len(ca) == len(cb):
            total += len(ca)
            same += sum(x == y for x, y in zip(ca, cb))
    print(f"runs {a} vs {b}: {same} of {total} draft ids equal in aligned chunks ({100 * same / max(total, 1):.1f}%)")
