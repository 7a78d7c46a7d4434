//! Attacks on sessions over HTTP (issue #34 stage 1b; docs/api.md "Sessions"), as a hostile
//! model's code inside a cell or a hostile or buggy API client would make them, each through a
//! real `agentjail serve` and real sandboxes. Every cell prints a sentinel (`RAN-…`) so that
//! "refused by us" is never confused with "failed anyway".

#![allow(clippy::unwrap_used, clippy::expect_used)]

#[macro_use]
mod common;
use common::serve::{Api, Serve, actor, json_output, write_config};

use std::path::PathBuf;
use std::time::{Duration, Instant};

use serde_json::{Value, json};

const ALICE: &str = "tok-alice-sessions-attacks-41c2";
const CAROL: &str = "tok-carol-sessions-attacks-88d0";
const BOB: &str = "tok-bob-sessions-attacks-7e19";
const OPS: &str = "tok-ops-sessions-attacks-5b3a";

fn config() -> String {
    format!(
        r#"
[tenants.acme]
[tenants.beta]
{alice}{carol}{bob}{ops}
[tasks.py]
description = "Model-proposed Python"
code = "allowed"
command = ["/usr/bin/python3", "/input/code.py"]
allowed_actors = ["alice", "carol", "bob"]
stdout_bytes = 4096
{output}[tasks.py.limits]
seconds = 30
processes = 32
[tasks.py.session]
max_mb = 2
max_files = 2000
max_cells = 100

[tasks.big]
description = "Model-proposed Python with a 64 MB workspace"
code = "allowed"
command = ["/usr/bin/python3", "/input/code.py"]
allowed_actors = ["alice"]
{big_output}[tasks.big.limits]
seconds = 60
memory_mb = 512
[tasks.big.session]
max_mb = 64
"#,
        alice = actor("alice", "acme", ALICE, false),
        carol = actor("carol", "acme", CAROL, false),
        bob = actor("bob", "beta", BOB, false),
        ops = actor("ops", "acme", OPS, true),
        output = json_output("py", "o.json", 1000),
        big_output = json_output("big", "o.json", 1000),
    )
}

struct Env {
    dir: tempfile::TempDir,
    data: PathBuf,
    /// The service on SQLite; None on PostgreSQL, where `fleet` is.
    serve: Option<Serve>,
    fleet: Option<common::pg::Fleet>,
    api: Api,
}

fn start() -> Env {
    let dir = common::tmp();
    let cfg = write_config(dir.path(), &config());
    let data = dir.path().join("data");
    let serve = Serve::start(&cfg, &data, &[]);
    let api = Api::new(&serve.base);
    Env {
        dir,
        data,
        serve: Some(serve),
        fleet: None,
        api,
    }
}

/// [`start`] on a throwaway PostgreSQL cluster: one replica executing the cells from the
/// database's queue. None when PostgreSQL is missing (fails under CI).
fn start_pg() -> Option<Env> {
    let f = common::pg::Fleet::start(&config(), "2", 1, 0)?;
    Some(Env {
        dir: common::tmp(),
        data: f.data.clone(),
        serve: None,
        api: f.apis[0].clone(),
        fleet: Some(f),
    })
}

on_both_stores!(
    a_daemon_forked_by_a_cell_does_not_outlive_it_nor_change_its_checkpoint,
    a_hostile_tree_in_work_restores_as_plain_files_only,
    cells_over_the_bounds_leave_the_head_where_it_was,
    a_cells_run_is_not_anothers_to_read_or_cancel,
    a_cell_submitted_as_the_session_closes_does_not_run_on,
    one_cell_request_id_from_many_clients_runs_once,
);

fn stdout(v: &Value) -> String {
    format!(
        "{}{}",
        v["stdout"]["head"].as_str().unwrap_or(""),
        v["stdout"]["tail"].as_str().unwrap_or("")
    )
}

impl Env {
    fn send(
        &self,
        method: reqwest::Method,
        token: &str,
        path: &str,
        body: Option<Value>,
    ) -> (u16, Value) {
        self.api.send(method, token, path, body)
    }

    fn open(&self, token: &str, request_id: &str) -> String {
        let (s, v) = self.send(
            reqwest::Method::POST,
            token,
            "/v1/sessions",
            Some(json!({"request_id": request_id, "task": "py"})),
        );
        assert_eq!(s, 201, "{v}");
        v["session_id"].as_str().unwrap().to_string()
    }

    fn cell_raw(
        &self,
        token: &str,
        sid: &str,
        request_id: &str,
        body: &str,
        wait: bool,
    ) -> (u16, Value) {
        self.api.cell_raw(token, sid, request_id, body, wait)
    }

    /// A cell that must be answered 200 after it ran (whatever its status).
    fn cell(&self, sid: &str, request_id: &str, body: &str) -> Value {
        let (s, v) = self.cell_raw(ALICE, sid, request_id, body, true);
        assert_eq!(s, 200, "{v}");
        v
    }

    fn session(&self, sid: &str) -> Value {
        let (s, v) = self.send(
            reqwest::Method::GET,
            ALICE,
            &format!("/v1/sessions/{sid}"),
            None,
        );
        assert_eq!(s, 200, "{v}");
        v
    }

    fn checkpoint_file(&self, sha: &str) -> PathBuf {
        self.data
            .join("checkpoints")
            .join(sha.strip_prefix("sha256:").unwrap())
    }
}

/// Host processes whose command line holds `marker`.
fn marked(marker: &str) -> Vec<(i32, String)> {
    let mut found = Vec::new();
    for e in std::fs::read_dir("/proc").unwrap().flatten() {
        let Some(pid) = e.file_name().to_str().and_then(|s| s.parse::<i32>().ok()) else {
            continue;
        };
        let cmdline = std::fs::read(format!("/proc/{pid}/cmdline"))
            .map(|b| String::from_utf8_lossy(&b).replace('\0', " "))
            .unwrap_or_default();
        if cmdline.contains(marker)
            && !cmdline.contains("cargo")
            && !cmdline.contains("sessions_attacks")
        {
            found.push((pid, cmdline));
        }
    }
    found
}

/// A daemon (double fork, `setsid`, exec'd with a marker in its command line) that keeps
/// writing into `/work` after its cell ended must not survive the cell, nor change the
/// checkpoint that was hashed and stored.
fn a_daemon_forked_by_a_cell_does_not_outlive_it_nor_change_its_checkpoint(e: Env) {
    let sid = e.open(ALICE, "open-daemon");
    let marker = format!("DAEMON-MARK-{}", std::process::id());
    let daemon = format!(
        r#"
import os, sys, time
open('/work/base.txt', 'w').write('base')
if os.fork() == 0:
    os.setsid()
    if os.fork() == 0:
        for fd in (0, 1, 2):
            try: os.close(fd)
            except OSError: pass
        os.execv('/usr/bin/python3', ['/usr/bin/python3', '-c',
            "import time\nfor i in range(400):\n    open('/work/late.txt', 'a').write('x')\n    time.sleep(0.05)",
            '{marker}'])
    os._exit(0)
os.wait()
time.sleep(0.3)
print('RAN-DAEMON-FORKED', os.path.exists('/work/late.txt'), flush=True)
"#
    );
    let c0 = e.cell(&sid, "daemon", &daemon);
    assert_eq!(c0["status"], "ok", "{c0}");
    assert!(stdout(&c0).contains("RAN-DAEMON-FORKED True"), "{c0}");
    let after = c0["workspace"]["after"]
        .as_str()
        .expect("a checkpoint")
        .to_string();
    // The cell has ended: its daemon is gone (not merely the cell's process).
    let t = Instant::now();
    while !marked(&marker).is_empty() && t.elapsed() < Duration::from_secs(5) {
        std::thread::sleep(Duration::from_millis(50));
    }
    assert!(
        marked(&marker).is_empty(),
        "the daemon survived its cell: {:?}",
        marked(&marker)
    );
    // And the stored checkpoint is still the bytes that were hashed.
    std::thread::sleep(Duration::from_millis(500));
    let bytes = match &e.fleet {
        None => std::fs::read(e.checkpoint_file(&after)).unwrap(),
        Some(f) => f.checkpoint(&after),
    };
    assert_eq!(
        format!("sha256:{}", common::serve::sha256_hex(&bytes)),
        after
    );
    // The next cell sees what was there when the cell ended, and nothing writes it any more.
    let c1 = e.cell(
        &sid,
        "probe",
        "import os, time\na = os.path.getsize('/work/late.txt')\ntime.sleep(0.5)\nb = os.path.getsize('/work/late.txt')\nprint('RAN-PROBE', a == b, open('/work/base.txt').read())",
    );
    assert_eq!(c1["status"], "ok", "{c1}");
    assert!(stdout(&c1).contains("RAN-PROBE True base"), "{c1}");
}

/// A cell leaves in `/work` symlinks (to a host file and out of the tree), a hard link, a
/// FIFO, a socket, a device node (if it can make one), non-UTF-8, `..`-like, long and deeply
/// nested names: the checkpoint holds only the plain files and folders, the next cell's
/// restore makes no link, and the host file the links named is untouched.
fn a_hostile_tree_in_work_restores_as_plain_files_only(e: Env) {
    let host = e.dir.path().join("host-sentinel.txt");
    std::fs::write(&host, "HOST-UNTOUCHED").unwrap();
    let sid = e.open(ALICE, "open-tree");
    let tree = format!(
        r#"
import os, socket
os.chdir('/work')
open('keep.txt', 'w').write('kept')
os.symlink('{host}', 'host-link')
os.symlink('/etc/shadow', 'shadow-link')
os.symlink('../../../../', 'up')
os.mkdir('dir')
os.symlink('/', 'dir/root')
open('orig', 'w').write('o')
os.link('orig', 'hard')
os.mkfifo('fifo')
s = socket.socket(socket.AF_UNIX); s.bind('/work/sock')
try:
    os.mknod('dev', 0o20666, os.makedev(1, 3))
    print('MADE-DEV')
except OSError as err:
    print('NO-DEV', err.errno)
open(b'/work/\xff\xfe-bytes', 'w').write('nonutf8')
open('...', 'w').write('dots')
open('.. ', 'w').write('dotdotspace')
open('a' * 255, 'w').write('long')
p = '/work/deep'
for i in range(300):
    p += '/d'
os.makedirs(p)
open(p + '/bottom', 'w').write('bottom')
print('RAN-TREE', flush=True)
"#,
        host = host.display()
    );
    let c0 = e.cell(&sid, "tree", &tree);
    assert!(stdout(&c0).contains("RAN-TREE"), "{c0}");
    let after = c0["workspace"]["after"].as_str().map(str::to_string);
    let probe = r#"
import os, stat
bad = []
count = 0
for root, dirs, files in os.walk(b'/work'):
    for n in dirs + files:
        p = os.path.join(root, n)
        st = os.lstat(p)
        count += 1
        if not (stat.S_ISREG(st.st_mode) or stat.S_ISDIR(st.st_mode)):
            bad.append(p)
print('BAD', bad)
print('HAS', [n for n in (b'keep.txt', b'orig', b'\xff\xfe-bytes', b'...', b'.. ', b'a' * 255) if os.path.exists(b'/work/' + n)])
print('DEEP', os.path.exists('/work/deep' + '/d' * 300 + '/bottom'))
print('RAN-PROBE', flush=True)
"#;
    let c1 = e.cell(&sid, "probe", probe);
    let out = stdout(&c1);
    assert!(out.contains("RAN-PROBE"), "cell 0: {c0}\ncell 1: {c1}");
    assert!(
        out.contains("BAD []"),
        "a non-plain entry was restored: {out}\ncell 0: {c0}"
    );
    if after.is_some() {
        assert!(out.contains("b'keep.txt'"), "{out}\n{c0}");
    }
    assert_eq!(std::fs::read_to_string(&host).unwrap(), "HOST-UNTOUCHED");
    eprintln!(
        "cell 0: status {} after {after:?} workspace report {}",
        c0["status"], c0["report"]["workspace"]
    );
    eprintln!("cell 1: {out}");
}

/// A sparse 4 MB file (a bigger one is stopped by the output size rlimit) and 10,001 files: each cell crosses the bound, ends `output_rejected`
/// quickly (the sparse file's bytes are never read), and leaves the head where it was.
fn cells_over_the_bounds_leave_the_head_where_it_was(e: Env) {
    let sid = e.open(ALICE, "open-bounds");
    let c0 = e.cell(
        &sid,
        "base",
        "open('/work/base.txt', 'w').write('base')\nprint('RAN-BASE')",
    );
    assert_eq!(c0["status"], "ok", "{c0}");
    let head = c0["workspace"]["after"].as_str().unwrap().to_string();
    let t = Instant::now();
    let sparse = e.cell(
        &sid,
        "sparse",
        "f = open('/work/huge', 'wb')\nf.truncate(4 * 1024 ** 2 + 1)\nf.close()\nprint('RAN-SPARSE', flush=True)",
    );
    assert!(stdout(&sparse).contains("RAN-SPARSE"), "{sparse}");
    assert_eq!(sparse["status"], "output_rejected", "{sparse}");
    assert!(t.elapsed() < Duration::from_secs(20), "{:?}", t.elapsed());
    assert_eq!(e.session(&sid)["workspace_sha256"], head.as_str());
    let many = e.cell(
        &sid,
        "many",
        "import os\nos.mkdir('/work/many')\nfor i in range(10001):\n    open('/work/many/%d' % i, 'w').close()\nprint('RAN-MANY', flush=True)",
    );
    assert!(stdout(&many).contains("RAN-MANY"), "{many}");
    assert_eq!(many["status"], "output_rejected", "{many}");
    assert_eq!(e.session(&sid)["workspace_sha256"], head.as_str());
    let probe = e.cell(
        &sid,
        "probe",
        "import os\nprint('RAN-PROBE', sorted(os.listdir('/work')))",
    );
    assert!(stdout(&probe).contains("RAN-PROBE ['base.txt']"), "{probe}");
}

/// A cell is a run: another tenant cannot read, follow or cancel it by its request id; another
/// actor of the same tenant cannot cancel it.
fn a_cells_run_is_not_anothers_to_read_or_cancel(e: Env) {
    let sid = e.open(ALICE, "open-runs");
    let (st, c0) = e.cell_raw(
        ALICE,
        &sid,
        "long",
        "print('RAN-SECRET-OUTPUT', flush=True)\nimport time\ntime.sleep(30)",
        false,
    );
    assert_eq!(st, 202, "{c0}");
    let run_id = c0["request_id"].as_str().unwrap().to_string();
    assert_eq!(run_id, format!("{sid}-0"));
    e.api.wait_status(ALICE, &run_id, "running", 30);
    for path in [
        format!("/v1/runs/{run_id}"),
        format!("/v1/runs/{run_id}/logs?stream=stdout"),
        format!("/v1/runs/{run_id}/events"),
        format!("/v1/runs/{run_id}/receipt"),
    ] {
        let (s, v) = e.send(reqwest::Method::GET, BOB, &path, None);
        assert_eq!(s, 404, "{path}: {v}");
    }
    let (s, v) = e.send(
        reqwest::Method::POST,
        BOB,
        &format!("/v1/runs/{run_id}/cancel"),
        None,
    );
    assert_eq!(s, 404, "{v}");
    let (s, v) = e.send(
        reqwest::Method::POST,
        CAROL,
        &format!("/v1/runs/{run_id}/cancel"),
        None,
    );
    assert!(s == 403 || s == 404, "{s} {v}");
    // Neither can start a run under the cell's request id, nor a session cell through it.
    let (s, v) = e.send(
        reqwest::Method::POST,
        BOB,
        "/v1/runs",
        Some(json!({"request_id": format!("{sid}-1"), "task": "py", "code": "print(1)"})),
    );
    assert_eq!(s, 400, "{v}");
    let (s, v) = e.cell_raw(CAROL, &sid, "steal", "print('RAN-STOLEN')", true);
    assert_eq!(s, 404, "{v}");
    // The run is still alive (nobody else cancelled it).
    assert_eq!(e.api.status_of(ALICE, &run_id)["status"], "running");
    let (s, v) = e.send(
        reqwest::Method::DELETE,
        ALICE,
        &format!("/v1/sessions/{sid}"),
        None,
    );
    assert_eq!(s, 200, "{v}");
    e.api.wait_status(ALICE, &run_id, "cancelled", 30);
}

/// `DELETE` racing a cell's submission: once the session answers `closed`, no cell of it may
/// still be running a moment later (the close cancels whatever cell got in before it).
fn a_cell_submitted_as_the_session_closes_does_not_run_on(e: Env) {
    for round in 0..40u64 {
        let sid = e.open(ALICE, &format!("open-close-race-{round}"));
        let barrier = std::sync::Barrier::new(2);
        let (cell, closed) = std::thread::scope(|s| {
            let c = s.spawn(|| {
                barrier.wait();
                e.cell_raw(
                    ALICE,
                    &sid,
                    "late",
                    "print('RAN-LATE', flush=True)\nimport time\ntime.sleep(25)",
                    false,
                )
            });
            let d = s.spawn(|| {
                barrier.wait();
                std::thread::sleep(Duration::from_micros(250 * (round % 20)));
                e.send(
                    reqwest::Method::DELETE,
                    ALICE,
                    &format!("/v1/sessions/{sid}"),
                    None,
                )
            });
            (c.join().unwrap(), d.join().unwrap())
        });
        eprintln!("round {round}: cell {} {}", cell.0, cell.1["type"]);
        assert_eq!(closed.0, 200, "{closed:?}");
        assert_eq!(closed.1["state"], "closed");
        // Admitted: answered 202 while it was queued, or 200 when the close had already
        // ended it by the time the answer was read (on PostgreSQL a queued cell no executor
        // claimed yet is cancelled at once).
        if cell.0 == 202 || cell.0 == 200 {
            let run_id = cell.1["request_id"].as_str().unwrap().to_string();
            let ended = e.api.wait_status(ALICE, &run_id, "cancelled", 20);
            assert_eq!(ended["status"], "cancelled", "round {round}: {ended}");
        } else {
            assert_eq!(cell.0, 409, "{cell:?}");
        }
    }
}

/// Bytes of the files in `dir` (not recursive).
fn dir_bytes(dir: &std::path::Path) -> (u64, usize) {
    let mut n = (0, 0);
    for e in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        n.0 += e.metadata().map(|m| m.len()).unwrap_or(0);
        n.1 += 1;
    }
    n
}

/// The checkpoint store is bounded: while a session is open only its head and its most recent
/// `keep_checkpoints` (default 8) cells' checkpoints are kept (a fork from an older cell is
/// `410 checkpoint-gone`), and once it is closed the retention sweep deletes its checkpoints,
/// except one a live session (a fork) still starts from. Two sessions of 30 cells, each
/// leaving a distinct 1 MiB `/work` (formerly 60 files that were never deleted).
#[test]
fn checkpoint_storage_grows_with_every_distinct_cell() {
    // The retention sweep every second.
    let dir = common::tmp();
    let cfg = write_config(
        dir.path(),
        &format!("[server]\nsweep_interval_seconds = 1\n{}", config()),
    );
    let data = dir.path().join("data");
    let serve = Serve::start(&cfg, &data, &[]);
    let api = Api::new(&serve.base);
    let e = Env {
        dir,
        data,
        serve: Some(serve),
        fleet: None,
        api,
    };
    let files = || dir_bytes(&e.data.join("checkpoints")).1;
    // Waits for a sweep to bring the store down to `most` files.
    let settle = |most: usize| {
        let deadline = Instant::now() + Duration::from_secs(30);
        while files() > most && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(200));
        }
        files()
    };
    let cells = 30;
    let mut forks = Vec::new();
    for s in 0..2 {
        let sid = e.open(ALICE, &format!("open-disk-{s}"));
        for i in 0..cells {
            let c = e.cell(
                &sid,
                &format!("fill-{i}"),
                "import os\nopen('/work/r.bin', 'wb').write(os.urandom(1024 * 1024))\nprint('RAN-FILL')",
            );
            assert_eq!(c["status"], "ok", "{c}");
        }
        // Open: the head and the 8 most recent cells' checkpoints (the head is the last one's).
        let n = settle(8 + 2 * forks.len());
        assert!(n <= 8 + 2 * forks.len(), "{n} checkpoint files while open");
        let fork = |rid: &str, cell: u64| {
            e.send(
                reqwest::Method::POST,
                ALICE,
                &format!("/v1/sessions/{sid}/fork"),
                Some(json!({"request_id": rid, "cell": cell})),
            )
        };
        let (st, v) = fork(&format!("fork-old-{s}"), 0);
        assert_eq!(st, 410, "{v}");
        assert!(
            v["type"].as_str().unwrap().ends_with("/checkpoint-gone"),
            "{v}"
        );
        let (st, v) = fork(&format!("fork-recent-{s}"), cells - 3);
        assert_eq!(st, 201, "{v}");
        forks.push(v["session_id"].as_str().unwrap().to_string());
        let (st, v) = e.send(
            reqwest::Method::DELETE,
            ALICE,
            &format!("/v1/sessions/{sid}"),
            None,
        );
        assert_eq!(st, 200, "{v}");
        // Closed: only what the forks (live) start from is left.
        let n = settle(forks.len());
        assert_eq!(
            n,
            forks.len(),
            "{n} checkpoint files after the close and a sweep"
        );
    }
    // The forks still start from their checkpoints (nothing they need was deleted).
    for f in &forks {
        let c = e.cell(
            f,
            "probe",
            "print('RAN-PROBE', len(open('/work/r.bin', 'rb').read()))",
        );
        assert!(stdout(&c).contains("RAN-PROBE 1048576"), "{c}");
        let (st, v) = e.send(
            reqwest::Method::DELETE,
            ALICE,
            &format!("/v1/sessions/{f}"),
            None,
        );
        assert_eq!(st, 200, "{v}");
    }
    assert_eq!(settle(0), 0, "every session closed: no checkpoint is left");
}

/// Follows `request_id` from its start until `ended` (or the stream ends): the stdout text put
/// together (offsets checked: nothing lost or sent twice) and the last event's kind and data.
fn follow(e: &Env, token: &str, request_id: &str) -> (String, String, Value) {
    let r = e
        .api
        .http
        .get(e.api.url(&format!("/v1/runs/{request_id}/events")))
        .bearer_auth(token)
        .send()
        .unwrap();
    assert_eq!(r.status(), 200);
    let (mut text, mut at, mut last) = (String::new(), 0u64, (String::new(), Value::Null));
    common::serve::read_sse(r, |ev| {
        let d: Value = serde_json::from_str(&ev.data).unwrap_or(Value::Null);
        if ev.event == "stdout" {
            assert_eq!(d["offset"].as_u64(), Some(at), "a chunk lost or repeated");
            at += d["bytes"].as_u64().unwrap();
            text.push_str(d["text"].as_str().unwrap());
        }
        last = (ev.event.clone(), d);
        ev.event != "ended"
    });
    (text, last.0, last.1)
}

/// The service's CPU time so far (user + system, in clock ticks) and resident memory (kB).
fn cpu_and_rss(pid: u32) -> (u64, u64) {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    let fields: Vec<&str> = stat
        .rsplit(')')
        .next()
        .unwrap()
        .split_whitespace()
        .collect();
    let cpu = fields[11].parse::<u64>().unwrap() + fields[12].parse::<u64>().unwrap();
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let rss = status
        .lines()
        .find(|l| l.starts_with("VmRSS:"))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    (cpu, rss)
}

/// A run that prints and exits at once, followed from the moment it is submitted: 200 times,
/// every byte and `ended` arrive (the end comes right after the last write, the wake-up of
/// the write and the end of the news racing the follower's look).
#[test]
fn a_follower_gets_every_byte_and_the_end_of_runs_that_end_right_after_writing() {
    let e = start();
    let rounds = 200;
    std::thread::scope(|s| {
        for t in 0..2 {
            let e = &e;
            s.spawn(move || {
                for i in (t..rounds).step_by(2) {
                    let rid = format!("short-{i}");
                    let want = format!("{}END-{i}\n", "x".repeat(i * 37 % 5000));
                    let body = format!(
                        "import json, os, sys\njson.dump({{'ok': 1}}, open('/output/o.json', 'w'))\nsys.stdout.write({want:?})\nsys.stdout.flush()\nos._exit(0)\n"
                    );
                    let r = e.api.run(
                        ALICE,
                        &json!({"request_id": rid, "task": "py", "code": body}),
                        "?wait=false",
                    );
                    assert_eq!(r.status(), 202);
                    let (text, last, data) = follow(e, ALICE, &rid);
                    assert_eq!(last, "ended", "round {i}: {data}");
                    assert_eq!(data["status"], "ok", "round {i}: {data}");
                    assert_eq!(text, want, "round {i}");
                }
            });
        }
    });
}

/// A run printing a byte at a time, followed by 20 clients and by one that never reads: the
/// service does not spin (its CPU over the run is measured), nor holds memory per byte, and
/// every reading follower gets every byte and the end.
#[test]
fn a_chatty_run_with_many_followers_does_not_make_the_service_spin() {
    let e = start();
    let n = 3000;
    let body = format!(
        "import json, os, time\njson.dump({{'ok': 1}}, open('/output/o.json', 'w'))\nt = time.time()\nfor i in range({n}):\n    os.write(1, b'.')\n    time.sleep(0.001)\nprint('RAN-CHATTY %.2f' % (time.time() - t), flush=True)\n"
    );
    let pid = e.serve.as_ref().unwrap().child.id();
    let looks = || {
        e.api
            .metrics()
            .lines()
            .find(|l| l.starts_with("agentjail_follower_looks_total"))
            .and_then(|l| l.split_whitespace().nth(1))
            .and_then(|v| v.parse::<f64>().ok())
            .unwrap_or(0.0)
    };
    let looks_before = looks();
    let before = cpu_and_rss(pid);
    let r = e.api.run(
        ALICE,
        &json!({"request_id": "chatty", "task": "py", "code": body}),
        "?wait=false",
    );
    assert_eq!(r.status(), 202);
    let t = Instant::now();
    // One follower that never reads: its connection is opened and left alone.
    let stuck = e
        .api
        .http
        .get(e.api.url("/v1/runs/chatty/events"))
        .bearer_auth(ALICE)
        .send()
        .unwrap();
    let texts: Vec<(String, String)> = std::thread::scope(|s| {
        let hs: Vec<_> = (0..20)
            .map(|_| {
                let e = &e;
                s.spawn(move || {
                    let (text, last, _) = follow(e, ALICE, "chatty");
                    (text, last)
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let wall = t.elapsed();
    let after = cpu_and_rss(pid);
    drop(stuck);
    let looked = looks() - looks_before;
    let tick = 100.0; // USER_HZ
    let cpu_s = (after.0 - before.0) as f64 / tick;
    eprintln!(
        "MEASURED: {n} one-byte writes, 20 followers + 1 stuck: service CPU {cpu_s:.2} s over {:.2} s wall, {looked} looks; RSS {} kB -> {} kB",
        wall.as_secs_f64(),
        before.1,
        after.1
    );
    for (text, last) in &texts {
        assert_eq!(last, "ended");
        assert!(text.starts_with(&".".repeat(n)), "{}", text.len());
        assert!(text.contains("RAN-CHATTY"), "{text}");
    }
    // 20 followers at one look each 20 ms at most: a bounded cost, not a spin (two cores).
    assert!(
        cpu_s < wall.as_secs_f64() * 1.0,
        "the service spun: {cpu_s:.2} s of CPU in {wall:?}"
    );
    assert!(
        after.1 < before.1 + 64 * 1024,
        "memory grew: {before:?} -> {after:?}"
    );
}

/// The service's peak resident memory so far (kB).
fn peak_rss(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    status
        .lines()
        .find(|l| l.starts_with("VmHWM:"))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|v| v.parse().ok())
        .unwrap()
}

/// A client sends many cells at once to a session whose head is a 60 MB checkpoint (while a
/// cell runs, so that every one of them is refused): the head is checked before each is
/// refused, but the service must not hold a copy of the checkpoint per request.
#[test]
fn cells_sent_at_once_do_not_each_hold_the_checkpoint_in_the_services_memory() {
    let e = start();
    let (st, v) = e.send(
        reqwest::Method::POST,
        ALICE,
        "/v1/sessions",
        Some(json!({"request_id": "open-big", "task": "big"})),
    );
    assert_eq!(st, 201, "{v}");
    let sid = v["session_id"].as_str().unwrap().to_string();
    let fill = "import os\nfor i in range(15):\n    open('/work/f%d' % i, 'wb').write(os.urandom(4 * 1024 * 1024))\nprint('RAN-FILL')";
    let c0 = e.cell(&sid, "fill", fill);
    assert_eq!(c0["status"], "ok", "{c0}");
    let head = c0["workspace"]["after"].as_str().unwrap().to_string();
    assert!(std::fs::metadata(e.checkpoint_file(&head)).unwrap().len() > 60_000_000);
    let (st, v) = e.cell_raw(
        ALICE,
        &sid,
        "busy",
        "import time\nprint('RAN-BUSY', flush=True)\ntime.sleep(40)",
        false,
    );
    assert_eq!(st, 202, "{v}");
    let busy = v["request_id"].as_str().unwrap().to_string();
    e.api.wait_status(ALICE, &busy, "running", 30);
    let pid = e.serve.as_ref().unwrap().child.id();
    let before = peak_rss(pid);
    let answers: Vec<u16> = std::thread::scope(|s| {
        let hs: Vec<_> = (0..16)
            .map(|i| {
                let (e, sid) = (&e, &sid);
                s.spawn(move || {
                    e.cell_raw(
                        ALICE,
                        sid,
                        &format!("flood-{i}"),
                        "print('RAN-FLOOD')",
                        false,
                    )
                    .0
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let after = peak_rss(pid);
    eprintln!(
        "MEASURED: 16 cells at once against a 60 MB head: peak RSS {before} kB -> {after} kB"
    );
    assert!(answers.iter().all(|s| *s == 409), "{answers:?}");
    assert!(
        after < before + 200 * 1024,
        "the service's peak memory grew by {} MB",
        (after - before) / 1024
    );
    let (st, v) = e.send(
        reqwest::Method::DELETE,
        ALICE,
        &format!("/v1/sessions/{sid}"),
        None,
    );
    assert_eq!(st, 200, "{v}");
}

/// The same cell request id from six clients at once (same code): it runs once, and every
/// client gets that one cell; a retry after it ended (`output_rejected`: over the bound) is the
/// recorded cell, not a new run; other code under the id is a conflict.
fn one_cell_request_id_from_many_clients_runs_once(e: Env) {
    let sid = e.open(ALICE, "open-same-id");
    let body = "open('/work/count', 'a').write('x')\nopen('/work/big', 'wb').write(b'0' * (3 * 1024 * 1024))\nimport time\ntime.sleep(1)\nprint('RAN-SAME')";
    let barrier = std::sync::Barrier::new(6);
    let answers: Vec<(u16, Value)> = std::thread::scope(|s| {
        let hs: Vec<_> = (0..6)
            .map(|_| {
                let (e, sid, barrier) = (&e, &sid, &barrier);
                s.spawn(move || {
                    barrier.wait();
                    e.cell_raw(ALICE, sid, "same", body, true)
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    for (s, v) in &answers {
        assert_eq!(*s, 200, "{answers:?}");
        assert_eq!(v["cell"], 0, "{v}");
        assert_eq!(v["status"], "output_rejected", "{v}");
        assert_eq!(v["job_id"], answers[0].1["job_id"], "{answers:?}");
    }
    let (s, again) = e.cell_raw(ALICE, &sid, "same", body, true);
    assert_eq!(s, 200, "{again}");
    assert_eq!(again["job_id"], answers[0].1["job_id"]);
    let (s, other) = e.cell_raw(ALICE, &sid, "same", "print('RAN-OTHER')", true);
    assert_eq!(s, 409, "{other}");
    let next = e.cell(
        &sid,
        "next",
        "import os\nprint('RAN-NEXT', os.path.exists('/work/count'))",
    );
    assert!(stdout(&next).contains("RAN-NEXT False"), "{next}");
    assert_eq!(next["cell"], 1);
    assert_eq!(e.session(&sid)["cells"], 2);
}

/// The checkpoint store is out of every cell's reach: a cell of another session (or the same
/// one) cannot read or list DATA/checkpoints by its host path, nor find it under /proc.
#[test]
fn a_cell_cannot_reach_the_checkpoint_store() {
    let e = start();
    let a = e.open(ALICE, "open-store-a");
    let c0 = e.cell(
        &a,
        "secret",
        "open('/work/secret.txt', 'w').write('SECRET-OF-A')\nprint('RAN-A')",
    );
    let head = c0["workspace"]["after"].as_str().unwrap().to_string();
    let stored = e.checkpoint_file(&head);
    assert!(stored.exists());
    let b = e.open(ALICE, "open-store-b");
    let probe = format!(
        r#"
import os
found = []
for p in ({stored:?}, {dir:?}, {data:?}, '/proc/1/root' + {stored:?}):
    try:
        if os.path.isdir(p):
            found.append(('LISTED', p, os.listdir(p)))
        else:
            found.append(('READ', p, open(p, 'rb').read()[:64]))
    except OSError as err:
        pass
print('FOUND', found)
print('RAN-PROBE', flush=True)
"#,
        stored = stored.display().to_string(),
        dir = e.data.join("checkpoints").display().to_string(),
        data = e.data.display().to_string(),
    );
    let c = e.cell(&b, "probe", &probe);
    let out = stdout(&c);
    assert!(out.contains("RAN-PROBE"), "{c}");
    assert!(out.contains("FOUND []"), "{out}");
    assert!(!out.contains("SECRET-OF-A"), "{out}");
}

/// Two cells' stored checkpoints swapped in DATA/checkpoints (each file under the other's
/// name): the next cell is refused before it runs, and `agentjail receipt verify --workspace`
/// does not accept the other cell's checkpoint for a receipt.
#[test]
fn swapped_checkpoints_are_refused_and_do_not_verify() {
    let e = start();
    let sid = e.open(ALICE, "open-swap");
    let c0 = e.cell(
        &sid,
        "one",
        "open('/work/a', 'w').write('one')\nprint('RAN-ONE')",
    );
    let c1 = e.cell(
        &sid,
        "two",
        "open('/work/a', 'w').write('two')\nprint('RAN-TWO')",
    );
    let (s0, s1) = (
        c0["workspace"]["after"].as_str().unwrap().to_string(),
        c1["workspace"]["after"].as_str().unwrap().to_string(),
    );
    assert_ne!(s0, s1);
    let (p0, p1) = (e.checkpoint_file(&s0), e.checkpoint_file(&s1));
    let tmp = p0.with_extension("swap");
    std::fs::rename(&p0, &tmp).unwrap();
    std::fs::rename(&p1, &p0).unwrap();
    std::fs::rename(&tmp, &p1).unwrap();
    let (st, v) = e.cell_raw(ALICE, &sid, "three", "print('RAN-THREE')", true);
    assert_eq!(st, 409, "{v}");
    assert!(
        v["type"].as_str().unwrap().ends_with("/checkpoint-invalid"),
        "{v}"
    );
    assert_eq!(e.session(&sid)["cells"], 2);
    let dir = common::tmp();
    let key = e.data.join("private").join("receipt-key.pem");
    let pubkey = common::agentjail(&["receipt", "pubkey", "--key", key.to_str().unwrap()]);
    assert_eq!(pubkey.code, 0, "{}", pubkey.dump());
    let pem = dir.path().join("pub.pem");
    std::fs::write(&pem, &pubkey.stdout).unwrap();
    let rc = dir.path().join("receipt.json");
    std::fs::write(&rc, serde_json::to_vec(&c1["receipt"]).unwrap()).unwrap();
    let verify = |ck: &std::path::Path| {
        common::agentjail(&[
            "receipt",
            "verify",
            rc.to_str().unwrap(),
            "--pubkey",
            pem.to_str().unwrap(),
            "--workspace",
            ck.to_str().unwrap(),
        ])
    };
    // Cell 1's receipt with the file now under its checkpoint's name (cell 0's bytes): refused.
    let v = verify(&p1);
    assert_ne!(v.code, 0, "{}", v.dump());
    // With its own bytes (now under the other name): accepted, whatever the file is called.
    let v = verify(&p0);
    assert_eq!(v.code, 0, "{}", v.dump());
    // The head replaced by a symlink to a host file, then truncated: refused each time, and
    // nothing ran (the session's cell count does not move).
    let head = e.session(&sid)["workspace_sha256"]
        .as_str()
        .unwrap()
        .to_string();
    let ph = e.checkpoint_file(&head);
    let bytes = std::fs::read(&p0).unwrap();
    std::fs::remove_file(&ph).unwrap();
    std::os::unix::fs::symlink("/etc/passwd", &ph).unwrap();
    let (st, v) = e.cell_raw(ALICE, &sid, "four", "print('RAN-FOUR')", true);
    assert_eq!(st, 409, "{v}");
    assert!(
        v["type"].as_str().unwrap().ends_with("/checkpoint-invalid"),
        "{v}"
    );
    std::fs::remove_file(&ph).unwrap();
    std::fs::write(&ph, &bytes[..bytes.len() / 2]).unwrap();
    let (st, v) = e.cell_raw(ALICE, &sid, "five", "print('RAN-FIVE')", true);
    assert_eq!(st, 409, "{v}");
    assert!(
        v["type"].as_str().unwrap().ends_with("/checkpoint-invalid"),
        "{v}"
    );
    assert_eq!(e.session(&sid)["cells"], 2);
}

/// A client cancels a run it has just submitted (the request id is its own, so it can send the
/// cancel at once): the cancel must not be lost between the run's record and its execution's
/// registration (the run then ran to its end although the cancel was answered).
#[test]
fn a_cancel_sent_with_the_submission_is_not_lost() {
    let e = start();
    for round in 0..30u64 {
        let rid = format!("cancel-race-{round}");
        let barrier = std::sync::Barrier::new(2);
        let (sub, can) = std::thread::scope(|s| {
            let a = s.spawn(|| {
                barrier.wait();
                let body = json!({"request_id": rid, "task": "py", "code": "print('RAN-RACE', flush=True)\nimport time\ntime.sleep(25)"});
                e.api.run(ALICE, &body, "?wait=false").status().as_u16()
            });
            let b = s.spawn(|| {
                barrier.wait();
                std::thread::sleep(Duration::from_micros(200 * (round % 15)));
                e.send(
                    reqwest::Method::POST,
                    ALICE,
                    &format!("/v1/runs/{rid}/cancel"),
                    None,
                )
            });
            (a.join().unwrap(), b.join().unwrap())
        });
        assert_eq!(sub, 202);
        if can.0 == 404 {
            // Before the record: nothing to cancel; cancel it now.
            let (s, v) = e.send(
                reqwest::Method::POST,
                ALICE,
                &format!("/v1/runs/{rid}/cancel"),
                None,
            );
            assert_eq!(s, 200, "{v}");
        }
        let ended = e.api.wait_status(ALICE, &rid, "cancelled", 20);
        assert_eq!(
            ended["status"], "cancelled",
            "round {round}: cancel answered {can:?}"
        );
    }
}

/// A cell's run belongs to the session's owner: another actor of the same tenant gets, on every
/// run endpoint, exactly the 404 of a missing run, and does not see the cells in the listing;
/// the owner and an operator do.
#[test]
fn a_cells_run_is_the_session_owners_alone_within_the_tenant() {
    let e = start();
    let sid = e.open(ALICE, "open-own");
    let c0 = e.cell(&sid, "c0", "print('RAN-SECRET-CELL')");
    assert_eq!(c0["status"], "ok", "{c0}");
    let run_id = c0["request_id"].as_str().unwrap().to_string();
    let missing = format!("{sid}-7");
    let get = |token: &str, path: &str| e.send(reqwest::Method::GET, token, path, None);
    for (path, gone) in [
        (format!("/v1/runs/{run_id}"), format!("/v1/runs/{missing}")),
        (
            format!("/v1/runs/{run_id}/artifact"),
            format!("/v1/runs/{missing}/artifact"),
        ),
        (
            format!("/v1/runs/{run_id}/receipt"),
            format!("/v1/runs/{missing}/receipt"),
        ),
        (
            format!("/v1/runs/{run_id}/logs?stream=stdout"),
            format!("/v1/runs/{missing}/logs?stream=stdout"),
        ),
        (
            format!("/v1/runs/{run_id}/events"),
            format!("/v1/runs/{missing}/events"),
        ),
    ] {
        let (s, v) = get(CAROL, &path);
        let (ms, mv) = get(CAROL, &gone);
        assert_eq!((s, ms), (404, 404), "{path}: {v} / {mv}");
        assert_eq!(v, mv, "{path}: not the 404 of a missing run");
        assert!(!v.to_string().contains("RAN-SECRET"), "{v}");
        let (s, v) = get(ALICE, &path);
        assert_eq!(s, 200, "{path}: {v}");
        let (s, v) = get(OPS, &path);
        assert_eq!(s, 200, "operator {path}: {v}");
    }
    let (s, v) = e.send(
        reqwest::Method::POST,
        CAROL,
        &format!("/v1/runs/{run_id}/cancel"),
        None,
    );
    let (ms, mv) = e.send(
        reqwest::Method::POST,
        CAROL,
        &format!("/v1/runs/{missing}/cancel"),
        None,
    );
    assert_eq!((s, ms), (404, 404), "{v} / {mv}");
    assert_eq!(v, mv);
    // The listing: carol's has no cell of alice's session; alice's and the operator's do.
    let listed = |token: &str| {
        let (s, v) = get(token, "/v1/runs?limit=100");
        assert_eq!(s, 200, "{v}");
        v.to_string().contains(&sid)
    };
    assert!(!listed(CAROL), "carol's listing names alice's session");
    assert!(listed(ALICE));
    assert!(listed(OPS));
    // MCP's `get_run`: carol's answer is the one for a missing run; alice's is the cell.
    let carol = mcp_get_run(&e, CAROL, &run_id);
    assert!(!carol.contains("RAN-SECRET"), "{carol}");
    assert!(carol.contains("not-found"), "{carol}");
    assert_eq!(
        carol.replace(&run_id, "ID"),
        mcp_get_run(&e, CAROL, &missing).replace(&missing, "ID")
    );
    assert!(mcp_get_run(&e, ALICE, &run_id).contains("RAN-SECRET-CELL"));
}

/// MCP's `get_run` of `request_id` as `token` (Streamable HTTP): the answer's body.
fn mcp_get_run(e: &Env, token: &str, request_id: &str) -> String {
    let post = |session: Option<&str>, msg: Value| {
        let mut rq = e
            .api
            .http
            .post(e.api.url("/mcp"))
            .bearer_auth(token)
            .header("accept", "application/json, text/event-stream")
            .header("mcp-protocol-version", "2025-11-25")
            .header("content-type", "application/json")
            .body(msg.to_string());
        if let Some(s) = session {
            rq = rq.header("mcp-session-id", s);
        }
        let r = rq.send().unwrap();
        let sid = r
            .headers()
            .get("mcp-session-id")
            .map(|v| v.to_str().unwrap().to_string());
        (r.status().as_u16(), sid, r.text().unwrap_or_default())
    };
    let init = json!({"jsonrpc":"2.0","id":1,"method":"initialize","params":{
        "protocolVersion":"2025-11-25","capabilities":{},"clientInfo":{"name":"attacks","version":"1"}}});
    let (code, sid, body) = post(None, init);
    assert_eq!(code, 200, "{body}");
    let sid = sid.expect("no Mcp-Session-Id");
    let (code, _, body) = post(
        Some(&sid),
        json!({"jsonrpc":"2.0","method":"notifications/initialized"}),
    );
    assert_eq!(code, 202, "{body}");
    let call = json!({"jsonrpc":"2.0","id":2,"method":"tools/call","params":{
        "name":"get_run","arguments":{"request_id": request_id}}});
    let (code, _, body) = post(Some(&sid), call);
    assert_eq!(code, 200, "{body}");
    body
}
