#!/bin/bash
# Runs simulate-pod.py (SIMULATE_CMD=entrypoint: the StatefulSet's own entrypoint, then
# `agentjail check` and `selftest --tier native`) on pure cgroup v2, which this project's CI
# machine does not have: inside the kernel matrix's VM (ci/kernel-matrix: Debian 12's 6.12
# kernel under qemu, the host's / shared read-only), with a kubelet-like `kubepods.slice`.
# Needs what ci/kernel-matrix needs, plus runc and Docker's default profile (see
# docs/deploy.md, "How this was checked"). Prints the guest's console; takes ~10 minutes.
# Usage: simulate-on-cgroup-v2.sh AGENTJAIL_BINARY DOCKER_DEFAULT_SECCOMP_JSON [VARIANT...]
set -euo pipefail
REPO=$(realpath "$(dirname "$0")/../../..")
AJ=$(realpath "$1"); PROFILE=$(realpath "$2"); shift 2
VARIANTS=${*:-seccomp-profile+unmasked+cgroup-rw+minimal-caps privileged default}
# The kernel matrix takes its repository to be two levels above itself: a work folder (outside
# /tmp, which the guest covers with a tmpfs) holding a copy of it with this guest script.
W=$REPO/target/k8s-sim
rm -rf "$W/ci" && mkdir -p "$W/ci" && cp -r "$REPO/ci/kernel-matrix" "$W/ci/"
cp "$PROFILE" "$W/default.json"
cat > "$W/ci/kernel-matrix/guest.sh" <<GUEST
#!/bin/bash
set -u
export PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin LANG=C.UTF-8
exec 2>&1
echo "AJ-SCRIPT-START"
CG=/sys/fs/cgroup
mount -t securityfs securityfs /sys/kernel/security 2>/dev/null
echo "AJ-KERNEL 6.12 \$(uname -r) lsm=\$(cat /sys/kernel/security/lsm 2>/dev/null)"
# kubelet's layout: controllers enabled from the root down to the pods' slice.
echo "+memory +pids +cpu" > \$CG/cgroup.subtree_control
mkdir -p \$CG/kubepods.slice && echo "+memory +pids +cpu" > \$CG/kubepods.slice/cgroup.subtree_control
cd $REPO/deploy/kubernetes/tools
for v in $VARIANTS; do
  SIMULATE_CGROUP_PARENT=/kubepods.slice SIMULATE_CMD=entrypoint /usr/bin/python3 simulate-pod.py /tmp/aj/agentjail $W/default.json \$v
done
echo "cgroups left under kubepods.slice: \$(find \$CG/kubepods.slice -mindepth 1 -type d | tr '\n' ' ')"
echo "AJ-DONE 6.12" | tee -a /tmp/out/results
poweroff -f
GUEST
chmod +x "$W/ci/kernel-matrix/guest.sh"
AJ_MATRIX="6.12:6.12:pod:" QEMU_TIMEOUT=${QEMU_TIMEOUT:-1500} "$W/ci/kernel-matrix/run.sh" "$AJ" "$W/runs" >/dev/null || true
tr -d '\r' < "$W/runs/6.12/console.log" | sed -n '/AJ-SCRIPT-START/,$p' | grep -v 'Memory cgroup out of memory'
grep -q '^AJ-DONE' "$W/runs/6.12/out/results"
