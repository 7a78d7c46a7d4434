# agentjail's resident Python driver for a live session (docs/api.md, "Live sessions").
# It runs as the task's command inside the session's sandbox; its stdin (fd 0) is the
# control socket to the service. Each request is a frame (4-byte big-endian length, then JSON
# {"seq": int, "code": str, "seconds": int}); each cell's code is executed with exec() in one persistent
# globals dict, its stdout and stderr (file descriptors 1 and 2, so child processes' output
# too) captured into files of /tmp; the answer is a frame with JSON {"seq": the request's, "status": "ok" | "error"
# | "interrupted", "stdout": str, "stderr": str, "truncated": bool}. After each cell every other process of
# the sandbox is killed (kill(-1) in its pid namespace spares only this one and the init). That
# is a courtesy: a cell can rewrite anything here; what holds is the supervisor's sweep, from
# outside the sandbox, before it passes the answer on (crates/engine/src/live_relay.rs).
import io, json, os, signal, struct, sys, traceback

CTL = 0
LIMIT = 1 << 20  # bytes of stdout and of stderr kept per cell


def read_exact(n):
    b = b""
    while len(b) < n:
        c = os.read(CTL, n - len(b))
        if not c:
            return None
        b += c
    return b


def send(obj):
    body = json.dumps(obj).encode()
    data = struct.pack(">I", len(body)) + body
    while data:
        data = data[os.write(CTL, data):]


def on_alarm(_sig, _frame):
    raise KeyboardInterrupt("the cell's time limit passed")


signal.signal(signal.SIGALRM, on_alarm)
# The control socket is no stream for the cells' code.
null = os.open("/dev/null", os.O_RDONLY)
ctl = os.dup(CTL)
os.dup2(null, 0)
CTL = ctl
os.set_inheritable(CTL, False)
out_path, err_path = "/tmp/.cell-stdout", "/tmp/.cell-stderr"
saved_out, saved_err = os.dup(1), os.dup(2)
g = {"__name__": "__main__", "__builtins__": __builtins__}

while True:
    head = read_exact(4)
    if head is None:
        break
    (n,) = struct.unpack(">I", head)
    req = json.loads(read_exact(n) or b"{}")
    code = req.get("code", "")
    sys.stdout.flush(); sys.stderr.flush()
    fo = os.open(out_path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o600)
    fe = os.open(err_path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o600)
    os.dup2(fo, 1); os.dup2(fe, 2)
    status = "ok"
    try:
        signal.setitimer(signal.ITIMER_REAL, float(req.get("seconds", 0)))
        try:
            exec(compile(code, "<cell>", "exec"), g)
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)
    except KeyboardInterrupt:
        status = "interrupted"
        traceback.print_exc()
    except SystemExit as e:
        status = "ok" if e.code in (None, 0) else "error"
    except BaseException:
        status = "error"
        traceback.print_exc()
    try:
        sys.stdout.flush(); sys.stderr.flush()
    except BaseException:
        pass
    # Processes the cell left behind: killed (this one and the init are spared).
    try:
        os.kill(-1, signal.SIGKILL)
    except OSError:
        pass
    try:
        while True:
            os.waitpid(-1, 0)
    except ChildProcessError:
        pass
    os.dup2(saved_out, 1); os.dup2(saved_err, 2)
    res = {"seq": req.get("seq"), "status": status, "truncated": False}
    for name, f in (("stdout", fo), ("stderr", fe)):
        size = os.lseek(f, 0, os.SEEK_END)
        os.lseek(f, 0, os.SEEK_SET)
        data = os.read(f, min(size, LIMIT)) if size else b""
        res["truncated"] |= size > LIMIT
        res[name] = data.decode("utf-8", "replace")
        os.close(f)
    send(res)
