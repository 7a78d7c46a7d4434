#!/usr/bin/env python3
"""Writes deploy/kubernetes/seccomp/agentjail.json: Docker's default seccomp profile (the one
containerd's RuntimeDefault is derived from) plus exactly the calls agentjail's native tier
makes to build its sandbox, which Docker's profile allows only to containers holding
CAP_SYS_ADMIN (or, for pivot_root, to none). docs/deploy.md explains each one.

Second, the calls agentjail's own filter refuses inside the sandbox and names in the run
report (crates/engine/src/seccomp.rs, `denied_syscalls`, read from the source): a filter of the
pod that refused them first would win (the kernel applies the strictest action of all filters,
and EPERM beats agentjail's user notification), so they would still be refused but no longer
reported, and `agentjail selftest` would fail its syscall probes. The container still lacks the
capabilities most of them need (CAP_SYS_ADMIN, CAP_SYS_MODULE, CAP_SYS_BOOT, CAP_SYS_TIME, …),
so for agentjail's own processes outside the sandbox the kernel refuses those anyway.

Usage: generate.py DOCKER_DEFAULT_JSON ENGINE_SECCOMP_RS > agentjail.json
DOCKER_DEFAULT_JSON is profiles/seccomp/default.json of moby (Debian 12 ships it in the package
golang-github-docker-docker-dev, at
/usr/share/gocode/src/github.com/docker/docker/profiles/seccomp/default.json);
ci/validate-k8s.sh regenerates the file from that package and fails when it differs.
"""

import json
import re
import sys

# What the native tier calls (crates/engine: supervisor.rs, inside.rs and inside/, root_sys.rs, sys.rs).
ADDED = {
    "names": [
        "clone",          # clone(CLONE_VM|CLONE_VFORK) of the payload on kernels without clone3
        "clone3",         # the sandbox init: CLONE_NEWUSER|NEWNS|NEWPID|NEWIPC|NEWUTS; the payload: CLONE_INTO_CGROUP
        "unshare",        # the init: CLONE_NEWNET; the payload: CLONE_NEWCGROUP
        "mount",          # tmpfs, proc, read-only binds of the sandbox's root
        "umount2",        # detaching the old root after pivot_root
        "pivot_root",     # into the sandbox's root (Docker's profile never allows it)
        "mount_setattr",  # read-only, nosuid, nodev on whole bind trees (AT_RECURSIVE)
        "sethostname",    # the sandbox's own hostname (its own UTS namespace)
    ],
    "action": "SCMP_ACT_ALLOW",
    "comment": "agentjail: building the sandbox in its own user, mount, pid, ipc, uts, net and "
    "cgroup namespaces (docs/deploy.md); the sandboxed command gets agentjail's own, stricter "
    "filter on top",
}


def reported(seccomp_rs, already):
    """The names in `denied_syscalls()` of crates/engine/src/seccomp.rs, plus `socket` and
    `socketpair` (agentjail's filter allows families itself and reports the others), minus what
    the profile already allows unconditionally."""
    src = open(seccomp_rs).read()
    body = src[src.index("pub fn denied_syscalls()"):]
    body = body[: body.index("\n}\n")]
    names = re.findall(r'\(libc::SYS_\w+, "(\w+)"\)', body) + ["socket", "socketpair"]
    if len(names) < 40:
        sys.exit(f"{seccomp_rs}: found only {len(names)} denied syscalls; has its format changed?")
    return sorted(set(names) - already)


def main():
    with open(sys.argv[1]) as f:
        p = json.load(f)
    out = []
    for s in p["syscalls"]:
        excl = s.get("excludes", {}).get("caps", [])
        # The rules that narrow clone/clone3 for containers without CAP_SYS_ADMIN (clone only
        # without namespace flags; clone3 ENOSYS) would shadow the allow below: drop them.
        if "CAP_SYS_ADMIN" in excl and set(s["names"]) <= {"clone", "clone3"}:
            continue
        out.append(s)
    out.append(ADDED)
    plain = {
        n
        for s in out
        if s["action"] == "SCMP_ACT_ALLOW" and not s.get("args")
        and not s.get("includes") and not s.get("excludes")
        for n in s["names"]
    }
    out.append({
        "names": reported(sys.argv[2], plain),
        "action": "SCMP_ACT_ALLOW",
        "comment": "agentjail: refused inside the sandbox by agentjail's own filter, which names "
        "each refusal in the run report; refused here, they would go unreported (docs/deploy.md)",
    })
    p["syscalls"] = out
    json.dump(p, sys.stdout, indent=2)
    sys.stdout.write("\n")


if __name__ == "__main__":
    main()
