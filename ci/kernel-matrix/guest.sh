#!/bin/bash
# The kernel matrix's suite, run as root inside the VM (pure cgroup v2, no systemd). It lays the
# cgroup tree out the way systemd does, then runs agentjail placed as hosts place it:
#   root   in the true root cgroup
#   scope  root from a login session's scope (session-1.scope, which holds the "login shell" too)
#   leaf   root alone in a fresh `systemd-run --scope`-like unit (system.slice/run-uN.scope)
#   deleg  an ordinary user (uid 1000) alone in a scope of its delegated subtree
#          (user@1000.service, chown'd as Delegate=yes does; `systemd-run --user --scope`)
#   nodeleg an ordinary user in its root-owned session scope (no delegation)
# Each probe prints `AJ-RESULT <kernel-label> <config> <probe> PASS|FAIL <detail>`; the host
# (run.sh) compares them with the expectations. Every config also checks that nothing is left
# in the cgroup tree and that no controller changed outside agentjail's own cgroups.
set -u
export PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin LANG=C.UTF-8
exec 2>&1
echo "AJ-SCRIPT-START"
AJ=/tmp/aj/agentjail
P=/tmp/aj/probes.py
CG=/sys/fs/cgroup
arg() { sed -n "s/.*aj\.$1=\([^ ]*\).*/\1/p" /tmp/aj/cmdline; }
LABEL=$(arg label); REPO=$(arg repo); CONFIGS=$(arg configs | tr , ' ')
W=/tmp/w; mkdir -p $W; chmod 1777 $W
mkdir -p /tmp/home1000 && chown 1000:1000 /tmp/home1000
CFG=-
result() { echo "AJ-RESULT $LABEL $CFG $1 $2 ${*:3}" | tee -a /tmp/out/results; }
mount -t securityfs securityfs /sys/kernel/security 2>/dev/null
echo "AJ-KERNEL $LABEL $(uname -r) lsm=$(cat /sys/kernel/security/lsm 2>/dev/null)" | tee -a /tmp/out/results

# --- systemd's layout: controllers enabled down to the slices, as systemd enables them.
echo "+memory +pids +cpu" > $CG/cgroup.subtree_control
for d in user.slice user.slice/user-0.slice user.slice/user-1000.slice system.slice; do
  mkdir -p $CG/$d && echo "+memory +pids +cpu" > $CG/$d/cgroup.subtree_control
done
mkdir -p $CG/user.slice/user-0.slice/session-1.scope $CG/user.slice/user-1000.slice/session-2.scope
# user@1000.service with Delegate=yes: its directory and delegation files belong to the user,
# whose manager enables controllers below it and makes app.slice.
U=$CG/user.slice/user-1000.slice/user@1000.service
mkdir -p $U
chown 1000:1000 $U $U/cgroup.procs $U/cgroup.subtree_control $U/cgroup.threads
setpriv --reuid 1000 --regid 1000 --clear-groups sh -c "echo '+memory +pids +cpu' > $U/cgroup.subtree_control && mkdir $U/app.slice && echo '+memory +pids +cpu' > $U/app.slice/cgroup.subtree_control"
# The login shells of the two sessions (other processes in those scopes).
sleep 100000 & echo $! > $CG/user.slice/user-0.slice/session-1.scope/cgroup.procs
setpriv --reuid 1000 --regid 1000 --clear-groups sleep 100000 & echo $! > $CG/user.slice/user-1000.slice/session-2.scope/cgroup.procs

# --- placing a command as each config does.
N=0
place() {  # place CONFIG CMD... : run CMD placed as CONFIG places agentjail
  local cfg=$1; shift; N=$((N+1))
  case $cfg in
    root) "$@" ;;
    scope|d-scope) bash -c 'echo $$ > '$CG'/user.slice/user-0.slice/session-1.scope/cgroup.procs && exec "$@"' _ "$@" ;;
    leaf) local s=$CG/system.slice/run-u$N.scope; mkdir $s
          bash -c 'echo $$ > '$s'/cgroup.procs && exec "$@"' _ "$@"; local rc=$?
          rmdir $s || echo "AJ-LEFTOVER $s: $(ls $s | grep -v '^cgroup\.\|^memory\.\|^pids\.\|^cpu\.\|^io\.' )"; return $rc ;;
    deleg) local s=$U/app.slice/run-u$N.scope
          setpriv --reuid 1000 --regid 1000 --clear-groups mkdir $s
          bash -c 'echo $$ > '$s'/cgroup.procs && exec setpriv --reuid 1000 --regid 1000 --clear-groups env HOME=/tmp/home1000 "$@"' _ "$@"; local rc=$?
          rmdir $s || echo "AJ-LEFTOVER $s"; return $rc ;;
    nodeleg) bash -c 'echo $$ > '$CG'/user.slice/user-1000.slice/session-2.scope/cgroup.procs && exec setpriv --reuid 1000 --regid 1000 --clear-groups env HOME=/tmp/home1000 "$@"' _ "$@" ;;
  esac
}
controllers() { find $CG -name cgroup.subtree_control | sort | while read -r f; do echo "$f: $(cat $f)"; done; }

run_config() {
  CFG=$1; local cgv=v2; [ "$CFG" = nodeleg ] && cgv=none
  local before; before=$(controllers)
  local t0=$SECONDS o=$W/$CFG; rm -rf $o; mkdir -p $o; chmod 777 $o
  # check: the cgroups line, and what the host offers this config.
  place $CFG $AJ check > $o/check.txt 2>&1
  local cgl; cgl=$(grep '^cgroups' $o/check.txt | tr -s ' ')
  echo "AJ-PROTECTIONS $LABEL $CFG $(grep -E '^(landlock|seccomp|cgroups|strict run)' $o/check.txt | tr -s ' ' | tr '\n' ';')"
  if [ $cgv = v2 ]; then
    case "$cgl" in "cgroups ok v2"*) result check PASS "$cgl";; *) result check FAIL "$cgl";; esac
  else
    # No delegated cgroup, and no systemd in this guest (busybox is PID 1): the fix `check`
    # names must fit that host (an admin's delegation, or --allow-degraded), not systemd-run.
    if echo "$cgl" | grep -q "Permission denied" && grep -q "an admin can delegate one" $o/check.txt \
      && grep -q -e "--allow-degraded" $o/check.txt && ! grep -q "systemd-run" $o/check.txt; then
      result check PASS "$cgl"
    else result check FAIL "$cgl $(grep -m1 'fix:' $o/check.txt | head -c 200)"; fi
  fi
  # The CSV example, strict (no --allow-degraded).
  place $CFG $AJ run --manifest $REPO/examples/csv-summary/manifest.yaml --output-dir $o/csv --report $o/csv.json > $o/csv.out 2>&1
  local rc=$?
  if [ $cgv = v2 ]; then
    result csv-strict $(python3 $P eval ok $o/csv.json v2) "rc=$rc $(grep -m1 refusing $o/csv.out)"
  else
    if [ $rc -ne 0 ] && grep -q 'Permission denied' $o/csv.out && grep -q 'agentjail check' $o/csv.out \
      && ! grep -q 'systemd-run' $o/csv.out; then result csv-strict PASS "refused, pointing at the fix: $(grep -m1 -o 'mkdir[^;]*' $o/csv.out)"
    else result csv-strict FAIL "rc=$rc $(head -c 300 $o/csv.out)"; fi
    place $CFG $AJ run --allow-degraded --manifest $REPO/examples/csv-summary/manifest.yaml --output-dir $o/csvd --report $o/csvd.json > $o/csvd.out 2>&1
    result csv-degraded $(python3 $P eval ok $o/csvd.json none)
  fi
  local RO="--ro $P:/input/probes.py"
  place $CFG $AJ run --allow-degraded --report $o/mem.json --memory-mb 64 $RO -- python3 /input/probes.py hog 200 > $o/mem.out 2>&1
  result memory $(python3 $P eval memory $o/mem.json $cgv)
  place $CFG $AJ run --allow-degraded --report $o/pids.json --pids 8 $RO -- python3 /input/probes.py forkbomb > $o/pids.out 2>&1
  if grep -q '^FORKS .* REFUSED [1-9]' $o/pids.out; then
    result pids $(python3 $P eval pids $o/pids.json $cgv) "$(grep FORKS $o/pids.out)"
  else result pids FAIL "no fork refused: $(head -c 200 $o/pids.out)"; fi
  if [ $cgv = v2 ]; then
    place $CFG $AJ run --allow-degraded --report $o/cpu.json --cpus 0.5 $RO -- python3 /input/probes.py spin 4 > $o/cpu.out 2>&1
    result cpu-limit $(python3 $P eval cpu $o/cpu.json v2 0.25 0.75) "$(head -c 200 $o/cpu.out | grep -v SPIN-DONE)"
  fi
  place $CFG $AJ run --allow-degraded --report $o/esc.json $RO -- python3 /input/probes.py escape > $o/esc.out 2>&1
  if grep -q ESCAPE-PROBE-DONE $o/esc.out && ! grep -q ESCAPED $o/esc.out; then result escape PASS "$(grep HELD $o/esc.out)"
  else result escape FAIL "$(grep -E 'ESCAPED|HELD' $o/esc.out | tr '\n' ' ') $(tail -c 300 $o/esc.out)"; fi
  # v2: the command is born in its cgroup (clone3 CLONE_INTO_CGROUP), not moved in afterwards.
  if [ $cgv = v2 ]; then
    place $CFG env AGENTJAIL_DEBUG_TIMING=coarse $AJ run --allow-degraded -- /bin/true > $o/into.out 2>&1
    grep -q 'cloned into its cgroup (CLONE_INTO_CGROUP)' $o/into.out && result clone-into-cgroup PASS || result clone-into-cgroup FAIL "$(grep -c timing $o/into.out) timing lines"
  fi
  # A long-lived parent (as `serve` is for its runners) in the same cgroup starts several runs.
  if [ $cgv = v2 ]; then
    place $CFG bash -c "for i in 1 2 3; do $AJ run --allow-degraded --report $o/serve\$i.json -- /bin/true || exit 1; done" > $o/serve.out 2>&1
    local sv; sv=$(for i in 1 2 3; do python3 $P eval ok $o/serve$i.json v2 | cut -d' ' -f1; done | sort -u | tr '\n' ' ')
    [ "$sv" = "PASS " ] && result serve-like PASS "3 runs under one parent, each with v2 limits" || result serve-like FAIL "$sv $(tail -c 300 $o/serve.out)"
  fi
  # --- The shipped escape corpus (docs/selftest.md), native tier: it must pass wherever a strict
  # run is possible; where strict is refused (no delegation, no Landlock) it fails honestly on
  # `host.strict_run` and the cgroup-bound probes, listed in `expect`. The gVisor tier is not run
  # here: on pure cgroup v2 runsc leaves its own cgroup behind and enables controllers outside
  # agentjail's (seen in this matrix; docs/isolation.md), which `cleanup` below would report.
  # Not in `scope` and `leaf`: they differ from `root` only in the cgroup placement, which the
  # probes above cover; the self-test takes 50-105 s per placement under TCG.
  case $CFG in scope|leaf) ;; *)
  place $CFG $AJ selftest --tier native > $o/selftest.out 2>&1 && result selftest PASS "$(tail -n 1 $o/selftest.out)" || result selftest FAIL "$(grep -a FAIL $o/selftest.out | cut -c1-60 | tr '\n' ';' | tail -c 400) $(tail -n 1 $o/selftest.out)"
  ;; esac
  # Nothing left behind, no controller changed outside agentjail's own cgroups.
  local left; left=$(find $CG -name 'agentjail-*' -type d)
  [ -z "$left" ] && result cleanup PASS "no agentjail cgroups left" || result cleanup FAIL "left: $left"
  local after; after=$(controllers)
  [ "$before" = "$after" ] && result controllers PASS "unchanged" || result controllers FAIL "$(diff <(echo "$before") <(echo "$after") | tr '\n' ' ')"
  echo "AJ-TIME $LABEL $CFG $((SECONDS - t0))s"
}

for c in $CONFIGS; do run_config $c; done
echo "AJ-DONE $LABEL" | tee -a /tmp/out/results
sync
poweroff -f
