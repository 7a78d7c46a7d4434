//! Live sessions (issue #34; docs/api.md "Live sessions"): a task with
//! `session.interpreter = "python"` keeps one sandbox per session with a resident Python
//! interpreter. Attacked through a real `agentjail serve` and real sandboxes: state persists
//! between cells; two sessions (two tenants, two actors) never share state or `/work`; a
//! background process does not survive its cell; a timed-out cell is interrupted and the state
//! kept, one that ignores the interrupt loses it (and says so); the memory limit of the
//! whole session holds across cells and the cell that crossed it is named; a retried cell runs
//! once; `DELETE` leaves no process; an idle session's sandbox ends with its workspace
//! checkpointed and the next cell says the interpreter restarted. On the fleet (PostgreSQL):
//! the session's cells go to the one worker holding its interpreter, its idle end moves the
//! head through the database, and a killed holder's session restarts once, elsewhere.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;
use common::serve::{Api, Serve, actor, json_output, write_config};

use serde_json::{Value, json};

const ALICE: &str = "tok-alice-live-7d1e2a";
const CAROL: &str = "tok-carol-live-0b9f4c";
const BOB: &str = "tok-bob-live-c4e8d1";
const OPS: &str = "tok-ops-live-5a7e90";

fn config() -> String {
    format!("[server]\nmax_concurrent_runs = 8\n{}", tenants_and_task())
}

/// The tenants, actors and the live task (no `[server]` table).
fn tenants_and_task() -> String {
    format!(
        r#"
[tenants.acme]
[tenants.beta]
{alice}{carol}{bob}{ops}
[tasks.live]
description = "Model-proposed Python in a live session"
code = "allowed"
command = ["/usr/bin/python3", "/input/code.py"]
allowed_actors = ["alice", "carol", "bob"]
stdout_bytes = 4096
{output}[tasks.live.limits]
seconds = 3
memory_mb = 160
[tasks.live.session]
interpreter = "python"
idle_seconds = 5
"#,
        alice = actor("alice", "acme", ALICE, false),
        carol = actor("carol", "acme", CAROL, false),
        bob = actor("bob", "beta", BOB, false),
        ops = actor("ops", "acme", OPS, true),
        output = json_output("live", "o.json", 1000),
    )
}

struct Env {
    _dir: tempfile::TempDir,
    _serve: Serve,
    api: Api,
}

fn start() -> Env {
    let dir = common::tmp();
    let cfg = write_config(dir.path(), &config());
    let data = dir.path().join("data");
    let serve = Serve::start(&cfg, &data, &[]);
    let api = Api::new(&serve.base);
    Env {
        _dir: dir,
        _serve: serve,
        api,
    }
}

fn open(api: &Api, token: &str, rid: &str) -> String {
    let (st, v) = api.send(
        reqwest::Method::POST,
        token,
        "/v1/sessions",
        Some(json!({"request_id": rid, "task": "live"})),
    );
    assert_eq!(st, 201, "{v}");
    v["session_id"].as_str().unwrap().to_owned()
}

fn cell(api: &Api, token: &str, sid: &str, rid: &str, code: &str) -> Value {
    let (st, v) = api.send(
        reqwest::Method::POST,
        token,
        &format!("/v1/sessions/{sid}/cells?wait=true"),
        Some(json!({"request_id": rid, "code": code})),
    );
    assert!(st == 200 || st == 201, "{st} {v}");
    v
}

fn stdout(v: &Value) -> String {
    format!(
        "{}{}",
        v["stdout"]["head"].as_str().unwrap_or_default(),
        v["stdout"]["tail"].as_str().unwrap_or_default()
    )
}

fn interpreter(v: &Value) -> String {
    v["interpreter"].as_str().unwrap_or_default().to_owned()
}

#[test]
fn state_persists_between_cells() {
    let e = start();
    let sid = open(&e.api, ALICE, "s1");
    let a = cell(
        &e.api,
        ALICE,
        &sid,
        "c0",
        "import math\nx = 41\ndef inc(v):\n    return v + 1\nsq = lambda v: v * v\ngen = (i for i in range(3))\n",
    );
    assert_eq!(a["status"], "ok", "{a}");
    assert_eq!(interpreter(&a), "started", "{a}");
    let b = cell(
        &e.api,
        ALICE,
        &sid,
        "c1",
        "print(inc(x), sq(3), next(gen), next(gen), math.pi > 3)",
    );
    assert_eq!(b["status"], "ok", "{b}");
    assert_eq!(stdout(&b).trim(), "42 9 0 1 True", "{b}");
    assert_eq!(interpreter(&b), "kept", "{b}");
    let c = cell(&e.api, ALICE, &sid, "c2", "raise ValueError('boom')");
    assert_eq!(c["status"], "exit_nonzero", "{c}");
    assert!(
        c["stderr"]["head"].to_string().contains("ValueError: boom"),
        "{c}"
    );
    let d = cell(&e.api, ALICE, &sid, "c3", "print(x)");
    assert_eq!(stdout(&d).trim(), "41", "{d}");
}

#[test]
fn sessions_never_share_state_or_work() {
    let e = start();
    let a = open(&e.api, ALICE, "sa");
    let b = open(&e.api, BOB, "sb");
    let c = open(&e.api, CAROL, "sc");
    let w = cell(
        &e.api,
        ALICE,
        &a,
        "c0",
        "secret = 'alice-7'\nopen('/work/secret', 'w').write('alice-7')\nimport os\nprint(os.getpid())",
    );
    assert_eq!(w["status"], "ok", "{w}");
    for (tok, sid) in [(BOB, &b), (CAROL, &c)] {
        let r = cell(
            &e.api,
            tok,
            sid,
            "c0",
            "import os, glob\nprint('secret' in globals(), os.path.exists('/work/secret'), [p for p in glob.glob('/proc/*/root/work/secret')])",
        );
        assert_eq!(r["status"], "ok", "{r}");
        assert_eq!(stdout(&r).trim(), "False False []", "{r}");
    }
    // And the other way: alice's state is hers.
    let r = cell(&e.api, ALICE, &a, "c1", "print(secret)");
    assert_eq!(stdout(&r).trim(), "alice-7", "{r}");
}

#[test]
fn a_background_process_does_not_survive_its_cell() {
    let e = start();
    let sid = open(&e.api, ALICE, "bg");
    // The child would write the sentinel after 1 s; the proof it runs: it writes `alive` now.
    let a = cell(
        &e.api,
        ALICE,
        &sid,
        "c0",
        "import subprocess\nsubprocess.Popen(['/bin/sh', '-c', 'echo alive > /work/alive; sleep 1; echo late > /work/sentinel'])\nimport time\ntime.sleep(0.3)\nprint(open('/work/alive').read().strip())",
    );
    assert_eq!(stdout(&a).trim(), "alive", "{a}");
    std::thread::sleep(std::time::Duration::from_millis(1500));
    let b = cell(
        &e.api,
        ALICE,
        &sid,
        "c1",
        "import os\nprint(os.path.exists('/work/sentinel'), sorted(p for p in os.listdir('/proc') if p.isdigit() and p not in ('1', str(os.getpid()))))",
    );
    assert_eq!(stdout(&b).trim(), "False []", "{b}");
}

/// The driver's own clean-up runs in the process the cell's code runs in: a cell can disarm it
/// (`os.kill` and `os.waitpid` replaced, so the driver answers at once) and leave processes
/// behind: a plain child in a session of its own, a daemon reparented to the init (a double
/// fork), and a child whose main thread exited (a zombie in its status) while another thread
/// of it goes on. The supervisor's relay kills them from
/// outside the sandbox before the cell's answer is passed on (live_relay.rs).
#[test]
fn a_cell_that_disarms_the_drivers_cleanup_still_loses_its_background_processes() {
    let e = start();
    let sid = open(&e.api, ALICE, "disarm");
    let a = cell(
        &e.api,
        ALICE,
        &sid,
        "c0",
        "import os, subprocess, time\n\
         os.kill = lambda *a, **k: None\n\
         os.killpg = lambda *a, **k: None\n\
         def gone(*a):\n\
         \x20   raise ChildProcessError\n\
         os.waitpid = gone\n\
         subprocess.Popen(['/bin/sh', '-c', 'echo alive > /work/alive; sleep 1; echo late > /work/sentinel'], start_new_session=True)\n\
         if os.fork() == 0:\n\
         \x20   os.setsid()\n\
         \x20   if os.fork() == 0:\n\
         \x20       open('/work/daemon', 'w').write('alive')\n\
         \x20       time.sleep(1)\n\
         \x20       open('/work/sentinel2', 'w').write('late')\n\
         \x20   os._exit(0)\n\
         import ctypes, threading\n\
         if os.fork() == 0:\n\
         \x20   def late():\n\
         \x20       open('/work/headless', 'w').write('alive')\n\
         \x20       time.sleep(1)\n\
         \x20       open('/work/sentinel3', 'w').write('late')\n\
         \x20       os._exit(0)\n\
         \x20   threading.Thread(target=late).start()\n\
         \x20   ctypes.CDLL(None).pthread_exit(None)\n\
         time.sleep(0.3)\n\
         print(open('/work/alive').read().strip(), open('/work/daemon').read(), open('/work/headless').read())",
    );
    assert_eq!(stdout(&a).trim(), "alive alive alive", "{a}");
    std::thread::sleep(std::time::Duration::from_millis(1500));
    let b = cell(
        &e.api,
        ALICE,
        &sid,
        "c1",
        // Zombies (the cell disarmed the driver's reaping) can do nothing: only processes with
        // a thread that still runs count (the third's main thread is a zombie, its other not).
        "import os\n\
         def live(p):\n\
         \x20   try:\n\
         \x20       return any(open(f'/proc/{p}/task/{t}/stat').read().rsplit(')', 1)[1].split()[0] != 'Z' for t in os.listdir(f'/proc/{p}/task'))\n\
         \x20   except OSError:\n\
         \x20       return False\n\
         print(os.path.exists('/work/sentinel'), os.path.exists('/work/sentinel2'), os.path.exists('/work/sentinel3'), sorted(p for p in os.listdir('/proc') if p.isdigit() and p not in ('1', str(os.getpid())) and live(p)))",
    );
    assert_eq!(interpreter(&b), "kept", "{b}");
    assert_eq!(stdout(&b).trim(), "False False False []", "{b}");
}

#[test]
fn a_timed_out_cell_is_interrupted_and_says_what_became_of_the_state() {
    let e = start();
    let sid = open(&e.api, ALICE, "to");
    cell(&e.api, ALICE, &sid, "c0", "kept = 7");
    let a = cell(&e.api, ALICE, &sid, "c1", "import time\ntime.sleep(30)");
    assert_eq!(a["status"], "timeout", "{a}");
    assert_eq!(interpreter(&a), "kept", "{a}");
    let b = cell(&e.api, ALICE, &sid, "c2", "print(kept)");
    assert_eq!(stdout(&b).trim(), "7", "{b}");
    // A cell that swallows the interrupt: killed after the grace, its state lost.
    let c = cell(
        &e.api,
        ALICE,
        &sid,
        "c3",
        "import time\nwhile True:\n    try:\n        time.sleep(30)\n    except KeyboardInterrupt:\n        pass",
    );
    assert_eq!(c["status"], "timeout", "{c}");
    assert_eq!(interpreter(&c), "lost", "{c}");
    let d = cell(&e.api, ALICE, &sid, "c4", "print('kept' in globals())");
    assert_eq!(interpreter(&d), "restarted", "{d}");
    assert_eq!(stdout(&d).trim(), "False", "{d}");
}

#[test]
fn the_session_memory_limit_holds_across_cells() {
    let e = start();
    let sid = open(&e.api, ALICE, "mem");
    cell(&e.api, ALICE, &sid, "c0", "hoard = []");
    let mut crossed = None;
    for i in 1..12 {
        let v = cell(
            &e.api,
            ALICE,
            &sid,
            &format!("c{i}"),
            "hoard.append(bytearray(24 * 1024 * 1024))\nprint(len(hoard))",
        );
        if v["status"] != "ok" {
            crossed = Some((i, v));
            break;
        }
    }
    let (i, v) = crossed.expect("the session's memory limit was never reached");
    assert!(i >= 3, "cells before the limit each stayed within it: {v}");
    assert_eq!(v["status"], "memory_limit", "{v}");
    assert_eq!(interpreter(&v), "lost", "{v}");
}

#[test]
fn a_retried_cell_runs_once() {
    let e = start();
    let sid = open(&e.api, ALICE, "retry");
    let code = "import os\np = '/work/n'\nn = int(open(p).read()) + 1 if os.path.exists(p) else 1\nopen(p, 'w').write(str(n))\nprint(n)";
    let a = cell(&e.api, ALICE, &sid, "step", code);
    let b = cell(&e.api, ALICE, &sid, "step", code);
    assert_eq!(stdout(&a).trim(), "1", "{a}");
    assert_eq!(a["cell"], b["cell"]);
    assert_eq!(stdout(&b).trim(), "1", "{b}");
    let c = cell(&e.api, ALICE, &sid, "next", "print(open('/work/n').read())");
    assert_eq!(stdout(&c).trim(), "1", "the retry executed again: {c}");
}

/// The host pids of every process in the pid namespace `ns` (`pid:[N]`, as a cell reads
/// `/proc/self/ns/pid`): found through the host's /proc (the tests run as root).
fn processes_in(ns: &str) -> Vec<String> {
    let mut found = Vec::new();
    for e in std::fs::read_dir("/proc").unwrap().flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        if !name.bytes().all(|b| b.is_ascii_digit()) {
            continue;
        }
        if let Ok(l) = std::fs::read_link(e.path().join("ns/pid"))
            && l.to_string_lossy() == ns
        {
            found.push(name);
        }
    }
    found
}

#[test]
fn delete_leaves_no_process_and_idle_ends_with_a_checkpoint() {
    let e = start();
    let sid = open(&e.api, ALICE, "del");
    let a = cell(
        &e.api,
        ALICE,
        &sid,
        "c0",
        "import os\nopen('/work/kept', 'w').write('yes')\nmarker = 1\nprint(os.readlink('/proc/self/ns/pid'))",
    );
    let ns = stdout(&a).trim().to_owned();
    assert!(
        processes_in(&ns).len() >= 2,
        "the live sandbox (its init and interpreter) is found on the host"
    );
    // Idle (5 s): the sandbox ends, the workspace is checkpointed; the next cell restarts.
    let until = std::time::Instant::now() + std::time::Duration::from_secs(30);
    while !processes_in(&ns).is_empty() && std::time::Instant::now() < until {
        std::thread::sleep(std::time::Duration::from_millis(200));
    }
    assert_eq!(
        processes_in(&ns),
        Vec::<String>::new(),
        "an idle session's sandbox still runs"
    );
    // The checkpoint is recorded once the runner, which outlives the sandbox, has ended.
    let head = || {
        let (_, s) = e.api.send(
            reqwest::Method::GET,
            ALICE,
            &format!("/v1/sessions/{sid}"),
            None,
        );
        s["workspace_sha256"].clone()
    };
    while head().is_null() && std::time::Instant::now() < until {
        std::thread::sleep(std::time::Duration::from_millis(200));
    }
    assert!(head().as_str().is_some(), "the idle end left no checkpoint");
    // The interpreter's run ended cleanly (before: `output_rejected`, for the task's output
    // file an interpreter never writes).
    let run = e.api.status_of(ALICE, &format!("{sid}-live-0"));
    assert_eq!(run["status"], "ok", "{run}");
    let b = cell(
        &e.api,
        ALICE,
        &sid,
        "c1",
        "import os\nprint('marker' in globals(), open('/work/kept').read(), os.readlink('/proc/self/ns/pid'))",
    );
    assert_eq!(interpreter(&b), "restarted", "{b}");
    let out = stdout(&b);
    let mut words = out.split_whitespace();
    assert_eq!(words.next(), Some("False"), "{b}");
    assert_eq!(words.next(), Some("yes"), "{b}");
    let ns = words.next().unwrap().to_owned();
    assert!(processes_in(&ns).len() >= 2, "the new sandbox runs");
    let (st, _) = e.api.send(
        reqwest::Method::DELETE,
        ALICE,
        &format!("/v1/sessions/{sid}"),
        None,
    );
    assert_eq!(st, 200);
    assert_eq!(
        processes_in(&ns),
        Vec::<String>::new(),
        "a closed session's sandbox still runs"
    );
}

#[test]
fn a_lost_interpreter_restarts_from_its_checkpoint() {
    let e = start();
    let sid = open(&e.api, ALICE, "lost");
    cell(
        &e.api,
        ALICE,
        &sid,
        "c0",
        "open('/work/f', 'w').write('kept')\nv = 1",
    );
    let a = cell(
        &e.api,
        ALICE,
        &sid,
        "c1",
        "import os, signal\nos.kill(os.getpid(), signal.SIGKILL)",
    );
    assert_ne!(a["status"], "ok", "{a}");
    assert_eq!(interpreter(&a), "lost", "{a}");
    let b = cell(
        &e.api,
        ALICE,
        &sid,
        "c2",
        "print('v' in globals(), open('/work/f').read())",
    );
    assert_eq!(interpreter(&b), "restarted", "{b}");
    assert_eq!(stdout(&b).trim(), "False kept", "{b}");
}

/// The digest a session's chain names a receipt by (RFC 8785 JSON of its envelope).
fn receipt_digest(receipt: &Value) -> String {
    format!(
        "sha256:{}",
        common::serve::sha256_hex(serde_jcs::to_vec(receipt).unwrap())
    )
}

/// A receipt envelope's statement.
fn statement(receipt: &Value) -> Value {
    use base64::Engine as _;
    let body = base64::engine::general_purpose::STANDARD
        .decode(receipt["payload"].as_str().expect("a receipt"))
        .unwrap();
    serde_json::from_slice(&body).unwrap()
}

/// Each live cell has a receipt of its own, signed with the node's key: it names the cell's
/// code, streams, status and interpreter, and the previous cell's receipt, so that a
/// session's cells chain through the restarts; an interpreter's end does not move the chain
/// (its run receipt names the receipt before its first cell).
#[test]
fn each_live_cell_has_a_receipt_and_the_cells_chain_through_restarts() {
    let e = start();
    let sid = open(&e.api, ALICE, "chain");
    let codes = [
        "x = 6\nprint('six')",
        "print(x * 7)",
        "import os, signal\nos.kill(os.getpid(), signal.SIGKILL)",
        "print('again')",
    ];
    let cells: Vec<Value> = codes
        .iter()
        .enumerate()
        .map(|(i, c)| cell(&e.api, ALICE, &sid, &format!("c{i}"), c))
        .collect();
    let words = ["started", "kept", "lost", "restarted"];
    let runs = [0, 0, 0, 3].map(|n| format!("{sid}-live-{n}"));
    let mut previous = Value::Null;
    for (i, c) in cells.iter().enumerate() {
        assert_eq!(interpreter(c), words[i], "{c}");
        let st = statement(&c["receipt"]);
        assert_eq!(
            st["predicateType"], "https://agentjail.dev/attestation/live-cell/v1",
            "{st}"
        );
        let p = &st["predicate"];
        assert_eq!(p["request_id"], format!("{sid}-{i}"), "{p}");
        assert_eq!(p["session"]["id"], sid.as_str(), "{p}");
        assert_eq!(p["session"]["cell"], i, "{p}");
        assert_eq!(
            p["session"]["previous_receipt_sha256"], previous,
            "cell {i}: {p}"
        );
        assert_eq!(p["interpreter"]["state"], words[i], "{p}");
        assert_eq!(p["interpreter"]["request_id"], runs[i].as_str(), "{p}");
        assert_eq!(p["status"], c["status"], "{p}");
        assert_eq!(
            st["subject"][0]["digest"]["sha256"],
            common::serve::sha256_hex(codes[i]),
            "{st}"
        );
        previous = Value::String(receipt_digest(&c["receipt"]));
    }
    let session = |e: &Env| {
        let (_, s) = e.api.send(
            reqwest::Method::GET,
            ALICE,
            &format!("/v1/sessions/{sid}"),
            None,
        );
        s
    };
    assert_eq!(session(&e)["last_receipt_sha256"], previous);
    // The first interpreter's run receipt names no earlier cell; the second names the
    // receipt of the cell before it started (cell 2).
    let first = e.api.status_of(ALICE, &runs[0]);
    let p = statement(&first["receipt"])["predicate"].clone();
    assert!(p["session"]["previous_receipt_sha256"].is_null(), "{p}");
    let (st, _) = e.api.send(
        reqwest::Method::DELETE,
        ALICE,
        &format!("/v1/sessions/{sid}"),
        None,
    );
    assert_eq!(st, 200);
    let second = e.api.status_of(ALICE, &runs[3]);
    let p = statement(&second["receipt"])["predicate"].clone();
    assert_eq!(
        p["session"]["previous_receipt_sha256"].as_str(),
        Some(receipt_digest(&cells[2]["receipt"]).as_str()),
        "{p}"
    );
    assert!(p["workspace"]["after"].as_str().is_some(), "{p}");
    // Its end (a checkpoint) moved the head, not the chain: the last cell's receipt is still
    // the one the next cell would name.
    assert_eq!(session(&e)["last_receipt_sha256"], previous);

    // The operator console's run page checks a cell's receipt like a run's.
    let login = e
        .api
        .http
        .post(format!("{}/console/login", e.api.base))
        .header("Origin", &e.api.base)
        .json(&json!({ "token": OPS }))
        .send()
        .unwrap();
    assert_eq!(login.status(), 200);
    let cookie = login.headers()["set-cookie"].to_str().unwrap().to_string();
    let page: Value = e
        .api
        .http
        .get(format!("{}/console/api/runs/acme/{sid}-1", e.api.base))
        .header("Cookie", cookie.split(';').next().unwrap())
        .send()
        .unwrap()
        .json()
        .unwrap();
    assert_eq!(
        (
            &page["receipt_check"]["verifies"],
            &page["receipt_check"]["trust"]
        ),
        (&json!(true), &json!("this node")),
        "{page}"
    );

    // `agentjail receipt verify` checks a cell's receipt with the node's public key, its code
    // and its stdout; other code, another stdout or a workspace is refused.
    let dir = common::tmp();
    let key = e._dir.path().join("data/private/receipt-key.pem");
    let pubkey = common::agentjail(&["receipt", "pubkey", "--key", key.to_str().unwrap()]);
    assert_eq!(pubkey.code, 0, "{}", pubkey.dump());
    let pem = dir.path().join("pub.pem");
    std::fs::write(&pem, &pubkey.stdout).unwrap();
    let rc = dir.path().join("receipt.json");
    std::fs::write(&rc, serde_json::to_vec(&cells[1]["receipt"]).unwrap()).unwrap();
    let code = dir.path().join("code.py");
    let log = dir.path().join("stdout.log");
    std::fs::write(&log, "42\n").unwrap();
    let verify = |code_text: &str, extra: &[&str]| {
        std::fs::write(&code, code_text).unwrap();
        let mut args = vec![
            "receipt",
            "verify",
            rc.to_str().unwrap(),
            "--pubkey",
            pem.to_str().unwrap(),
            "--artifact",
            code.to_str().unwrap(),
            "--live-cell",
        ];
        args.extend_from_slice(extra);
        common::agentjail(&args)
    };
    // Without --live-cell, an authentic cell receipt is not taken for a run's (exit 3).
    let not_a_run = common::agentjail(&[
        "receipt",
        "verify",
        rc.to_str().unwrap(),
        "--pubkey",
        pem.to_str().unwrap(),
    ]);
    assert_eq!(not_a_run.code, 3, "{}", not_a_run.dump());
    assert!(
        not_a_run.stderr.contains("--live-cell"),
        "{}",
        not_a_run.dump()
    );
    let ok = verify(codes[1], &["--stdout", log.to_str().unwrap()]);
    assert_eq!(ok.code, 0, "{}", ok.dump());
    assert!(
        ok.stdout.contains("live cell 1 of session"),
        "{}",
        ok.dump()
    );
    assert!(ok.stdout.contains("interpreter kept"), "{}", ok.dump());
    let other = verify("print(x * 8)", &[]);
    assert_eq!(other.code, 1, "{}", other.dump());
    std::fs::write(&log, "43\n").unwrap();
    let forged = verify(codes[1], &["--stdout", log.to_str().unwrap()]);
    assert_eq!(forged.code, 1, "{}", forged.dump());
    let ws = verify(codes[1], &["--workspace", log.to_str().unwrap()]);
    assert_eq!(ws.code, 1, "{}", ws.dump());
    assert!(ws.stderr.contains("no workspace digest"), "{}", ws.dump());
    // The third-party verifier accepts it too.
    let script =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../verify/tests/receipt_verify.py");
    let py = |extra: &[&str]| {
        std::process::Command::new("python3")
            .arg(&script)
            .arg(&rc)
            .arg(&pem)
            .args(extra)
            .output()
            .expect("python3 runs")
    };
    assert!(
        !py(&[]).status.success(),
        "a cell's receipt taken for a run's"
    );
    let py = py(&["--live-cell"]);
    assert!(
        py.status.success(),
        "{}{}",
        String::from_utf8_lossy(&py.stdout),
        String::from_utf8_lossy(&py.stderr)
    );
}

/// `POST /v1/sessions/{id}/checkpoint` of a live session: `/work` is collected now, from
/// outside the sandbox, and becomes the session's head; the interpreter is kept (its
/// variables survive), the next cell's receipt names the new head, and a fork from the last
/// cell starts from it. A workspace over its bounds is refused with the interpreter kept;
/// another tenant's session is a 404, a closed one a 409.
#[test]
fn a_checkpoint_on_request_keeps_the_interpreter_and_a_fork_starts_from_it() {
    let e = start();
    let sid = open(&e.api, ALICE, "ckpt");
    let checkpoint = |token: &str, sid: &str| {
        e.api.send(
            reqwest::Method::POST,
            token,
            &format!("/v1/sessions/{sid}/checkpoint"),
            None,
        )
    };
    let a = cell(
        &e.api,
        ALICE,
        &sid,
        "c0",
        "v = 5\nopen('/work/a', 'w').write('one')",
    );
    assert_eq!(a["status"], "ok", "{a}");
    let (st, s) = checkpoint(ALICE, &sid);
    assert_eq!(st, 200, "{s}");
    let head = s["workspace_sha256"].as_str().expect("a head").to_owned();
    // The interpreter was not stopped: its variables are there.
    let b = cell(
        &e.api,
        ALICE,
        &sid,
        "c1",
        "print(v, open('/work/a').read())",
    );
    assert_eq!(interpreter(&b), "kept", "{b}");
    assert_eq!(stdout(&b).trim(), "5 one", "{b}");
    let p = statement(&b["receipt"])["predicate"].clone();
    assert_eq!(p["session_head"].as_str(), Some(head.as_str()), "{p}");
    // A fork from cell 0 (the last cell when the checkpoint was taken) starts from it.
    let (st, f) = e.api.send(
        reqwest::Method::POST,
        ALICE,
        &format!("/v1/sessions/{sid}/fork"),
        Some(json!({"request_id": "ckpt-fork", "cell": 0})),
    );
    assert_eq!(st, 201, "{f}");
    let fid = f["session_id"].as_str().unwrap().to_owned();
    let c = cell(
        &e.api,
        ALICE,
        &fid,
        "f0",
        "print(open('/work/a').read(), 'v' in globals())",
    );
    assert_eq!(stdout(&c).trim(), "one False", "{c}");
    // Over the workspace's bounds (10,000 entries by default): refused, the interpreter kept.
    cell(
        &e.api,
        ALICE,
        &sid,
        "c2",
        "import os\nos.mkdir('/work/many')\nfor i in range(10001):\n    open(f'/work/many/{i}', 'w').close()",
    );
    let (st, p) = checkpoint(ALICE, &sid);
    assert_eq!(
        (st, p["type"].as_str().unwrap_or("")),
        (409, "https://agentjail.dev/problems/checkpoint-invalid"),
        "{p}"
    );
    assert!(
        p["detail"].as_str().unwrap().contains("over its bounds"),
        "{p}"
    );
    let d = cell(&e.api, ALICE, &sid, "c3", "print(v)");
    assert_eq!(
        (interpreter(&d).as_str(), stdout(&d).trim()),
        ("kept", "5"),
        "{d}"
    );
    // Another tenant's session is not found; a closed one takes no checkpoint.
    let (st, _) = checkpoint(BOB, &sid);
    assert_eq!(st, 404);
    e.api.send(
        reqwest::Method::DELETE,
        ALICE,
        &format!("/v1/sessions/{sid}"),
        None,
    );
    let (st, p) = checkpoint(ALICE, &sid);
    assert_eq!(st, 409, "{p}");
}

/// Sends cell `rid` (number `n`), which loops until stopped, cancels its run 0.7 s later, and
/// checks that it ended `cancelled` with its interpreter `lost` within `ms` of its start
/// (before its 3-second limit).
fn cancel_a_busy_cell(api: &Api, sid: &str, rid: &str, n: u64, ms: u64) {
    let t0 = std::time::Instant::now();
    let busy = {
        let (api, sid, rid) = (api.clone(), sid.to_owned(), rid.to_owned());
        std::thread::spawn(move || {
            cell(
                &api,
                ALICE,
                &sid,
                &rid,
                "import time\nwhile True:\n    time.sleep(0.05)",
            )
        })
    };
    std::thread::sleep(std::time::Duration::from_millis(700));
    let (st, v) = api.send(
        reqwest::Method::POST,
        ALICE,
        &format!("/v1/runs/{sid}-{n}/cancel"),
        None,
    );
    assert_eq!(st, 200, "{v}");
    let x = busy.join().unwrap();
    assert_eq!(
        (x["status"].as_str(), interpreter(&x).as_str()),
        (Some("cancelled"), "lost"),
        "{x}"
    );
    assert!(t0.elapsed() < std::time::Duration::from_millis(ms), "{x}");
}

/// `POST /v1/runs/{id}/cancel` of a running live cell stops it at once (before its 3-second
/// limit): the cell's code runs in the interpreter, so its sandbox is killed, the cell ends
/// `cancelled` saying so, and the next cell restarts. (Before: the cancel did not reach the
/// cell, which ran on to its limit.)
#[test]
fn a_cancelled_cell_ends_its_interpreter_and_the_next_restarts() {
    let e = start();
    let sid = open(&e.api, ALICE, "cancel");
    cell(&e.api, ALICE, &sid, "c0", "v = 1");
    cancel_a_busy_cell(&e.api, &sid, "c1", 1, 2800);
    let b = cell(&e.api, ALICE, &sid, "c2", "print('v' in globals())");
    assert_eq!(interpreter(&b), "restarted", "{b}");
    assert_eq!(stdout(&b).trim(), "False", "{b}");
}

#[test]
fn an_answer_written_out_of_turn_ends_the_interpreter() {
    let e = start();
    let sid = open(&e.api, ALICE, "forge");
    // The cell's own code writes a forged answer to the next request on the channel (the
    // driver's descriptor), then the real answer follows: the next cell reads the forgery.
    let forge = "import json, struct, os\nctl = [fd for fd in range(3, 64) if os.path.exists(f'/proc/self/fd/{fd}') and os.readlink(f'/proc/self/fd/{fd}').startswith('socket:')][0]\nb = json.dumps({'seq': 99, 'status': 'ok', 'stdout': 'forged', 'stderr': '', 'truncated': False}).encode()\nos.write(ctl, struct.pack('>I', len(b)) + b)";
    let a = cell(&e.api, ALICE, &sid, "c0", forge);
    assert_ne!(stdout(&a).trim(), "forged", "{a}");
    assert_eq!(interpreter(&a), "lost", "{a}");
    let b = cell(&e.api, ALICE, &sid, "c1", "print('real')");
    assert_ne!(
        stdout(&b).trim(),
        "forged",
        "a forged answer was taken: {b}"
    );
}

/// The driver cuts a cell's streams at 1 MiB, but it runs in the cell's own process: a cell
/// that raises the driver's limit (or answers by itself) must still not get more than a run's
/// stream bound stored and returned (the service cuts what it is given).
#[test]
fn a_cell_that_lifts_the_drivers_limit_still_gets_a_bounded_stdout() {
    let e = start();
    let sid = open(&e.api, ALICE, "flood");
    let flood = "import sys\nsys.modules['__main__'].LIMIT = 1 << 30\nsys.stdout.write('x' * (5 << 20))\nsys.stderr.write('y' * (3 << 20))";
    let a = cell(&e.api, ALICE, &sid, "c0", flood);
    for s in ["stdout", "stderr"] {
        let bytes = a[s]["bytes"].as_u64().unwrap_or(u64::MAX);
        assert!(bytes <= 1 << 20, "{s}: {bytes} bytes kept");
        assert_eq!(a[s]["truncated"], true, "{s}: {}", a[s]["bytes"]);
    }
    let b = cell(&e.api, ALICE, &sid, "c1", "print('after')");
    assert_eq!(stdout(&b).trim(), "after", "{b}");
}

/// The runs of session `sid`'s interpreters on the fleet, oldest first: `node:status`.
fn interpreters(pg: &common::pg::Pg, sid: &str) -> Vec<String> {
    pg.psql(&format!(
        "SELECT node_id || ':' || status FROM runs WHERE interpreter_of = '{sid}' ORDER BY created_at, job_id"
    ))
    .lines()
    .map(str::to_owned)
    .collect()
}

/// Live sessions on the fleet (PostgreSQL; an API replica with no run slot, two workers): the
/// cells go to the worker that holds the interpreter (the other is free all along) and its
/// state persists; the idle end checkpoints `/work` through the database; a killed holder's
/// interpreter ends `unknown` at its lease's end and the next cell starts exactly one new
/// interpreter on the other worker, from the last checkpoint (its memory gone, said so);
/// `DELETE` ends it there.
#[test]
fn on_the_fleet_a_live_session_stays_on_its_worker_and_restarts_once_when_that_is_lost() {
    let Some(mut f) = common::pg::Fleet::start(&tenants_and_task(), "0", 1, 2) else {
        return;
    };
    let api = f.apis[0].clone();
    let sid = open(&api, ALICE, "fleet-live");
    let a = cell(
        &api,
        ALICE,
        &sid,
        "c0",
        "x = 41\nopen('/work/a', 'w').write('a')",
    );
    assert_eq!(
        (a["status"].as_str(), interpreter(&a).as_str()),
        (Some("ok"), "started"),
        "{a}"
    );
    for i in 1..4 {
        let v = cell(&api, ALICE, &sid, &format!("c{i}"), "x += 1\nprint(x)");
        assert_eq!(stdout(&v).trim(), (41 + i).to_string(), "{v}");
        assert_eq!(interpreter(&v), "kept", "{v}");
    }
    // A checkpoint on request through the replica (no run slot, no interpreter): the worker
    // holding the session takes it; the interpreter is kept.
    let (st, v) = api.send(
        reqwest::Method::POST,
        ALICE,
        &format!("/v1/sessions/{sid}/checkpoint"),
        None,
    );
    assert_eq!(st, 200, "{v}");
    let taken = v["workspace_sha256"]
        .as_str()
        .expect("a checkpoint")
        .to_owned();
    let k = cell(
        &api,
        ALICE,
        &sid,
        "c3k",
        "x += 1\nprint(x, open('/work/a').read())",
    );
    assert_eq!(
        (stdout(&k).trim(), interpreter(&k).as_str()),
        ("45 a", "kept"),
        "{k}"
    );
    let pg = &f.pg;
    assert_eq!(
        pg.psql(&format!(
            "SELECT head_after FROM session_cells WHERE session_id = '{sid}' AND cell = 3"
        )),
        taken,
        "a fork from the last cell before the checkpoint starts from it"
    );
    let holder = interpreters(pg, &sid);
    assert_eq!(holder.len(), 1, "{holder:?}");
    let first = holder[0].split(':').next().unwrap().to_owned();
    assert_eq!(holder[0], format!("{first}:running"));
    let cells_on = pg.psql(&format!(
        "SELECT string_agg(DISTINCT node_id, ',') FROM runs WHERE live_cell_of = '{sid}'"
    ));
    assert_eq!(
        cells_on, first,
        "a cell went to another worker than the holder"
    );
    // Idle (5 s): the interpreter ends and its workspace becomes the session's head.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    // (A clean end: `ok`, not `output_rejected` for the task's output file, which an
    // interpreter never writes.)
    let ended = |v: &[String]| v == [format!("{first}:ok")];
    while !ended(&interpreters(pg, &sid)) {
        assert!(
            std::time::Instant::now() < deadline,
            "{:?}",
            interpreters(pg, &sid)
        );
        std::thread::sleep(std::time::Duration::from_millis(200));
    }
    let s = api
        .send(
            reqwest::Method::GET,
            ALICE,
            &format!("/v1/sessions/{sid}"),
            None,
        )
        .1;
    assert!(s["workspace_sha256"].as_str().is_some(), "{s}");
    let b = cell(
        &api,
        ALICE,
        &sid,
        "c4",
        "import os\ny = 1\nprint('x' in globals(), open('/work/a').read())",
    );
    assert_eq!(interpreter(&b), "restarted", "{b}");
    assert_eq!(stdout(&b).trim(), "False a", "{b}");
    // Cells sent at once take turns: the second waits for the first instead of a 409.
    let slow = {
        let (api, sid) = (api.clone(), sid.clone());
        std::thread::spawn(move || {
            cell(
                &api,
                ALICE,
                &sid,
                "c4a",
                "import time\ntime.sleep(1)\nz = 7",
            )
        })
    };
    std::thread::sleep(std::time::Duration::from_millis(300));
    let z = cell(&api, ALICE, &sid, "c4b", "print(z)");
    assert_eq!(slow.join().unwrap()["status"], "ok");
    assert_eq!(
        (stdout(&z).trim(), interpreter(&z).as_str()),
        ("7", "kept"),
        "{z}"
    );
    let now = interpreters(pg, &sid);
    assert_eq!(now.len(), 2, "{now:?}");
    let second = now[1].split(':').next().unwrap().to_owned();
    // Its holder is killed: nodes are [serve0, w0, w1].
    let (idx, other) = if second == "w0" { (1, "w1") } else { (2, "w0") };
    f.nodes[idx].kill();
    let c = cell(
        &api,
        ALICE,
        &sid,
        "c5",
        "print('y' in globals(), open('/work/a').read())",
    );
    assert_eq!(interpreter(&c), "restarted", "{c}");
    assert_eq!(stdout(&c).trim(), "False a", "{c}");
    let idled = interpreters(pg, &sid)[0].clone();
    // The lost one's row is marked `unknown` by the next lease sweep (every second here),
    // which may come just after the new interpreter started: its expired lease already let
    // the new one start.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(15);
    while interpreters(pg, &sid).get(1) != Some(&format!("{second}:unknown"))
        && std::time::Instant::now() < deadline
    {
        std::thread::sleep(std::time::Duration::from_millis(200));
    }
    assert_eq!(
        interpreters(pg, &sid),
        [
            idled,
            format!("{second}:unknown"),
            format!("{other}:running")
        ],
        "one new interpreter, on the other worker, once the lost one's lease ended"
    );
    let d = cell(&api, ALICE, &sid, "c6", "print('y' in globals())");
    assert_eq!(
        (stdout(&d).trim(), interpreter(&d).as_str()),
        ("False", "kept"),
        "{d}"
    );
    // A cancel on the replica reaches the cell on its worker (through the cell's lease
    // renewal) before the cell's 3-second limit.
    cancel_a_busy_cell(&api, &sid, "c7", d["cell"].as_u64().unwrap() + 1, 2900);
    let (st, v) = api.send(
        reqwest::Method::DELETE,
        ALICE,
        &format!("/v1/sessions/{sid}"),
        None,
    );
    assert_eq!(st, 200, "{v}");
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    while interpreters(pg, &sid)
        .last()
        .is_some_and(|l| l.ends_with(":running"))
    {
        assert!(
            std::time::Instant::now() < deadline,
            "DELETE left the interpreter running"
        );
        std::thread::sleep(std::time::Duration::from_millis(200));
    }
    // Every cell that answered has a receipt, signed by the worker that ran it, and the
    // receipts chain across the workers and the restart: each names the latest earlier one.
    let (st, list) = api.send(
        reqwest::Method::GET,
        ALICE,
        &format!("/v1/sessions/{sid}/cells?limit=100"),
        None,
    );
    assert_eq!(st, 200, "{list}");
    let mut previous = Value::Null;
    let mut signed = 0;
    for c in list["cells"].as_array().unwrap() {
        if c["receipt"].is_null() {
            assert_ne!(c["status"], "ok", "an ok cell without a receipt: {c}");
            continue;
        }
        let p = statement(&c["receipt"])["predicate"].clone();
        assert_eq!(p["session"]["cell"], c["cell"], "{p}");
        assert_eq!(p["session"]["previous_receipt_sha256"], previous, "{p}");
        previous = Value::String(receipt_digest(&c["receipt"]));
        signed += 1;
    }
    assert!(signed >= 7, "{list}");
}
