//! The /proc and /sys probes of `agentjail selftest` (see [`super`]).

use std::time::Duration;

use super::super::kit::{Env, Probe, Tier, Verdict};
use super::common::*;

pub(super) const PROC: &[Probe] = &[
    Probe {
        id: "proc.host_pids",
        layer: "pid namespace",
        attempt: "count /proc's processes; signal a host pid",
        expect: "only the sandbox's few processes; ESRCH",
    },
    Probe {
        id: "proc.kernel_files",
        layer: "fresh /proc, uid without capabilities",
        attempt: "read /proc/kcore, write /proc/sysrq-trigger and /proc/sys/kernel/hostname",
        expect: "refused (the sandbox reads its own /proc/self/status: control)",
    },
    Probe {
        id: "proc.init",
        layer: "pid namespace, credentials",
        attempt: "list /proc/1/root, read /proc/1/environ (the sandbox's init)",
        expect: "refused",
    },
    Probe {
        id: "proc.init_cmdline",
        layer: "hidden init (/proc mount options)",
        attempt: "read the caller's command line from /proc/1/cmdline",
        expect: "refused, or without the caller's arguments",
    },
    Probe {
        id: "proc.mountinfo",
        layer: "mount namespace",
        attempt: "read the host's mount table from /proc/self/mountinfo",
        expect: "only the sandbox's own mounts (an input's bind root still names its host path: a documented exposure)",
    },
    Probe {
        id: "sys.hidden",
        layer: "mount namespace",
        attempt: "list /sys",
        expect: "refused (no /sys in the sandbox)",
    },
];

pub(super) const PROC_PY: &str = r#"
pids = [p for p in os.listdir("/proc") if p.isdigit()]
print("PIDS", len(pids), flush=True)
attempt("host_pid", lambda: os.kill(@HOSTPID@, 0))
attempt("kcore", lambda: open("/proc/kcore", "rb").read(16))
attempt("sysrq", lambda: open("/proc/sysrq-trigger", "w").write("h"))
attempt("sys_write", lambda: open("/proc/sys/kernel/hostname", "w").write("x"))
attempt("self_status", lambda: open("/proc/self/status").read())
attempt("init_root", lambda: os.listdir("/proc/1/root/"))
attempt("init_environ", lambda: open("/proc/1/environ").read())
def cmdline():
    s = open("/proc/1/cmdline", "rb").read()
    print("INIT_CMDLINE_LEAK", b"@MARK@" in s, flush=True)
attempt("init_cmdline", cmdline)
def mountinfo():
    s = open("/proc/self/mountinfo").read()
    ours = ("/usr", "/bin", "/sbin", "/lib", "/etc/", "/dev", "/proc", "/tmp", "/work", "/output", "/input")
    foreign = [l.split()[4] for l in s.splitlines() if l.split()[4] != "/" and not l.split()[4].startswith(ours)]
    print("MOUNTINFO_FOREIGN", ",".join(foreign) or "-", flush=True)
    print("MOUNTINFO_LEAK", "@HOSTDIR@" in s, flush=True)
attempt("mountinfo", mountinfo)
attempt("sys", lambda: os.listdir("/sys"))
"#;

pub(super) fn proc_(env: &Env, tier: Tier) -> Verdicts {
    let mark = env.unique("selftest-marker");
    let hostdir = env
        .dir()
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let body = PROC_PY
        .replace("@HOSTPID@", &std::process::id().to_string())
        .replace("@MARK@", &mark)
        .replace("@HOSTDIR@", &hostdir);
    let o = env.py(tier, &body, &s(&["--request-id", &mark]));
    if !o.complete() {
        return all(PROC, fail(o.incomplete()));
    }
    let pids: usize = o
        .line("PIDS ")
        .and_then(|n| n.parse().ok())
        .unwrap_or(usize::MAX);
    let host_pids = if pids <= 8 && res(&o, "host_pid") == "errno=3" {
        pass(format!("{pids} process(es) in /proc; the host pid: ESRCH"))
    } else {
        fail(format!(
            "{pids} process(es) in /proc; signal to the host pid: {}",
            res(&o, "host_pid")
        ))
    };
    let kernel = match (
        refused(&o, &["kcore", "sysrq", "sys_write"]),
        res(&o, "self_status") == "ok",
    ) {
        (Verdict::Pass(d), true) => pass(d),
        (Verdict::Pass(d), false) => fail(format!("{d}, but /proc/self/status was unreadable too")),
        (v, _) => v,
    };
    let cmdline = match (
        res(&o, "init_cmdline").as_str(),
        o.line("INIT_CMDLINE_LEAK "),
    ) {
        (r, _) if r.starts_with("errno=") => pass(format!("refused ({r})")),
        ("ok", Some(l)) if l == "False" => pass("readable, without the caller's arguments"),
        ("ok", Some(_)) => fail(
            "the caller's command line (with its --request-id) is readable from /proc/1/cmdline",
        ),
        (r, _) => fail(format!("init_cmdline: {r}")),
    };
    // The kernel prints a bind's root as its path within the source file system, so an input's
    // host path stays visible (docs/isolation.md, "Still visible"); what must not be there is
    // any mount of the host's own table.
    let mountinfo = match (
        res(&o, "mountinfo").as_str(),
        o.line("MOUNTINFO_FOREIGN "),
        o.line("MOUNTINFO_LEAK "),
    ) {
        (r, _, _) if r.starts_with("errno=") => pass(format!("refused ({r})")),
        ("ok", Some(f), Some(leak)) if f == "-" => pass(if leak == "True" {
            "only the sandbox's mounts; an input's bind root names its host path (documented)"
        } else {
            "only the sandbox's mounts"
        }),
        ("ok", Some(f), _) => fail(format!("the host's mounts are listed: {f}")),
        (r, _, _) => fail(format!("mountinfo: {r}")),
    };
    vec![
        ("proc.host_pids", host_pids),
        ("proc.kernel_files", kernel),
        ("proc.init", refused(&o, &["init_root", "init_environ"])),
        ("proc.init_cmdline", cmdline),
        ("proc.mountinfo", mountinfo),
        ("sys.hidden", refused(&o, &["sys"])),
    ]
}

pub(super) const PID1: &[Probe] = &[
    Probe {
        id: "proc.prlimit_init",
        layer: "seccomp (target must be the caller)",
        attempt: "prlimit(1, RLIMIT_NOFILE, 0) on the sandbox's init",
        expect: "refused and reported; the run ends with the command's status, not a timeout",
    },
    Probe {
        id: "proc.setpriority_init",
        layer: "seccomp (target must be the caller)",
        attempt: "setpriority(PRIO_PROCESS, 1, 19) on the init",
        expect: "refused and reported",
    },
];

pub(super) const PID1_PY: &str = r#"
import resource
attempt("prlimit_self", lambda: resource.prlimit(0, resource.RLIMIT_CORE, (0, 0)))
attempt("prlimit_init", lambda: resource.prlimit(1, resource.RLIMIT_NOFILE, (0, 0)))
sys_call("setpriority_init", 141, 0, 1, 19)
"#;

pub(super) fn pid1(env: &Env, tier: Tier) -> Verdicts {
    let o = env.py(tier, PID1_PY, &s(&["--timeout", "10"]));
    if !o.complete() {
        return all(PID1, fail(o.incomplete()));
    }
    let prompt = o.status() == "ok" && o.elapsed < Duration::from_secs(8);
    let check = |name: &str, needle: &str| {
        let r = res(&o, name);
        let reported = o.denied("syscall", needle);
        if !r.starts_with("errno=") {
            fail(format!("NOT refused: {name}: {r}"))
        } else if !reported {
            fail(format!(
                "{name}: {r}, but not reported as a `{needle}` denial (refused by the kernel, not by agentjail)"
            ))
        } else if !prompt {
            fail(format!(
                "refused and reported, but the run ended {} after {} ms",
                o.status(),
                o.elapsed.as_millis()
            ))
        } else {
            pass(format!("{r}, reported; the run ended ok promptly"))
        }
    };
    if res(&o, "prlimit_self") != "ok" {
        return all(
            PID1,
            fail("the control prlimit on itself failed, so this proves nothing"),
        );
    }
    vec![
        ("proc.prlimit_init", check("prlimit_init", "prlimit")),
        (
            "proc.setpriority_init",
            check("setpriority_init", "setpriority"),
        ),
    ]
}
