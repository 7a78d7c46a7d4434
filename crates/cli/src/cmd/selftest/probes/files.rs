//! The file system probes of `agentjail selftest` (see [`super`]).

use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::Path;

use super::super::kit::{Env, Probe, Tier, Verdict};
use super::common::*;

pub(super) const FS: &[Probe] = &[
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

pub(super) const FS_PY: &str = r#"
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

pub(super) fn fs(env: &Env, tier: Tier) -> Verdicts {
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

pub(super) const INPUTS: &[Probe] = &[
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

pub(super) const INPUTS_PY: &str = r#"
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

pub(super) fn inputs(env: &Env, tier: Tier) -> Verdicts {
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

pub(super) const VANISH: &[Probe] = &[Probe {
    id: "fs.writes_vanish",
    layer: "tmpfs scratch + output collection",
    attempt: "write /work, /tmp, /dev/shm, /var/tmp, / and /output; look again from a second run and from the host",
    expect: "only /output's file is delivered; nothing else survives the run",
}];

pub(super) const VANISH_WRITE_PY: &str = r#"
for p in ["/work/@M@", "/tmp/@M@", "/dev/shm/@M@", "/var/tmp/@M@", "/@M@"]:
    attempt("w:" + p, lambda: open(p, "w").write("persist?"))
open("/output/kept.txt", "w").write("kept")
"#;
pub(super) const VANISH_READ_PY: &str = r#"
for p in ["/work/@M@", "/tmp/@M@", "/dev/shm/@M@", "/var/tmp/@M@", "/@M@"]:
    print("SEEN", p, os.path.exists(p), flush=True)
"#;

pub(super) fn vanish(env: &Env, tier: Tier) -> Verdicts {
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
