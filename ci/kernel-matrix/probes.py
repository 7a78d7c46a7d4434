#!/usr/bin/env python3
"""The kernel matrix's probes.

Inside the sandbox (mounted at /input/probes.py):  hog MiB | forkbomb | spin SECONDS | escape
Outside, on a run report:  eval KIND REPORT [ARGS]  -> prints "PASS detail" or "FAIL detail".
Every sandbox probe prints a sentinel at its end, so that a probe that was refused by agentjail
("refused by us") cannot be confused with one that failed for another reason.
"""
import json, os, sys, time


def hog(mib):
    chunks = []
    for i in range(int(mib)):
        chunks.append(bytearray(1 << 20))
        for j in range(0, 1 << 20, 4096):
            chunks[-1][j] = 1
    print("HOG-SURVIVED", flush=True)


def forkbomb():
    kids, refused = [], 0
    for _ in range(64):
        try:
            pid = os.fork()
        except OSError:
            refused += 1
            continue
        if pid == 0:
            time.sleep(2)
            os._exit(0)
        kids.append(pid)
    for k in kids:
        os.waitpid(k, 0)
    print(f"FORKS {len(kids)} REFUSED {refused}", flush=True)


def spin(seconds):
    # Two busy processes (not threads: Python's GIL would serialise them) for a fixed wall time.
    end = time.time() + float(seconds)
    pid = os.fork()
    while time.time() < end:
        pass
    if pid == 0:
        os._exit(0)
    os.waitpid(pid, 0)
    print("SPIN-DONE", flush=True)


def escape():
    import ctypes, socket
    libc = ctypes.CDLL(None, use_errno=True)
    held = []

    def attempt(name, fn):
        try:
            ok = fn()
        except Exception as e:  # refused: what we want
            held.append(name)
            return
        if ok:
            print(f"ESCAPED {name}", flush=True)
        else:
            held.append(name)

    attempt("read-shadow", lambda: len(open("/etc/shadow").read()) >= 0)
    attempt("write-usr", lambda: open("/usr/agentjail-escape", "w").write("x") >= 0)
    attempt("write-etc", lambda: open("/etc/agentjail-escape", "w").write("x") >= 0)
    attempt("unshare-user", lambda: libc.unshare(0x10000000) == 0)
    attempt("unshare-mount", lambda: libc.unshare(0x00020000) == 0)
    attempt("mount-tmpfs", lambda: libc.mount(b"none", b"/tmp", b"tmpfs", 0, None) == 0)
    attempt("ptrace-init", lambda: libc.ptrace(16, 1, None, None) == 0)  # PTRACE_ATTACH
    def kill_init():
        # Refused (EPERM: another uid, or Landlock's signal scoping), or accepted and dropped by
        # the kernel (SIGKILL to a pid namespace's init from inside it). Had it taken effect,
        # the whole sandbox would be gone and the sentinel below never printed.
        os.kill(1, 9)
        time.sleep(0.3)
        os.kill(1, 0)
        print("NOTE kill-init: SIGKILL to the sandbox's init was accepted and had no effect", flush=True)
        return False
    attempt("kill-init", kill_init)
    attempt("raw-socket", lambda: socket.socket(socket.AF_INET, socket.SOCK_RAW, 1) is not None)
    attempt("connect-out", lambda: socket.create_connection(("10.0.2.2", 80), timeout=2) is not None)
    attempt("cgroup-write", lambda: open("/sys/fs/cgroup/cgroup.procs", "w").write("1") >= 0)
    print("HELD " + " ".join(held), flush=True)
    print("ESCAPE-PROBE-DONE", flush=True)


def evaluate(kind, path, *args):
    try:
        r = json.load(open(path))
    except Exception as e:
        return f"FAIL no report ({e})"
    iso = r.get("isolation") or {}
    cg = iso.get("cgroup")
    status = r.get("status")
    denials = " | ".join(d.get("detail", "") for d in r.get("denials") or [])
    base = f"status={status} cgroup={cg} landlock={iso.get('landlock_abi')}"
    want_cg = args[0] if args else "v2"
    if kind == "ok":
        good = status == "ok" and (cg or "none") == want_cg
        return ("PASS " if good else "FAIL ") + base + f" degraded={len(iso.get('degraded') or [])}"
    if kind == "memory":
        peak = r.get("peak_memory_bytes", 0)
        if want_cg == "none":
            good = status != "ok"
        else:
            good = (status == "memory_limit" and cg == want_cg and peak >= 48 << 20
                    and "memory: limit" in denials)
        return ("PASS " if good else "FAIL ") + base + f" peak={peak} denials={denials!r}"
    if kind == "pids":
        good = cg == want_cg and "pids: fork refused" in denials if want_cg != "none" else True
        return ("PASS " if good else "FAIL ") + base + f" denials={denials!r}"
    if kind == "cpu":
        lo, hi = float(args[1]), float(args[2])
        wall, cpu = r.get("wall_ms") or 1, r.get("cpu_ms") or 0
        ratio = cpu / wall
        limit = (r.get("limits") or {}).get("cpus")
        good = status == "ok" and cg == want_cg and lo <= ratio <= hi
        return ("PASS " if good else "FAIL ") + base + f" cpus={limit} cpu_ms={cpu} wall_ms={wall} ratio={ratio:.2f} want {lo}..{hi}"
    return f"FAIL unknown kind {kind}"


if __name__ == "__main__":
    cmd, *rest = sys.argv[1:]
    if cmd == "eval":
        print(evaluate(*rest))
    else:
        {"hog": hog, "forkbomb": forkbomb, "spin": spin, "escape": escape}[cmd](*rest)
