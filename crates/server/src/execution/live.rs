//! Live sessions (a task's `session.interpreter`): one sandbox per session, started at its
//! first cell with the task's whole boundary (the same manifest, policy and runner path as a
//! run: namespaces, Landlock, seccomp, the run's cgroup bounding the memory and pids of the
//! whole tree, `/work` restored from the session's head checkpoint), running a resident
//! interpreter (the driver, `live_driver.py`, given as the run's code). The runner connects
//! to a Unix socket the service listens on in the job folder and gives the connection to the
//! command as its stdin: the control channel. Each cell is one frame there (4-byte big-endian
//! length, JSON `{seq, code, seconds}`) and one answer back (`{seq, status, stdout, stderr,
//! truncated}`), both bounded; an answer with another `seq` ends the sandbox as lost. What
//! the answer says is the interpreter's word, as untrusted as the cell's code that runs in
//! the same process (like a run's stdout). When the interpreter ends (idle, `DELETE`, lost), its run ends like any run:
//! the workspace is collected, checked and stored as the session's new head.

use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio_util::sync::CancellationToken;

use super::runner::{self, Admission, Job};
use crate::app::AppState;
pub use crate::live_slots::{Live, LiveSessions, Slot};

/// The driver the interpreter runs (the run's code).
pub const PYTHON_DRIVER: &str = include_str!("live_driver.py");

/// How long a cell that was interrupted at its time limit has to answer before its sandbox
/// is killed.
pub const GRACE: Duration = Duration::from_secs(2);

/// The most an answer frame may take (each stream is cut at 1 MiB by the driver; JSON
/// escaping can make that up to 6 times larger).
const ANSWER_LIMIT: u32 = 16 * 1024 * 1024;

/// How long the interpreter's sandbox has to start and connect.
const START_LIMIT: Duration = Duration::from_secs(60);

/// What a cell's execution came to.
pub enum Answer {
    /// The driver answered: `status` is `ok`, `error` (an exception) or `interrupted` (the
    /// time limit's KeyboardInterrupt).
    Done {
        status: String,
        stdout: String,
        stderr: String,
        truncated: bool,
    },
    /// No answer within the limit and the grace: the sandbox was killed.
    Timeout,
    /// The connection ended without an answer (the interpreter or its sandbox died).
    Lost,
    /// The cell was cancelled (`POST /v1/runs/{id}/cancel`): the sandbox was killed.
    Cancelled,
}

/// How an interpreter's run is executed and what run slot it holds for its life.
pub enum Exec {
    /// On this node's store (SQLite), in the admission's slot.
    Local(Admission),
    /// On the fleet (PostgreSQL): claimed by this executor (crate::execution::live_fleet)
    /// with `fence` at `claimed_at`, renewed by its heartbeat, in `permit`'s run slot.
    Leased {
        queue: crate::storage::pg::PgStore,
        fence: i64,
        claimed_at: (Instant, u64),
        permit: tokio::sync::OwnedSemaphorePermit,
    },
}

/// Starts the interpreter run `job` (its session part has `interpreter` set, its code the
/// driver) and waits for its runner's connection. Keeps the run slot for the run's life.
pub async fn start(
    state: &AppState,
    mut job: Job,
    how: Exec,
    idle: Duration,
    slot: &Arc<tokio::sync::Mutex<Slot>>,
    generation: u64,
) -> Result<Live, String> {
    let dir = runner::job_dir(state, &job.job_id);
    super::streams::job_folder(&dir).map_err(|e| format!("cannot create the job folder: {e}"))?;
    let path = runner::live_control_path(&dir);
    let listener = agentjail_engine::live::short_socket_path(&path)
        .and_then(|(_dir, short)| tokio::net::UnixListener::bind(short))
        .map_err(|e| format!("cannot listen on the control socket: {e}"))?;
    let cancel = CancellationToken::new();
    job.cancel = Some(cancel.clone());
    let request_id = job.request_id.clone();
    let mut run = match how {
        Exec::Local(a) => tokio::spawn(runner::execute(state.clone(), job, Some(a), None)),
        Exec::Leased {
            queue,
            fence,
            claimed_at,
            permit,
        } => tokio::spawn(super::lease::execute_leased(
            state.clone(),
            queue,
            job,
            fence,
            claimed_at,
            Some(permit),
        )),
    };
    let accepted = tokio::select! {
        a = tokio::time::timeout(START_LIMIT, listener.accept()) => a,
        _ = &mut run => {
            let _ = std::fs::remove_file(&path);
            return Err("the interpreter's sandbox ended before it took a cell".into());
        }
    };
    let _ = std::fs::remove_file(&path);
    drop(listener);
    let conn = match accepted {
        Ok(Ok((c, _))) => c,
        _ => {
            cancel.cancel();
            let _ = tokio::time::timeout(START_LIMIT, run).await;
            return Err("the interpreter's sandbox did not connect in time".into());
        }
    };
    tokio::spawn(watch_idle(slot.clone(), idle, generation));
    Ok(Live {
        conn,
        cancel,
        run,
        request_id,
        last: Instant::now(),
        generation,
        seq: 0,
    })
}

/// [`exec`] until `cancel` fires: then the sandbox is killed (the cell's code runs in the
/// interpreter: nothing short of that stops it for sure) and the answer is
/// [`Answer::Cancelled`].
pub async fn exec_cancellable(
    live: &mut Live,
    code: &str,
    seconds: u64,
    cancel: &CancellationToken,
) -> Answer {
    let kill = live.cancel.clone();
    tokio::select! {
        a = exec(live, code, seconds) => a,
        _ = cancel.cancelled() => {
            kill.cancel();
            Answer::Cancelled
        }
    }
}

/// Executes `code` in the live sandbox within `seconds` (the driver interrupts it then) and
/// [`GRACE`]; kills the sandbox when no answer comes.
pub async fn exec(live: &mut Live, code: &str, seconds: u64) -> Answer {
    live.last = Instant::now();
    live.seq += 1;
    let seq = live.seq;
    let body = serde_json::json!({"seq": seq, "code": code, "seconds": seconds}).to_string();
    let mut frame = Vec::with_capacity(body.len() + 4);
    frame.extend_from_slice(&(body.len() as u32).to_be_bytes());
    frame.extend_from_slice(body.as_bytes());
    let limit = Duration::from_secs(seconds) + GRACE;
    let conn = &mut live.conn;
    let exchange = async {
        conn.write_all(&frame).await.ok()?;
        let mut head = [0u8; 4];
        conn.read_exact(&mut head).await.ok()?;
        let n = u32::from_be_bytes(head);
        if n > ANSWER_LIMIT {
            return None;
        }
        let mut buf = Vec::new();
        (&mut *conn)
            .take(u64::from(n))
            .read_to_end(&mut buf)
            .await
            .ok()?;
        serde_json::from_slice::<serde_json::Value>(&buf).ok()
    };
    let answer = match tokio::time::timeout(limit, exchange).await {
        Err(_) => {
            live.cancel.cancel();
            return Answer::Timeout;
        }
        Ok(None) => return Answer::Lost,
        // An answer to another request (written by the cell's own code out of turn): the
        // channel is out of step; the sandbox is ended as lost.
        Ok(Some(v)) if v.get("seq").and_then(serde_json::Value::as_u64) != Some(seq) => {
            live.cancel.cancel();
            return Answer::Lost;
        }
        Ok(Some(v)) => v,
    };
    live.last = Instant::now();
    let text = |k: &str| {
        answer
            .get(k)
            .and_then(|s| s.as_str())
            .unwrap_or("")
            .to_owned()
    };
    Answer::Done {
        status: text("status"),
        stdout: text("stdout"),
        stderr: text("stderr"),
        truncated: answer.get("truncated").and_then(serde_json::Value::as_bool) == Some(true),
    }
}

/// A checkpoint taken on request of a live sandbox (see [`checkpoint_now`]).
pub struct Taken {
    /// `sha256:<hex>`, checked to be the bytes'.
    pub sha256: String,
    pub bytes: Vec<u8>,
    /// The interpreter run's request id (its record says whether it is still in flight).
    pub run: String,
}

/// A checkpoint on request of the session's live sandbox held in `slot` (locked by the
/// caller: between cells), for the task's session settings `set`: None when no sandbox is up
/// (the head is the last checkpoint); `Err` why none was taken (over the workspace's bounds,
/// the interpreter kept; or a sandbox that answered out of step, ended here).
pub async fn checkpoint_now(
    slot: &mut Slot,
    set: &crate::config::SessionSettings,
) -> Option<Result<Taken, String>> {
    if slot.live.as_ref().is_some_and(Live::ended) {
        slot.live = None;
    }
    let l = slot.live.as_mut()?;
    Some(match checkpoint(l, checkpoint_limit(set)).await {
        Collected::Archive { sha256, bytes } => Ok(Taken {
            sha256,
            bytes,
            run: l.request_id.clone(),
        }),
        Collected::Refused(why) => Err(format!(
            "no checkpoint was taken (the interpreter is kept): {why}"
        )),
        Collected::Lost => {
            if let Some(l) = slot.live.take() {
                end(l, true).await;
            }
            Err("the live sandbox did not answer the checkpoint in step; it was ended (the next cell restarts from the last checkpoint)".into())
        }
    })
}

/// What a checkpoint request to a live sandbox came to.
enum Collected {
    /// The archive and its digest (`sha256:<hex>`), checked to be that digest.
    Archive { sha256: String, bytes: Vec<u8> },
    /// The supervisor made none (over the workspace's bounds, unreadable): why, one line.
    Refused(String),
    /// No answer in step: the sandbox was killed.
    Lost,
}

/// The most a checkpoint's answer may take for a session of `set`: the workspace's content
/// plus, per entry, a tar header, a GNU long-name entry for a path of up to 4 KiB and the
/// padding (6 KiB in all), and the answer's JSON line.
fn checkpoint_limit(set: &crate::config::SessionSettings) -> u64 {
    set.max_mb
        .saturating_mul(1 << 20)
        .saturating_add(set.max_files.saturating_mul(6 << 10))
        .saturating_add(1 << 20)
        .min(u64::from(u32::MAX))
}

/// How long the supervisor has to collect `/work` for a checkpoint on request.
const COLLECT_LIMIT: Duration = Duration::from_secs(120);

/// Asks the live sandbox's supervisor (its relay, outside the sandbox) for a checkpoint of
/// `/work` now, between cells: an answer of at most `limit` bytes. The interpreter keeps
/// running. A channel out of step or silent past [`COLLECT_LIMIT`] ends the sandbox.
async fn checkpoint(live: &mut Live, limit: u64) -> Collected {
    live.seq += 1;
    let seq = live.seq;
    let body = serde_json::json!({"seq": seq, "checkpoint": true}).to_string();
    let mut frame = Vec::with_capacity(body.len() + 4);
    frame.extend_from_slice(&(body.len() as u32).to_be_bytes());
    frame.extend_from_slice(body.as_bytes());
    let conn = &mut live.conn;
    let exchange = async {
        conn.write_all(&frame).await.ok()?;
        let mut head = [0u8; 4];
        conn.read_exact(&mut head).await.ok()?;
        let n = u64::from(u32::from_be_bytes(head));
        if n > limit {
            return None;
        }
        let mut buf = Vec::new();
        (&mut *conn).take(n).read_to_end(&mut buf).await.ok()?;
        (buf.len() as u64 == n).then_some(buf)
    };
    let answer = match tokio::time::timeout(COLLECT_LIMIT, exchange).await {
        Ok(Some(a)) => a,
        _ => {
            live.cancel.cancel();
            return Collected::Lost;
        }
    };
    let split = answer.iter().position(|b| *b == b'\n');
    let head = split.and_then(|i| serde_json::from_slice::<serde_json::Value>(&answer[..i]).ok());
    let (Some(i), Some(head)) = (split, head) else {
        live.cancel.cancel();
        return Collected::Lost;
    };
    if head.get("seq").and_then(serde_json::Value::as_u64) != Some(seq) {
        live.cancel.cancel();
        return Collected::Lost;
    }
    live.last = Instant::now();
    if let Some(why) = head.get("error").and_then(|e| e.as_str()) {
        return Collected::Refused(agentjail_manifest::text::printable(why, 300));
    }
    let mut answer = answer;
    let bytes = answer.split_off(i + 1);
    let sha256 = format!("sha256:{}", crate::config::sha256_hex(&bytes));
    if head.get("sha256").and_then(|s| s.as_str()) != Some(sha256.as_str()) {
        live.cancel.cancel();
        return Collected::Lost;
    }
    Collected::Archive { sha256, bytes }
}

/// Ends a live sandbox: `kill` kills it (a close, a timeout); otherwise its control channel
/// is closed and the driver exits by itself, its workspace collected as the session's head.
/// Returns once its run's end is recorded (bounded).
pub async fn end(live: Live, kill: bool) {
    let Live {
        conn, cancel, run, ..
    } = live;
    if kill {
        cancel.cancel();
    }
    // The driver reads the end of its channel and exits; the sandbox ends with it (its init
    // and every process of its pid namespace), and the runner, which outlives them, collects
    // the workspace. One that does not exit in time is killed.
    drop(conn);
    let mut run = run;
    if tokio::time::timeout(QUIT_LIMIT, &mut run).await.is_err() {
        cancel.cancel();
        let abort = run.abort_handle();
        if tokio::time::timeout(START_LIMIT, run).await.is_err() {
            abort.abort();
        }
    }
}

/// How long a driver told to end (its channel closed) has to exit before it is killed.
const QUIT_LIMIT: Duration = Duration::from_secs(5);

/// Ends the session's live sandbox on this node, if any (`DELETE`): the driver is told to
/// end (it is between cells: the slot is held), then killed if it lingers (`kill`: at once,
/// without a checkpoint); returns once its runner, which outlives the sandbox, has exited.
pub async fn close(state: &AppState, session_id: &str, kill: bool) {
    if let Some(slot) = state.inner.live.get(session_id) {
        let live = slot.lock().await.live.take();
        if let Some(l) = live {
            end(l, kill).await;
        }
        state.inner.live.forget(session_id);
    }
}

/// Ends every live sandbox of this node as at its idle end (an executor's drain): each
/// workspace is checkpointed, and each session's next cell starts a new sandbox wherever it
/// is executed.
pub async fn close_all(state: &AppState) {
    for id in state.inner.live.ids() {
        if let Some(slot) = state.inner.live.get(&id) {
            let live = slot.lock().await.live.take();
            if let Some(l) = live {
                end(l, false).await;
            }
        }
    }
}

/// Ends generation `generation` of the session's sandbox once it has taken no cell for `idle`.
async fn watch_idle(slot: Arc<tokio::sync::Mutex<Slot>>, idle: Duration, generation: u64) {
    let mut wait = idle;
    loop {
        tokio::time::sleep(wait).await;
        let mut s = slot.lock().await;
        let Some(l) = &s.live else { return };
        if l.generation != generation {
            return;
        }
        let quiet = l.last.elapsed();
        if quiet >= idle || l.ended() {
            if let Some(l) = s.live.take() {
                // Under the slot's lock: the next cell starts from the checkpoint this leaves.
                end(l, false).await;
            }
            return;
        }
        wait = idle - quiet;
    }
}
