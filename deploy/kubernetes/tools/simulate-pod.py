#!/usr/bin/env python3
"""Run agentjail inside a container built the way a Kubernetes node builds a pod's container,
with one securityContext setting changed at a time, and print what agentjail says.

No cluster is needed: `runc` (Debian's package) runs an OCI bundle whose config carries what
kubelet + containerd would put there for each setting (docs/deploy.md, "Why each setting"):

- seccomp: Docker's default profile (the source of containerd's RuntimeDefault), converted to
  the OCI form for the container's capabilities exactly as containerd does (`includes`/
  `excludes` by capability and architecture); or deploy/kubernetes/seccomp/agentjail.json
  (Localhost); or none (Unconfined).
- capabilities: containerd's default set (no CAP_SYS_ADMIN).
- procMount Default: runc's masked and read-only /proc and /sys paths; Unmasked: none.
- /sys/fs/cgroup: read-only (every unprivileged container) or read-write (privileged).
- hostUsers: false: a user namespace mapping 65536 ids from host uid 100000 (kubelet's
  default range size).

AppArmor cannot be simulated on a host without AppArmor in its LSM list; the docs say so.

Usage: simulate-pod.py AGENTJAIL_BINARY DOCKER_DEFAULT_SECCOMP_JSON [VARIANT...]
Needs root and runc. Each variant's bundle lives in a temporary folder, removed afterwards.

By default the container's root is empty but for the host's /usr, /bin, /sbin, /lib, /lib64
and /etc (read-only binds) and AGENTJAIL_BINARY at /opt/agentjail/agentjail. With
SIMULATE_ROOTFS=DIR the root is DIR instead, an image's root file system (ci/release/check.sh
passes the imported release image), read-only, and agentjail is the image's own
/usr/local/bin/agentjail: give `-` as AGENTJAIL_BINARY. DOCKER_DEFAULT_SECCOMP_JSON may be `-`
when no variant asked for uses it.
"""

import json
import re
import os
import shutil
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
AGENTJAIL_PROFILE = os.path.join(HERE, "..", "seccomp", "agentjail.json")

# containerd's default capability set for a container (oci.WithDefaultUnixDevices' sibling
# `defaultUnixCaps` in containerd's pkg/oci/spec.go), which kubelet leaves as is.
CONTAINERD_DEFAULT_CAPS = [
    "CAP_CHOWN", "CAP_DAC_OVERRIDE", "CAP_FSETID", "CAP_FOWNER", "CAP_MKNOD", "CAP_NET_RAW",
    "CAP_SETGID", "CAP_SETUID", "CAP_SETFCAP", "CAP_SETPCAP", "CAP_NET_BIND_SERVICE",
    "CAP_SYS_CHROOT", "CAP_KILL", "CAP_AUDIT_WRITE",
]
ALL_CAPS = CONTAINERD_DEFAULT_CAPS + [
    "CAP_DAC_READ_SEARCH", "CAP_LINUX_IMMUTABLE", "CAP_NET_BROADCAST", "CAP_NET_ADMIN",
    "CAP_IPC_LOCK", "CAP_IPC_OWNER", "CAP_SYS_MODULE", "CAP_SYS_RAWIO", "CAP_SYS_PTRACE",
    "CAP_SYS_PACCT", "CAP_SYS_ADMIN", "CAP_SYS_BOOT", "CAP_SYS_NICE",
    "CAP_SYS_TIME", "CAP_SYS_TTY_CONFIG", "CAP_LEASE", "CAP_AUDIT_CONTROL", "CAP_MAC_OVERRIDE",
    "CAP_MAC_ADMIN", "CAP_SYSLOG", "CAP_WAKE_ALARM", "CAP_BLOCK_SUSPEND", "CAP_AUDIT_READ",
    "CAP_PERFMON", "CAP_BPF", "CAP_CHECKPOINT_RESTORE",
    # CAP_SYS_RESOURCE is left out: the machine these were checked on lacks it in its own
    # bounding set, and runc cannot grant what it does not hold.
]

# Go architecture names used in the profiles' `includes.arches`, for this machine.
GO_ARCHES = {"x86_64": {"amd64", "x32", "x86"}, "aarch64": {"arm64", "arm"}}


def to_oci(profile, caps):
    """The Docker/containerd seccomp profile format → the OCI runtime spec's linux.seccomp, for
    a container with `caps`, as containerd's and moby's loaders do it."""
    arches = GO_ARCHES.get(os.uname().machine, set())
    kernel = tuple(int(x) for x in os.uname().release.split("-")[0].split(".")[:2])
    out = {
        "defaultAction": profile["defaultAction"],
        "architectures": [],
        "syscalls": [],
    }
    if "defaultErrnoRet" in profile:
        out["defaultErrnoRet"] = profile["defaultErrnoRet"]
    for a in profile.get("archMap", []):
        if a["architecture"] in ("SCMP_ARCH_X86_64", "SCMP_ARCH_AARCH64"):
            out["architectures"] = [a["architecture"]] + (a["subArchitectures"] or [])
    for s in profile["syscalls"]:
        inc, exc = s.get("includes", {}), s.get("excludes", {})
        if inc.get("caps") and not set(inc["caps"]) <= set(caps):
            continue
        if inc.get("arches") and not set(inc["arches"]) & arches:
            continue
        if inc.get("minKernel"):
            want = tuple(int(x) for x in inc["minKernel"].split(".")[:2])
            if kernel < want:
                continue
        if exc.get("caps") and set(exc["caps"]) & set(caps):
            continue
        if exc.get("arches") and set(exc["arches"]) & arches:
            continue
        rule = {"names": s["names"], "action": s["action"]}
        if s.get("args"):
            rule["args"] = s["args"]
        if "errnoRet" in s:
            rule["errnoRet"] = s["errnoRet"]
        out["syscalls"].append(rule)
    return out


# Each variant: the pod settings it stands for.
BASE = {
    "seccomp": "runtime-default",  # runtime-default | agentjail | unconfined
    "caps": "default",  # default | all
    "proc": "masked",  # masked (procMount Default) | unmasked
    "cgroup": "ro",  # ro | rw
    "userns": False,  # hostUsers: false
    "nnp": True,  # allowPrivilegeEscalation: false
}
VARIANTS = {
    # What an unprivileged pod gets by default (restricted-ish; runs as root in the container).
    "default": {},
    "seccomp-profile": {"seccomp": "agentjail"},
    "seccomp-profile+unmasked": {"seccomp": "agentjail", "proc": "unmasked"},
    "seccomp-profile+unmasked+cgroup-rw": {
        "seccomp": "agentjail", "proc": "unmasked", "cgroup": "rw"},
    "capsysadmin+unmasked+cgroup-rw": {
        "seccomp": "runtime-default", "caps": "all", "proc": "unmasked", "cgroup": "rw"},
    "unconfined+unmasked+cgroup-rw": {
        "seccomp": "unconfined", "proc": "unmasked", "cgroup": "rw"},
    "seccomp-profile+unmasked+cgroup-rw+no-caps": {
        "seccomp": "agentjail", "proc": "unmasked", "cgroup": "rw", "caps": "none"},
    "seccomp-profile+unmasked+cgroup-rw+setid-caps": {
        "seccomp": "agentjail", "proc": "unmasked", "cgroup": "rw", "caps": "setid"},
    "seccomp-profile+unmasked+cgroup-rw+setid-setfcap-caps": {
        "seccomp": "agentjail", "proc": "unmasked", "cgroup": "rw", "caps": "setid+setfcap"},
    "seccomp-profile+unmasked+cgroup-rw+minimal-caps": {
        "seccomp": "agentjail", "proc": "unmasked", "cgroup": "rw", "caps": "minimal"},
    "seccomp-profile+cgroup-rw": {"seccomp": "agentjail", "cgroup": "rw"},
    "hostusers-false+seccomp-profile+unmasked": {
        "seccomp": "agentjail", "proc": "unmasked", "userns": True},
    "privileged": {"seccomp": "unconfined", "caps": "all", "proc": "unmasked", "cgroup": "rw",
                   "nnp": False},
}

# The OCI runtime: runc (what containerd runs by default), or gVisor's runsc (a node's `runsc`
# RuntimeClass; the pod's network is not needed here).
RUNTIMES = {
    "runc": ["runc"],
    "runsc": ["runsc", "--network=none", "--platform=ptrace"],
}

ROOT_BINDS = ["/usr", "/bin", "/sbin", "/lib", "/lib64", "/etc"]


ROOTFS = os.environ.get("SIMULATE_ROOTFS")
# Where agentjail is inside the container.
AGENTJAIL = "/usr/local/bin/agentjail" if ROOTFS else "/opt/agentjail/agentjail"


def config(v, docker_profile, agentjail_bin, args):
    caps = {"all": ALL_CAPS, "default": CONTAINERD_DEFAULT_CAPS, "none": [],
            "setid": ["CAP_SETUID", "CAP_SETGID"],
            "setid+setfcap": ["CAP_SETUID", "CAP_SETGID", "CAP_SETFCAP"],
            "minimal": ["CAP_SETUID", "CAP_SETGID", "CAP_SETFCAP", "CAP_DAC_OVERRIDE"]}[v["caps"]]
    d = tempfile.mkdtemp(prefix="ajk8s-spec-")
    try:
        subprocess.run(["runc", "spec", "--bundle", d], check=True)
        with open(os.path.join(d, "config.json")) as f:
            c = json.load(f)
    finally:
        shutil.rmtree(d)
    c["process"]["terminal"] = False
    c["process"]["args"] = args
    path = "/usr/local/bin:/usr/bin:/bin" if ROOTFS else "/opt/agentjail:/usr/bin:/bin"
    c["process"]["env"] = [f"PATH={path}", "HOME=/root", "TMPDIR=/tmp"]
    c["process"]["noNewPrivileges"] = v["nnp"]
    c["process"]["capabilities"] = {k: caps for k in ("bounding", "effective", "permitted")}
    c["root"] = {"path": ROOTFS or "rootfs", "readonly": True}
    c["hostname"] = "pod"
    for m in c["mounts"]:
        if m["destination"] == "/sys/fs/cgroup":
            m["options"] = [o for o in m["options"] if o not in ("ro", "rw")] + [v["cgroup"]]
    if not ROOTFS:
        c["mounts"] += [
            {"destination": b, "type": "bind", "source": b, "options": ["rbind", "ro"]}
            for b in ROOT_BINDS if os.path.isdir(b)
        ]
        c["mounts"] += [
            {"destination": AGENTJAIL, "type": "bind", "source": agentjail_bin,
             "options": ["bind", "ro"]},
        ]
    c["mounts"] += [
        {"destination": "/tmp", "type": "tmpfs", "source": "tmpfs",
         "options": ["nosuid", "nodev", "mode=1777", "size=262144k"]},
        {"destination": "/root", "type": "tmpfs", "source": "tmpfs",
         "options": ["nosuid", "nodev", "mode=700", "size=65536k"]},
    ]
    lin = c["linux"]
    lin["namespaces"] = [{"type": t} for t in ("pid", "network", "ipc", "uts", "mount", "cgroup")]
    if v["userns"]:
        lin["namespaces"].append({"type": "user"})
        lin["uidMappings"] = [{"containerID": 0, "hostID": 100000, "size": 65536}]
        lin["gidMappings"] = [{"containerID": 0, "hostID": 100000, "size": 65536}]
    if v["proc"] == "unmasked":
        lin["maskedPaths"] = []
        lin["readonlyPaths"] = []
    # SIMULATE_CGROUP_PARENT: where the container's cgroup goes (a kubelet-like slice).
    lin["cgroupsPath"] = os.environ.get("SIMULATE_CGROUP_PARENT", "") + f"/ajk8s-{os.getpid()}"
    lin.pop("resources", None)
    if v["seccomp"] == "runtime-default":
        lin["seccomp"] = to_oci(docker_profile, caps)
    elif v["seccomp"] == "agentjail":
        with open(AGENTJAIL_PROFILE) as f:
            lin["seccomp"] = to_oci(json.load(f), caps)
    return c


def run_variant(name, docker_profile, agentjail_bin, args):
    v = dict(BASE, **VARIANTS[name])
    bundle = tempfile.mkdtemp(prefix="ajk8s-")
    try:
        if not ROOTFS:
            rootfs = os.path.join(bundle, "rootfs")
            os.mkdir(rootfs)
            for d in ROOT_BINDS + ["/proc", "/dev", "/sys", "/tmp", "/root", "/opt/agentjail"]:
                os.makedirs(rootfs + d, exist_ok=True)
            open(rootfs + AGENTJAIL, "w").close()
        if v["userns"]:
            os.chmod(bundle, 0o755)
        with open(os.path.join(bundle, "config.json"), "w") as f:
            json.dump(config(v, docker_profile, agentjail_bin, args), f, indent=1)
        cid = f"ajk8s-{os.getpid()}-{name.replace('+', '-')}"[:60]
        runtime = RUNTIMES[os.environ.get("SIMULATE_RUNTIME", "runc")]
        r = subprocess.run(runtime + ["run", "--bundle", bundle, cid], capture_output=True,
                           text=True, timeout=900, stdin=subprocess.DEVNULL)
        subprocess.run(runtime + ["delete", "--force", cid], capture_output=True)
        return v, r.returncode, r.stdout + r.stderr
    finally:
        shutil.rmtree(bundle, ignore_errors=True)


def statefulset_entrypoint():
    """The container's shell script in ../statefulset.yaml (the block under `args: - |`)."""
    with open(os.path.join(HERE, "..", "statefulset.yaml")) as f:
        lines = f.read().split("\n")
    start = next(i for i, l in enumerate(lines) if l.strip() == "- |") + 1
    indent = len(lines[start]) - len(lines[start].lstrip())
    body = []
    for l in lines[start:]:
        if l.strip() and len(l) - len(l.lstrip()) < indent:
            break
        body.append(l[indent:])
    return "\n".join(body).strip() + "\n"


def main():
    if len(sys.argv) < 3:
        print(__doc__, file=sys.stderr)
        return 2
    agentjail_bin, docker_json = sys.argv[1], sys.argv[2]
    names = sys.argv[3:] or list(VARIANTS)
    if (agentjail_bin == "-") != bool(ROOTFS):
        print("simulate-pod: AGENTJAIL_BINARY is `-` exactly when SIMULATE_ROOTFS is set", file=sys.stderr)
        return 2
    docker_profile = None
    if docker_json != "-":
        with open(docker_json) as f:
            docker_profile = json.load(f)
    elif any(dict(BASE, **VARIANTS[n])["seccomp"] == "runtime-default" for n in names):
        print("simulate-pod: a variant with RuntimeDefault seccomp needs Docker's default profile",
              file=sys.stderr)
        return 2
    cmd = os.environ.get("SIMULATE_CMD", "check")
    # The whole `exec … serve …` line (whatever flags follow) is replaced.
    entrypoint = re.sub(
        r"exec /usr/local/bin/agentjail serve --config /etc/agentjail/config.toml[^\n]*",
        lambda _: "set +e\necho \"cgroup: $(cat /proc/self/cgroup); root's subtree_control: "
        "$(cat /sys/fs/cgroup/cgroup.subtree_control 2>/dev/null)\"\n"
        f"{AGENTJAIL} check; echo check exit status $?\n"
        f"{AGENTJAIL} selftest --tier native > /tmp/selftest.out 2>&1; st=$?\n"
        "grep -E '^\\[.*FAIL|passed' /tmp/selftest.out; echo selftest exit status $st",
        statefulset_entrypoint())
    args = {
        "check": [AGENTJAIL, "check"],
        "run": [AGENTJAIL, "run", "--", "/bin/echo", "SENTINEL-ran-inside"],
        "run-degraded": [AGENTJAIL, "run", "--allow-degraded", "--",
                         "/bin/echo", "SENTINEL-ran-inside"],
        "run-gvisor": [AGENTJAIL, "run", "--isolation", "gvisor", "--",
                       "/bin/echo", "SENTINEL-ran-inside"],
        # Not as pid 1 of the container (in a pod, `serve` is pid 1 and runs the self-test as
        # its child): the probe `proc.host_pids` signals the self-test's own pid from inside
        # the sandbox, and pid 1 there is the sandbox's own init.
        # The StatefulSet's own entrypoint (its cgroup v2 step), then check and selftest in
        # place of `serve`.
        "entrypoint": ["/bin/sh", "-c", entrypoint],
        "selftest": ["/bin/sh", "-c", f"{AGENTJAIL} selftest --tier native; "
                     "echo selftest exit status $?"],
    }[cmd]
    for name in names:
        v, rc, out = run_variant(name, docker_profile, agentjail_bin, args)
        print(f"=== {name}: {json.dumps(v, sort_keys=True)}")
        print(f"--- `agentjail {cmd}` exit status {rc}")
        print(out.rstrip())
    return 0


if __name__ == "__main__":
    sys.exit(main())
