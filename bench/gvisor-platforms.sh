#!/usr/bin/env bash
# gVisor platforms side by side: agentjail's gVisor tier on every platform that runs on this
# machine, in one hyperfine run each for `/bin/true` and for the CSV example, with bare and the
# native tier as reference points.
#
# Platforms: Debian's runsc (ptrace; the 20221219 package has no systrap) and, when RUNSC_NEW
# names a newer runsc (e.g. Debian 13's 20240729, unpacked without installing it, see
# docs/performance.md), that one's systrap and ptrace. KVM is first tried under a timeout: when
# it does not start /bin/true within KVM_TIMEOUT seconds it is reported and left out (on a VM
# whose /dev/kvm is kvm_pvm, gVisor's KVM platform spins at start-up).
# Usage: [RUNSC_NEW=/path/to/newer/runsc] [AJ=agentjail] bench/gvisor-platforms.sh [RUNS]   (root; installs hyperfine and runsc if missing)
set -euo pipefail
cd "$(dirname "$0")/.."
runs=${1:-100}
KVM_TIMEOUT=${KVM_TIMEOUT:-20}
command -v hyperfine >/dev/null && command -v runsc >/dev/null || {
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq hyperfine runsc
}
# AJ=path/to/agentjail measures that binary instead of a fresh release build.
if [ -z "${AJ:-}" ]; then
  cargo build --release -q -p agentjail
  AJ="$PWD/target/x86_64-unknown-linux-gnu/release/agentjail"
fi
aj=$AJ
py=/usr/bin/python3
work=$(mktemp -d /tmp/agentjail-gvbench-XXXXXX)
chmod 755 "$work"
trap 'rm -rf "$work"' EXIT
$py bench/gen_csv.py "$work/bench.csv"
cp examples/csv-summary/summarize.py "$work/summarize.py"
chmod 644 "$work"/*
old=$(command -v runsc)
# name:runsc:platform for every combination that starts here.
candidates=("ptrace-2022:$old:ptrace" "kvm-2022:$old:kvm")
if [ -n "${RUNSC_NEW:-}" ]; then
  candidates+=("systrap-2024:$RUNSC_NEW:systrap" "ptrace-2024:$RUNSC_NEW:ptrace" "kvm-2024:$RUNSC_NEW:kvm")
fi
true_cmds=(-n bare '/bin/true' -n agentjail-native "$aj run -- /bin/true")
csv_args="--ro $work/bench.csv:/input/report.csv --ro $work/summarize.py:/input/summarize.py -- $py /input/summarize.py /input/report.csv /output/summary.json"
csv_cmds=(-n bare "$py $work/summarize.py $work/bench.csv $work/bare.json" -n agentjail-native "$aj run $csv_args")
for c in "${candidates[@]}"; do
  IFS=: read -r name runsc platform <<<"$c"
  env_=(env AGENTJAIL_RUNSC="$runsc" AGENTJAIL_GVISOR_PLATFORM="$platform")
  if ! timeout "$KVM_TIMEOUT" "${env_[@]}" "$aj" run --isolation gvisor --timeout "$KVM_TIMEOUT" -- /bin/true >/dev/null 2>&1; then
    echo "== $name ($runsc --platform=$platform): does not run here (no exit 0 within ${KVM_TIMEOUT} s); left out"
    continue
  fi
  echo "== $name ($runsc --platform=$platform): runs"
  true_cmds+=(-n "gvisor-$name" "${env_[*]} $aj run --isolation gvisor -- /bin/true")
  csv_cmds+=(-n "gvisor-$name" "${env_[*]} $aj run --isolation gvisor $csv_args")
done
medians() {
  $py -c 'import json, sys
for r in json.load(open(sys.argv[1]))["results"]:
    print("median %-22s %8.2f ms" % (r["command"], r["median"] * 1000))' "$1"
}
echo "== /bin/true =="
hyperfine -N -w 5 -r "$runs" --export-markdown "$work/true.md" --export-json "$work/true.json" "${true_cmds[@]}"
cat "$work/true.md"; medians "$work/true.json"
echo "== CSV summary (10 MB, 200k rows) =="
csv_runs=$(( runs / 5 > 10 ? runs / 5 : 10 ))
hyperfine -w 2 -r "$csv_runs" --export-markdown "$work/csv.md" --export-json "$work/csv.json" "${csv_cmds[@]}"
cat "$work/csv.md"; medians "$work/csv.json"
