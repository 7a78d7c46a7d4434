//! Jobs: build the manifest from the task type, run it in a separate `agentjail run` process
//! (never a shell; the sandbox needs a single-threaded process), read its report, keep only
//! verified output, record the outcome; plus start-up reconciliation and the retention sweep.
//!
//! Over 800 lines for now: the runner-side lease (`Lease`, `LeaseEnd`, `send_renewals`,
//! `payload_margin`) has just landed here and is kept whole while it settles. The seams for a
//! later split are the spawning of `agentjail run`, the collection and verification of its
//! outputs, and the lifeline framing; about 260 of the lines are its unit tests.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use agentjail_manifest::report::{RunReport, Status};
use agentjail_manifest::{Manifest, Network};
use tokio_util::sync::CancellationToken;

use crate::app::{AppState, ServerError};
use crate::config::Task;
use crate::news::Teller;
use crate::policy::{self, JobPaths};
use crate::run_state::RunState;
use crate::storage::audit::Event;
use crate::storage::db::InputRow;
use crate::storage::store::{FinishRun, InFlight, RetentionFiles};
use crate::util::now;

/// Everything a job needs, fixed at admission.
#[derive(Debug, Clone)]
pub struct Job {
    pub tenant: String,
    pub actor: String,
    pub request_id: String,
    pub task: String,
    pub job_id: String,
    pub job_expires_at: i64,
    pub inputs: Vec<InputRow>,
    pub code: Option<String>,
    pub args: Vec<String>,
    /// Cancels the run (an MCP client's `notifications/cancelled`): a queued job never starts,
    /// a running one has its `agentjail run` process killed, which kills the whole sandbox (its
    /// init dies with its parent, and the pid namespace with its init). None for HTTP runs: a
    /// client that disconnects never cancels them.
    pub cancel: Option<CancellationToken>,
    /// A run claimed from the PostgreSQL queue: every write of it is fenced, and the sandbox is
    /// killed when the lease is lost. None: a run of this node's own (SQLite).
    pub lease: Option<Lease>,
    /// A session's cell: its workspace restored and collected, its place in the session
    /// (crate::execution::checkpoints). None for a run outside a session.
    pub session: Option<super::checkpoints::CellJob>,
}

/// The claim an executor holds on a run (docs/deploy.md, "Leases and fencing").
#[derive(Clone)]
pub struct Lease {
    /// The queue the run was claimed from.
    pub queue: crate::storage::pg::PgStore,
    /// The fencing token of this claim: every write of the run is conditioned on it.
    pub fence: i64,
    /// Cancelled by the heartbeat when the lease is lost (renewal refused, or not renewed
    /// before its end by this process's monotonic clock): the sandbox is killed.
    pub lost: CancellationToken,
    /// Its end as of the last successful renewal (moved by each): the runner gets every new
    /// end over its lifeline ([`send_renewals`]) and kills its sandbox by itself when the
    /// renewals stop.
    pub end: Arc<tokio::sync::watch::Sender<LeaseEnd>>,
}

impl Lease {
    /// The end of the lease's time for the payload, by this process's clock, as of now: the
    /// `running` mark must commit before it.
    pub fn deadline(&self) -> Instant {
        self.end.borrow().payload
    }
}

/// The end of a lease, as of its last renewal (docs/deploy.md, "Leases and fencing").
#[derive(Clone, Copy, Debug)]
pub struct LeaseEnd {
    /// When the database's lease ends at the earliest, by this process's monotonic clock: the
    /// renewal's request was sent before the database took its own time.
    pub lease: Instant,
    /// When the payload must be dead, by this process's monotonic clock: [`PAYLOAD_MARGIN`]
    /// before [`LeaseEnd::lease`].
    pub payload: Instant,
    /// The same moment on `CLOCK_BOOTTIME` (nanoseconds, which also counts a suspended host):
    /// the runner kills its sandbox then unless a later renewal reached it.
    pub payload_boot_ns: u64,
}

/// How much earlier than the lease's end the runner kills its sandbox: the time that killing
/// it takes, so that the payload is dead when another node may take the run over. At most
/// a second, and a sixth of the lease (a renewal is sent every third).
pub fn payload_margin(lease: Duration) -> Duration {
    (lease / 6).min(Duration::from_secs(1))
}

impl LeaseEnd {
    /// The end of a lease of `lease` whose claim or renewal was sent at `sent` (monotonic)
    /// and `sent_boot_ns` (`CLOCK_BOOTTIME`), both read before the request left.
    pub fn after(sent: Instant, sent_boot_ns: u64, lease: Duration) -> LeaseEnd {
        let payload = lease.saturating_sub(payload_margin(lease));
        LeaseEnd {
            lease: sent + lease,
            payload: sent + payload,
            payload_boot_ns: sent_boot_ns.saturating_add(payload.as_nanos() as u64),
        }
    }
}

/// Sends the runner each new end of the lease (a [`agentjail_manifest::results::LEASE`]
/// frame), the current one first, until the lease's sender is gone or the lifeline fails.
/// The runner kills its sandbox when the last end it received passes.
async fn send_renewals(
    mut to_runner: tokio::net::UnixStream,
    mut end: tokio::sync::watch::Receiver<LeaseEnd>,
) {
    use tokio::io::AsyncWriteExt;
    loop {
        let ns = end.borrow_and_update().payload_boot_ns;
        let frame = agentjail_manifest::results::lease_frame(ns);
        if to_runner.write_all(&frame).await.is_err() || end.changed().await.is_err() {
            return;
        }
    }
}

impl std::fmt::Debug for Lease {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Lease").field("fence", &self.fence).finish()
    }
}

/// Resolves when the job's lease is lost; never for a job without one.
async fn lease_lost(job: &Job) {
    match &job.lease {
        Some(l) => l.lost.cancelled().await,
        None => std::future::pending().await,
    }
}

/// The `running` mark: fenced for a claimed run, and then committed with its `run_start`
/// record (`start`) and only while the payload can still start (see
/// [`crate::storage::pg::PgStore::mark_running_fenced`]); on the local store `run_start` is appended
/// after the mark, by the caller.
async fn mark_started(
    state: &AppState,
    job: &Job,
    start: &Event,
) -> Result<bool, crate::storage::store::StoreError> {
    match &job.lease {
        Some(l) => {
            l.queue
                .mark_running_fenced(&job.job_id, l.fence, now(), || l.deadline(), start)
                .await
        }
        None => state.store().mark_running(&job.job_id, now()).await,
    }
}

/// Records the end of a run and audits it (`ev`, its `run_end` or `run_refused`), so that no
/// recorded outcome is ever missing from the audit chain, whatever moment the service dies at.
/// A claimed run's result is fenced (refused: [`crate::storage::store::StoreError::Fenced`], nothing
/// written and nothing audited) and its record is appended in the same transaction, so an
/// audit chain that cannot be appended to keeps results from being recorded. On the
/// local store (the audit log is a file beside the database) the record is appended first,
/// then the outcome is written: a crash in between leaves the run `running`, which the restart
/// marks `unknown` and audits (`run_unknown`), so the chain says both what ended and what
/// became of its record. Only the executor ends a run on the local store, so the write never
/// finds the run ended by someone else.
async fn record_end(
    state: &AppState,
    job: &Job,
    f: FinishRun,
    ev: Event,
    cell: Option<&crate::storage::sessions::CellEnd>,
) -> Result<(), crate::storage::store::StoreError> {
    match &job.lease {
        // A session's cell: its end, checkpoint and the session's new head in the same fenced
        // transaction (crate::storage::pg::sessions).
        Some(l) => match l
            .queue
            .finish_fenced_cell(f, l.fence, Some(&ev), cell)
            .await
        {
            // Fail closed: a result whose record cannot be appended is not recorded either
            // (the run stays in flight and ends `unknown` when its lease runs out). When the
            // database refused the write for another reason than fencing, the record is
            // tried on its own so that the chain still says what ran. Not when the database
            // stayed unreachable: whether the write committed (with its record) is unknown,
            // and a second record must not follow a first.
            Err(e @ crate::storage::store::StoreError::Database(_)) => {
                state.store().audit(ev).await;
                Err(e)
            }
            r => r,
        },
        None => {
            state.store().audit(ev).await;
            state.store().finish_run(f).await
        }
    }
}

/// Who and what a run is, for the records of its end.
pub(crate) struct RunIds<'a> {
    pub actor: &'a str,
    pub tenant: &'a str,
    pub task: &'a str,
    pub request_id: &'a str,
    pub job_id: &'a str,
}

impl<'a> RunIds<'a> {
    pub(crate) fn of(r: &'a crate::storage::db::RunRow) -> RunIds<'a> {
        RunIds {
            actor: &r.actor,
            tenant: &r.tenant,
            task: &r.task,
            request_id: &r.request_id,
            job_id: &r.job_id,
        }
    }

    /// The run's `run_end` audit record, ended as `status` for `reason`.
    pub(crate) fn end_event(&self, status: RunState, reason: &str) -> Event {
        Event {
            event: "run_end",
            actor: Some(self.actor.into()),
            tenant: Some(self.tenant.into()),
            task: Some(self.task.into()),
            request_id: Some(self.request_id.into()),
            job_id: Some(self.job_id.into()),
            status: Some(status.into()),
            reason: Some(reason.into()),
            ..Default::default()
        }
    }
}

/// Ends a claimed run this executor cannot run as a set-up error (`reason`): the fenced result
/// and its `run_end` record in one transaction; a failure is logged.
pub(crate) async fn end_claim_as_setup_error(
    queue: &crate::storage::pg::PgStore,
    fence: i64,
    who: RunIds<'_>,
    reason: &str,
) {
    let ev = who.end_event(RunState::SetupError, reason);
    let f = FinishRun::without_outputs(who.job_id, RunState::SetupError, reason.into(), now());
    if let Err(e) = queue.finish_fenced(f, fence, Some(&ev)).await {
        tracing::error!(job_id = %who.job_id, error = %e, "recording a set-up error failed");
    }
}

/// Resolves when `c` is cancelled; never when there is no token.
async fn cancelled(c: Option<&CancellationToken>) {
    match c {
        Some(c) => c.cancelled().await,
        None => std::future::pending().await,
    }
}

/// How a cancelled run is recorded: `cancelled` when the task has no network access (the
/// sandbox was killed and nothing outside can have happened), else `unknown` (an external
/// effect may have happened before the kill; an operator reconciles it).
pub(crate) fn cancelled_outcome(task: &Task, started: bool) -> (RunState, String) {
    let what = if started {
        "cancelled while running; the sandbox was killed"
    } else {
        "cancelled before the run started"
    };
    if !started || matches!(task.network, Network::Deny) {
        (RunState::Cancelled, what.into())
    } else {
        (
            RunState::Unknown,
            format!(
                "{what}; the task has network access, so an external effect may have happened; reconcile before retrying"
            ),
        )
    }
}

/// Holds one admission slot (queued or running); released on drop.
pub struct Admission(AppState);

impl Admission {
    /// Takes a slot unless concurrency + queue are full.
    pub fn try_take(state: &AppState) -> Option<Admission> {
        let i = &state.inner;
        let mut cur = i.admitted.load(Ordering::Acquire);
        loop {
            if cur >= i.max_admitted {
                return None;
            }
            match i
                .admitted
                .compare_exchange(cur, cur + 1, Ordering::AcqRel, Ordering::Acquire)
            {
                Ok(_) => return Some(Admission(state.clone())),
                Err(v) => cur = v,
            }
        }
    }
}

impl Drop for Admission {
    fn drop(&mut self) {
        self.0.inner.admitted.fetch_sub(1, Ordering::AcqRel);
    }
}

/// The folder of a job.
pub fn job_dir(state: &AppState, job_id: &str) -> PathBuf {
    state.inner.data_dir.join("jobs").join(job_id)
}

/// Path of a stored object.
pub fn object_path(state: &AppState, sha256: &str) -> PathBuf {
    state.inner.data_dir.join("objects").join(sha256)
}

/// The manifest of a job: [`policy::manifest`] with this data directory's paths (the task's
/// output schema is the file written once at start-up, `DATA/schemas/<sha256>.json`).
pub fn build_manifest(state: &AppState, task: &Task, job: &Job) -> Manifest {
    let objects = state.inner.data_dir.join("objects");
    let schema = state.inner.schemas.get(&job.task).map(|s| s.file.as_path());
    let mut m = policy::manifest(
        task,
        &job.request_id,
        &job.args,
        &job.inputs,
        job.code.as_deref(),
        job.job_expires_at,
        JobPaths {
            objects: &objects,
            schema,
        },
    );
    if let Some(cell) = &job.session {
        super::checkpoints::apply(&mut m, &state.inner.data_dir, cell);
        // A live session's interpreter lives until its session's idle end or close, at most
        // the session's lifetime and a day; each cell has the task's limit ([`super::live`]).
        // It produces no output file of its own (its cells answer over the control channel,
        // their streams recorded as each cell's): its run is `ok` when the driver exits
        // cleanly, not `output_rejected` for the task's output it never writes.
        if cell.interpreter {
            m.limits.seconds = run_seconds(task, job);
            m.output = None;
            m.output_schema = None;
        }
    }
    m
}

/// A live session interpreter's control socket in its job folder ([`super::live`]).
pub fn live_control_path(job_dir: &Path) -> PathBuf {
    job_dir.join("live.sock")
}

/// The wall-clock limit of the job's sandbox: the task's, or a live session interpreter's.
fn run_seconds(task: &Task, job: &Job) -> u64 {
    match &job.session {
        Some(c) if c.interpreter => task.session.lifetime_seconds.min(86_400),
        _ => task.limits.seconds,
    }
}

/// How the manifest digest names a task's output schema file: the name it had in the job
/// folder before schemas were written once per schema (content-addressed). The digest covers
/// the schema's text anyway; keeping the old name keeps the digests recorded before the change
/// (so their retries) valid.
const DIGEST_SCHEMA_NAME: &str = "output.schema.json";

/// The digest of what a request runs, the same for every attempt: `sha256:` over the RFC 8785
/// JSON of `{"manifest", "output_schema"}`, the manifest as [`build_manifest`] builds it minus
/// the attempt's own part (the job id's expiry) and the code (empty here: a run with code is
/// never retried, its code is not kept), and the task's output schema text (the manifest names only the schema's file, and the
/// digest names that file [`DIGEST_SCHEMA_NAME`] whatever its path). Recorded
/// with the run at admission; a retry whose rebuilt manifest has another digest (the task
/// type's command, env, limits, network, isolation, output or schema changed) is refused.
/// A manifest without a canonical form is an error, never the digest of empty bytes.
pub fn manifest_digest(
    state: &AppState,
    task_name: &str,
    task: &Task,
    request_id: &str,
    inputs: &[InputRow],
    args: &[String],
) -> Result<String, serde_json::Error> {
    let job = Job {
        tenant: String::new(),
        actor: String::new(),
        request_id: request_id.to_owned(),
        task: task_name.to_owned(),
        job_id: String::new(),
        job_expires_at: 0,
        inputs: inputs.to_vec(),
        code: None,
        args: args.to_vec(),
        cancel: None,
        lease: None,
        session: None,
    };
    let schema = state.inner.schemas.get(task_name).map(|s| &s.text);
    let mut m = build_manifest(state, task, &job);
    m.expires_at = None;
    if m.output_schema.is_some() {
        m.output_schema = Some(DIGEST_SCHEMA_NAME.into());
    }
    let doc = serde_json::json!({ "manifest": m, "output_schema": schema });
    let bytes = serde_jcs::to_vec(&doc)?;
    Ok(format!("sha256:{}", crate::config::sha256_hex(&bytes)))
}

/// Why a job could not be prepared (logged; the run ends as a set-up failure).
#[derive(Debug, thiserror::Error)]
pub enum PrepareError {
    /// The manifest could not be encoded.
    #[error("manifest: {0}")]
    Encode(#[from] serde_json::Error),
}

/// The environment variable that marks a runner as this data directory's (start-up sweep).
pub const SERVICE_MARK: &str = "AGENTJAIL_SERVICE_DATA";

/// The job's manifest as one line of JSON, which reaches the runner through its lifeline and is
/// never written to disk (it holds the task's env values and the request's code). No file is
/// made for a run: the runner sends its results back over the lifeline, and the job folder
/// (`DATA/jobs/<job_id>`, 0700) is created only when the run writes to its stdout or stderr,
/// for their logs ([`Logs`]).
fn prepare(state: &AppState, task: &Task, job: &Job) -> Result<Vec<u8>, PrepareError> {
    let m = build_manifest(state, task, job);
    let mut line = serde_json::to_vec(&m)?;
    line.push(b'\n');
    Ok(line)
}

/// What the runner process left.
struct Outcome {
    status: RunState,
    reason: Option<String>,
    report: Option<String>,
    receipt: Option<String>,
    /// The verified artifact and its digest (`sha256:…`, checked against the report's).
    artifact: Option<(Vec<u8>, String)>,
    /// The kind of each of the report's denials (for the metric; the report is parsed once).
    denials: Vec<String>,
}

/// A runner that has been started and waits for its manifest on the
/// lifeline. `agentjail run --lifeline` reads nothing before its manifest, so nothing of the
/// run can happen before [`hand_over_and_wait`]; [`Started::abort`] ends it instead.
struct Started {
    child: tokio::process::Child,
    /// The service's end of the runner's stdin, a Unix socket: the manifest goes through it,
    /// the results come back on it ([`Results`]), and it stays open until the runner exits.
    lifeline: std::os::unix::net::UnixStream,
    /// Its stdout and stderr, on their way to the job folder.
    logs: Logs,
    /// Where the denials it sends as they happen go (the job folder's `denials.jsonl`).
    denials: super::denials::Writer,
}

/// Most of each of the runner's streams kept in its log: the runner passes at most
/// [`agentjail_engine::STREAM_LIMIT`] of the command's stdout and of its stderr through, and
/// writes nothing of its own there (`run --lifeline`), so the logs hold exactly the bytes
/// whose digests the report and the receipt carry ([`super::streams`]).
const LOG_LIMIT: u64 = agentjail_engine::STREAM_LIMIT;

/// How long the logs may take to reach end-of-file once the runner has exited (its sandbox
/// died with it, so normally at once).
const LOG_DRAIN: Duration = Duration::from_secs(5);

/// The runner's stdout and stderr, drained from pipes into the job folder's `stdout.log` and
/// `stderr.log` (0600). A log file is created only once its stream has a first byte, so a run
/// that writes nothing costs no inode; each keeps at most [`LOG_LIMIT`] bytes (the rest is
/// read and dropped, so the runner never blocks on a full pipe).
struct Logs(Vec<tokio::task::JoinHandle<()>>);

impl Logs {
    fn start(
        dir: &Path,
        stdout: Option<tokio::process::ChildStdout>,
        stderr: Option<tokio::process::ChildStderr>,
        news: Option<Teller>,
    ) -> Logs {
        let mut tasks = Vec::with_capacity(2);
        if let Some(s) = stdout {
            tasks.push(tokio::spawn(drain_log(
                s,
                dir.join(super::streams::log_name(true)),
                news.clone(),
            )));
        }
        if let Some(s) = stderr {
            tasks.push(tokio::spawn(drain_log(
                s,
                dir.join(super::streams::log_name(false)),
                news,
            )));
        }
        Logs(tasks)
    }

    /// Waits, after the runner exited, for both streams to end and be written; gives up
    /// (drops the pipes) after [`LOG_DRAIN`].
    async fn finish(self) {
        let deadline = tokio::time::Instant::now() + LOG_DRAIN;
        for t in self.0 {
            let abort = t.abort_handle();
            if tokio::time::timeout_at(deadline, t).await.is_err() {
                abort.abort();
            }
        }
    }
}

/// Copies one of the runner's streams into `path` (see [`Logs`]), telling the run's followers
/// on this node after each write.
async fn drain_log(
    mut from: impl tokio::io::AsyncRead + Unpin,
    path: PathBuf,
    news: Option<Teller>,
) {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    use tokio::io::AsyncReadExt;
    let mut buf = vec![0u8; 16 * 1024];
    let mut file: Option<std::fs::File> = None;
    let mut room = LOG_LIMIT;
    loop {
        let n = match from.read(&mut buf).await {
            Ok(0) | Err(_) => return,
            Ok(n) => n,
        };
        let keep = (n as u64).min(room) as usize;
        if keep == 0 {
            continue;
        }
        if file.is_none() {
            if let Some(dir) = path.parent()
                && let Err(e) = super::streams::job_folder(dir)
            {
                tracing::warn!(path = %dir.display(), error = %e, "cannot create a run's job folder; its output is dropped");
                room = 0;
                continue;
            }
            match std::fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .mode(0o600)
                .open(&path)
            {
                Ok(f) => file = Some(f),
                Err(e) => {
                    tracing::warn!(path = %path.display(), error = %e, "cannot create a run's log; its output is dropped");
                    room = 0;
                    continue;
                }
            }
        }
        if let Some(f) = file.as_mut()
            && let Err(e) = f.write_all(&buf[..keep])
        {
            tracing::warn!(path = %path.display(), error = %e, "cannot write a run's log; the rest is dropped");
            room = 0;
            continue;
        }
        room -= keep as u64;
        if let Some(n) = &news {
            n.tell();
        }
    }
}

/// Starts the runner (`agentjail run --lifeline …`) in the job folder, its stdout and stderr
/// through pipes to the folder's logs ([`Logs`]). It then waits for its manifest.
fn spawn_runner(state: &AppState, task: &Task, job: &Job) -> Result<Started, &'static str> {
    let dir = job_dir(state, &job.job_id);
    // The lifeline: the runner's stdin is a Unix socket whose other end only this process
    // holds (close-on-exec, so no other child keeps it). The manifest goes through it first,
    // the results come back on it; it stays open until the run ends. If this process dies,
    // the runner sees the hang-up, kills its sandbox and exits: no run outlives the service.
    let (lifeline, theirs) = std::os::unix::net::UnixStream::pair().map_err(|e| {
        tracing::error!(job_id = %job.job_id, error = %e, "cannot create the lifeline socket");
        "cannot create the lifeline socket"
    })?;
    let data = &state.inner.data_dir;
    let mut cmd = tokio::process::Command::new(&state.inner.runner);
    // No working directory (`current_dir`): a child started with one is forked, which copies
    // this multi-threaded process's page tables and makes every page copy-on-write until the
    // exec; without one, std starts it with posix_spawn (clone with CLONE_VM | CLONE_VFORK).
    // The runner writes no file: its results come back on the lifeline. docs/performance.md.
    cmd.arg("run")
        .arg("--lifeline")
        .arg("--results-on-lifeline")
        .arg("--source-root")
        .arg(data.join("objects"))
        .arg("--source-root")
        .arg(data.join("schemas"))
        .arg("--key")
        .arg(data.join("private").join("receipt-key.pem"));
    if state.inner.allow_degraded {
        cmd.arg("--allow-degraded");
    }
    // A task on a pinned image: the service's image store (checked at start-up).
    if task.image.is_some() {
        cmd.arg("--image-store")
            .arg(crate::images::store_dir(&state.inner.config.server, data));
    }
    // A session's cell restores its workspace from the checkpoints' folder.
    if job.session.is_some() {
        let d = super::checkpoints::dir(data);
        if let Err(e) = std::fs::create_dir_all(&d) {
            tracing::error!(job_id = %job.job_id, error = %e, "cannot create the checkpoints' folder");
            return Err("cannot create the checkpoints' folder");
        }
        cmd.arg("--source-root").arg(d);
    }
    // A live session's interpreter: its command's stdin is the control socket the service
    // listens on in the job folder ([`super::live`]).
    if job.session.as_ref().is_some_and(|c| c.interpreter) {
        cmd.arg("--live-control").arg(live_control_path(&dir));
    }
    // A claimed run: the runner kills its sandbox by itself when the lease's renewals stop
    // reaching it (the first end now; later ones over the lifeline).
    if let Some(l) = &job.lease {
        cmd.arg("--lease-until")
            .arg(l.end.borrow().payload_boot_ns.to_string());
    }
    cmd.env_clear()
        .env("PATH", "/usr/local/bin:/usr/bin:/bin")
        .env("LANG", "C.UTF-8")
        .env(SERVICE_MARK, data)
        // This service reads the denials the runner sends as they happen (`DENIAL` frames).
        .env(agentjail_manifest::results::LIVE_DENIALS_ENV, "1");
    // The image store's key, when the service was given one of its own (else `<store>.key`).
    if let Some(k) = std::env::var_os(agentjail_image::KEY_ENV) {
        cmd.env(agentjail_image::KEY_ENV, k);
    }
    // Secrets the task type binds to destinations (`network.credentials`, `env:NAME`): the
    // runner's gateway reads them from its own environment, otherwise cleared. They never
    // reach the sandbox (docs/network.md).
    if let Network::Allow(p) = &task.network {
        for c in &p.credentials {
            if let Some(("env", name)) = c.value_from.split_once(':')
                && let Some(v) = std::env::var_os(name)
            {
                cmd.env(name, v);
            }
        }
    }
    cmd.stdin(Stdio::from(std::os::fd::OwnedFd::from(theirs)))
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    let mut child = cmd.spawn().map_err(|e| {
        tracing::error!(job_id = %job.job_id, error = %e, runner = %state.inner.runner.display(), "cannot start the runner");
        "cannot start the runner"
    })?;
    let news = state.inner.news.teller(&job.job_id);
    let logs = Logs::start(&dir, child.stdout.take(), child.stderr.take(), news.clone());
    // `cmd` holds the runner's end until dropped (here); the runner's copy is the only one left.
    Ok(Started {
        child,
        lifeline,
        logs,
        denials: super::denials::Writer::new(dir.join(super::denials::NAME), news),
    })
}

impl Started {
    /// Ends a runner that must not run: the lifeline is closed before any manifest was
    /// written, so the runner reads end-of-file where its manifest should be and exits
    /// without starting anything (its report says so). Waits for it; kills it if it lingers.
    async fn abort(self) {
        let Started {
            mut child,
            lifeline,
            logs,
            ..
        } = self;
        drop(lifeline);
        if tokio::time::timeout(Duration::from_secs(10), child.wait())
            .await
            .is_err()
        {
            let _ = child.kill().await;
        }
        logs.finish().await;
    }
}

/// How the runner's process ended. Once this is known the run slot is released; the job
/// folder is read afterwards ([`collect`]).
enum Ended {
    /// It exited by itself.
    Exited(std::process::ExitStatus),
    /// The client cancelled; it was killed.
    Cancelled,
    /// It outlived the guard time and was killed, or waiting for it failed.
    Lost,
    /// The manifest could not be handed over; it was killed.
    HandOffFailed,
    /// The executor lost its lease on the run; it was killed.
    LeaseLost,
}

/// Hands the manifest over (from here on the run may execute) and waits for the runner to
/// exit, bounded by the task's limit plus a margin, or to be cancelled; then for its results
/// and logs.
async fn hand_over_and_wait(
    started: Started,
    task: &Task,
    job: &Job,
    manifest: Vec<u8>,
) -> (Ended, Results) {
    let Started {
        child,
        lifeline,
        logs,
        denials,
    } = started;
    let (ended, results) = run_to_exit(child, lifeline, task, job, manifest, denials).await;
    let results = match results {
        Some(r) => {
            let abort = r.abort_handle();
            match tokio::time::timeout(LOG_DRAIN, r).await {
                Ok(Ok(r)) => r,
                _ => {
                    // Whether the sandbox started is not known: count it as started (a death
                    // without a report is then `unknown`, never a false "nothing ran").
                    abort.abort();
                    Results {
                        started: true,
                        ..Results::default()
                    }
                }
            }
        }
        None => Results::default(),
    };
    logs.finish().await;
    (ended, results)
}

/// What a runner sent back on its lifeline (`run --results-on-lifeline`,
/// [`agentjail_manifest::results`]): its report, receipt and verified artifact, each read
/// within a bound; the first frame of each kind counts. The first report ends the results.
#[derive(Default)]
struct Results {
    report: Option<Vec<u8>>,
    receipt: Option<Vec<u8>>,
    artifact: Option<Vec<u8>>,
    /// The artifact's frame was larger than the task's `output.max_bytes` (not kept).
    artifact_too_big: bool,
    /// The runner announced that it was starting the sandbox (the command may have run).
    started: bool,
    /// A session cell's collected workspace checkpoint (within the session's bound).
    workspace: Option<Vec<u8>>,
}

/// The most a report or a receipt may take on the lifeline.
const RESULT_LIMIT: u64 = 4 * 1024 * 1024;

/// Reads the runner's results until the lifeline ends (the runner exited). Holds the
/// service's end of the lifeline until then, so the runner never sees a hang-up while it runs.
/// A frame over its bound is read and dropped; the first report, or a frame with an unknown
/// tag, ends the reading (what came before stands), and the rest of the stream is drained.
/// A body is read as it comes (never allocated by its claimed length first). The denials sent
/// while the run goes on go to `denials` as they come.
async fn read_results(
    stream: tokio::net::UnixStream,
    artifact_max: u64,
    workspace_max: u64,
    mut denials: super::denials::Writer,
) -> Results {
    use agentjail_manifest::results::{
        ARTIFACT, DENIAL, HEADER_LEN, RECEIPT, REPORT, STARTING, WORKSPACE, parse_header,
    };
    use tokio::io::AsyncReadExt;
    let mut r = Results::default();
    let mut stream = stream;
    let mut sink = [0u8; 16 * 1024];
    loop {
        let mut head = [0u8; HEADER_LEN];
        if stream.read_exact(&mut head).await.is_err() {
            break;
        }
        let (tag, len) = parse_header(&head);
        if tag == STARTING {
            if len != 0 {
                break;
            }
            r.started = true;
            continue;
        }
        let limit = match tag {
            ARTIFACT => artifact_max,
            RECEIPT | REPORT => RESULT_LIMIT,
            DENIAL => super::denials::FRAME_LIMIT,
            WORKSPACE => workspace_max,
            _ => break,
        };
        let mut body = (&mut stream).take(len);
        if len > limit {
            // Read and dropped, so the runner is never blocked on a full socket.
            while let Ok(n) = body.read(&mut sink).await {
                if n == 0 {
                    break;
                }
            }
            if tag == ARTIFACT {
                r.artifact_too_big = true;
            } else if tag == DENIAL {
                tracing::warn!(
                    bytes = len,
                    "a runner's denial frame is over its bound; dropped"
                );
            }
            continue;
        }
        let mut bytes = Vec::new();
        if body.read_to_end(&mut bytes).await.is_err() || bytes.len() as u64 != len {
            break;
        }
        if tag == DENIAL {
            denials.frame(&bytes);
            continue;
        }
        let slot = match tag {
            ARTIFACT => &mut r.artifact,
            RECEIPT => &mut r.receipt,
            WORKSPACE => &mut r.workspace,
            _ => &mut r.report,
        };
        if slot.is_none() {
            *slot = Some(bytes);
        }
        if tag == REPORT {
            break;
        }
    }
    // Until the runner's end closes: the lifeline stays up while the runner lives.
    while let Ok(n) = stream.read(&mut sink).await {
        if n == 0 {
            break;
        }
    }
    r
}

/// [`hand_over_and_wait`] up to the runner's exit; the results, when the manifest was handed
/// over, still being read.
async fn run_to_exit(
    mut child: tokio::process::Child,
    lifeline: std::os::unix::net::UnixStream,
    task: &Task,
    job: &Job,
    manifest: Vec<u8>,
    denials: super::denials::Writer,
) -> (Ended, Option<tokio::task::JoinHandle<Results>>) {
    let small = manifest.len() <= 4096;
    let workspace_max = job
        .session
        .as_ref()
        .map_or(0, super::checkpoints::CellJob::frame_limit);
    let write = move || {
        use std::io::Write;
        let mut w = lifeline;
        let r = w.write_all(&manifest);
        (w, r)
    };
    // A write of at most one page into the fresh, empty pipe never blocks (a pipe holds at
    // least one page, however the system limits pipe buffers), so a manifest that small is
    // written here; a larger one, which may wait for the runner to read, on a blocking thread.
    let written = if small {
        Ok(write())
    } else {
        tokio::task::spawn_blocking(write).await
    };
    // From here the lifeline is read (the results) until the runner's end closes; a claimed
    // run's lease renewals are written to it (through a second descriptor of the socket, never
    // shut down: that task ends at its first write after the runner exited, or with the lease).
    let results = match written {
        Ok((w, Ok(()))) => match w.set_nonblocking(true).and_then(|()| {
            let renew = match &job.lease {
                Some(l) => Some((w.try_clone()?, l.end.subscribe())),
                None => None,
            };
            Ok((tokio::net::UnixStream::from_std(w)?, renew))
        }) {
            Ok((s, renew)) => {
                if let Some((w, end)) = renew {
                    match tokio::net::UnixStream::from_std(w) {
                        Ok(w) => drop(tokio::spawn(send_renewals(w, end))),
                        Err(e) => {
                            // Without renewals the runner would kill the run at the first end.
                            tracing::error!(job_id = %job.job_id, error = %e, "cannot send lease renewals to the runner");
                        }
                    }
                }
                Some(tokio::spawn(read_results(
                    s,
                    task.output.max_bytes,
                    workspace_max,
                    denials,
                )))
            }
            Err(e) => {
                tracing::error!(job_id = %job.job_id, error = %e, "cannot read the runner's results");
                let _ = child.kill().await;
                return (Ended::HandOffFailed, None);
            }
        },
        Ok((w, Err(e))) => {
            // The runner exited before reading all of its manifest (nothing ran); what it sent
            // back (its set-up error) is still read.
            tracing::warn!(job_id = %job.job_id, error = %e, "the runner did not take its manifest");
            w.set_nonblocking(true)
                .and_then(|()| tokio::net::UnixStream::from_std(w))
                .ok()
                .map(|s| {
                    tokio::spawn(read_results(
                        s,
                        task.output.max_bytes,
                        workspace_max,
                        denials,
                    ))
                })
        }
        Err(_) => {
            let _ = child.kill().await;
            return (Ended::HandOffFailed, None);
        }
    };
    if job.lease.as_ref().is_some_and(|l| l.lost.is_cancelled()) {
        let _ = child.kill().await;
        tracing::error!(job_id = %job.job_id, "lease lost: the runner and its sandbox were killed");
        return (Ended::LeaseLost, results);
    }
    // The sandbox enforces the task's limit; this bounds a runner that hangs for any other reason.
    let guard = Duration::from_secs(run_seconds(task, job) + 60);
    let waited = tokio::select! {
        w = tokio::time::timeout(guard, child.wait()) => w,
        _ = cancelled(job.cancel.as_ref()) => {
            // SIGKILL to the runner: the sandbox's init has PDEATHSIG=KILL, and its pid
            // namespace (every process of the run) dies with it.
            let _ = child.kill().await;
            tracing::info!(job_id = %job.job_id, "run cancelled; runner killed");
            return (Ended::Cancelled, results);
        }
        _ = lease_lost(job) => {
            // The same kill: the runner, then its sandbox with it. Another node may now mark
            // the run `unknown`; nothing of this execution can be recorded any more.
            let _ = child.kill().await;
            tracing::error!(job_id = %job.job_id, "lease lost: the runner and its sandbox were killed");
            return (Ended::LeaseLost, results);
        }
    };
    let ended = match waited {
        Ok(Ok(s)) => Ended::Exited(s),
        Ok(Err(e)) => {
            tracing::error!(job_id = %job.job_id, error = %e, "waiting for the runner failed");
            let _ = child.kill().await;
            Ended::Lost
        }
        Err(_) => {
            let _ = child.kill().await;
            Ended::Lost
        }
    };
    (ended, results)
}

/// What the runner sent back (its report, receipt and the task's artifact), taken after it
/// ended and outside the run slot.
fn collect(task: &Task, job: &Job, ended: Ended, results: Results) -> Outcome {
    let exit = match ended {
        Ended::Exited(s) => s,
        Ended::Cancelled => {
            let (status, reason) = cancelled_outcome(task, true);
            return Outcome {
                status,
                reason: Some(reason),
                report: None,
                receipt: None,
                artifact: None,
                denials: Vec::new(),
            };
        }
        Ended::Lost => {
            return Outcome {
                status: RunState::Unknown,
                reason: Some(
                    "the runner did not finish in time and was killed; outcome unknown".into(),
                ),
                report: None,
                receipt: None,
                artifact: None,
                denials: Vec::new(),
            };
        }
        Ended::HandOffFailed => return setup_failed("handing the manifest to the runner failed"),
        Ended::LeaseLost => {
            return Outcome {
                status: RunState::Unknown,
                reason: Some(
                    "the executor lost its lease and killed the sandbox; outcome unknown".into(),
                ),
                report: None,
                receipt: None,
                artifact: None,
                denials: Vec::new(),
            };
        }
    };
    let report: Option<RunReport> = results
        .report
        .as_deref()
        .and_then(|b| serde_json::from_slice(b).ok());
    let Some(report) = report else {
        if !results.started {
            // It died before it started the sandbox: nothing ran.
            tracing::error!(job_id = %job.job_id, ?exit, "the runner ended before it started the sandbox");
            return setup_failed(&format!(
                "the runner ended ({}) before it started the sandbox; nothing ran",
                describe_exit(exit)
            ));
        }
        // It had announced the sandbox's start, so the command may have run (and, with
        // network access, acted outside) before the runner died: not a setup error, which
        // says nothing ran and cannot be reconciled.
        tracing::error!(job_id = %job.job_id, ?exit, "the runner ended without a report; outcome unknown");
        return Outcome {
            status: RunState::Unknown,
            reason: Some(format!(
                "the runner ended ({}) without a report after it started the sandbox; outcome unknown",
                describe_exit(exit)
            )),
            report: None,
            receipt: None,
            artifact: None,
            denials: Vec::new(),
        };
    };
    if report.status == Status::SetupError {
        tracing::error!(job_id = %job.job_id, error = report.error.as_deref().unwrap_or(""), "run setup failed");
    }
    let receipt = results.receipt.and_then(|b| String::from_utf8(b).ok());
    let mut status = RunState::from_report(report.status);
    let mut reason = None;
    let mut artifact = None;
    // A live session's interpreter writes no artifact (its manifest asks for none).
    let interpreter = job.session.as_ref().is_some_and(|c| c.interpreter);
    if report.status == Status::Ok && !interpreter {
        // The artifact must be the file the report lists (its digest), as a check of the
        // channel: only the runner writes to the lifeline.
        let rel = task.output.path.trim_start_matches("/output/");
        let listed = report
            .output
            .files
            .iter()
            .find(|f| f.path == rel)
            .map(|f| f.sha256.as_str());
        let checked = results
            .artifact
            .filter(|_| !results.artifact_too_big)
            .map(|a| {
                let sha = format!("sha256:{}", crate::config::sha256_hex(&a));
                (a, sha)
            })
            .filter(|(_, sha)| listed == Some(sha.as_str()));
        match checked {
            Some(a) => artifact = Some(a),
            None => {
                status = RunState::OutputRejected;
                reason = Some(format!(
                    "the artifact is missing, larger than the task's {} bytes, or not the file its report lists",
                    task.output.max_bytes
                ));
            }
        }
    } else if report.status == Status::Timeout && !matches!(task.network, Network::Deny) {
        status = RunState::Unknown;
        reason = Some(
            "timed out with network access: an external effect may have happened; reconcile before retrying".into(),
        );
    }
    Outcome {
        status,
        reason,
        denials: report
            .denials
            .iter()
            .map(|d| {
                serde_json::to_value(d.kind)
                    .ok()
                    .and_then(|v| v.as_str().map(str::to_owned))
                    .unwrap_or_default()
            })
            .collect(),
        report: serde_json::to_string(&report).ok(),
        receipt,
        artifact,
    }
}

/// "killed by signal 9" or "exit code 3", for a reason text.
fn describe_exit(exit: std::process::ExitStatus) -> String {
    use std::os::unix::process::ExitStatusExt;
    match (exit.code(), exit.signal()) {
        (Some(c), _) => format!("exit code {c}"),
        (None, Some(sig)) => format!("killed by signal {sig}"),
        (None, None) => "ended".into(),
    }
}

fn setup_failed(reason: &str) -> Outcome {
    Outcome {
        status: RunState::SetupError,
        reason: Some(reason.into()),
        report: None,
        receipt: None,
        artifact: None,
        denials: Vec::new(),
    }
}

/// Records the end of a run that never started (cancelled while queued, expired, or its
/// runner could not be started or its start could not be recorded): the outcome, the metric
/// and the `run_end` (or `run_refused`) audit record.
async fn end_unstarted(
    state: &AppState,
    job: &Job,
    status: RunState,
    reason: String,
    event: Event,
) {
    let ev = Event {
        status: Some(status.into()),
        reason: Some(reason.clone()),
        ..event
    };
    let f = FinishRun::without_outputs(&job.job_id, status, reason, now());
    if let Err(e) = record_end(state, job, f, ev, None).await {
        tracing::error!(error = %e, job_id = %job.job_id, status = status.as_str(), "recording the end of a run that did not start failed");
        if matches!(e, crate::storage::store::StoreError::Fenced(_)) {
            return;
        }
    }
    metrics::counter!("agentjail_runs_total", "task" => job.task.clone(), "status" => status.as_str()).increment(1);
}

/// Runs one admitted job to its recorded end. Spawned on its own task, so a client that
/// disconnects never cancels a run.
///
/// The run slot (`max_concurrent_runs`) is held from the runner's start to its exit, nothing
/// more: the runner is started before the run is recorded as started (its start-up overlaps
/// the store's write), but gets its manifest, and so can run anything, only once the
/// `running` mark is committed and `run_start` audited; if the mark fails, the runner is ended
/// through its lifeline before it has a manifest. After it exits, the slot is released, and
/// only then are its report and artifact read and the outcome recorded with its `run_end`
/// ([`record_end`]: never an outcome the audit chain lacks; a crash before the outcome's
/// write leaves the run in flight, so `unknown` at the next start-up). The admission (queue)
/// slot is held until the end.
///
/// A run claimed from the PostgreSQL queue (`job.lease`) comes with its run slot (`slot`),
/// taken by the executor before it claimed; its writes are fenced, and a lost lease kills it.
pub async fn execute(
    state: AppState,
    mut job: Job,
    admission: Option<Admission>,
    slot: Option<tokio::sync::OwnedSemaphorePermit>,
) {
    // Cancellable by `POST /v1/runs/{id}/cancel` (and, for a fleet executor, by the request
    // its lease renewal reads) as well as by the caller's own token (MCP cancellation).
    let token = job
        .cancel
        .as_ref()
        .map(CancellationToken::child_token)
        .unwrap_or_default();
    job.cancel = Some(token.clone());
    let _registered = Registered::new(&state, &job.job_id, token);
    execute_registered(state.clone(), job, admission, slot).await;
}

/// Registers the execution of `job_id` that is not a runner's (a live session's cell,
/// executed in its interpreter): `POST /v1/runs/{id}/cancel` (or a fleet executor's lease
/// renewal) cancels the token; the registration (and the run's followers here) ends when the
/// returned guard is dropped.
pub(crate) fn register(state: &AppState, job_id: &str) -> (CancellationToken, Registered) {
    let token = CancellationToken::new();
    let r = Registered::new(state, job_id, token.clone());
    (token, r)
}

/// A run's entry in [`crate::app::Inner::cancels`], removed when the run's execution ends (or
/// is dropped).
pub(crate) struct Registered {
    state: AppState,
    job_id: String,
}

impl Registered {
    fn new(state: &AppState, job_id: &str, token: CancellationToken) -> Registered {
        cancels(state).insert(job_id.to_string(), token);
        state.inner.news.open(job_id);
        Registered {
            state: state.clone(),
            job_id: job_id.to_string(),
        }
    }
}

impl Drop for Registered {
    fn drop(&mut self) {
        cancels(&self.state).remove(&self.job_id);
        // After the run's end was recorded: its followers here wake and find it.
        self.state.inner.news.close(&self.job_id);
    }
}

fn cancels(
    state: &AppState,
) -> std::sync::MutexGuard<'_, std::collections::HashMap<String, CancellationToken>> {
    state
        .inner
        .cancels
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// Cancels the run `job_id` if it executes or waits for a slot on this node; false if not.
pub fn cancel_here(state: &AppState, job_id: &str) -> bool {
    match cancels(state).get(job_id) {
        Some(t) => {
            t.cancel();
            true
        }
        None => false,
    }
}

async fn execute_registered(
    state: AppState,
    job: Job,
    _admission: Option<Admission>,
    slot: Option<tokio::sync::OwnedSemaphorePermit>,
) {
    let Some(task) = state.inner.config.tasks.get(&job.task).cloned() else {
        if let Some(l) = &job.lease {
            // A task type this executor's configuration lacks: ended as a set-up error.
            tracing::error!(job_id = %job.job_id, task = %job.task, "a claimed run names a task type this node's configuration does not have");
            let who = RunIds {
                actor: &job.actor,
                tenant: &job.tenant,
                task: &job.task,
                request_id: &job.request_id,
                job_id: &job.job_id,
            };
            let reason = "the executor that claimed the run does not know its task type";
            end_claim_as_setup_error(&l.queue, l.fence, who, reason).await;
        }
        return;
    };
    // A session's cell whose session was ended before this execution was registered (and so
    // could not be cancelled by the close): it never starts.
    let closed = match &job.session {
        Some(c) => super::checkpoints::session_closed(&state, c).await,
        None => false,
    };
    let permit = match slot {
        _ if closed => None,
        Some(p) => Some(Ok(p)),
        None => tokio::select! {
            p = state.inner.run_slots.clone().acquire_owned() => Some(p),
            _ = cancelled(job.cancel.as_ref()) => None,
        },
    };
    let base = Event {
        actor: Some(job.actor.clone()),
        tenant: Some(job.tenant.clone()),
        task: Some(job.task.clone()),
        request_id: Some(job.request_id.clone()),
        job_id: Some(job.job_id.clone()),
        ..Default::default()
    };
    let store = state.store();
    let permit = match permit {
        Some(Ok(p)) => p,
        Some(Err(_)) => return,
        None => {
            let (status, reason) = cancelled_outcome(&task, false);
            let ev = Event {
                event: "run_end",
                ..base
            };
            end_unstarted(&state, &job, status, reason, ev).await;
            return;
        }
    };
    if now() >= job.job_expires_at {
        drop(permit);
        let ev = Event {
            event: "run_refused",
            decision: Some("deny"),
            ..base
        };
        let reason = "the job id expired before a run slot was free".to_string();
        end_unstarted(&state, &job, RunState::Expired, reason, ev).await;
        return;
    }
    let started = Instant::now();
    // A shared store (PostgreSQL) writes the inputs into this node's object folder first.
    let shas = job.inputs.iter().map(|i| i.sha256.clone()).collect();
    let spawned = store
        .materialise(shas)
        .await
        .map_err(|e| {
            tracing::error!(job_id = %job.job_id, error = %e, "fetching the run's inputs from the store failed");
            "the run's inputs could not be fetched from the store"
        })
        .and_then(|()| {
            prepare(&state, &task, &job).map_err(|e| {
                tracing::error!(job_id = %job.job_id, error = %e, "preparing the run's manifest failed");
                "the run's manifest could not be prepared"
            })
        })
        .and_then(|manifest| Ok((manifest, spawn_runner(&state, &task, &job)?)));
    let (manifest, runner) = match spawned {
        Ok(s) => s,
        Err(why) => {
            drop(permit);
            let ev = Event {
                event: "run_end",
                ..base
            };
            end_unstarted(&state, &job, RunState::SetupError, why.into(), ev).await;
            return;
        }
    };
    let start = Event {
        event: "run_start",
        ..base.clone()
    };
    let marked = if job.lease.as_ref().is_some_and(|l| l.lost.is_cancelled()) {
        Err(crate::storage::store::StoreError::Fenced(
            job.lease.as_ref().map_or(0, |l| l.fence),
        ))
    } else {
        mark_started(&state, &job, &start).await
    };
    state.inner.news.started(&job.job_id);
    // The mark committed, but the lease was lost meanwhile (the executor's clock): the runner
    // is killed on the way (`hand_over_and_wait`), and the run ends `unknown`.
    if !matches!(marked, Ok(true)) {
        // Not recorded as started: the runner never gets its manifest.
        runner.abort().await;
        drop(permit);
        // Nothing ran; the folder, if the runner's refusal made one, holds its log. It stays
        // only as the job of a recorded set-up error. Otherwise the claim was lost before the
        // start (the run goes back to the queue under a new job id, is someone else's, or,
        // after a mark that committed but whose answer was lost and was retried after the lease
        // ended, becomes `unknown` at the lease sweep) or someone else ended the run: no
        // retention would reach the folder.
        if !matches!(&marked, Err(e) if !matches!(e, crate::storage::store::StoreError::Fenced(_)))
        {
            let _ = std::fs::remove_dir_all(job_dir(&state, &job.job_id));
        }
        match marked {
            Err(e @ crate::storage::store::StoreError::Fenced(_)) => {
                tracing::error!(job_id = %job.job_id, error = %e, "the running mark was refused by fencing; the run was not started here");
            }
            Ok(false) if job.lease.is_some() => {
                tracing::error!(job_id = %job.job_id, "the running mark was refused by fencing (the lease expired or was taken); the run was not started here");
            }
            Err(e) => {
                tracing::error!(job_id = %job.job_id, error = %e, "marking a run as running failed; it was not run");
                let ev = Event {
                    event: "run_end",
                    ..base
                };
                let reason = "the run could not be recorded as started, so it was not run".into();
                end_unstarted(&state, &job, RunState::SetupError, reason, ev).await;
            }
            // No longer queued: someone else ended it; nothing is recorded here.
            _ => {}
        }
        return;
    }
    if job.lease.is_none() {
        state.store().audit(start).await;
    }
    metrics::gauge!("agentjail_runs_in_flight").increment(1.0);
    let (ended, results) = hand_over_and_wait(runner, &task, &job, manifest).await;
    let elapsed = started.elapsed();
    // The runner has exited (or was killed): the slot is free for the next run while this
    // one's outcome is read and recorded.
    drop(permit);
    metrics::gauge!("agentjail_runs_in_flight").decrement(1.0);
    let mut results = results;
    let checkpoint_bytes = results.workspace.take();
    let outcome = collect(&task, &job, ended, results);
    // A session's cell: its checkpoint, kept only when it is the one the report names.
    let cell_end = match &job.session {
        Some(c) => Some(
            super::checkpoints::cell_end(
                &state,
                &job.job_id,
                c,
                &outcome.report,
                &outcome.receipt,
                checkpoint_bytes,
            )
            .await,
        ),
        None => None,
    };
    // The folder (logs, created private) stays until the task's retention.
    metrics::histogram!("agentjail_run_duration_seconds", "task" => job.task.clone())
        .record(elapsed.as_secs_f64());
    metrics::counter!("agentjail_runs_total", "task" => job.task.clone(), "status" => outcome.status.as_str())
        .increment(1);
    if outcome.status == RunState::Unknown {
        metrics::counter!("agentjail_unknown_outcomes_total").increment(1);
    }
    for kind in &outcome.denials {
        metrics::counter!("agentjail_sandbox_denials_total", "kind" => kind.clone()).increment(1);
    }
    let (artifact, sha) = match outcome.artifact {
        Some((bytes, sha)) => (Some(bytes), Some(sha)),
        None => (None, None),
    };
    let dir = job_dir(&state, &job.job_id);
    let streams = match outcome
        .report
        .as_deref()
        .and_then(|r| serde_json::from_str::<agentjail_manifest::report::RunReport>(r).ok())
    {
        Some(r) if r.stdout.sha256.is_some() || r.stderr.sha256.is_some() => {
            Some(super::streams::record(&dir, &task, &r.stdout, &r.stderr))
        }
        Some(_) => None,
        // No report: the runner was killed (a cancel, a lost lease); what it printed is kept.
        None => super::streams::record_from_logs(&dir, &task),
    }
    .and_then(|s| serde_json::to_string(&s).ok());
    // A store shared by several nodes keeps the logs themselves (any replica serves them), and
    // the live denials whole (its copy while the run went on may lack the last ones).
    let keeps = streams.is_some() && state.store().keeps_logs();
    let read = |name: &str| std::fs::read(dir.join(name)).unwrap_or_default();
    let logs = keeps.then(|| {
        use super::streams::log_name;
        (read(log_name(true)), read(log_name(false)))
    });
    let denials = keeps.then(|| read(super::denials::NAME));
    let ev = Event {
        event: "run_end",
        status: Some(outcome.status.into()),
        reason: outcome.reason.clone(),
        denials: Some(outcome.denials.len()),
        duration_ms: Some(elapsed.as_millis() as u64),
        ..base
    };
    let f = FinishRun {
        job_id: job.job_id.clone(),
        status: outcome.status,
        reason: outcome.reason,
        now: now(),
        report: outcome.report,
        receipt: outcome.receipt,
        artifact,
        artifact_sha256: sha,
        streams,
        logs,
        denials,
    };
    let recorded = match (cell_end, &job.lease) {
        (Some(end), None) => {
            // The cell's end and the session's new head commit together.
            state.store().audit(ev).await;
            crate::storage::sessions::finish_cell(state.store(), f, end).await
        }
        (end, _) => record_end(&state, &job, f, ev, end.as_ref()).await,
    };
    match recorded {
        Ok(()) => {}
        Err(crate::storage::store::StoreError::Fenced(fence)) => {
            // Another node owns the run now, or has ended it (`unknown`): this execution's
            // late result is not recorded, and no `run_end` is audited for it.
            tracing::error!(job_id = %job.job_id, fence, status = outcome.status.as_str(), "the result was refused by fencing (the lease expired or was taken); nothing recorded");
            metrics::counter!("agentjail_fenced_writes_total").increment(1);
        }
        Err(e) => tracing::error!(error = %e, "recording a finished run failed"),
    }
}

/// Start-up sweep, before reconciliation: kills every runner a previous service on this data
/// directory left (normally none: a runner dies when its lifeline hangs up). A process is
/// taken for one only when its command line is `… run --lifeline …` and its environment
/// marks it with this data directory; it is opened as a pidfd first and then checked, so that
/// a recycled pid is never signalled. Its sandbox dies with it (the init's parent-death
/// signal). Returns how many were killed; waits up to 5 s for them to be gone.
pub fn kill_leftovers(data_dir: &Path) -> usize {
    use rustix::process::{Pid, PidfdFlags, Signal, pidfd_open, pidfd_send_signal};
    let mut mark = format!("{SERVICE_MARK}={}", data_dir.display()).into_bytes();
    mark.push(0);
    let me = std::process::id() as i32;
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return 0;
    };
    let mut killed = Vec::new();
    for e in entries.flatten() {
        let Some(pid) = e
            .file_name()
            .to_str()
            .and_then(|s| s.parse::<i32>().ok())
            .filter(|p| *p != me)
            .and_then(Pid::from_raw)
        else {
            continue;
        };
        let Ok(fd) = pidfd_open(pid, PidfdFlags::empty()) else {
            continue;
        };
        let base = format!("/proc/{}", pid.as_raw_nonzero());
        let (Ok(cmdline), Ok(environ)) = (
            std::fs::read(format!("{base}/cmdline")),
            std::fs::read(format!("{base}/environ")),
        ) else {
            continue;
        };
        let args: Vec<&[u8]> = cmdline.split(|b| *b == 0).collect();
        let is_runner = args.get(1) == Some(&&b"run"[..]) && args.contains(&&b"--lifeline"[..]);
        let marked = environ
            .split_inclusive(|b| *b == 0)
            .any(|v| v == mark.as_slice());
        if is_runner && marked && pidfd_send_signal(&fd, Signal::KILL).is_ok() {
            tracing::warn!(
                pid = pid.as_raw_nonzero(),
                "killed a runner left by a previous service on this data directory"
            );
            killed.push(fd);
        }
    }
    let deadline = Instant::now() + Duration::from_secs(5);
    for fd in &killed {
        let left = deadline.saturating_duration_since(Instant::now());
        let ts = rustix::time::Timespec {
            tv_sec: left.as_secs() as i64,
            tv_nsec: left.subsec_nanos() as i64,
        };
        let mut fds = [rustix::event::PollFd::new(fd, rustix::event::PollFlags::IN)];
        let _ = rustix::event::poll(&mut fds, Some(&ts));
    }
    killed.len()
}

/// Start-up: runs left `queued`/`running` become `unknown` (never re-run) and their job folders
/// are removed; each is audited.
pub fn reconcile_at_startup(state: &AppState) -> Result<(), ServerError> {
    let killed = kill_leftovers(&state.inner.data_dir);
    if killed > 0 {
        tracing::warn!(
            killed,
            "start-up sweep: killed runners left by a previous service"
        );
    }
    // Earlier builds wrote each run's code to `DATA/code/<job_id>` (0644, in a 0711
    // folder) for the run's sandbox to read; the code now goes by value in the manifest and
    // never reaches the disk. What such a build left is removed (its runners are gone,
    // above, and the data directory's lock keeps any other process out).
    let _ = std::fs::remove_dir_all(state.inner.data_dir.join("code"));
    let t = now();
    let (rows, given_up) = state.store().mark_in_flight_unknown(t)?;
    for job_id in given_up {
        // Claimed and prepared here, never started: the run is back on the queue under a new
        // job id; nothing ran in this folder.
        let _ = std::fs::remove_dir_all(job_dir(state, &job_id));
        tracing::warn!(%job_id, "a claim this node held on a run it had not started was given up at start-up: the run is back on the queue under a new job id");
    }
    for InFlight {
        tenant,
        request_id,
        task,
        job_id,
    } in rows
    {
        let _ = std::fs::remove_dir_all(job_dir(state, &job_id));
        tracing::warn!(%tenant, %request_id, %job_id, %task, "run found in flight at start-up: marked unknown, not re-run; an operator reconciles it");
        // Audited by the store with the marking (`run_unknown`).
        metrics::counter!("agentjail_unknown_outcomes_total").increment(1);
    }
    Ok(())
}

/// One retention pass: outputs, job folders (logs) and inputs past their retention.
pub async fn sweep(state: &AppState) {
    let files = Arc::new(JobFiles(state.inner.data_dir.clone()));
    let r = state
        .store()
        .sweep(now(), files)
        .await
        .map(|w| (w.outputs, w.job_folders, w.objects, w.checkpoints));
    match r {
        Ok((outputs, logs, objects, checkpoints)) if outputs + logs + objects + checkpoints > 0 => {
            state
        .store()
        .audit(Event {
                    event: "retention_sweep",
                    reason: Some(format!(
                        "deleted outputs of {outputs} run(s), {logs} job folder(s), {objects} input object(s), {checkpoints} session checkpoint(s)"
                    )),
                    ..Default::default()
                })
                .await;
        }
        Ok(_) => {}
        Err(e) => tracing::error!(error = %e, "retention sweep failed"),
    }
}

/// The service's files under its data directory, as the retention sweep deletes them.
struct JobFiles(PathBuf);

impl RetentionFiles for JobFiles {
    fn drop_outputs(&self, job_id: &str) {
        // Retention means deletion: the copies in the job folder go too (the logs stay until
        // `logs_seconds`).
        let d = self.0.join("jobs").join(job_id);
        let _ = std::fs::remove_dir_all(d.join("out"));
        let _ = std::fs::remove_file(d.join("report.json"));
        let _ = std::fs::remove_file(d.join("receipt.json"));
    }
    fn drop_job(&self, job_id: &str) -> bool {
        let d = self.0.join("jobs").join(job_id);
        d.exists() && std::fs::remove_dir_all(&d).is_ok()
    }
    fn drop_object(&self, sha256: &str) -> bool {
        std::fs::remove_file(self.0.join("objects").join(sha256)).is_ok()
    }
    fn checkpoints(&self) -> Vec<(String, i64)> {
        crate::execution::checkpoints::stored(&self.0)
    }
    fn drop_checkpoint(&self, hex: &str) -> bool {
        crate::execution::checkpoints::path(&self.0, &format!("sha256:{hex}"))
            .is_some_and(|p| std::fs::remove_file(p).is_ok())
    }
}

/// Runs [`sweep`] at start-up and every `sweep_interval_seconds`.
pub fn spawn_sweeper(state: AppState) {
    tokio::spawn(async move {
        let every = Duration::from_secs(state.inner.config.server.sweep_interval_seconds);
        loop {
            sweep(&state).await;
            tokio::time::sleep(every).await;
        }
    });
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;
    use crate::storage::db;

    /// The service records an artifact only when it is the file the runner's report lists: an
    /// artifact frame whose digest differs from the report's (a confused or tampered channel)
    /// ends the run `output_rejected`; the control, the same report with the real bytes, `ok`.
    #[test]
    fn an_artifact_that_is_not_the_reported_file_is_rejected() {
        use std::os::unix::process::ExitStatusExt;
        let cfg = crate::Config::example().unwrap();
        let task = cfg.tasks["summarize_csv"].clone();
        let job = Job {
            tenant: "dev".into(),
            actor: "dev".into(),
            request_id: "r-1".into(),
            task: "summarize_csv".into(),
            job_id: "job_x".into(),
            job_expires_at: now() + 60,
            inputs: vec![],
            code: None,
            args: vec![],
            cancel: None,
            lease: None,
            session: None,
        };
        let real = br#"{"rows": 1}"#.to_vec();
        let mut report = RunReport::setup_error(task.limits, String::new());
        report.status = Status::Ok;
        report.error = None;
        report
            .output
            .files
            .push(agentjail_manifest::report::OutputFile {
                path: "summary.json".into(),
                bytes: real.len() as u64,
                sha256: format!("sha256:{}", crate::config::sha256_hex(&real)),
            });
        let with = |artifact: &[u8]| Results {
            report: Some(serde_json::to_vec(&report).unwrap()),
            receipt: None,
            artifact: Some(artifact.to_vec()),
            artifact_too_big: false,
            started: true,
            workspace: None,
        };
        let exited = || Ended::Exited(std::process::ExitStatus::from_raw(0));
        let ok = collect(&task, &job, exited(), with(&real));
        assert_eq!(ok.status, RunState::Ok, "{:?}", ok.reason);
        assert_eq!(ok.artifact.map(|(b, _)| b), Some(real.clone()));
        let forged = collect(&task, &job, exited(), with(br#"{"rows": 999}"#));
        assert_eq!(forged.status, RunState::OutputRejected);
        assert!(forged.artifact.is_none());
    }

    /// Frames as a runner would send them, read by [`read_results`] from a socket whose other
    /// end is then closed (the runner exited).
    async fn results_of(frames: &[(u8, &[u8])], artifact_max: u64) -> Results {
        results_to(
            frames,
            artifact_max,
            Path::new("/nonexistent/denials.jsonl"),
        )
        .await
    }

    /// [`results_of`], the denials written to `denials`.
    async fn results_to(frames: &[(u8, &[u8])], artifact_max: u64, denials: &Path) -> Results {
        use tokio::io::AsyncWriteExt;
        let (ours, mut theirs) = tokio::net::UnixStream::pair().unwrap();
        let denials = crate::execution::denials::Writer::new(denials.to_path_buf(), None);
        let reader = tokio::spawn(read_results(ours, artifact_max, 0, denials));
        for (tag, body) in frames {
            let head = agentjail_manifest::results::header(*tag, body.len() as u64);
            theirs.write_all(&head).await.unwrap();
            theirs.write_all(body).await.unwrap();
        }
        drop(theirs);
        reader.await.unwrap()
    }

    /// The first frame of each kind counts, the first report ends the results, an artifact
    /// over its bound is dropped (and said so), an unknown tag ends the reading; the reader
    /// drains the stream to its end either way.
    #[tokio::test]
    async fn results_frames_are_bounded_and_the_first_of_each_kind_counts() {
        let r = results_of(
            &[
                (b'A', b"a1"),
                (b'A', b"a2"),
                (b'C', b"c1"),
                (b'R', b"r1"),
                (b'R', b"r2"),
                (b'A', b"a3"),
            ],
            10,
        )
        .await;
        assert_eq!(r.artifact.as_deref(), Some(&b"a1"[..]));
        assert_eq!(r.receipt.as_deref(), Some(&b"c1"[..]));
        assert_eq!(r.report.as_deref(), Some(&b"r1"[..]));
        let big = vec![b'x'; 64 * 1024];
        let r = results_of(&[(b'A', &big), (b'R', b"r")], 1000).await;
        assert!(r.artifact.is_none() && r.artifact_too_big);
        assert_eq!(r.report.as_deref(), Some(&b"r"[..]));
        let r = results_of(&[(b'C', b"c"), (b'?', b"zz"), (b'R', b"r")], 10).await;
        assert_eq!(r.receipt.as_deref(), Some(&b"c"[..]));
        assert!(r.report.is_none(), "a frame after an unknown tag was taken");
        assert!(!r.started);
        // The start's announcement is empty; one with a body ends the reading.
        let r = results_of(&[(b'S', b""), (b'R', b"r")], 10).await;
        assert!(r.started && r.report.is_some());
        let r = results_of(&[(b'S', b"x"), (b'R', b"r")], 10).await;
        assert!(!r.started && r.report.is_none());
        // A frame cut short by the runner's end: nothing of it is taken.
        let (ours, mut theirs) = tokio::net::UnixStream::pair().unwrap();
        let denials = crate::execution::denials::Writer::new("/nonexistent/d.jsonl".into(), None);
        let reader = tokio::spawn(read_results(ours, 10, 0, denials));
        tokio::io::AsyncWriteExt::write_all(
            &mut theirs,
            &agentjail_manifest::results::header(b'R', 100),
        )
        .await
        .unwrap();
        tokio::io::AsyncWriteExt::write_all(&mut theirs, b"partial")
            .await
            .unwrap();
        drop(theirs);
        assert!(reader.await.unwrap().report.is_none());
    }

    /// Denials sent while the run goes on (`D` frames) go to the job folder's log, one line
    /// each; one over its bound or that is not a denial is dropped; either way the frames
    /// after it (the report) are still read. An old runner sends none: nothing is created.
    #[tokio::test]
    async fn denial_frames_go_to_the_log_and_bad_ones_are_dropped() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("job").join(crate::execution::denials::NAME);
        let big = vec![b' '; 64 * 1024];
        let frames: &[(u8, &[u8])] = &[
            (b'S', b""),
            (b'D', br#"{"kind":"syscall","detail":"ptrace"}"#),
            (b'D', b"{garbage"),
            (b'D', &big),
            (
                b'D',
                br#"{"kind":"network","detail":"GET a.test:80: not allowed"}"#,
            ),
            (b'R', b"r"),
        ];
        let r = results_to(frames, 10, &path).await;
        assert!(r.started && r.report.as_deref() == Some(&b"r"[..]));
        let log = std::fs::read_to_string(&path).unwrap();
        assert_eq!(
            log,
            "{\"kind\":\"syscall\",\"detail\":\"ptrace\"}\n{\"kind\":\"network\",\"detail\":\"GET a.test:80: not allowed\"}\n"
        );
        let old = dir.path().join("old").join(crate::execution::denials::NAME);
        let r = results_to(&[(b'S', b""), (b'R', b"r")], 10, &old).await;
        assert!(r.report.is_some() && !old.exists());
    }

    #[test]
    fn manifest_comes_from_the_task_type_only() {
        let dir = tempfile::tempdir().unwrap();
        let cfg = crate::Config::example().unwrap();
        let state = AppState::open(cfg, &dir.path().join("d"), "/bin/false".into(), false).unwrap();
        let task = state.inner.config.tasks["summarize_csv"].clone();
        let job = Job {
            tenant: "dev".into(),
            actor: "dev".into(),
            request_id: "r-1".into(),
            task: "summarize_csv".into(),
            job_id: "job_x".into(),
            job_expires_at: now() + 60,
            inputs: vec![InputRow {
                id: "in_x".into(),
                sha256: "ab".repeat(32),
                name: "../../etc/passwd".into(),
                media_type: "text/csv".into(),
                bytes: 1,
                created_at: 0,
            }],
            code: Some("print(1)".into()),
            args: vec![],
            cancel: None,
            lease: None,
            session: None,
        };
        let m = build_manifest(&state, &task, &job);
        assert_eq!(m.command, task.command);
        assert_eq!(m.limits, task.limits);
        assert_eq!(m.network, Network::Deny);
        assert_eq!(m.output.as_deref(), Some("/output/summary.json"));
        assert_eq!(m.inputs.len(), 1);
        assert_eq!(m.inputs[0].mount, "/input/data.csv");
        // The upload's name never reaches the manifest; the source is the content-addressed object.
        assert_eq!(
            Path::new(&m.inputs[0].source),
            object_path(&state, &"ab".repeat(32))
        );
        // The code goes by value, as an inline input: no host file holds it.
        assert_eq!(m.inline_inputs.len(), 1);
        assert_eq!(m.inline_inputs[0].mount, "/input/code.py");
        assert_eq!(m.inline_inputs[0].content, "print(1)");
        assert!(m.expires_at.is_some());
        assert_eq!(m.request_id.as_deref(), Some("r-1"));
        assert_eq!(m.isolation, agentjail_manifest::Tier::Native);
        // A task type can require the gVisor tier; the request cannot choose it.
        let mut strict = task.clone();
        strict.isolation = agentjail_manifest::Tier::Gvisor;
        assert_eq!(
            build_manifest(&state, &strict, &job).isolation,
            agentjail_manifest::Tier::Gvisor
        );
    }

    #[test]
    fn admission_is_bounded() {
        let dir = tempfile::tempdir().unwrap();
        let mut cfg = crate::Config::example().unwrap();
        cfg.server.max_concurrent_runs = Some(1);
        cfg.server.max_queued_runs = 1;
        let state = AppState::open(cfg, dir.path(), "/bin/false".into(), false).unwrap();
        let a = Admission::try_take(&state).unwrap();
        let b = Admission::try_take(&state).unwrap();
        assert!(Admission::try_take(&state).is_none());
        drop(a);
        assert!(Admission::try_take(&state).is_some());
        drop(b);
    }

    #[tokio::test(flavor = "current_thread")]
    async fn sweep_applies_retention() {
        let dir = tempfile::tempdir().unwrap();
        let state = AppState::open(
            crate::Config::example().unwrap(),
            dir.path(),
            "/bin/false".into(),
            false,
        )
        .unwrap();
        let t = now();
        let sha = "cd".repeat(32);
        std::fs::write(object_path(&state, &sha), "x").unwrap();
        std::fs::create_dir(job_dir(&state, "job_old")).unwrap();
        let row = db::RunRow {
            tenant: "dev".into(),
            request_id: "old".into(),
            body_sha256: "h".into(),
            task: "summarize_csv".into(),
            actor: "dev".into(),
            job_id: "job_old".into(),
            job_expires_at: t - 100,
            status: RunState::Ok,
            reason: None,
            created_at: t - 100,
            started_at: Some(t - 100),
            finished_at: Some(t - 99),
            inputs: "[]".into(),
            report: Some("{}".into()),
            receipt: Some("{}".into()),
            artifact: Some(b"{}".to_vec()),
            artifact_sha256: Some("sha256:x".into()),
            outputs_expire_at: t - 1,
            logs_expire_at: t - 1,
            outputs_deleted: false,
            args: "[]".into(),
            manifest_digest: None,
            streams: None,
        };
        let input = InputRow {
            id: "in_old".into(),
            sha256: sha.clone(),
            name: "a.csv".into(),
            media_type: "text/csv".into(),
            bytes: 1,
            created_at: t - 100,
        };
        state
            .inner
            .db
            .call_sync(|c| {
                db::insert_run(c, &row)?;
                db::insert_input(c, "dev", &input, t - 1)
            })
            .unwrap();
        sweep(&state).await;
        let r = state
            .inner
            .db
            .call_sync(|c| db::get_run(c, "dev", "old"))
            .unwrap()
            .unwrap();
        assert!(
            r.outputs_deleted && r.artifact.is_none() && r.receipt.is_none() && r.report.is_none()
        );
        assert_eq!(r.status, "ok", "the record itself stays");
        assert!(!job_dir(&state, "job_old").exists());
        assert!(!object_path(&state, &sha).exists());
        assert!(
            state
                .inner
                .db
                .call_sync(|c| db::get_input(c, "dev", "in_old"))
                .unwrap()
                .is_none()
        );
        let log = std::fs::read_to_string(state.audit_path()).unwrap();
        assert!(log.contains("retention_sweep"));
    }
}
