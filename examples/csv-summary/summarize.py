"""Summarize a CSV file into JSON: row count, and per numeric column count/min/max/mean/sum.

This is the kind of code a model proposes for "summarize this upload". It runs inside
agentjail with the CSV mounted read-only at /input and writes one file to /output.
"""
import csv
import json
import sys


def summarize(path):
    with open(path, newline="", encoding="utf-8") as f:
        reader = csv.DictReader(f)
        columns = reader.fieldnames or []
        rows = 0
        numeric = {c: [] for c in columns}
        non_numeric = set()
        missing = {c: 0 for c in columns}
        for row in reader:
            rows += 1
            for c in columns:
                v = (row.get(c) or "").strip()
                if v == "":
                    missing[c] += 1
                    continue
                try:
                    numeric[c].append(float(v))
                except ValueError:
                    non_numeric.add(c)
    stats = {}
    for c in columns:
        vals = numeric[c]
        if c in non_numeric or not vals:
            continue
        stats[c] = {
            "count": len(vals),
            "missing": missing[c],
            "min": min(vals),
            "max": max(vals),
            "mean": round(sum(vals) / len(vals), 6),
            "sum": round(sum(vals), 6),
        }
    return {"rows": rows, "columns": columns, "numeric": stats}


if __name__ == "__main__":
    src, dst = sys.argv[1], sys.argv[2]
    summary = summarize(src)
    with open(dst, "w", encoding="utf-8") as out:
        json.dump(summary, out, indent=2, sort_keys=True)
        out.write("\n")
