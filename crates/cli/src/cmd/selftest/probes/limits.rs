//! The limits probes of `agentjail selftest` (see [`super`]).

use std::process::Command;
use std::time::{Duration, Instant};

use super::super::kit::{Env, PY, Probe, Tier};
use super::common::*;

pub(super) const LIMITS: &[Probe] = &[
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
pub(super) const FORK_PY: &str = r#"
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

pub(super) fn limits(env: &Env, tier: Tier) -> Verdicts {
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

pub(super) const EXHAUST: &[Probe] = &[
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

pub(super) const EXHAUST_PY: &str = r#"
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

pub(super) fn exhaust(env: &Env, tier: Tier) -> Verdicts {
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
