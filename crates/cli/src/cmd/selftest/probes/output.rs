//! The output collection probes of `agentjail selftest` (see [`super`]).

use std::path::Path;

use super::super::kit::{Env, Probe, Tier, Verdict};
use super::common::*;

pub(super) const OUTPUT: &[Probe] = &[
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

pub(super) const OUTPUT_PY: &str = r#"
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
pub(super) fn walk(dir: &Path, rel: &Path, out: &mut Vec<(std::path::PathBuf, std::fs::FileType)>) {
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

pub(super) fn output(env: &Env, tier: Tier) -> Verdicts {
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

pub(super) const OUTPUT_SIZE: &[Probe] = &[
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

pub(super) fn output_size(env: &Env, tier: Tier) -> Verdicts {
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

pub(super) const SPARSE_PY: &str = r#"
def sparse(path, size):
    with open(path, "wb") as f:
        f.truncate(size)
attempt("huge", lambda: sparse("/output/huge.bin", 1 << 30))
attempt("over", lambda: sparse("/output/over.bin", 6 << 20))
"#;

pub(super) const OUTPUT_RACE: &[Probe] = &[Probe {
    id: "output.swap_race",
    layer: "output collector (checks each entry before and after opening)",
    attempt: "a daemon swaps /output/race between a file and a symlink to a host file while the run ends",
    expect: "never a symlink delivered, never the host file read or changed",
}];

pub(super) const RACE_PY: &str = r#"
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

pub(super) fn output_race(env: &Env, tier: Tier) -> Verdicts {
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
