//! The probes of `agentjail selftest`, grouped by the sandbox run(s) that check them. Each
//! probe's id, layer, attempt and expectation are listed once, in its group's table; the group's
//! function returns a verdict per id (an id without a verdict fails). docs/selftest.md describes
//! every probe.

use std::io::Read;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use super::{Env, Group, PY, Probe, RunOut, Tier, Verdict, printable};

const BOTH: &[Tier] = &[Tier::Native, Tier::Gvisor];
const NATIVE: &[Tier] = &[Tier::Native];

type Verdicts = Vec<(&'static str, Verdict)>;

fn s(v: &[&str]) -> Vec<String> {
    v.iter().map(|x| x.to_string()).collect()
}

/// Every probe of `probes` gets the same verdict (a run that could not be made or completed).
fn all(probes: &[Probe], v: Verdict) -> Verdicts {
    probes.iter().map(|p| (p.id, v.clone())).collect()
}

fn pass(d: impl Into<String>) -> Verdict {
    Verdict::Pass(d.into())
}
fn fail(d: impl Into<String>) -> Verdict {
    Verdict::Fail(d.into())
}

fn res(o: &RunOut, name: &str) -> String {
    o.result(name).unwrap_or_else(|| "no result".into())
}

/// Every named attempt was refused (`errno=…`); the detail lists what each got.
fn refused(o: &RunOut, names: &[&str]) -> Verdict {
    let got: Vec<String> = names
        .iter()
        .map(|n| format!("{n}: {}", res(o, n)))
        .collect();
    if names.iter().all(|n| res(o, n).starts_with("errno=")) {
        pass(format!("refused ({})", got.join(", ")))
    } else {
        fail(format!("NOT refused: {}", got.join(", ")))
    }
}

/// Like [`refused`], with one exact errno each.
fn refused_with(o: &RunOut, names: &[&str], errno: i32) -> Verdict {
    let want = format!("errno={errno}");
    let got: Vec<String> = names
        .iter()
        .map(|n| format!("{n}: {}", res(o, n)))
        .collect();
    if names.iter().all(|n| res(o, n) == want) {
        pass(format!("refused with errno {errno} ({})", got.join(", ")))
    } else {
        fail(format!("expected errno {errno}: {}", got.join(", ")))
    }
}

fn sandbox_file(env: &Env, what: &str, content: &str) -> Result<std::path::PathBuf, Verdict> {
    env.file(what, content.as_bytes(), 0o644)
        .map_err(|e| fail(format!("setup: {e}")))
}

pub static GROUPS: &[Group] = &[
    Group {
        name: "host",
        tiers: NATIVE,
        probes: HOST,
        run: host,
    },
    Group {
        name: "fs",
        tiers: BOTH,
        probes: FS,
        run: fs,
    },
    Group {
        name: "inputs",
        tiers: BOTH,
        probes: INPUTS,
        run: inputs,
    },
    Group {
        name: "vanish",
        tiers: BOTH,
        probes: VANISH,
        run: vanish,
    },
    Group {
        name: "proc",
        tiers: NATIVE,
        probes: PROC,
        run: proc_,
    },
    Group {
        name: "pid1",
        tiers: NATIVE,
        probes: PID1,
        run: pid1,
    },
    Group {
        name: "syscall",
        tiers: NATIVE,
        probes: SYSCALL,
        run: syscall,
    },
    Group {
        name: "creds",
        tiers: BOTH,
        probes: CREDS,
        run: creds,
    },
    Group {
        name: "net",
        tiers: BOTH,
        probes: NET,
        run: net,
    },
    Group {
        name: "signal",
        tiers: NATIVE,
        probes: SIGNAL,
        run: signal,
    },
    Group {
        name: "limits",
        tiers: BOTH,
        probes: LIMITS,
        run: limits,
    },
    Group {
        name: "exhaust",
        tiers: NATIVE,
        probes: EXHAUST,
        run: exhaust,
    },
    Group {
        name: "timeout",
        tiers: NATIVE,
        probes: TIMEOUT,
        run: timeout,
    },
    Group {
        name: "output",
        tiers: BOTH,
        probes: OUTPUT,
        run: output,
    },
    Group {
        name: "output-size",
        tiers: BOTH,
        probes: OUTPUT_SIZE,
        run: output_size,
    },
    Group {
        name: "output-race",
        tiers: NATIVE,
        probes: OUTPUT_RACE,
        run: output_race,
    },
];

// --- host ---------------------------------------------------------------------------------------

const HOST: &[Probe] = &[Probe {
    id: "host.strict_run",
    layer: "all layers",
    attempt: "run /bin/true with every protection required (no --allow-degraded)",
    expect: "runs; nothing degraded",
}];

fn host(env: &Env, _tier: Tier) -> Verdicts {
    let report = env.dir().join(format!("{}.json", env.unique("strict")));
    let mut cmd = Command::new(std::fs::read_link("/proc/self/exe").unwrap_or_default());
    cmd.arg("run")
        .arg("--report")
        .arg(&report)
        .args(["--", "/bin/true"]);
    let o = super::run_command(cmd, &report);
    let degraded = o.report["isolation"]["degraded"]
        .as_array()
        .map(|a| a.len())
        .unwrap_or(0);
    let v = if o.code == 0 && o.status() == "ok" && degraded == 0 {
        pass(format!(
            "ran strictly: landlock ABI {}, seccomp notify {}, cgroup {}",
            o.report["isolation"]["landlock_abi"],
            o.report["isolation"]["seccomp_notify"],
            o.report["isolation"]["cgroup"]
        ))
    } else {
        let line = o
            .stderr
            .lines()
            .find(|l| !l.trim().is_empty())
            .unwrap_or("");
        fail(format!(
            "a strict run is refused here (exit {}): {}",
            o.code,
            printable(line, 300)
        ))
    };
    vec![("host.strict_run", v)]
}

// --- file system --------------------------------------------------------------------------------

const FS: &[Probe] = &[
    Probe {
        id: "fs.host_file",
        layer: "mount namespace (pivot_root)",
        attempt: "read a world-readable host file by its path, and /etc/shadow",
        expect: "refused (not in the sandbox's root)",
    },
    Probe {
        id: "fs.other_users_file",
        layer: "mount namespace; a host uid per run",
        attempt: "read another user's 0600 file, list /root and /home",
        expect: "refused",
    },
    Probe {
        id: "fs.etc_curated",
        layer: "curated /etc",
        attempt: "list /etc, /etc/ssh, /etc/ssl/private and /var",
        expect: "no shadow, ssh, sudoers or private keys",
    },
    Probe {
        id: "fs.traversal",
        layer: "mount namespace",
        attempt: "../ out of /input, /output and /proc/self/root",
        expect: "refused (ENOENT: nothing above the sandbox root)",
    },
    Probe {
        id: "fs.own_input",
        layer: "control",
        attempt: "read its own input",
        expect: "works (sentinel: the refusals above are not a broken probe)",
    },
];

const FS_PY: &str = r#"
attempt("canary_public", lambda: open("@CPUB@").read())
attempt("canary_private", lambda: open("@CPRIV@").read())
attempt("shadow", lambda: open("/etc/shadow").read())
attempt("root_home", lambda: os.listdir("/root"))
attempt("home", lambda: os.listdir("/home"))
attempt("var", lambda: os.listdir("/var"))
attempt("ssh_keys", lambda: os.listdir("/etc/ssh"))
attempt("ssl_private", lambda: os.listdir("/etc/ssl/private"))
print("ETC", " ".join(sorted(os.listdir("/etc"))), flush=True)
attempt("input_up", lambda: open("/input/data/../../@SECRET@").read())
attempt("input_up_deep", lambda: open("/input/data/../../../../../../etc/shadow").read())
attempt("output_up", lambda: open("/output/../../../../etc/shadow").read())
attempt("input_sibling", lambda: open("/input/data/../@SECRET@").read())
attempt("proc_root_up", lambda: open("/proc/self/root/../../@SECRET@").read())
attempt("own_input", lambda: open("/input/data/a.csv").read())
"#;

fn fs(env: &Env, tier: Tier) -> Verdicts {
    let setup = || -> Result<_, String> {
        let cpub = env.file("canary-public", b"CANARY-PUBLIC-5521", 0o644)?;
        let cpriv = env.file("canary-private", b"CANARY-PRIVATE-7731", 0o600)?;
        let secret = env.file("secret", b"TRAVERSAL-SECRET-4411", 0o644)?;
        let data = env.subdir("data")?;
        std::fs::write(data.join("a.csv"), "x,y\n1,2\n").map_err(|e| e.to_string())?;
        std::fs::set_permissions(data.join("a.csv"), std::fs::Permissions::from_mode(0o644))
            .map_err(|e| e.to_string())?;
        Ok((cpub, cpriv, secret, data))
    };
    let (cpub, cpriv, secret, data) = match setup() {
        Ok(x) => x,
        Err(e) => return all(FS, fail(format!("setup: {e}"))),
    };
    let name = |p: &Path| {
        p.file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default()
    };
    let body = FS_PY
        .replace("@CPUB@", &cpub.display().to_string())
        .replace("@CPRIV@", &cpriv.display().to_string())
        .replace("@SECRET@", &name(&secret));
    let o = env.py(
        tier,
        &body,
        &s(&["--ro", &format!("{}:/input/data", data.display())]),
    );
    if !o.complete() {
        return all(FS, fail(o.incomplete()));
    }
    let own = res(&o, "own_input") == "ok";
    let with_control = |v: Verdict| match v {
        Verdict::Pass(d) if !own => fail(format!(
            "{d}, but the control read of its own input failed too, so this proves nothing"
        )),
        v => v,
    };
    let leaked = ["CANARY-PUBLIC", "CANARY-PRIVATE", "TRAVERSAL-SECRET"]
        .iter()
        .any(|c| o.stdout.contains(c));
    let etc = o.line("ETC ").unwrap_or_default();
    let etc_bad: Vec<&str> = ["shadow", "gshadow", "ssh", "sudoers"]
        .into_iter()
        .filter(|b| etc.split(' ').any(|e| e.starts_with(b)))
        .collect();
    let etc_v = match (
        refused(&o, &["ssh_keys", "ssl_private", "var"]),
        etc_bad.is_empty(),
    ) {
        (Verdict::Pass(d), true) => pass(format!(
            "/etc holds {} entries; {d}",
            etc.split(' ').count()
        )),
        (Verdict::Pass(_), false) => fail(format!("/etc holds {}", etc_bad.join(", "))),
        (v, _) => v,
    };
    vec![
        (
            "fs.host_file",
            with_control(if leaked {
                fail("a canary's content was read")
            } else {
                refused(&o, &["canary_public", "shadow"])
            }),
        ),
        (
            "fs.other_users_file",
            with_control(refused(&o, &["canary_private", "root_home", "home"])),
        ),
        ("fs.etc_curated", with_control(etc_v)),
        (
            "fs.traversal",
            with_control(refused_with(
                &o,
                &[
                    "input_up",
                    "input_up_deep",
                    "output_up",
                    "input_sibling",
                    "proc_root_up",
                ],
                2,
            )),
        ),
        (
            "fs.own_input",
            if own {
                pass("read it")
            } else {
                fail(format!("own_input: {}", res(&o, "own_input")))
            },
        ),
    ]
}

const INPUTS: &[Probe] = &[
    Probe {
        id: "inputs.read_only",
        layer: "read-only bind mount + Landlock",
        attempt: "append to, truncate, chmod, rename, unlink an input; create a file in /input",
        expect: "refused; the host file unchanged",
    },
    Probe {
        id: "fs.system_read_only",
        layer: "read-only root + Landlock",
        attempt: "create /evil and /usr/bin/evil, append to /etc/passwd",
        expect: "refused",
    },
    Probe {
        id: "fs.scratch_writable",
        layer: "control",
        attempt: "write /work and /tmp",
        expect: "works (sentinel: writing is not broken)",
    },
];

const INPUTS_PY: &str = r#"
attempt("append", lambda: open("/input/data.csv", "a").write("x"))
attempt("truncate", lambda: os.truncate("/input/data.csv", 0))
attempt("chmod", lambda: os.chmod("/input/data.csv", 0o777))
attempt("rename", lambda: os.rename("/input/data.csv", "/input/moved.csv"))
attempt("unlink", lambda: os.unlink("/input/data.csv"))
attempt("create_in_input", lambda: open("/input/new.txt", "w"))
attempt("create_in_root", lambda: open("/evil", "w"))
attempt("write_usr", lambda: open("/usr/bin/evil", "w"))
attempt("write_etc", lambda: open("/etc/passwd", "a"))
attempt("write_work", lambda: open("/work/fine.txt", "w").write("ok"))
attempt("write_tmp", lambda: open("/tmp/fine.txt", "w").write("ok"))
"#;

fn inputs(env: &Env, tier: Tier) -> Verdicts {
    let data = match sandbox_file(env, "data.csv", "a,b\n1,2\n") {
        Ok(d) => d,
        Err(v) => return all(INPUTS, v),
    };
    let before = std::fs::metadata(&data).map(|m| (m.mode(), m.mtime(), m.ino()));
    let o = env.py(
        tier,
        INPUTS_PY,
        &s(&["--ro", &format!("{}:/input/data.csv", data.display())]),
    );
    if !o.complete() {
        return all(INPUTS, fail(o.incomplete()));
    }
    let after = std::fs::metadata(&data).map(|m| (m.mode(), m.mtime(), m.ino()));
    let unchanged = std::fs::read_to_string(&data).ok().as_deref() == Some("a,b\n1,2\n")
        && before.ok() == after.ok();
    let ro = match refused(
        &o,
        &[
            "append",
            "truncate",
            "chmod",
            "rename",
            "unlink",
            "create_in_input",
        ],
    ) {
        Verdict::Pass(d) if !unchanged => fail(format!("{d}, but the host file changed")),
        v => v,
    };
    let scratch = refused(&o, &["write_work", "write_tmp"]);
    vec![
        ("inputs.read_only", ro),
        (
            "fs.system_read_only",
            refused(&o, &["create_in_root", "write_usr", "write_etc"]),
        ),
        (
            "fs.scratch_writable",
            match scratch {
                Verdict::Fail(_) => pass("wrote /work and /tmp"),
                _ => fail(format!(
                    "write_work: {}, write_tmp: {}",
                    res(&o, "write_work"),
                    res(&o, "write_tmp")
                )),
            },
        ),
    ]
}

const VANISH: &[Probe] = &[Probe {
    id: "fs.writes_vanish",
    layer: "tmpfs scratch + output collection",
    attempt: "write /work, /tmp, /dev/shm, /var/tmp, / and /output; look again from a second run and from the host",
    expect: "only /output's file is delivered; nothing else survives the run",
}];

const VANISH_WRITE_PY: &str = r#"
for p in ["/work/@M@", "/tmp/@M@", "/dev/shm/@M@", "/var/tmp/@M@", "/@M@"]:
    attempt("w:" + p, lambda: open(p, "w").write("persist?"))
open("/output/kept.txt", "w").write("kept")
"#;
const VANISH_READ_PY: &str = r#"
for p in ["/work/@M@", "/tmp/@M@", "/dev/shm/@M@", "/var/tmp/@M@", "/@M@"]:
    print("SEEN", p, os.path.exists(p), flush=True)
"#;

fn vanish(env: &Env, tier: Tier) -> Verdicts {
    let m = env.unique("agentjail-persist");
    let out = env.dir().join(env.unique("out"));
    let o = env.py(
        tier,
        &VANISH_WRITE_PY.replace("@M@", &m),
        &s(&["--output-dir", &out.display().to_string()]),
    );
    if !o.complete() {
        return all(VANISH, fail(o.incomplete()));
    }
    if res(&o, "w:/work/@M@".replace("@M@", &m).as_str()) != "ok"
        || res(&o, &format!("w:/tmp/{m}")) != "ok"
    {
        return all(
            VANISH,
            fail("the control writes to /work and /tmp failed, so this proves nothing"),
        );
    }
    let o2 = env.py(tier, &VANISH_READ_PY.replace("@M@", &m), &[]);
    if !o2.complete() {
        return all(VANISH, fail(o2.incomplete()));
    }
    let seen: Vec<String> = o2
        .stdout
        .lines()
        .filter(|l| l.starts_with("SEEN") && l.ends_with("True"))
        .map(str::to_string)
        .collect();
    let on_host: Vec<String> = ["/tmp", "/dev/shm", "/var/tmp", "/"]
        .iter()
        .map(|d| Path::new(d).join(&m))
        .filter(|p| p.exists())
        .map(|p| p.display().to_string())
        .collect();
    let delivered: Vec<String> = std::fs::read_dir(&out)
        .map(|rd| {
            rd.flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default();
    let v = if !seen.is_empty() {
        fail(format!("a later run saw: {}", seen.join("; ")))
    } else if !on_host.is_empty() {
        fail(format!("on the host: {}", on_host.join(", ")))
    } else if delivered != ["kept.txt"] {
        fail(format!("delivered: {delivered:?}"))
    } else {
        pass(
            "wrote /work and /tmp; a second run and the host saw none of it; only kept.txt delivered",
        )
    };
    vec![("fs.writes_vanish", v)]
}

// --- /proc and /sys -----------------------------------------------------------------------------

const PROC: &[Probe] = &[
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

const PROC_PY: &str = r#"
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

fn proc_(env: &Env, tier: Tier) -> Verdicts {
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

const PID1: &[Probe] = &[
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

const PID1_PY: &str = r#"
import resource
attempt("prlimit_self", lambda: resource.prlimit(0, resource.RLIMIT_CORE, (0, 0)))
attempt("prlimit_init", lambda: resource.prlimit(1, resource.RLIMIT_NOFILE, (0, 0)))
sys_call("setpriority_init", 141, 0, 1, 19)
"#;

fn pid1(env: &Env, tier: Tier) -> Verdicts {
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

// --- syscalls -----------------------------------------------------------------------------------

/// (probe id, syscall number, arguments, denial name). x86_64 numbers.
const SYSCALLS: &[(&str, i64, &[i64], &str)] = &[
    ("syscall.ptrace", 101, &[16, 1, 0, 0], "ptrace"),
    ("syscall.mount", 165, &[0, 0, 0, 0, 0], "mount"),
    ("syscall.umount2", 166, &[0, 0], "umount2"),
    ("syscall.pivot_root", 155, &[0, 0], "pivot_root"),
    ("syscall.chroot", 161, &[0], "chroot"),
    ("syscall.unshare_user", 272, &[0x1000_0000], "unshare"),
    ("syscall.unshare_mount", 272, &[0x0002_0000], "unshare"),
    ("syscall.setns", 308, &[0, 0], "setns"),
    (
        "syscall.clone_newns",
        56,
        &[0x0002_0000 | 17, 0, 0, 0, 0],
        "clone(namespace flags)",
    ),
    ("syscall.bpf", 321, &[0, 0, 0], "bpf"),
    (
        "syscall.perf_event_open",
        298,
        &[0, 0, 0, 0, 0],
        "perf_event_open",
    ),
    ("syscall.io_uring_setup", 425, &[1, 0], "io_uring_setup"),
    ("syscall.userfaultfd", 323, &[0], "userfaultfd"),
    ("syscall.keyctl", 250, &[0, 0, 0], "keyctl"),
    ("syscall.add_key", 248, &[0, 0, 0, 0, 0], "add_key"),
    (
        "syscall.open_by_handle_at",
        304,
        &[0, 0, 0],
        "open_by_handle_at",
    ),
    ("syscall.kexec_load", 246, &[0, 0, 0, 0], "kexec_load"),
    (
        "syscall.kexec_file_load",
        320,
        &[0, 0, 0, 0, 0],
        "kexec_file_load",
    ),
    ("syscall.init_module", 175, &[0, 0, 0], "init_module"),
    ("syscall.finit_module", 313, &[0, 0, 0], "finit_module"),
    ("syscall.delete_module", 176, &[0, 0], "delete_module"),
    ("syscall.fsopen", 430, &[0, 0], "fsopen"),
    (
        "syscall.process_vm_readv",
        310,
        &[1, 0, 0, 0, 0, 0],
        "process_vm_readv",
    ),
];

macro_rules! sys_probe {
    ($id:literal, $what:literal) => {
        Probe {
            id: $id,
            layer: "seccomp (user notification)",
            attempt: $what,
            expect: "EPERM, and reported by name in the report's denials",
        }
    };
}

const SYSCALL: &[Probe] = &[
    sys_probe!("syscall.ptrace", "ptrace(PTRACE_ATTACH, 1)"),
    sys_probe!("syscall.mount", "mount()"),
    sys_probe!("syscall.umount2", "umount2()"),
    sys_probe!("syscall.pivot_root", "pivot_root()"),
    sys_probe!("syscall.chroot", "chroot()"),
    sys_probe!("syscall.unshare_user", "unshare(CLONE_NEWUSER)"),
    sys_probe!("syscall.unshare_mount", "unshare(CLONE_NEWNS)"),
    sys_probe!("syscall.setns", "setns()"),
    sys_probe!("syscall.clone_newns", "clone(CLONE_NEWNS)"),
    Probe {
        id: "syscall.clone3",
        layer: "seccomp",
        attempt: "clone3() (its flags are in memory a filter cannot read)",
        expect: "ENOSYS from the filter, so libc falls back to clone(), whose flags are checked",
    },
    sys_probe!("syscall.bpf", "bpf()"),
    sys_probe!("syscall.perf_event_open", "perf_event_open()"),
    sys_probe!("syscall.io_uring_setup", "io_uring_setup()"),
    sys_probe!("syscall.userfaultfd", "userfaultfd()"),
    sys_probe!("syscall.keyctl", "keyctl()"),
    sys_probe!("syscall.add_key", "add_key()"),
    sys_probe!("syscall.open_by_handle_at", "open_by_handle_at()"),
    sys_probe!("syscall.kexec_load", "kexec_load()"),
    sys_probe!("syscall.kexec_file_load", "kexec_file_load()"),
    sys_probe!("syscall.init_module", "init_module() (module loading)"),
    sys_probe!("syscall.finit_module", "finit_module() (module loading)"),
    sys_probe!("syscall.delete_module", "delete_module()"),
    sys_probe!("syscall.fsopen", "fsopen() (the new mount API)"),
    sys_probe!("syscall.process_vm_readv", "process_vm_readv() on pid 1"),
    sys_probe!(
        "syscall.tiocsti",
        "ioctl(TIOCSTI): type into the caller's terminal"
    ),
    Probe {
        id: "syscall.control",
        layer: "control",
        attempt: "getpid()",
        expect: "works and is not reported (sentinel)",
    },
];

fn syscall(env: &Env, tier: Tier) -> Verdicts {
    let mut body = String::new();
    for (id, nr, args, _) in SYSCALLS {
        let a: Vec<String> = args.iter().map(i64::to_string).collect();
        body.push_str(&format!("sys_call(\"{id}\", {nr}, {})\n", a.join(", ")));
    }
    body.push_str("sys_call(\"syscall.clone3\", 435, 0, 0)\n");
    body.push_str("import fcntl, termios\nattempt(\"syscall.tiocsti\", lambda: fcntl.ioctl(0, termios.TIOCSTI, b\"x\"))\n");
    body.push_str("sys_call(\"syscall.control\", 39)\n");
    let o = env.py(tier, &body, &[]);
    if !o.complete() {
        return all(SYSCALL, fail(o.incomplete()));
    }
    let check = |id: &'static str, needle: &str| {
        let r = res(&o, id);
        if r != "errno=1" {
            fail(format!("expected EPERM, got {r}"))
        } else if !o.denied("syscall", needle) {
            fail(format!(
                "EPERM, but no `{needle}` denial in the report (refused by the kernel, not by the filter)"
            ))
        } else {
            pass(format!("EPERM; reported as `{needle}`"))
        }
    };
    let mut v: Verdicts = SYSCALLS
        .iter()
        .map(|(id, _, _, needle)| (*id, check(id, needle)))
        .collect();
    v.push((
        "syscall.tiocsti",
        check("syscall.tiocsti", "ioctl(TIOCSTI)"),
    ));
    let c3 = res(&o, "syscall.clone3");
    v.push((
        "syscall.clone3",
        if c3 == "errno=38" {
            pass("ENOSYS (the kernel itself would answer EINVAL or EFAULT)")
        } else {
            fail(format!("expected ENOSYS, got {c3}"))
        },
    ));
    let ctl = res(&o, "syscall.control");
    v.push((
        "syscall.control",
        if ctl == "ok" && !o.denied("syscall", "getpid") {
            pass("getpid works, not reported")
        } else {
            fail(format!("getpid: {ctl}"))
        },
    ));
    v
}

// --- credentials, descriptors, environment ------------------------------------------------------

const CREDS: &[Probe] = &[
    Probe {
        id: "creds.capabilities",
        layer: "capability drop, no_new_privs",
        attempt: "read its capability sets and no_new_privs",
        expect: "every set empty, NoNewPrivs 1",
    },
    Probe {
        id: "creds.seccomp",
        layer: "seccomp",
        attempt: "read its seccomp mode",
        expect: "2 (filter)",
    },
    Probe {
        id: "creds.ids",
        layer: "user namespace",
        attempt: "read its uid, gid and groups",
        expect: "65534 65534, no groups",
    },
    Probe {
        id: "fd.inherited",
        layer: "close-on-exec of everything above stderr",
        attempt: "use a descriptor the caller left open (fd 7)",
        expect: "only 0, 1, 2 exist",
    },
    Probe {
        id: "env.caller",
        layer: "environment built from the manifest only",
        attempt: "read a secret from the caller's environment",
        expect: "absent from the sandbox and the report; only HOME, PATH … and --env given",
    },
];

const CREDS_PY: &str = r#"
print("FDS", sorted(int(x) for x in os.listdir("/proc/self/fd")), flush=True)
for l in open("/proc/self/status"):
    if l.startswith(("Cap", "NoNewPrivs", "Seccomp:")):
        print("STATUS", l.strip().replace("\t", " "), flush=True)
print("IDS", os.getuid(), os.getgid(), os.getgroups(), flush=True)
print("ENV", sorted(os.environ.items()), flush=True)
"#;

/// Starts a command with fd 7 open and inheritable (on the launcher's own file).
const FD_LAUNCHER: &str = "import os, subprocess, sys\nfd = os.open(sys.argv[0], os.O_RDONLY)\nos.dup2(fd, 7)\nos.set_inheritable(7, True)\nsys.exit(subprocess.run(sys.argv[1:], pass_fds=[7]).returncode)\n";

fn creds(env: &Env, tier: Tier) -> Verdicts {
    let secret = "hunter2-SELFTEST-SECRET-9981";
    let prepared = env.py_command(tier, CREDS_PY, &s(&["--env", "GIVEN=yes"]));
    let launcher = env.file("launch.py", FD_LAUNCHER.as_bytes(), 0o644);
    let ((inner, report), launcher) = match (prepared, launcher) {
        (Ok(c), Ok(l)) => (c, l),
        (Err(e), _) | (_, Err(e)) => return all(CREDS, fail(format!("setup: {e}"))),
    };
    let mut cmd = Command::new(PY);
    cmd.arg(&launcher)
        .arg(inner.get_program())
        .args(inner.get_args())
        .env("AGENTJAIL_SELFTEST_SECRET", secret);
    let o = super::run_command(cmd, &report);
    if !o.complete() {
        return all(CREDS, fail(o.incomplete()));
    }
    let status: Vec<String> = o
        .stdout
        .lines()
        .filter_map(|l| l.strip_prefix("STATUS "))
        .map(str::to_string)
        .collect();
    let has = |want: &str| status.iter().any(|l| l == want);
    let zero = "0000000000000000";
    let caps_ok = if tier == Tier::Gvisor {
        // gVisor's /proc/self/status shows no CapAmb or NoNewPrivs line: every set it shows.
        has(&format!("CapEff: {zero}"))
            && status
                .iter()
                .filter(|l| l.starts_with("Cap"))
                .all(|l| l.ends_with(zero))
    } else {
        ["CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb"]
            .iter()
            .all(|c| has(&format!("{c}: {zero}")))
            && has("NoNewPrivs: 1")
    };
    let fds = o.line("FDS ").unwrap_or_default();
    let ids = o.line("IDS ").unwrap_or_default();
    let envline = o.line("ENV ").unwrap_or_default();
    let env_ok = !o.stdout.contains(secret)
        && !envline.contains("AGENTJAIL_SELFTEST_SECRET")
        && !envline.contains("CARGO")
        && envline.contains("('GIVEN', 'yes')")
        && envline.contains("('HOME', '/work')")
        && !o.report.to_string().contains(secret);
    vec![
        (
            "creds.capabilities",
            if caps_ok {
                pass("all five capability sets empty; NoNewPrivs 1")
            } else {
                fail(status.join("; "))
            },
        ),
        (
            "creds.seccomp",
            if tier == Tier::Gvisor {
                Verdict::Skip(
                    "gVisor implements the syscalls itself; the native tier's filter does not apply"
                        .into(),
                )
            } else if has("Seccomp: 2") {
                pass("Seccomp: 2")
            } else {
                fail(
                    status
                        .iter()
                        .find(|l| l.starts_with("Seccomp:"))
                        .cloned()
                        .unwrap_or_else(|| "no Seccomp line".into()),
                )
            },
        ),
        (
            "creds.ids",
            if ids == "65534 65534 []" {
                pass("65534 65534, no groups")
            } else {
                fail(ids)
            },
        ),
        (
            "fd.inherited",
            // 0, 1, 2 and the descriptor listdir itself holds.
            if fds == "[0, 1, 2, 3]" {
                pass("fd 7 absent; only 0, 1, 2")
            } else {
                fail(format!("descriptors: {fds}"))
            },
        ),
        (
            "env.caller",
            if env_ok {
                pass("the secret is in neither the sandbox nor the report")
            } else {
                fail(format!("environment: {}", printable(&envline, 300)))
            },
        ),
    ]
}

// --- network ------------------------------------------------------------------------------------

const NET: &[Probe] = &[
    Probe {
        id: "net.tcp_host",
        layer: "network namespace + Landlock TCP rules",
        attempt: "connect to a listener on the host's 127.0.0.1",
        expect: "refused (EACCES from Landlock natively); the host listener sees nothing",
    },
    Probe {
        id: "net.tcp_listen",
        layer: "Landlock TCP rules",
        attempt: "bind and listen on a TCP port",
        expect: "refused (EACCES)",
    },
    Probe {
        id: "net.udp_host",
        layer: "network namespace",
        attempt: "send UDP to a socket on the host's 127.0.0.1",
        expect: "the host socket receives nothing",
    },
    Probe {
        id: "net.dns",
        layer: "network namespace",
        attempt: "resolve example.com",
        expect: "fails (no name server reachable)",
    },
    Probe {
        id: "net.raw",
        layer: "no CAP_NET_RAW",
        attempt: "open a raw ICMP socket",
        expect: "refused",
    },
    Probe {
        id: "net.abstract_unix",
        layer: "network namespace + Landlock scoping",
        attempt: "connect to an abstract unix socket the host listens on",
        expect: "refused; the host listener sees nothing",
    },
    Probe {
        id: "net.interfaces",
        layer: "network namespace",
        attempt: "list network interfaces",
        expect: "loopback only",
    },
    Probe {
        id: "net.vsock",
        layer: "seccomp socket-family allowlist",
        attempt: "socket(AF_VSOCK) and socketpair(AF_VSOCK) (vsock is not split per network namespace)",
        expect: "refused and reported",
    },
    Probe {
        id: "net.socket_families",
        layer: "seccomp socket-family allowlist",
        attempt: "socket() with every address family 0..45 but AF_UNIX, AF_INET, AF_INET6, AF_NETLINK",
        expect: "each refused and reported",
    },
];

const NET_PY: &str = r#"
def tcp():
    s = socket.create_connection(("127.0.0.1", @TCP@), timeout=3)
    s.sendall(b"LEAK")
attempt("tcp_host", tcp)
def listen():
    s = socket.socket(); s.bind(("127.0.0.1", 0)); s.listen()
attempt("tcp_listen", listen)
def udp():
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.sendto(b"LEAK", ("127.0.0.1", @UDP@))
attempt("udp_host", udp)
attempt("dns", lambda: socket.getaddrinfo("example.com", 80))
attempt("raw", lambda: socket.socket(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_ICMP))
def abstract():
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.settimeout(3)
    s.connect(b"\0@ABS@")
    s.sendall(b"LEAK")
attempt("abstract_unix", abstract)
def ifaces():
    names = [l.split(":")[0].strip() for l in open("/proc/net/dev").readlines()[2:]]
    print("IFACES", " ".join(sorted(names)), flush=True)
attempt("ifaces", ifaces)
attempt("vsock", lambda: socket.socket(40, socket.SOCK_STREAM))
attempt("vsock_pair", lambda: socket.socketpair(40, socket.SOCK_STREAM))
for fam in range(0, 46):
    if fam in (1, 2, 10, 16):
        continue
    r = None
    for typ in (1, 2, 3, 5):
        try:
            socket.socket(fam, typ, 0).close()
            r = "ok"
            break
        except OSError as e:
            r = r or ("errno=%d" % (e.errno or 0))
    print("FAMILY", fam, r, flush=True)
"#;

/// Linux address family names, by number: the names the engine reports refusals with.
fn af_name(n: u32) -> String {
    agentjail_engine::seccomp::family_name(n)
}

/// A `socket`/`socketpair` denial that names family `n` (by name or number).
fn family_reported(o: &RunOut, n: u32) -> bool {
    let name = af_name(n);
    let num = n.to_string();
    o.denial("syscall", |d| {
        d.contains("socket")
            && (d.contains(&name)
                || name
                    .strip_prefix("AF_")
                    .is_some_and(|short| d.contains(&short.to_ascii_lowercase()))
                || d.split(|c: char| !c.is_ascii_digit()).any(|t| t == num))
    })
}

fn net(env: &Env, tier: Tier) -> Verdicts {
    use std::os::linux::net::SocketAddrExt;
    let setup = || -> std::io::Result<_> {
        let tcp = std::net::TcpListener::bind("127.0.0.1:0")?;
        tcp.set_nonblocking(true)?;
        let udp = std::net::UdpSocket::bind("127.0.0.1:0")?;
        udp.set_nonblocking(true)?;
        let abs_name = env.unique("agentjail-selftest-abstract");
        let addr = std::os::unix::net::SocketAddr::from_abstract_name(abs_name.as_bytes())?;
        let abs = std::os::unix::net::UnixListener::bind_addr(&addr)?;
        abs.set_nonblocking(true)?;
        Ok((tcp, udp, abs, abs_name))
    };
    let (tcp, udp, abs, abs_name) = match setup() {
        Ok(x) => x,
        Err(e) => return all(NET, fail(format!("setup: host sockets: {e}"))),
    };
    let port = |r: std::io::Result<std::net::SocketAddr>| {
        r.map(|a| a.port().to_string()).unwrap_or_default()
    };
    let body = NET_PY
        .replace("@TCP@", &port(tcp.local_addr()))
        .replace("@UDP@", &port(udp.local_addr()))
        .replace("@ABS@", &abs_name);
    let o = env.py(tier, &body, &[]);
    if !o.complete() {
        return all(NET, fail(o.incomplete()));
    }
    let tcp_seen = tcp.accept().is_ok();
    let udp_seen = udp.recv_from(&mut [0u8; 64]).is_ok();
    let abs_seen = abs.accept().is_ok();
    let native = tier == Tier::Native;
    // Landlock's TCP rules exist from ABI 4 on; below it (Linux 6.1: ABI 2) the run's report
    // names the network namespace as their substitute (docs/isolation.md), and the probes
    // expect that layer's answers instead of Landlock's EACCES.
    let tcp_rules = o.report["isolation"]["landlock_rights"]
        .as_array()
        .is_some_and(|a| a.iter().any(|r| r == "tcp"));
    let tcp_v = match (tcp_seen, res(&o, "tcp_host").as_str()) {
        (true, _) => fail("the host listener accepted a connection from the sandbox"),
        (false, "errno=13") => pass("EACCES (Landlock); the host listener saw nothing"),
        (false, r) if (!native || !tcp_rules) && r.starts_with("errno=") => pass(format!(
            "{r} (the network namespace: no Landlock TCP rules here); the host listener saw nothing"
        )),
        (false, r) => fail(format!(
            "{r}: not refused by Landlock (an empty network namespace would give ECONNREFUSED=111)"
        )),
    };
    let listen_v = match res(&o, "tcp_listen").as_str() {
        "errno=13" => pass("EACCES (Landlock)"),
        r if !native => Verdict::Skip(format!(
            "gVisor's network stack is the boundary here (no Landlock): {r}"
        )),
        r if !tcp_rules => Verdict::Skip(format!(
            "no Landlock TCP rules on this kernel (ABI < 4): the port is the sandbox's own network namespace's, unreachable from outside: {r}"
        )),
        r => fail(format!("{r}: a TCP port could be bound")),
    };
    let udp_v = if udp_seen {
        fail("the host UDP socket received a datagram from the sandbox")
    } else {
        pass(format!(
            "the host socket received nothing (sendto inside: {})",
            res(&o, "udp_host")
        ))
    };
    let abs_v = if abs_seen {
        fail("the host's abstract unix socket accepted a connection")
    } else {
        refused(&o, &["abstract_unix"])
    };
    let ifaces = o.line("IFACES ").unwrap_or_default();
    let ifaces_v = if ifaces == "lo" || (!native && ifaces.is_empty()) {
        pass(format!("interfaces: {ifaces:?}"))
    } else {
        fail(format!("interfaces: {ifaces}"))
    };
    let vsock_v = {
        let r = refused(&o, &["vsock", "vsock_pair"]);
        match r {
            Verdict::Pass(d) if native && !family_reported(&o, 40) => fail(format!(
                "{d}, but no socket denial naming AF_VSOCK in the report"
            )),
            v => v,
        }
    };
    let mut not_refused = Vec::new();
    let mut not_reported = Vec::new();
    for line in o.stdout.lines().filter_map(|l| l.strip_prefix("FAMILY ")) {
        let mut it = line.split(' ');
        let (Some(n), Some(r)) = (it.next(), it.next()) else {
            continue;
        };
        let n: u32 = n.parse().unwrap_or(0);
        if !r.starts_with("errno=") {
            not_refused.push(af_name(n));
        } else if native && !family_reported(&o, n) {
            not_reported.push(af_name(n));
        }
    }
    let families_v = if !not_refused.is_empty() {
        fail(format!("created: {}", not_refused.join(", ")))
    } else if !not_reported.is_empty() {
        fail(format!(
            "refused, but not reported (refused by the kernel, not by agentjail): {}",
            not_reported.join(", ")
        ))
    } else {
        pass("every other family refused and reported")
    };
    vec![
        ("net.tcp_host", tcp_v),
        ("net.tcp_listen", listen_v),
        ("net.udp_host", udp_v),
        ("net.dns", refused(&o, &["dns"])),
        ("net.raw", refused(&o, &["raw"])),
        ("net.abstract_unix", abs_v),
        ("net.interfaces", ifaces_v),
        ("net.vsock", vsock_v),
        ("net.socket_families", families_v),
    ]
}

// --- signals ------------------------------------------------------------------------------------

const SIGNAL: &[Probe] = &[
    Probe {
        id: "signal.outside",
        layer: "pid namespace + Landlock signal scoping",
        attempt: "SIGKILL a process of the host by its pid",
        expect: "ESRCH; the host process lives on",
    },
    Probe {
        id: "signal.init",
        layer: "pid namespace init semantics, credentials",
        attempt: "SIGKILL the sandbox's init",
        expect: "no effect: the run ends normally",
    },
];

fn signal(env: &Env, tier: Tier) -> Verdicts {
    let mut victim = match Command::new("/bin/sleep").arg("60").spawn() {
        Ok(c) => c,
        Err(e) => return all(SIGNAL, fail(format!("setup: /bin/sleep: {e}"))),
    };
    let body = format!(
        "import signal\nattempt(\"kill_host\", lambda: os.kill({}, signal.SIGKILL))\nattempt(\"kill_init\", lambda: os.kill(1, signal.SIGKILL))\ntime.sleep(0.2)\n",
        victim.id()
    );
    let o = env.py(tier, &body, &[]);
    let alive = matches!(victim.try_wait(), Ok(None));
    let _ = victim.kill();
    let _ = victim.wait();
    if !o.complete() {
        return all(SIGNAL, fail(o.incomplete()));
    }
    let kh = res(&o, "kill_host");
    vec![
        (
            "signal.outside",
            if alive && kh.starts_with("errno=") {
                pass(format!("{kh}; the host process lives"))
            } else {
                fail(format!("kill: {kh}; host process alive: {alive}"))
            },
        ),
        (
            "signal.init",
            if o.status() == "ok" {
                pass(format!(
                    "kill(1): {}; the run ended ok",
                    res(&o, "kill_init")
                ))
            } else {
                fail(format!("the run ended {}", o.status()))
            },
        ),
    ]
}

// --- limits -------------------------------------------------------------------------------------

const LIMITS: &[Probe] = &[
    Probe {
        id: "limit.fork_bomb",
        layer: "cgroup pids limit (+ RLIMIT_NPROC)",
        attempt: "fork until it fails, under --pids 8",
        expect: "EAGAIN below 8 processes; the host keeps starting processes promptly",
    },
    Probe {
        id: "limit.memory",
        layer: "cgroup memory limit (+ RLIMIT_AS)",
        attempt: "allocate without end under --memory-mb 64",
        expect: "killed: status memory_limit, exit 137, peak within the limit",
    },
    Probe {
        id: "limit.cpu_spin",
        layer: "wall-clock deadline",
        attempt: "spin on the CPU forever under --timeout 1",
        expect: "killed at the deadline: status timeout, exit 124",
    },
];

/// Forks children that sleep until fork fails; prints `RESULT fork errno=N` and `KIDS n`.
const FORK_PY: &str = r#"
kids = 0
for i in range(200):
    try:
        if os.fork() == 0:
            time.sleep(30); os._exit(0)
        kids += 1
    except OSError as e:
        print("RESULT fork errno=%d" % e.errno, flush=True)
        break
print("KIDS", kids, flush=True)
"#;

fn limits(env: &Env, tier: Tier) -> Verdicts {
    let native = tier == Tier::Native;
    // Fork bomb, with the host's responsiveness measured meanwhile.
    let responsive = std::thread::spawn(|| {
        std::thread::sleep(Duration::from_millis(300));
        let t = Instant::now();
        let ok = Command::new("/bin/true")
            .status()
            .map(|s| s.success())
            .unwrap_or(false);
        (ok, t.elapsed())
    });
    let t = Instant::now();
    let o = env.py(tier, FORK_PY, &s(&["--pids", "8", "--timeout", "20"]));
    let took = t.elapsed();
    let (host_ok, host_took) = responsive.join().unwrap_or((false, Duration::MAX));
    let kids: u32 = o
        .line("KIDS ")
        .and_then(|k| k.parse().ok())
        .unwrap_or(u32::MAX);
    let fork_v = if !o.complete() {
        fail(o.incomplete())
    } else if res(&o, "fork") != "errno=11" || kids >= 8 {
        fail(format!("fork: {}, {kids} children", res(&o, "fork")))
    } else if !host_ok || host_took > Duration::from_secs(5) {
        fail(format!(
            "the host took {} ms to start /bin/true",
            host_took.as_millis()
        ))
    } else if native && !env.degraded && !o.denied("limit", "pids") {
        fail("EAGAIN, but no `pids` limit denial in the report")
    } else if took > Duration::from_secs(15) {
        fail(format!(
            "the children outlived the command ({} ms)",
            took.as_millis()
        ))
    } else if env.degraded {
        pass(format!(
            "EAGAIN after {kids} children (RLIMIT_NPROC only: no cgroup here)"
        ))
    } else {
        pass(format!(
            "EAGAIN after {kids} children; /bin/true on the host took {} ms",
            host_took.as_millis()
        ))
    };

    let o = env.run(
        tier,
        &s(&[
            "--memory-mb",
            "64",
            "--timeout",
            "30",
            "--",
            PY,
            "-c",
            "b = []\nwhile True: b.append(bytearray(8 << 20))",
        ]),
    );
    let peak = o.report["peak_memory_bytes"].as_u64().unwrap_or(0);
    let mem_v = if !native {
        if o.status() != "ok" && o.status() != "timeout" && !o.status().is_empty() {
            pass(format!("ended {} (exit {})", o.status(), o.code))
        } else {
            fail(format!(
                "ended {:?}: the memory limit did not hold",
                o.status()
            ))
        }
    } else if env.degraded {
        fail(format!(
            "no cgroup here: the tree's memory is not bounded as a whole, only each process by RLIMIT_AS (ended {}, exit {})",
            o.status(),
            o.code
        ))
    } else if o.status() == "memory_limit"
        && o.code == 137
        && o.denied("limit", "memory")
        && (32 << 20..=64 << 20).contains(&peak)
    {
        pass(format!("memory_limit, exit 137, peak {} MiB", peak >> 20))
    } else {
        fail(format!(
            "ended {} (exit {}), peak {} MiB",
            o.status(),
            o.code,
            peak >> 20
        ))
    };

    let t = Instant::now();
    let o = env.run(
        tier,
        &s(&["--timeout", "1", "--", PY, "-c", "while True: pass"]),
    );
    let took = t.elapsed();
    let bound = if native { 5 } else { 15 };
    let cpu_v = if o.code == 124 && o.status() == "timeout" && took < Duration::from_secs(bound) {
        pass(format!(
            "timeout after {} ms (cpu {} ms)",
            took.as_millis(),
            o.report["cpu_ms"]
        ))
    } else {
        fail(format!(
            "ended {} (exit {}) after {} ms",
            o.status(),
            o.code,
            took.as_millis()
        ))
    };
    vec![
        ("limit.fork_bomb", fork_v),
        ("limit.memory", mem_v),
        ("limit.cpu_spin", cpu_v),
    ]
}

const EXHAUST: &[Probe] = &[
    Probe {
        id: "limit.fds",
        layer: "RLIMIT_NOFILE",
        attempt: "open files until it fails",
        expect: "EMFILE at no more than 1024",
    },
    Probe {
        id: "limit.inodes",
        layer: "tmpfs inode limit",
        attempt: "create empty files in /output until it fails",
        expect: "ENOSPC at no more than 16384",
    },
    Probe {
        id: "limit.output_fill",
        layer: "tmpfs size",
        attempt: "fill /output (--output-max-mb 5)",
        expect: "ENOSPC at 5 MiB + the inode headroom (one page per inode; the collector refuses anything over 5 MiB)",
    },
    Probe {
        id: "limit.tmpfs_fill",
        layer: "tmpfs size + cgroup memory",
        attempt: "fill /tmp under --memory-mb 64",
        expect: "ENOSPC or a memory_limit kill, at no more than 64 MiB",
    },
    Probe {
        id: "limit.stdout",
        layer: "bounded stream capture",
        attempt: "write 3 MB to stdout",
        expect: "1 MiB passed on; the report says truncated",
    },
];

const EXHAUST_PY: &str = r#"
fds = []
try:
    while len(fds) < 100000:
        fds.append(os.open("/dev/null", os.O_RDONLY))
    print("RESULT fds none", len(fds), flush=True)
except OSError as e:
    print("RESULT fds errno=%d" % e.errno, len(fds), flush=True)
for fd in fds:
    os.close(fd)
n = 0
try:
    while n < 100000:
        open("/output/i%06d" % n, "w").close()
        n += 1
    print("RESULT inodes none", n, flush=True)
except OSError as e:
    print("RESULT inodes errno=%d" % e.errno, n, flush=True)
for i in range(n):
    os.unlink("/output/i%06d" % i)
def fill(name, path, mb):
    n = 0
    try:
        with open(path, "wb") as f:
            while n < mb:
                f.write(b"x" * (1 << 20))
                f.flush()
                os.fsync(f.fileno())
                n += 1
        print("RESULT", name, "none", n, flush=True)
    except OSError as e:
        print("RESULT", name, "errno=%d" % e.errno, n, flush=True)
    try:
        os.unlink(path)
    except OSError:
        pass
fill("output_fill", "/output/fill.bin", 64)
fill("tmpfs_fill", "/tmp/fill.bin", 512)
"#;

fn exhaust(env: &Env, tier: Tier) -> Verdicts {
    let o = env.py(
        tier,
        EXHAUST_PY,
        &s(&[
            "--memory-mb",
            "64",
            "--output-max-mb",
            "5",
            "--timeout",
            "30",
        ]),
    );
    // `RESULT name errno=N count`.
    let got = |name: &str| -> (String, u64) {
        let r = res(&o, name);
        let mut it = r.split(' ');
        let e = it.next().unwrap_or("").to_string();
        let n = it.next().and_then(|n| n.parse().ok()).unwrap_or(u64::MAX);
        (e, n)
    };
    let bounded = |name: &str, errno: &str, max: u64| {
        let (e, n) = got(name);
        if e == errno && n <= max {
            pass(format!("{e} after {n}"))
        } else {
            fail(format!(
                "{name}: {e} after {n} (expected {errno} at ≤ {max})"
            ))
        }
    };
    let tmp = {
        let (e, n) = got("tmpfs_fill");
        if (e == "errno=28" || e == "errno=27") && n <= 64 {
            // ENOSPC from the tmpfs size, or EFBIG from RLIMIT_FSIZE (the same bound).
            pass(format!("{e} after {n} MiB"))
        } else if o.status() == "memory_limit" && (n == u64::MAX || n <= 64) {
            pass("killed by the memory limit while filling /tmp")
        } else {
            fail(format!(
                "tmpfs_fill: {e} after {n} MiB; the run ended {}",
                o.status()
            ))
        }
    };
    let so = env.run(
        tier,
        &s(&[
            "--",
            "/bin/sh",
            "-c",
            "head -c 3000000 /dev/zero | tr '\\0' a; echo done >&2",
        ]),
    );
    let stdout_v = if so.stdout.len() == 1 << 20
        && so.report["stdout"]["truncated"] == true
        && so.report["stdout"]["bytes"] == 3_000_000
    {
        pass("1 MiB passed on; the report counts 3000000 bytes, truncated")
    } else {
        fail(format!(
            "{} bytes passed on; report: {}",
            so.stdout.len(),
            so.report["stdout"]
        ))
    };
    vec![
        ("limit.fds", bounded("fds", "errno=24", 1024)),
        ("limit.inodes", bounded("inodes", "errno=28", 16384)),
        // /output's tmpfs is the byte bound plus one page per inode of headroom
        // (`plan::output_tmpfs_bytes`), so that files within the bound always fit; filling
        // it must stop there.
        (
            "limit.output_fill",
            bounded(
                "output_fill",
                "errno=28",
                agentjail_engine::plan::output_tmpfs_bytes(&agentjail_manifest::Limits {
                    output_mb: 5,
                    ..Default::default()
                }) >> 20,
            ),
        ),
        ("limit.tmpfs_fill", tmp),
        ("limit.stdout", stdout_v),
    ]
}

// --- the deadline and leftover processes --------------------------------------------------------

const TIMEOUT: &[Probe] = &[
    Probe {
        id: "timeout.daemon_after_exit",
        layer: "pid namespace init kills the tree",
        attempt: "leave a double-forked, SIGTERM-ignoring daemon behind and exit 0",
        expect: "no process of the run outlives it",
    },
    Probe {
        id: "timeout.daemon_at_deadline",
        layer: "wall-clock deadline + tree kill",
        attempt: "a double-forked daemon and a SIGTERM-ignoring loop under --timeout 1",
        expect: "timeout (124); no process survives",
    },
    Probe {
        id: "timeout.stopped_child",
        layer: "tree kill with SIGKILL",
        attempt: "a SIGSTOPped child and a loop under --timeout 1",
        expect: "timeout (124); the stopped child is gone too",
    },
];

fn any_process_named(marker: &str) -> bool {
    let Ok(rd) = std::fs::read_dir("/proc") else {
        return false;
    };
    rd.flatten().any(|e| {
        let mut s = String::new();
        std::fs::File::open(e.path().join("cmdline"))
            .and_then(|mut f| f.read_to_string(&mut s))
            .is_ok()
            && s.contains(marker)
    })
}

fn timeout(env: &Env, tier: Tier) -> Verdicts {
    let survivors = |marker: &str| {
        // The kill is synchronous with the run's end; allow the kernel a moment to reap.
        let t = Instant::now();
        while t.elapsed() < Duration::from_millis(500) {
            if !any_process_named(marker) {
                return false;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        any_process_named(marker)
    };
    // (probe, marker, --timeout, the script given its marker, the exit code it must end with,
    // what a survivor means, what passing says).
    type Script = fn(&str) -> String;
    let cases: [(&'static str, &str, &str, Script, i32, &str, &str); 3] = [
        (
            "timeout.daemon_after_exit",
            "agentjail-daemon",
            "10",
            |m| {
                format!(
                    "trap '' TERM; (setsid sh -c 'trap \"\" TERM; exec -a {m} sleep 300' &) ; sleep 0.2; exit 0"
                )
            },
            0,
            "the daemon survived the run",
            "exit 0; the daemon is gone",
        ),
        (
            "timeout.daemon_at_deadline",
            "agentjail-loop",
            "1",
            |m| {
                format!(
                    "trap '' TERM; (setsid sh -c 'trap \"\" TERM; exec -a {m} sleep 300' &); while :; do :; done"
                )
            },
            124,
            "a process survived the timeout",
            "timeout; nothing survived",
        ),
        (
            "timeout.stopped_child",
            "agentjail-stopped",
            "1",
            |m| {
                format!(
                    "setsid sh -c 'exec -a {m} sleep 300' & P=$!; sleep 0.3; kill -STOP $P; while :; do :; done"
                )
            },
            124,
            "the stopped child survived the timeout",
            "timeout; the stopped child is gone",
        ),
    ];
    cases
        .into_iter()
        .map(|(id, prefix, seconds, script, want, survived, passed)| {
            let marker = env.unique(prefix);
            let o = env.run(
                tier,
                &s(&[
                    "--timeout",
                    seconds,
                    "--",
                    "/bin/sh",
                    "-c",
                    &script(&marker),
                ]),
            );
            let v = if o.code != want {
                // The first case ran to its end: its message says "the command".
                let what = if want == 0 {
                    "the command ended"
                } else {
                    "ended"
                };
                fail(format!("{what} {} (exit {})", o.status(), o.code))
            } else if survivors(&marker) {
                fail(survived)
            } else {
                pass(passed)
            };
            (id, v)
        })
        .collect()
}

// --- output collection --------------------------------------------------------------------------

const OUTPUT: &[Probe] = &[
    Probe {
        id: "output.symlink",
        layer: "output collector (never follows links)",
        attempt: "plant /output/summary.json as a symlink to a host file, and write through it",
        expect: "refused and reported; the host file untouched",
    },
    Probe {
        id: "output.fifo",
        layer: "output collector",
        attempt: "leave a FIFO in /output (a collector that opens it blocks)",
        expect: "refused (not delivered), the run ends",
    },
    Probe {
        id: "output.device",
        layer: "no CAP_MKNOD + output collector",
        attempt: "create a device node in /output",
        expect: "refused",
    },
    Probe {
        id: "output.socket",
        layer: "output collector",
        attempt: "leave a unix socket in /output",
        expect: "not delivered",
    },
    Probe {
        id: "output.hardlink",
        layer: "output collector",
        attempt: "leave a file with two names in /output",
        expect: "refused (not delivered)",
    },
    Probe {
        id: "output.hostile_names",
        layer: "output collector",
        attempt: "file names with a newline, terminal escapes, a leading dash",
        expect: "no control character reaches the host's names or terminal",
    },
    Probe {
        id: "output.deep_tree",
        layer: "output collector",
        attempt: "a directory tree 40 levels deep",
        expect: "refused below the depth limit",
    },
    Probe {
        id: "output.delivered",
        layer: "control",
        attempt: "a plain file beside the hostile ones",
        expect: "delivered intact (sentinel)",
    },
];

const OUTPUT_PY: &str = r#"
import stat
os.symlink("@TARGET@", "/output/summary.json")
attempt("write_through_link", lambda: open("/output/summary.json", "w").write("PWNED"))
os.symlink("/etc/passwd", "/output/passwd")
attempt("mkfifo", lambda: os.mkfifo("/output/fifo"))
attempt("mknod", lambda: os.mknod("/output/dev", 0o600 | stat.S_IFCHR, os.makedev(1, 3)))
def sock():
    s = socket.socket(socket.AF_UNIX)
    s.bind("/output/sock")
attempt("socket", sock)
open("/output/a.txt", "w").write("a")
attempt("hardlink", lambda: os.link("/output/a.txt", "/output/b.txt"))
for name in ["evil\nname.txt", "\x1b]0;pwned\x07.txt", "-rf", "x\x1b[2J"]:
    attempt("name", lambda: open("/output/" + name, "w").write("n"))
d = "/output/deep"
for i in range(40):
    d += "/d"
os.makedirs(d)
open(d + "/f.txt", "w").write("deep")
open("/output/fine.txt", "w").write("fine")
"#;

/// Every path below `dir` (relative), not following links.
fn walk(dir: &Path, rel: &Path, out: &mut Vec<(std::path::PathBuf, std::fs::FileType)>) {
    let Ok(rd) = std::fs::read_dir(dir) else {
        return;
    };
    for e in rd.flatten() {
        let Ok(t) = e.file_type() else { continue };
        let r = rel.join(e.file_name());
        if t.is_dir() {
            walk(&e.path(), &r, out);
        }
        out.push((r, t));
    }
}

fn output(env: &Env, tier: Tier) -> Verdicts {
    let target = match sandbox_file(env, "host-target.txt", "ORIGINAL") {
        Ok(t) => t,
        Err(v) => return all(OUTPUT, v),
    };
    let before = std::fs::metadata(&target).and_then(|m| m.modified()).ok();
    let out = env.dir().join(env.unique("out"));
    let o = env.py(
        tier,
        &OUTPUT_PY.replace("@TARGET@", &target.display().to_string()),
        &s(&[
            "--output-dir",
            &out.display().to_string(),
            "--timeout",
            "20",
        ]),
    );
    if !o.complete() {
        return all(OUTPUT, fail(o.incomplete()));
    }
    let mut delivered = Vec::new();
    walk(&out, Path::new(""), &mut delivered);
    let has = |name: &str| delivered.iter().any(|(p, _)| p == Path::new(name));
    let untouched = std::fs::read_to_string(&target).ok().as_deref() == Some("ORIGINAL")
        && std::fs::metadata(&target).and_then(|m| m.modified()).ok() == before;
    let any_link = delivered.iter().any(|(_, t)| t.is_symlink());
    let symlink_v = if !untouched {
        fail("the host file was changed")
    } else if any_link || has("summary.json") || has("passwd") {
        fail("a symlink was delivered")
    } else if !o.denied("output", "summary.json: symlink refused") {
        fail(format!(
            "not reported as `summary.json: symlink refused` (write through it: {})",
            res(&o, "write_through_link")
        ))
    } else {
        pass(format!(
            "refused and reported; the host file untouched (write through it inside: {})",
            res(&o, "write_through_link")
        ))
    };
    let special = |name: &str, attempt: &str, reason: &str| {
        let r = res(&o, attempt);
        if has(name) {
            fail(format!("{name} was delivered"))
        } else if r.starts_with("errno=") {
            pass(format!("refused at creation ({r})"))
        } else if o.denied("output", &format!("{name}: {reason}")) {
            pass(format!("not delivered; reported `{name}: {reason}`"))
        } else if tier == Tier::Gvisor {
            // gVisor keeps such a node in its own file system; the host's /output never sees it.
            pass("not delivered (it never reached the host's /output)")
        } else {
            fail(format!("not delivered, but not reported as `{reason}`"))
        }
    };
    let names_bad: Vec<String> = delivered
        .iter()
        .map(|(p, _)| p.to_string_lossy().into_owned())
        .filter(|p| p.chars().any(char::is_control))
        .collect();
    let names_v = if !names_bad.is_empty() {
        fail(format!("delivered: {:?}", names_bad))
    } else if o.stderr.contains('\x1b') {
        fail("a terminal escape reached agentjail's stderr")
    } else {
        pass("no control character in a delivered name or on the terminal")
    };
    let deepest = delivered
        .iter()
        .map(|(p, _)| p.components().count())
        .max()
        .unwrap_or(0);
    let deep_v = if deepest > 17 {
        fail(format!("delivered a path {deepest} levels deep"))
    } else if o.denied("output", "nested deeper") {
        pass(format!(
            "refused; the deepest delivered path has {deepest} levels"
        ))
    } else {
        fail("not reported as nested too deep")
    };
    let fine_v = match std::fs::read_to_string(out.join("fine.txt")) {
        Ok(c) if c == "fine" => pass(format!("delivered; status {}", o.status())),
        _ => fail(format!(
            "fine.txt was not delivered (status {}, delivered {:?})",
            o.status(),
            delivered
                .iter()
                .map(|(p, _)| p.display().to_string())
                .collect::<Vec<_>>()
        )),
    };
    let hard_v = if has("a.txt") && has("b.txt") {
        fail("both names were delivered")
    } else if res(&o, "hardlink").starts_with("errno=") {
        pass(format!("refused at creation ({})", res(&o, "hardlink")))
    } else if o.denied("output", "hard link refused") {
        pass("not delivered; reported `hard link refused`")
    } else {
        fail("not reported as a hard link")
    };
    vec![
        ("output.symlink", symlink_v),
        ("output.fifo", special("fifo", "mkfifo", "FIFO refused")),
        (
            "output.device",
            special("dev", "mknod", "device node refused"),
        ),
        ("output.socket", special("sock", "socket", "socket refused")),
        ("output.hardlink", hard_v),
        ("output.hostile_names", names_v),
        ("output.deep_tree", deep_v),
        ("output.delivered", fine_v),
    ]
}

const OUTPUT_SIZE: &[Probe] = &[
    Probe {
        id: "output.oversized",
        layer: "output collector budget",
        attempt: "a 3 MB file under --output-max-mb 1",
        expect: "refused (exit 65), not delivered",
    },
    Probe {
        id: "output.sparse",
        layer: "output collector budget (apparent size)",
        attempt: "sparse files of 1 GiB and of 6 MiB apparent size (nothing allocated)",
        expect: "refused at creation or at collection (exit 65), not delivered",
    },
];

fn output_size(env: &Env, tier: Tier) -> Verdicts {
    let out = env.dir().join(env.unique("out"));
    let o = env.run(
        tier,
        &s(&[
            "--output-max-mb",
            "1",
            "--output-dir",
            &out.display().to_string(),
            "--",
            "/bin/sh",
            "-c",
            "head -c 3000000 /dev/zero > /output/big.bin; exit 0",
        ]),
    );
    let big = if o.code == 65 && o.denied("output", "limit") && !out.join("big.bin").exists() {
        pass("exit 65; refused over the limit; not delivered")
    } else {
        fail(format!("ended {} (exit {})", o.status(), o.code))
    };
    let out2 = env.dir().join(env.unique("out"));
    let o = env.py(
        tier,
        SPARSE_PY,
        &s(&["--output-dir", &out2.display().to_string()]),
    );
    // huge.bin exists empty when RLIMIT_FSIZE refused the truncate after the open.
    let delivered = std::fs::metadata(out2.join("huge.bin"))
        .map(|m| m.len() > 0)
        .unwrap_or(false)
        || out2.join("over.bin").exists();
    let sparse = if !o.complete() {
        fail(o.incomplete())
    } else if delivered {
        fail("a sparse file over the budget was delivered")
    } else if res(&o, "over") == "ok" && o.code != 65 {
        fail(format!(
            "ended {} (exit {}), not output_rejected",
            o.status(),
            o.code
        ))
    } else {
        pass(format!(
            "1 GiB: {} (RLIMIT_FSIZE); 6 MiB apparent, 0 allocated: {}; neither delivered (exit {})",
            res(&o, "huge"),
            res(&o, "over"),
            o.code
        ))
    };
    vec![("output.oversized", big), ("output.sparse", sparse)]
}

const SPARSE_PY: &str = r#"
def sparse(path, size):
    with open(path, "wb") as f:
        f.truncate(size)
attempt("huge", lambda: sparse("/output/huge.bin", 1 << 30))
attempt("over", lambda: sparse("/output/over.bin", 6 << 20))
"#;

const OUTPUT_RACE: &[Probe] = &[Probe {
    id: "output.swap_race",
    layer: "output collector (checks each entry before and after opening)",
    attempt: "a daemon swaps /output/race between a file and a symlink to a host file while the run ends",
    expect: "never a symlink delivered, never the host file read or changed",
}];

const RACE_PY: &str = r#"
if os.fork() == 0:
    os.setsid()
    while True:
        try:
            os.symlink("@TARGET@", "/output/race.l")
            os.rename("/output/race.l", "/output/race")
            with open("/output/race.f", "w") as f:
                f.write("regular")
            os.rename("/output/race.f", "/output/race")
        except OSError:
            pass
time.sleep(0.3)
"#;

fn output_race(env: &Env, tier: Tier) -> Verdicts {
    let target = match sandbox_file(env, "race-target.txt", "HOST-SECRET-RACE") {
        Ok(t) => t,
        Err(v) => return all(OUTPUT_RACE, v),
    };
    let mut verdict = pass("");
    let rounds = 3;
    for _ in 0..rounds {
        let out = env.dir().join(env.unique("out"));
        let o = env.py(
            tier,
            &RACE_PY.replace("@TARGET@", &target.display().to_string()),
            &s(&[
                "--output-dir",
                &out.display().to_string(),
                "--timeout",
                "10",
            ]),
        );
        if !o.complete() {
            return all(OUTPUT_RACE, fail(o.incomplete()));
        }
        let mut delivered = Vec::new();
        walk(&out, Path::new(""), &mut delivered);
        let leaked = delivered.iter().any(|(p, t)| {
            t.is_symlink()
                || std::fs::read_to_string(out.join(p))
                    .map(|c| c.contains("HOST-SECRET"))
                    .unwrap_or(false)
        });
        if leaked || std::fs::read_to_string(&target).ok().as_deref() != Some("HOST-SECRET-RACE") {
            verdict = fail(format!("delivered: {delivered:?}"));
            break;
        }
    }
    if let Verdict::Pass(_) = verdict {
        verdict = pass(format!(
            "{rounds} rounds: no symlink and no host content delivered"
        ));
    }
    vec![("output.swap_race", verdict)]
}
