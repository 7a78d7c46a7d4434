"""Writes a seeded CSV (200k rows x 5 numeric columns, ~10 MB) for the CSV benchmark."""
import random
import sys

random.seed(42)
with open(sys.argv[1], "w") as f:
    f.write("a,b,c,d,e\n")
    for _ in range(200_000):
        f.write(",".join(f"{random.uniform(-1000, 1000):.4f}" for _ in range(5)) + "\n")
