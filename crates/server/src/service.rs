//! The service layer, shared by every front door: authenticate, upload, submit (with
//! execute-once and admission), get, read the artifact or receipt, reconcile, and the task
//! catalogue. It asks [`crate::policy`] for every decision, talks to the store and the audit
//! log, starts runs through [`crate::execution::runner`], and returns typed results or a [`Failure`]
//! (a policy [`Refusal`], or an internal error whose detail stays in the log). HTTP
//! ([`crate::doors::api`]) and MCP ([`crate::doors::mcp`]) map these to their own forms (status + problem
//! details; tool results and JSON-RPC errors); neither depends on the other.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::AtomicUsize;
use std::time::Duration;

use base64::Engine;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;
use utoipa::ToSchema;

use crate::app::{
    AppState, AuthFailures, Inner, ServerError, TaskSchema, metrics_handle, zero_metrics,
};
use crate::config::{self, CodePolicy, Config};
use crate::execution::runner::{self, Admission, Job};
use crate::policy;
pub use crate::policy::{Caller, Refusal, RunRequest};
use crate::run_state::RunState;
use crate::storage::audit::{self, Event};
use crate::storage::db::{InputRow, Insert, RunRow};
use crate::storage::store::StoreError;
use crate::storage::{db, store};
use crate::util::{now, random_hex};

/// Why a service call did not succeed.
#[derive(Debug)]
pub enum Failure {
    /// Policy (or the transport's parsing) refused the request; audited and counted.
    Refused(Refusal),
    /// The service could not complete it (store, randomness); the detail is in the log.
    Internal,
    /// The shared database cannot be reached now (restarting, connection lost); retry later.
    Unavailable,
}

impl Failure {
    /// The stable machine code: the refusal's, or `internal`.
    pub fn code(&self) -> &'static str {
        match self {
            Failure::Refused(r) => r.code(),
            Failure::Internal => "internal",
            Failure::Unavailable => "unavailable",
        }
    }
    /// What went wrong, for a person (never internal detail).
    pub fn detail(&self) -> String {
        match self {
            Failure::Refused(r) => r.detail(),
            Failure::Internal => {
                "the service could not complete the request; the details are in its log".into()
            }
            Failure::Unavailable => {
                "the service's database cannot be reached right now; retry later".into()
            }
        }
    }
}

impl From<StoreError> for Failure {
    fn from(e: StoreError) -> Self {
        tracing::error!(error = %e, "store error");
        match e {
            StoreError::Unavailable(_) => Failure::Unavailable,
            _ => Failure::Internal,
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Start-up

impl AppState {
    /// Opens the data directory (creating it), the database and the audit log, and reconciles
    /// runs left in flight by a previous process (they become `unknown`; never re-run).
    pub fn open(
        config: Config,
        data_dir: &Path,
        runner: PathBuf,
        allow_degraded: bool,
    ) -> Result<AppState, ServerError> {
        AppState::open_with(config, data_dir, runner, allow_degraded, None)
    }

    /// [`AppState::open`] with this node's run slots (`serve --slots`, `worker --slots`;
    /// default `max_concurrent_runs`); 0 (PostgreSQL only): this node executes nothing.
    pub fn open_with(
        config: Config,
        data_dir: &Path,
        runner: PathBuf,
        allow_degraded: bool,
        slots: Option<usize>,
    ) -> Result<AppState, ServerError> {
        use std::os::unix::fs::PermissionsExt;
        let io = |what: &str, p: &Path, e: std::io::Error| {
            ServerError::Io(format!("{what} {}: {e}", p.display()))
        };
        for d in [
            data_dir.to_path_buf(),
            data_dir.join("objects"),
            data_dir.join("jobs"),
        ] {
            std::fs::create_dir_all(&d).map_err(|e| io("cannot create", &d, e))?;
            // The sandbox user (an unprivileged host uid in root mode) must traverse these.
            std::fs::set_permissions(&d, std::fs::Permissions::from_mode(0o755))
                .map_err(|e| io("cannot set permissions of", &d, e))?;
        }
        let data_dir = data_dir
            .canonicalize()
            .map_err(|e| io("cannot resolve", data_dir, e))?;
        // No check of the data directory's ancestors: inputs and code are bound into the
        // sandbox by its init, with the init's privileges, so a 0700 ancestor (root's home)
        // does not keep the sandbox user from them; only their own modes matter.
        let private = data_dir.join("private");
        std::fs::create_dir_all(&private).map_err(|e| io("cannot create", &private, e))?;
        std::fs::set_permissions(&private, std::fs::Permissions::from_mode(0o700))
            .map_err(|e| io("cannot set permissions of", &private, e))?;
        // One process per data directory: start-up reconciliation marks every in-flight run
        // `unknown`, and the audit chain is kept in memory, so a second `serve` or `mcp` on the
        // same directory would corrupt both.
        let lock_path = private.join("lock");
        let lock = std::fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&lock_path)
            .map_err(|e| io("cannot open", &lock_path, e))?;
        if lock.try_lock().is_err() {
            return Err(ServerError::Io(format!(
                "the data directory {} is in use by another agentjail serve or mcp process; use another --data-dir, or connect to that server's /mcp endpoint",
                data_dir.display()
            )));
        }
        // Create the receipt key now, so concurrent runs never race to create it.
        agentjail_verify::receipt::ReceiptKey::load_or_create(&private.join("receipt-key.pem"))
            .map_err(|e| ServerError::Io(format!("receipt key: {e}")))?;
        let concurrency = slots
            .or(config.server.max_concurrent_runs)
            .unwrap_or_else(|| {
                std::thread::available_parallelism()
                    .map(|n| n.get())
                    .unwrap_or(2)
            });
        if concurrency == 0 && config.server.database.is_none() {
            return Err(ServerError::Io(
                "--slots 0 needs a shared PostgreSQL database (--database): without one nothing would run the runs this node accepts".into(),
            ));
        }
        // The store: PostgreSQL when the configuration names a database (shared by replicas),
        // else SQLite and the audit file in the private folder.
        let (store, sqlite, queue): (Arc<dyn store::Store>, Option<db::Db>, _) =
            match &config.server.database {
                Some(url) => {
                    let pg = open_pg(&config, url, &data_dir, concurrency)?;
                    (Arc::new(pg.clone()), None, Some(pg))
                }
                None => {
                    let db = db::Db::open(&private.join("agentjail.db"))?;
                    let audit = audit::AuditLog::open(&private.join("audit.jsonl"))?;
                    (
                        Arc::new(store::SqliteStore::new(db.clone(), audit)),
                        Some(db),
                        None,
                    )
                }
            };
        // Each output schema is written once, here, named by its content; runs name that file
        // (none is written per job). The runner (root, outside the sandbox) reads it.
        let schema_dir = data_dir.join("schemas");
        std::fs::create_dir_all(&schema_dir).map_err(|e| io("cannot create", &schema_dir, e))?;
        std::fs::set_permissions(&schema_dir, std::fs::Permissions::from_mode(0o700))
            .map_err(|e| io("cannot set permissions of", &schema_dir, e))?;
        let mut schemas = std::collections::BTreeMap::new();
        for (name, t) in &config.tasks {
            if let Some(s) = &t.output.schema {
                let v = s.value().map_err(config::ConfigError)?;
                let text = serde_json::to_string_pretty(&v).unwrap_or_default();
                let file = schema_dir.join(format!("{}.json", config::sha256_hex(text.as_bytes())));
                write_schema(&file, &text).map_err(|e| io("cannot write", &file, e))?;
                schemas.insert(name.clone(), TaskSchema { text, file });
            }
        }
        let state = AppState {
            inner: Arc::new(Inner {
                max_admitted: concurrency + config.server.max_queued_runs,
                config,
                data_dir,
                runner,
                allow_degraded,
                store,
                #[cfg(test)]
                db: sqlite
                    .ok_or_else(|| ServerError::Io("unit tests inspect SQLite only".into()))?,
                run_slots: Arc::new(Semaphore::new(concurrency)),
                slots: concurrency,
                queue,
                admitted: AtomicUsize::new(0),
                metrics: metrics_handle(),
                schemas,
                auth_failures: AuthFailures::default(),
                _lock: lock,
            }),
        };
        #[cfg(not(test))]
        drop(sqlite);
        zero_metrics(&state.inner.config);
        if state.inner.queue.is_some() {
            crate::execution::fleet::zero_cluster_metrics();
        }
        runner::reconcile_at_startup(&state)?;
        Ok(state)
    }
}

/// Writes a content-addressed schema file atomically (0600): a temporary file beside it, then
/// renamed over it, so that a runner never reads a partial schema. Rewritten at every start, so
/// that a file changed on disk since is replaced by what its name says.
fn write_schema(file: &Path, text: &str) -> std::io::Result<()> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let tmp = file.with_extension(format!("tmp{}", std::process::id()));
    let _ = std::fs::remove_file(&tmp);
    let written = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(&tmp)
        .and_then(|mut f| {
            f.write_all(text.as_bytes())?;
            f.sync_all()
        })
        .and_then(|()| std::fs::rename(&tmp, file));
    if written.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    written
}

/// Opens the PostgreSQL store named by `url` (docs/server.md, "PostgreSQL"): the password
/// from the 0600 file or `PGPASSWORD`, this node's id, migrations applied.
fn open_pg(
    config: &Config,
    url: &str,
    data_dir: &Path,
    concurrency: usize,
) -> Result<crate::storage::pg::PgStore, ServerError> {
    use crate::storage::pg;
    let s = &config.server;
    let node = pg::node_id(s.node_id.as_deref()).map_err(ServerError::Io)?;
    let password =
        pg::read_password(s.database_password_file.as_deref()).map_err(ServerError::Io)?;
    let c = pg::connect_config(url, password).map_err(ServerError::Io)?;
    let where_ = pg::describe(&c);
    // Every run holds a connection only per statement; requests and runs share the pool.
    let pool = pg::pool(c.clone(), concurrency * 2 + 8).map_err(ServerError::Io)?;
    let objects = data_dir.join("objects");
    let store = pg::block_on(pg::PgStore::open(pool, &c, node.clone(), objects))
        .map_err(ServerError::Io)?
        .map_err(|e| ServerError::Io(format!("database {where_}: {e}")))?;
    tracing::info!(database = %where_, node = %node, "store: PostgreSQL");
    Ok(store)
}

// ---------------------------------------------------------------------------------------------
// Authentication

/// Checks a bearer token against the configured token hashes (constant time, every actor). A
/// failure is counted and audited with `route` (never the token). Shared by the HTTP API, the
/// MCP endpoint and `agentjail mcp` over stdio.
pub(crate) async fn authenticate(
    state: &AppState,
    token: Option<&str>,
    route: String,
) -> Option<Caller> {
    let token = token.map(str::trim).filter(|t| !t.is_empty());
    let found = token.and_then(|t| state.inner.config.actor_for_token(t));
    match found {
        Some((name, a)) => Some(Caller {
            actor: name.to_string(),
            tenant: a.tenant.clone(),
            operator: a.operator,
        }),
        None => {
            metrics::counter!("agentjail_auth_failures_total").increment(1);
            // The route is logged without its query string; the token never is.
            let route = route.chars().take(200).collect::<String>();
            let window = Duration::from_secs(state.inner.config.server.auth_failure_audit_seconds);
            if let Some(ev) = state
                .inner
                .auth_failures
                .record(token.is_some(), route, window)
            {
                state.store().audit(ev).await;
            }
            None
        }
    }
}

/// Writes pending authentication failures once their window has passed.
pub(crate) fn spawn_auth_failure_flusher(state: AppState) {
    tokio::spawn(async move {
        let window = Duration::from_secs(state.inner.config.server.auth_failure_audit_seconds);
        loop {
            tokio::time::sleep(window.min(Duration::from_secs(1))).await;
            if let Some(ev) = state.inner.auth_failures.flush(window) {
                state.store().audit(ev).await;
            }
        }
    });
}

/// Records a refusal: counted by its code, audited as a denial (`reason` = `code: detail`).
pub(crate) async fn deny(state: &AppState, caller: &Caller, mut ev: Event, r: Refusal) -> Failure {
    metrics::counter!("agentjail_denials_total", "reason" => r.code()).increment(1);
    ev.decision = Some("deny");
    ev.reason = Some(r.to_string());
    if ev.actor.is_none() {
        ev.actor = Some(caller.actor.clone());
        ev.tenant = Some(caller.tenant.clone());
    }
    state.store().audit(ev).await;
    Failure::Refused(r)
}

// ---------------------------------------------------------------------------------------------
// Inputs

/// A stored input.
#[derive(Debug, Serialize, ToSchema)]
pub struct InputCreated {
    /// Opaque id, valid for the caller's tenant only.
    pub input_id: String,
    /// `sha256:<hex>` of the content.
    pub sha256: String,
    pub bytes: u64,
    pub name: String,
    pub media_type: String,
    /// When the input is deleted (RFC 3339).
    pub expires_at: String,
}

pub(crate) fn ts(secs: i64) -> String {
    jiff::Timestamp::from_second(secs)
        .map(|t| t.to_string())
        .unwrap_or_default()
}

/// Stores an upload for the caller's tenant (content-addressed), counts and audits it
/// (`input_upload`). Shared by `POST /v1/inputs` and the MCP tool `upload_input`; checks the
/// name, media type and `max_input_bytes` itself, so every front door gets the same policy.
pub(crate) async fn upload(
    state: &AppState,
    caller: &Caller,
    name: String,
    media_type: String,
    body: Vec<u8>,
) -> Result<InputCreated, Failure> {
    let ev = caller.event("input_upload");
    let max = state.inner.config.server.max_input_bytes;
    if let Err(r) = policy::check_upload(&name, &media_type, body.len() as u64, max) {
        return Err(deny(state, caller, ev, r).await);
    }
    let sha = crate::config::sha256_hex(&body);
    let bytes = body.len() as u64;
    let id = format!("in_{}", random_hex(16).map_err(|_| Failure::Internal)?);
    let t = now();
    let expires = t + state.inner.config.server.input_retention_seconds as i64;
    let row = InputRow {
        id: id.clone(),
        sha256: sha.clone(),
        name: name.clone(),
        media_type: media_type.clone(),
        bytes: body.len() as u64,
        created_at: t,
    };
    let path = runner::object_path(state, &sha);
    let objects = state.inner.data_dir.join("objects");
    let body: Arc<[u8]> = body.into();
    let content = body.clone();
    let write = Box::new(move || store_object(&objects, &path, &content));
    state
        .store()
        .put_input(&caller.tenant, row, expires, body, write)
        .await?;
    metrics::counter!("agentjail_inputs_stored_total").increment(1);
    state
        .store()
        .audit(Event {
            input_id: Some(id.clone()),
            decision: Some("allow"),
            ..ev
        })
        .await;
    Ok(InputCreated {
        input_id: id,
        sha256: format!("sha256:{sha}"),
        bytes,
        name,
        media_type,
        expires_at: ts(expires),
    })
}

/// Writes `body` at `path` (0644) unless an object with this hash exists: temp file, fsync, rename.
fn store_object(dir: &std::path::Path, path: &std::path::Path, body: &[u8]) -> std::io::Result<()> {
    use std::io::Write;
    use std::os::unix::fs::PermissionsExt;
    if path.exists() {
        return Ok(());
    }
    let mut tmp = tempfile_in(dir)?;
    tmp.1.write_all(body)?;
    tmp.1.sync_all()?;
    std::fs::set_permissions(&tmp.0, std::fs::Permissions::from_mode(0o644))?;
    std::fs::rename(&tmp.0, path)?;
    Ok(())
}

fn tempfile_in(dir: &std::path::Path) -> std::io::Result<(std::path::PathBuf, std::fs::File)> {
    let name = format!(".tmp-{}", random_hex(8)?);
    let p = dir.join(name);
    let f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(&p)?;
    Ok((p, f))
}

// ---------------------------------------------------------------------------------------------
// Runs

/// One input of a run.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct RunInput {
    pub input_id: String,
    pub sha256: String,
}

/// The verified artifact (status `ok` only).
#[derive(Debug, Serialize, ToSchema)]
pub struct ArtifactView {
    pub media_type: String,
    pub bytes: u64,
    pub sha256: String,
    /// The artifact itself when its media type is JSON.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<Object>)]
    pub json: Option<Value>,
    /// The artifact, base64, for other media types.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub base64: Option<String>,
}

/// A run record.
#[derive(Debug, Serialize, ToSchema)]
pub struct RunView {
    pub request_id: String,
    pub task: String,
    /// The short-lived job id this run was issued.
    pub job_id: String,
    /// When the job id expires (RFC 3339); a job not started by then is `expired`.
    pub job_expires_at: String,
    /// `queued`, `running`, `ok`, `exit_nonzero`, `signaled`, `timeout`, `memory_limit`,
    /// `output_rejected`, `setup_error`, `expired`, `unknown` or `abandoned`.
    #[schema(value_type = String)]
    pub status: RunState,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    pub actor: String,
    pub created_at: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub started_at: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub finished_at: Option<String>,
    pub inputs: Vec<RunInput>,
    /// Present for status `ok` only: only verified output leaves.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub artifact: Option<ArtifactView>,
    /// Signed receipt (DSSE envelope of an in-toto statement).
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<Object>)]
    pub receipt: Option<Value>,
    /// The run report (`agentjail report --schema`).
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<Object>)]
    pub report: Option<Value>,
    /// True once retention deleted the artifact, receipt and report.
    pub outputs_deleted: bool,
    /// Digest of what this request runs (its manifest without the attempt's job id and expiry,
    /// with the output schema), fixed at admission; a retry runs only under the same digest.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub manifest_digest: Option<String>,
}

/// The media type of `task`'s artifact (`application/octet-stream` once the task is gone).
fn output_media_type(state: &AppState, task: &str) -> String {
    state
        .inner
        .config
        .tasks
        .get(task)
        .map(|t| t.output.media_type.clone())
        .unwrap_or_else(|| "application/octet-stream".into())
}

/// A run record as callers see it.
pub(crate) fn view(state: &AppState, r: &RunRow) -> RunView {
    let media_type = output_media_type(state, &r.task);
    let artifact = match (&r.artifact, r.status) {
        (Some(a), RunState::Ok) => {
            let is_json = media_type == "application/json" || media_type.ends_with("+json");
            let json = if is_json {
                serde_json::from_slice(a).ok()
            } else {
                None
            };
            Some(ArtifactView {
                media_type,
                bytes: a.len() as u64,
                sha256: r.artifact_sha256.clone().unwrap_or_default(),
                base64: if json.is_none() {
                    Some(base64::engine::general_purpose::STANDARD.encode(a))
                } else {
                    None
                },
                json,
            })
        }
        _ => None,
    };
    let report = r
        .report
        .as_deref()
        .and_then(|s| serde_json::from_str::<Value>(s).ok())
        .map(|mut v| {
            // A setup error's message can name host paths of the service: it stays in the log.
            if let Some(e) = v.get_mut("error")
                && !e.is_null()
            {
                *e = Value::from("the run could not be set up; the details are in the service log");
            }
            v
        });
    RunView {
        request_id: r.request_id.clone(),
        task: r.task.clone(),
        job_id: r.job_id.clone(),
        job_expires_at: ts(r.job_expires_at),
        status: r.status,
        reason: r.reason.clone(),
        actor: r.actor.clone(),
        created_at: ts(r.created_at),
        started_at: r.started_at.map(ts),
        finished_at: r.finished_at.map(ts),
        inputs: serde_json::from_str(&r.inputs).unwrap_or_default(),
        artifact,
        receipt: r
            .receipt
            .as_deref()
            .and_then(|s| serde_json::from_str(s).ok()),
        report,
        outputs_deleted: r.outputs_deleted,
        manifest_digest: r.manifest_digest.clone(),
    }
}

/// Policy, execute-once, admission and the run itself: everything `POST /v1/runs` does after
/// parsing. Shared with the MCP task tools, so both front doors take the same path. Refusals
/// are counted and audited (`run_request`); returns the run record (final when `wait` and the
/// run was not cancelled). `cancel` (MCP cancellation) kills the run's `agentjail run` process.
pub(crate) async fn submit(
    state: &AppState,
    caller: &Caller,
    req: RunRequest,
    wait: bool,
    cancel: Option<CancellationToken>,
) -> Result<RunRow, Failure> {
    let mut ev = caller.event("run_request");
    if let Err(r) = policy::check_request_id(&req.request_id) {
        return Err(deny(state, caller, ev, r).await);
    }
    ev.request_id = Some(req.request_id.clone());
    // A recorded request_id is answered from the record (or refused if the body differs) before
    // any other check: execute-once holds even after its inputs expired or the config changed.
    let req = req.normalized();
    let body_sha = req.body_sha256();
    if let Some(existing) = state
        .store()
        .get_run(&caller.tenant, &req.request_id)
        .await?
    {
        return replay(
            state,
            caller,
            ev,
            existing,
            &body_sha,
            wait,
            cancel.as_ref(),
        )
        .await;
    }
    // The audit record names the task once the name is one (known or not).
    if crate::config::is_name(&req.task) {
        ev.task = Some(req.task.clone());
    }
    let checked = match policy::check_request(&state.inner.config, caller, &req) {
        Ok(c) => c,
        Err(r) => return Err(deny(state, caller, ev, r).await),
    };
    let rows = state
        .store()
        .get_inputs(&caller.tenant, checked.input_ids())
        .await?;
    let admitted = match checked.admit(rows) {
        Ok(a) => a,
        Err(r) => return Err(deny(state, caller, ev, r).await),
    };
    let task = admitted.task;

    // Execute once: the insert is atomic; a racing duplicate finds the other's record.
    let admission = Admission::try_take(state);
    let t = now();
    let job_id = format!("job_{}", random_hex(16).map_err(|_| Failure::Internal)?);
    let run_inputs: Vec<RunInput> = admitted
        .inputs
        .iter()
        .map(|r| RunInput {
            input_id: r.id.clone(),
            sha256: format!("sha256:{}", r.sha256),
        })
        .collect();
    let row = RunRow {
        tenant: caller.tenant.clone(),
        request_id: req.request_id.clone(),
        body_sha256: body_sha.clone(),
        task: req.task.clone(),
        actor: caller.actor.clone(),
        job_id: job_id.clone(),
        job_expires_at: t + state.inner.config.server.job_ttl_seconds as i64,
        status: RunState::Queued,
        reason: None,
        created_at: t,
        started_at: None,
        finished_at: None,
        inputs: serde_json::to_string(&run_inputs).unwrap_or_default(),
        report: None,
        receipt: None,
        artifact: None,
        artifact_sha256: None,
        outputs_expire_at: t + task.retention.outputs_seconds as i64,
        logs_expire_at: t + task.retention.logs_seconds as i64,
        outputs_deleted: false,
        args: serde_json::to_string(&admitted.args).unwrap_or_else(|_| "[]".into()),
        manifest_digest: Some(
            runner::manifest_digest(
                state,
                &req.task,
                task,
                &req.request_id,
                &admitted.inputs,
                &admitted.args,
            )
            .map_err(|_| Failure::Internal)?,
        ),
    };
    if let Some(queue) = &state.inner.queue {
        drop(admission);
        return enqueue(state, queue, caller, ev, row, admitted, wait, cancel).await;
    }
    let admitted_slot = admission.is_some();
    let inserted = if admitted_slot {
        state.store().insert_run(row.clone()).await?
    } else {
        // Full: still answer replays; refuse only new work.
        match state.store().get_run(&row.tenant, &row.request_id).await? {
            Some(r) => Insert::Exists(Box::new(r)),
            None => Insert::Inserted,
        }
    };
    match inserted {
        Insert::Exists(existing) => {
            drop(admission);
            return replay(
                state,
                caller,
                ev,
                *existing,
                &body_sha,
                wait,
                cancel.as_ref(),
            )
            .await;
        }
        Insert::Inserted if !admitted_slot => {
            metrics::counter!("agentjail_overload_refusals_total").increment(1);
            return Err(deny(state, caller, ev, Refusal::Overloaded).await);
        }
        Insert::Inserted => {}
    }
    state
        .store()
        .audit(Event {
            event: "run_accepted",
            decision: Some("allow"),
            job_id: Some(job_id.clone()),
            ..ev
        })
        .await;
    let job = Job {
        tenant: caller.tenant.clone(),
        actor: caller.actor.clone(),
        request_id: req.request_id.clone(),
        task: req.task.clone(),
        job_id,
        job_expires_at: row.job_expires_at,
        inputs: admitted.inputs,
        code: admitted.code,
        args: admitted.args,
        cancel,
        lease: None,
    };
    let Some(admission) = admission else {
        return Err(Failure::Internal);
    };
    let handle = tokio::spawn(runner::execute(state.clone(), job, Some(admission), None));
    if wait {
        // Until the run ends, or the HTTP client that would read the answer is gone.
        match CALLER_GONE.try_with(CancellationToken::clone) {
            Ok(gone) => {
                tokio::select! {
                    _ = handle => {}
                    _ = gone.cancelled() => {}
                }
            }
            Err(_) => {
                let _ = handle.await;
            }
        }
    }
    state
        .store()
        .get_run(&caller.tenant, &req.request_id)
        .await?
        .ok_or(Failure::Internal)
}

/// [`submit`] on PostgreSQL: the run is recorded `queued` with what an executor needs to run
/// it, and any node's executor claims it (crate::execution::fleet). The queue is bounded cluster-wide by
/// `max_queued_runs` (unclaimed runs); beyond it new work is refused as overloaded, replays are
/// still answered. `wait` polls the record until it is final; `cancel` (MCP) stops the wait
/// only: the run is on another node's executor.
#[allow(clippy::too_many_arguments)]
async fn enqueue(
    state: &AppState,
    queue: &crate::storage::pg::PgStore,
    caller: &Caller,
    ev: Event,
    row: RunRow,
    admitted: policy::Admitted<'_>,
    wait: bool,
    cancel: Option<CancellationToken>,
) -> Result<RunRow, Failure> {
    let body_sha = row.body_sha256.clone();
    let full = queue.queue_depth().await? >= state.inner.config.server.max_queued_runs as i64;
    let inserted = if full {
        match state.store().get_run(&row.tenant, &row.request_id).await? {
            Some(r) => Insert::Exists(Box::new(r)),
            None => {
                metrics::counter!("agentjail_overload_refusals_total").increment(1);
                return Err(deny(state, caller, ev, Refusal::Overloaded).await);
            }
        }
    } else {
        let spec = crate::storage::pg::JobSpec {
            inputs: admitted.inputs,
            code: admitted.code,
        };
        // The run and its `run_accepted` commit together.
        let accepted = Event {
            event: "run_accepted",
            decision: Some("allow"),
            job_id: Some(row.job_id.clone()),
            ..ev.clone()
        };
        queue
            .enqueue(row.clone(), &spec, &admitted.task.labels, &accepted)
            .await?
    };
    if let Insert::Exists(existing) = inserted {
        return replay(
            state,
            caller,
            ev,
            *existing,
            &body_sha,
            wait,
            cancel.as_ref(),
        )
        .await;
    }
    if wait {
        wait_for(state, &row.tenant, &row.request_id, cancel.as_ref()).await
    } else {
        state
            .store()
            .get_run(&row.tenant, &row.request_id)
            .await?
            .ok_or(Failure::Internal)
    }
}

/// Answers a repeated request_id: the recorded run for the same body, a conflict for another.
async fn replay(
    state: &AppState,
    caller: &Caller,
    ev: Event,
    existing: RunRow,
    body_sha: &str,
    wait: bool,
    cancel: Option<&CancellationToken>,
) -> Result<RunRow, Failure> {
    if let Err(r) = policy::check_replay(&existing.body_sha256, body_sha) {
        return Err(deny(state, caller, ev, r).await);
    }
    metrics::counter!("agentjail_replays_total").increment(1);
    state
        .store()
        .audit(Event {
            event: "run_replay",
            decision: Some("allow"),
            job_id: Some(existing.job_id.clone()),
            status: Some(existing.status.into()),
            task: Some(existing.task.clone()),
            ..ev
        })
        .await;
    if wait && !existing.status.is_terminal() {
        wait_for(state, &caller.tenant, &existing.request_id, cancel).await
    } else {
        Ok(existing)
    }
}

tokio::task_local! {
    /// Cancelled when the HTTP client of the request being handled has gone away (set by the
    /// API's detaching layer): a handler that goes on to finish its writes stops *waiting*
    /// for a run nobody will read the answer of. The run goes on.
    pub(crate) static CALLER_GONE: CancellationToken;
}

/// Whether the HTTP client of the request being handled has gone away.
fn caller_gone() -> bool {
    CALLER_GONE.try_with(|t| t.is_cancelled()).unwrap_or(false)
}

/// Polls the record until it is final (a replay of a run still in flight).
/// A cancelled waiter (MCP cancellation of a replayed call, or an HTTP client that left)
/// stops waiting; the run goes on.
async fn wait_for(
    state: &AppState,
    tenant: &str,
    request_id: &str,
    cancel: Option<&CancellationToken>,
) -> Result<RunRow, Failure> {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(3600);
    loop {
        let row = state
            .store()
            .get_run(tenant, request_id)
            .await?
            .ok_or(Failure::Internal)?;
        if row.status.is_terminal()
            || std::time::Instant::now() > deadline
            || cancel.is_some_and(|c| c.is_cancelled())
            || caller_gone()
        {
            return Ok(row);
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
}

/// The run `request_id` of the caller's tenant, audited as `event` (`run_read` …).
pub(crate) async fn get(
    state: &AppState,
    caller: &Caller,
    request_id: &str,
    event: &'static str,
) -> Result<RunRow, Failure> {
    get_checked(state, caller, request_id, event, |_| Ok(())).await
}

/// [`get`], with a check of the record: a refusal by `check` is audited as a denial (not as
/// an allowed read).
async fn get_checked(
    state: &AppState,
    caller: &Caller,
    request_id: &str,
    event: &'static str,
    check: impl FnOnce(&RunRow) -> Result<(), Refusal>,
) -> Result<RunRow, Failure> {
    let mut ev = caller.event(event);
    if !policy::valid_request_id(request_id) {
        return Err(deny(state, caller, ev, Refusal::NoSuchRun).await);
    }
    ev.request_id = Some(request_id.to_string());
    let row = state.store().get_run(&caller.tenant, request_id).await?;
    match row {
        Some(r) => {
            if let Err(e) = check(&r) {
                ev.task = Some(r.task.clone());
                return Err(deny(state, caller, ev, e).await);
            }
            state
                .store()
                .audit(Event {
                    decision: Some("allow"),
                    task: Some(r.task.clone()),
                    ..ev
                })
                .await;
            Ok(r)
        }
        None => Err(deny(state, caller, ev, Refusal::NoSuchRun).await),
    }
}

/// A verified artifact: its bytes, the task's media type and `sha256:<hex>`.
#[derive(Debug)]
pub struct Artifact {
    pub bytes: Vec<u8>,
    pub media_type: String,
    pub sha256: Option<String>,
}

/// The verified artifact of a run (state `ok` only), audited as `artifact_read`.
pub(crate) async fn artifact(
    state: &AppState,
    caller: &Caller,
    request_id: &str,
) -> Result<Artifact, Failure> {
    let r = get_checked(state, caller, request_id, "artifact_read", |r| {
        policy::check_artifact(r.status, r.artifact.is_some(), r.outputs_deleted)
    })
    .await?;
    match (r.artifact, r.status) {
        (Some(a), RunState::Ok) => Ok(Artifact {
            bytes: a,
            media_type: output_media_type(state, &r.task),
            sha256: r.artifact_sha256,
        }),
        _ => Err(Failure::Refused(Refusal::NoArtifact { state: r.status })),
    }
}

/// The signed receipt of a run (a DSSE envelope), audited as `receipt_read`.
pub(crate) async fn receipt(
    state: &AppState,
    caller: &Caller,
    request_id: &str,
) -> Result<Value, Failure> {
    let parse = |r: &RunRow| {
        r.receipt
            .as_deref()
            .and_then(|s| serde_json::from_str::<Value>(s).ok())
    };
    let r = get_checked(state, caller, request_id, "receipt_read", |r| {
        policy::check_receipt(r.status, parse(r).is_some(), r.outputs_deleted)
    })
    .await?;
    parse(&r).ok_or(Failure::Refused(Refusal::NoReceipt { state: r.status }))
}

/// Reconcile decision.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum ReconcileAction {
    Retry,
    Abandon,
}

/// An operator's decision on an `unknown` run: abandon it, or retry it (network-free tasks
/// with a fixed program only) and wait for its end. Returns the record afterwards.
/// The answer to a reconcile that found the run no longer `unknown` when it came to change it:
/// a concurrent reconcile decided first. The refusal names what that one did (read from the
/// run now) and is audited (`reconcile`, `deny`).
async fn lost_reconcile(state: &AppState, caller: &Caller, request_id: &str) -> Failure {
    let mut ev = caller.event("reconcile");
    ev.request_id = Some(request_id.to_string());
    let decision = match state.store().get_run(&caller.tenant, request_id).await {
        Ok(Some(r)) => {
            ev.task = Some(r.task.clone());
            match r.status {
                RunState::Abandoned => "abandoned it".to_string(),
                s => format!("retried it as job {} (now `{s}`)", r.job_id),
            }
        }
        _ => "changed it".to_string(),
    };
    deny(state, caller, ev, Refusal::ReconcileLost { decision }).await
}

pub(crate) async fn reconcile(
    state: &AppState,
    caller: &Caller,
    request_id: &str,
    action: ReconcileAction,
) -> Result<RunRow, Failure> {
    let mut ev = caller.event("reconcile");
    let r = get(state, caller, request_id, "run_read").await?;
    ev.request_id = Some(r.request_id.clone());
    ev.task = Some(r.task.clone());
    if let Err(e) = policy::check_reconcile(caller, r.status) {
        return Err(deny(state, caller, ev, e).await);
    }
    let task = state.inner.config.tasks.get(&r.task).cloned();
    let (tenant, rid) = (caller.tenant.as_str(), r.request_id.as_str());
    if action == ReconcileAction::Abandon {
        // The change and its record land together (see `Store::reconcile`).
        let record = Event {
            decision: Some("allow"),
            reason: Some("abandon".into()),
            status: Some(RunState::Abandoned.into()),
            ..ev
        };
        if !state
            .store()
            .reconcile(tenant, rid, None, now(), record)
            .await?
        {
            return Err(lost_reconcile(state, caller, request_id).await);
        }
    } else {
        let task = match policy::check_retry(task.as_ref()) {
            Ok(t) => t,
            Err(e) => return Err(deny(state, caller, ev, e).await),
        };
        let inputs: Vec<RunInput> = serde_json::from_str(&r.inputs).unwrap_or_default();
        let ids: Vec<String> = inputs.iter().map(|i| i.input_id.clone()).collect();
        let rows = state.store().get_inputs(tenant, &ids).await?;
        let rows = match policy::check_retry_inputs(rows) {
            Ok(rows) => rows,
            Err(e) => return Err(deny(state, caller, ev, e).await),
        };
        // The same request again: its `args` as recorded (the rest comes from the task type).
        let Ok(args) = serde_json::from_str::<Vec<String>>(&r.args) else {
            return Err(Failure::Internal);
        };
        if let Err(e) = policy::check_retry_code(task) {
            return Err(deny(state, caller, ev, e).await);
        }
        // The same run, or none: the manifest rebuilt now must be the first attempt's.
        let rebuilt = runner::manifest_digest(state, &r.task, task, &r.request_id, &rows, &args)
            .map_err(|_| Failure::Internal)?;
        if let Err(e) = policy::check_retry_digest(&r.task, r.manifest_digest.as_deref(), &rebuilt)
        {
            return Err(deny(state, caller, ev, e).await);
        }
        let job_id = format!("job_{}", random_hex(16).map_err(|_| Failure::Internal)?);
        let expires = now() + state.inner.config.server.job_ttl_seconds as i64;
        let record = |ev: Event| Event {
            decision: Some("allow"),
            reason: Some("retry".into()),
            job_id: Some(job_id.clone()),
            ..ev
        };
        if let Some(queue) = &state.inner.queue {
            // On PostgreSQL the retry goes back on the queue (any executor claims it), its
            // record in the same transaction.
            let spec = crate::storage::pg::JobSpec {
                inputs: rows,
                code: None,
            };
            if !queue
                .requeue(tenant, rid, (job_id.clone(), expires), &spec, &record(ev))
                .await?
            {
                return Err(lost_reconcile(state, caller, request_id).await);
            }
            return state
                .store()
                .get_run(&caller.tenant, &r.request_id)
                .await?
                .ok_or(Failure::Internal);
        }
        let Some(admission) = Admission::try_take(state) else {
            return Err(deny(state, caller, ev, Refusal::Overloaded).await);
        };
        let ok = state
            .store()
            .reconcile(
                tenant,
                rid,
                Some((job_id.clone(), expires)),
                now(),
                record(ev),
            )
            .await?;
        if !ok {
            drop(admission);
            return Err(lost_reconcile(state, caller, request_id).await);
        }
        {
            let job = Job {
                tenant: caller.tenant.clone(),
                actor: r.actor.clone(),
                request_id: r.request_id.clone(),
                task: r.task.clone(),
                job_id,
                job_expires_at: expires,
                inputs: rows,
                code: None,
                args,
                cancel: None,
                lease: None,
            };
            let _ = tokio::spawn(runner::execute(state.clone(), job, Some(admission), None)).await;
        }
    }
    state
        .store()
        .get_run(&caller.tenant, &r.request_id)
        .await?
        .ok_or(Failure::Internal)
}

// ---------------------------------------------------------------------------------------------
// Catalogue

/// One input of a task, as the catalogue shows it.
#[derive(Debug, Serialize, ToSchema)]
pub struct TaskInputView {
    pub mount: String,
    pub media_types: Vec<String>,
    pub max_bytes: u64,
}

/// A task type, as an agent needs it.
#[derive(Debug, Serialize, ToSchema)]
pub struct TaskView {
    pub name: String,
    pub description: String,
    /// Whether `code` is required (`allowed`) or refused (`forbidden`).
    pub code: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub code_mount: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_code_bytes: Option<usize>,
    pub max_args: usize,
    pub inputs: Vec<TaskInputView>,
    pub output_path: String,
    pub output_media_type: String,
    pub output_max_bytes: u64,
    /// JSON Schema the artifact satisfies.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<Object>)]
    pub output_schema: Option<Value>,
    /// `deny`, or the allowlist.
    #[schema(value_type = Value)]
    pub network: Value,
    #[schema(value_type = Object)]
    pub limits: Value,
    /// JSON Schema of a `POST /v1/runs` body for this task.
    #[schema(value_type = Object)]
    pub request_schema: Value,
}

/// The tasks `caller` may use, by name.
pub(crate) fn usable_tasks<'a>(
    state: &'a AppState,
    caller: &'a Caller,
) -> impl Iterator<Item = (&'a String, &'a crate::config::Task)> + 'a {
    let cfg = &state.inner.config;
    cfg.tasks
        .iter()
        .filter(move |(_, t)| policy::may_use(cfg, caller, t))
}

/// The catalogue as the caller sees it: the tasks it may use, with their schemas. Shared by
/// `GET /v1/tasks` and the MCP tool list.
pub(crate) fn task_views(state: &AppState, caller: &Caller) -> Vec<TaskView> {
    usable_tasks(state, caller)
        .map(|(name, t)| {
            let allowed = t.code == CodePolicy::Allowed;
            let mut props = serde_json::json!({
                "request_id": {"type": "string", "pattern": "^[A-Za-z0-9._:-]{1,128}$"},
                "task": {"const": name},
                "inputs": {"type": "array", "items": {"type": "string", "pattern": "^in_[0-9a-f]{32}$"},
                           "minItems": t.inputs.len(), "maxItems": t.inputs.len()},
            });
            // A task without inputs is called without `inputs` (an omitted one is `[]`).
            let mut required = vec!["request_id", "task"];
            if !t.inputs.is_empty() {
                required.push("inputs");
            }
            if allowed {
                props["code"] = serde_json::json!({"type": "string", "maxLength": t.max_code_bytes});
                required.push("code");
            }
            if t.max_args > 0 {
                props["args"] = serde_json::json!({"type": "array", "maxItems": t.max_args, "items": {"type": "string", "maxLength": 256}});
            }
            TaskView {
                name: name.clone(),
                description: t.description.clone(),
                code: if allowed { "allowed" } else { "forbidden" }.into(),
                code_mount: allowed.then(|| t.code_mount.clone()),
                max_code_bytes: allowed.then_some(t.max_code_bytes),
                max_args: t.max_args,
                inputs: t
                    .inputs
                    .iter()
                    .map(|s| TaskInputView {
                        mount: s.mount.clone(),
                        media_types: s.media_types.clone(),
                        max_bytes: s.max_bytes,
                    })
                    .collect(),
                output_path: t.output.path.clone(),
                output_media_type: t.output.media_type.clone(),
                output_max_bytes: t.output.max_bytes,
                output_schema: t.output.schema.as_ref().and_then(|s| s.value().ok()),
                network: serde_json::to_value(&t.network).unwrap_or_default(),
                limits: serde_json::to_value(t.limits).unwrap_or_default(),
                request_schema: serde_json::json!({
                    "type": "object", "additionalProperties": false,
                    "required": required, "properties": props,
                }),
            }
        })
        .collect()
}
