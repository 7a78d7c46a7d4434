#!/usr/bin/env bash
# Side-by-side start-up and CSV benchmark: bare exec, agentjail's native tier (fully isolated;
# the musl and the glibc build), bubblewrap (the profile measured in
# shared/research/perf-baselines.md) and agentjail's gVisor tier, in one hyperfine run each.
# Usage: bench/run.sh [RUNS]   (needs root for agentjail's cgroups; installs hyperfine and bwrap)
set -euo pipefail
cd "$(dirname "$0")/.."
runs=${1:-300}
command -v hyperfine >/dev/null && command -v bwrap >/dev/null && command -v runsc >/dev/null || {
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq hyperfine bubblewrap runsc
}
cargo build --release -q -p agentjail
aj="$PWD/target/x86_64-unknown-linux-gnu/release/agentjail"
# The musl build (the deployment build on x86_64; needs Rust's musl target and musl-tools).
command -v x86_64-linux-musl-gcc >/dev/null || DEBIAN_FRONTEND=noninteractive apt-get install -y -qq musl-tools
rustup target add x86_64-unknown-linux-musl >/dev/null
cargo build --release -q -p agentjail --target x86_64-unknown-linux-musl
ajm="$PWD/target/x86_64-unknown-linux-musl/release/agentjail"
py=/usr/bin/python3
work=$(mktemp -d /tmp/agentjail-bench-XXXXXX)
chmod 755 "$work"
trap 'rm -rf "$work"' EXIT
$py bench/gen_csv.py "$work/bench.csv"
cp examples/csv-summary/summarize.py "$work/summarize.py"
chmod 644 "$work"/*
bwrap_profile=(bwrap --unshare-all --die-with-parent --new-session --ro-bind /usr /usr
  --symlink usr/lib /lib --symlink usr/lib64 /lib64 --symlink usr/bin /bin
  --proc /proc --dev /dev --tmpfs /tmp)
out="$work/out"
# The issue's target is about medians; hyperfine's tables show means.
medians() {
  $py -c 'import json, sys
for r in json.load(open(sys.argv[1]))["results"]:
    print("median %-18s %8.2f ms" % (r["command"], r["median"] * 1000))' "$1"
}

echo "== /bin/true: bare vs agentjail vs bwrap =="
hyperfine -N -w 20 -r "$runs" --export-markdown "$work/true.md" --export-json "$work/true.json" \
  -n bare '/bin/true' \
  -n agentjail-musl "$ajm run -- /bin/true" \
  -n agentjail-glibc "$aj run -- /bin/true" \
  -n bwrap "${bwrap_profile[*]} -- /bin/true" \
  -n agentjail-gvisor "$aj run --isolation gvisor -- /bin/true"
cat "$work/true.md"
medians "$work/true.json"

echo "== CSV summary (10 MB, 200k rows): bare vs agentjail vs bwrap =="
csv_runs=$(( runs / 10 > 10 ? runs / 10 : 10 ))
hyperfine -w 3 -r "$csv_runs" --export-markdown "$work/csv.md" --export-json "$work/csv.json" \
  -n bare "$py $work/summarize.py $work/bench.csv $work/bare.json" \
  -n agentjail-musl "$ajm run --ro $work/bench.csv:/input/report.csv --ro $work/summarize.py:/input/summarize.py -- $py /input/summarize.py /input/report.csv /output/summary.json" \
  -n agentjail-glibc "$aj run --ro $work/bench.csv:/input/report.csv --ro $work/summarize.py:/input/summarize.py -- $py /input/summarize.py /input/report.csv /output/summary.json" \
  -n bwrap "${bwrap_profile[*]} --ro-bind $work/bench.csv /input/report.csv --ro-bind $work/summarize.py /input/summarize.py --tmpfs /output -- $py /input/summarize.py /input/report.csv /output/summary.json" \
  -n agentjail-gvisor "$aj run --isolation gvisor --ro $work/bench.csv:/input/report.csv --ro $work/summarize.py:/input/summarize.py -- $py /input/summarize.py /input/report.csv /output/summary.json"
cat "$work/csv.md"
medians "$work/csv.json"
