#!/bin/bash
# The kernel matrix: boots Debian 12's 6.1 and 6.12 kernels under qemu (TCG: this CI machine's
# /dev/kvm cannot run a stock kernel) with the host's / shared read-only over 9p and the given
# agentjail binary inside, and runs guest.sh's configurations and probes in each.
# Usage: run.sh AGENTJAIL_BINARY [RUN_DIR]    Env: AJ_KERNEL_CACHE (default
# /var/cache/agentjail-kernels), AJ_MATRIX (default: all boots below), AJ_MATRIX_JOBS (boots at
# once, default 2), QEMU_TIMEOUT (per boot).
# Exit 0 only when every probe passed or is an expected failure listed in `expect`.
set -uo pipefail
HERE=$(dirname "$(realpath "$0")")
REPO=$(realpath "$HERE/../..")
AJ=$(realpath "$1"); RUNS=$(realpath -m "${2:-$REPO/target/kernel-matrix}")
CACHE=${AJ_KERNEL_CACHE:-/var/cache/agentjail-kernels}
# label  series  configs  extra kernel args
MATRIX=${AJ_MATRIX:-"6.12:6.12:root,scope,leaf,deleg,nodeleg: 6.1:6.1:root,scope,leaf,deleg,nodeleg: 6.1-nolsm:6.1:root:lsm=lockdown,capability,yama,apparmor,tomoyo,bpf"}
for t in qemu-system-x86_64 busybox depmod python3 setpriv; do
  command -v $t >/dev/null || { echo "kernel-matrix: $t is missing (apt-get install qemu-system-x86 busybox-static kmod)" >&2; exit 1; }
done
declare -A KDIR
while read -r series dir; do KDIR[$series]=$dir; done < <("$HERE/fetch-kernels.sh" "$CACHE") || exit 1
mkdir -p "$RUNS"; rm -f "$RUNS/results"
fail=0
# One boot: its initramfs, qemu, and its results in $RUNS/<label>/results.txt. The guest's suite
# runs one agentjail at a time, so a boot keeps about one host core busy: AJ_MATRIX_JOBS boots
# (default 2) run side by side; the results are gathered in the matrix's order afterwards.
boot() {
  local label=$1 series=$2 configs=$3 kargs=$4
  local kdir=${KDIR[$series]:?no kernel $series}
  local d=$RUNS/$label; rm -rf "$d"; mkdir -p "$d/out"
  if ! "$HERE/build-initrd.sh" "$kdir" "$d/initrd.gz" "$AJ" > "$d/initrd.log" 2>&1; then
    cat "$d/initrd.log" >&2
    echo "AJ-RESULT $label - boot FAIL initrd" > "$d/results.txt"; return
  fi
  local start=$SECONDS
  timeout "${QEMU_TIMEOUT:-900}" qemu-system-x86_64 -accel tcg,thread=multi -cpu max -m 2048 -smp 2 \
    -nographic -no-reboot -nic none -kernel "$(ls "$kdir"/boot/vmlinuz-*)" -initrd "$d/initrd.gz" \
    -virtfs local,path=/,mount_tag=hostroot,security_model=none,readonly=on,multidevs=remap \
    -virtfs local,path="$d/out",mount_tag=out,security_model=none \
    -append "console=ttyS0 panic=-1 loglevel=4 aj.label=$label aj.repo=$REPO aj.configs=$configs $kargs" \
    > "$d/console.log" 2>&1 < /dev/null
  echo "kernel-matrix: $label booted and ran in $((SECONDS - start))s (console: $d/console.log)"
  {
    grep -q "AJ-DONE $label" "$d/out/results" 2>/dev/null \
      || echo "AJ-RESULT $label - boot FAIL the suite did not finish (see $d/console.log)"
    cat "$d/out/results" 2>/dev/null
    grep -a '^AJ-PROTECTIONS\|^AJ-TIME\|^AJ-LEFTOVER' "$d/console.log" | tr -d '\r'
  } > "$d/results.txt"
}
jobs_max=${AJ_MATRIX_JOBS:-2}
for entry in $MATRIX; do
  IFS=: read -r label series configs kargs <<< "$entry"
  while [ "$(jobs -rp | wc -l)" -ge "$jobs_max" ]; do wait -n; done
  boot "$label" "$series" "$configs" "$kargs" &
done
wait
for entry in $MATRIX; do
  label=${entry%%:*}
  cat "$RUNS/$label/results.txt" >> "$RUNS/results" 2>/dev/null \
    || echo "AJ-RESULT $label - boot FAIL no results" >> "$RUNS/results"
done
# Compare with the expectations.
expected() {  # expected LABEL CONFIG PROBE -> reason, if listed
  awk -v l="$1" -v c="$2" -v p="$3" '!/^#/ && NF>=3 && ($1==l||$1=="*") && ($2==c||$2=="*") && ($3==p||$3=="*") { $1=$2=$3=""; print; exit }' "$HERE/expect"
}
echo "=== kernel matrix ($(date -u +%FT%TZ)) ==="
grep -a '^AJ-KERNEL\|^AJ-PROTECTIONS\|^AJ-TIME\|^AJ-LEFTOVER' "$RUNS/results"
while read -r _ label cfg probe verdict detail; do
  why=$(expected "$label" "$cfg" "$probe")
  if [ "$verdict" = PASS ]; then
    [ -n "$why" ] && echo "XPASS $label $cfg $probe (expected to fail: $why; delete its line in ci/kernel-matrix/expect)" || echo "pass  $label $cfg $probe  $detail"
  elif [ -n "$why" ]; then echo "xfail $label $cfg $probe ($why)  $detail"
  else echo "FAIL  $label $cfg $probe  $detail"; fail=1; fi
done < <(grep -a '^AJ-RESULT' "$RUNS/results")
grep -aq '^AJ-LEFTOVER' "$RUNS/results" && { echo "FAIL: cgroups left behind (AJ-LEFTOVER above)"; fail=1; }
for entry in $MATRIX; do
  label=${entry%%:*}
  grep -aq "^AJ-DONE $label" "$RUNS/results" || { echo "FAIL  $label did not finish"; fail=1; }
done
[ $fail = 0 ] && echo "kernel matrix: OK" || echo "kernel matrix: FAILED"
exit $fail
