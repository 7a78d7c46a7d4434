//! The policy step of request → policy → manifest, in one place and free of I/O: who may use
//! which task, what a run request may carry, which inputs fit the task, what an upload and a
//! reconcile may do, and the manifest an admitted run implies. Every "no" is a [`Refusal`]: a
//! typed reason with a stable machine code ([`Refusal::code`], the suffix of the HTTP problem
//! type) and a text for people ([`Refusal::detail`]). The service layer ([`crate::service`])
//! asks the store for what policy needs (a recorded run, the inputs' records) and applies the
//! answers; the transports (HTTP in [`crate::doors::api`], MCP in [`crate::doors::mcp`]) map refusals to
//! their own form. Table-tested below: every refusal is reached by some request.

use std::path::Path;

use agentjail_manifest::{InlineInput, Input, Manifest, Mode, Network};
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use crate::config::{CodePolicy, Config, Task, is_name};
use crate::run_state::RunState;
use crate::storage::audit::Event;
use crate::storage::db::InputRow;

/// The authenticated caller.
#[derive(Debug, Clone)]
pub struct Caller {
    pub actor: String,
    pub tenant: String,
    pub operator: bool,
}

impl Caller {
    /// An audit record of `event` by this caller.
    pub(crate) fn event(&self, event: &'static str) -> Event {
        Event {
            event,
            actor: Some(self.actor.clone()),
            tenant: Some(self.tenant.clone()),
            ..Default::default()
        }
    }
}

/// A run request. Unknown fields are refused: the request cannot name a host path, image,
/// mount, limit or network destination; those come from the task type.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct RunRequest {
    /// The caller's idempotency key: 1-128 of `A-Z a-z 0-9 . _ : -`. A request_id executes at most
    /// once per tenant.
    #[schema(
        pattern = r"^(?:[A-Za-z0-9._:-]*[A-Za-z0-9_:-][A-Za-z0-9._:-]*|\.{3,})$",
        min_length = 1,
        max_length = 128
    )]
    pub request_id: String,
    /// Task type name (see `GET /v1/tasks`).
    #[schema(pattern = r"^[a-z0-9_-]{1,64}$")]
    pub task: String,
    /// Input ids from `POST /v1/inputs`, in the task's input order. May be omitted for a task
    /// without inputs (the same request as `[]`).
    #[serde(default)]
    #[schema(default = json!([]))]
    pub inputs: Vec<String>,
    /// Model-proposed code (tasks with `code: allowed` only; required there).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub code: Option<String>,
    /// Extra command arguments (only as many as the task's `max_args`; no paths).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub args: Option<Vec<String>>,
}

impl RunRequest {
    /// The request in its canonical form: `"args": []` is the same request as no `args`.
    pub fn normalized(mut self) -> RunRequest {
        if self.args.as_ref().is_some_and(Vec::is_empty) {
            self.args = None;
        }
        self
    }

    /// The digest that makes a repeated request_id a replay (same body) or a conflict:
    /// sha256 of the canonical JSON (RFC 8785) of the normalized request. The request holds
    /// strings only, so canonicalisation cannot fail (it fails only on non-finite numbers).
    pub fn body_sha256(&self) -> String {
        crate::config::sha256_hex(&serde_jcs::to_vec(self).unwrap_or_default())
    }
}

/// Why the service says no. [`Refusal::code`] is stable (clients and the audit log match on
/// it); [`Refusal::detail`] is for people and never carries internal detail.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Refusal {
    // ----- a run request
    /// The request_id is not 1-128 of `A-Z a-z 0-9 . _ : -`, or is `.`/`..`.
    BadRequestId,
    /// No such task (or not a task name at all).
    UnknownTask,
    /// The actor (and its tenant) is not among the task's allowed actors/tenants.
    TaskNotPermitted,
    /// Code for a task that runs a fixed program.
    CodeNotAccepted,
    /// A task that runs model-proposed code, without code.
    CodeRequired,
    /// Code longer than the task allows, or with a NUL byte.
    CodeTooLarge { max: usize },
    /// More args than the task's `max_args`.
    TooManyArgs { max: usize },
    /// args[index] looks like a path, has a control character or is too long.
    BadArg { index: usize },
    /// Not as many inputs as the task has slots.
    InputCount { expected: usize },
    /// inputs[index] is not an input id.
    BadInputId { index: usize },
    /// inputs[index] does not exist in the caller's tenant (missing and foreign are alike).
    NoSuchInput { index: usize },
    /// inputs[index] has a media type the slot does not accept.
    InputMediaType {
        index: usize,
        media_type: String,
        accepted: Vec<String>,
    },
    /// inputs[index] is larger than the slot allows.
    InputTooLarge { index: usize, max: u64 },
    /// The request_id was recorded with a different body.
    RequestIdConflict,
    /// Every run slot and the queue are full.
    Overloaded,
    // ----- an upload
    /// The file name is not 1-128 of `A-Z a-z 0-9 . _ -` or starts with `.`.
    BadFileName,
    /// The media type does not look like type/subtype.
    BadMediaType,
    /// The content is larger than `server.max_input_bytes`.
    UploadTooLarge { max: u64 },
    // ----- a recorded run
    /// No such run in the caller's tenant.
    NoSuchRun,
    /// Retention deleted the run's outputs.
    OutputsExpired,
    /// The run has no verified artifact (its state is not `ok`).
    NoArtifact { state: RunState },
    /// The run has no receipt.
    NoReceipt { state: RunState },
    /// The run has no log: it has not ended, or its command never started.
    NoLog { state: RunState },
    /// Retention deleted the run's logs.
    LogsExpired,
    /// Only a queued or running run is cancelled; this one ended otherwise.
    NotCancellable { state: RunState },
    /// Only the actor that submitted a run, or an operator, cancels it.
    NotYourRun,
    /// The task shows none of this stream (`stdout_bytes` / `stderr_bytes` = 0).
    StreamNotShown { stream: &'static str },
    // ----- reconcile
    /// Only operators reconcile.
    NotOperator,
    /// Only operators list another tenant's runs (or every tenant's).
    ListOtherTenant,
    /// Only `unknown` runs are reconciled.
    NotUnknown { state: RunState },
    /// A concurrent reconcile of the run decided first (`decision`: what it did); this one
    /// changed nothing.
    ReconcileLost { decision: String },
    /// The run's task was removed from the configuration.
    TaskGone,
    /// A task with network access cannot be retried (an external effect may have happened).
    RetryWithNetwork,
    /// An input of the run was deleted by retention.
    InputExpired,
    /// The run's code is not kept, so it cannot run again.
    CodeNotKept,
    /// The manifest a retry would build differs from the first attempt's: the task type
    /// changed, so it would be a different run.
    TaskChanged {
        task: String,
        first: String,
        rebuilt: String,
    },
    /// The first attempt's manifest digest was not recorded (an older version ran it).
    NoManifestDigest,
    // ----- transport-level refusals, audited like the rest
    /// The request is malformed in a way the transport found (query, body, JSON).
    Malformed(String),
    /// The body was not sent as `application/json`.
    NotJson,
    /// The request body is larger than `server.max_request_bytes`.
    RequestTooLarge { max: u64 },
    // ----- sessions (docs/api.md, "Sessions")
    /// No such session for this caller (missing, or another tenant's or actor's: the same).
    NoSuchSession,
    /// No such cell in the session (a fork's `cell`).
    NoSuchCell,
    /// The task cannot be opened as a session (it takes no code, or its sessions are off).
    NotASessionTask,
    /// The session's previous cell is still queued or running.
    CellInProgress { cell: u64 },
    /// The session was ended (`DELETE`).
    SessionClosed,
    /// The session's lifetime has passed.
    SessionExpired,
    /// The session ran as many cells as its task allows.
    SessionFull { max: u64 },
    /// The session's checkpoint no longer matches its stored bytes, or is missing.
    CheckpointInvalid(String),
    /// A fork from a cell whose checkpoint is no longer kept (not one of the session's most
    /// recent `keep` cells).
    CheckpointGone { cell: u64, keep: u64 },
    /// The service's store keeps no sessions (not answered by this version: both stores do).
    SessionsUnsupported,
}

impl Refusal {
    /// The stable machine code (the suffix of the problem type URI over HTTP, `error` in an
    /// MCP error result, the prefix of the audit record's `reason`, the metric's `reason`).
    pub fn code(&self) -> &'static str {
        use Refusal::*;
        match self {
            BadRequestId
            | CodeRequired
            | CodeTooLarge { .. }
            | TooManyArgs { .. }
            | BadArg { .. }
            | BadInputId { .. }
            | BadFileName
            | BadMediaType
            | Malformed(_) => "invalid-request",
            UnknownTask => "unknown-task",
            TaskNotPermitted
            | CodeNotAccepted
            | NotOperator
            | ListOtherTenant
            | NotYourRun
            | StreamNotShown { .. }
            | TaskGone
            | RetryWithNetwork => "forbidden",
            NoSuchInput { .. } | NoSuchRun => "not-found",
            InputCount { .. } | InputMediaType { .. } | InputTooLarge { .. } => "input-mismatch",
            RequestIdConflict => "request-id-conflict",
            Overloaded => "overloaded",
            UploadTooLarge { .. } | RequestTooLarge { .. } => "too-large",
            OutputsExpired => "outputs-expired",
            NoArtifact { .. } => "no-verified-artifact",
            NoReceipt { .. } => "no-receipt",
            NoLog { .. } => "no-log",
            LogsExpired => "logs-expired",
            NotCancellable { .. } => "not-cancellable",
            NotUnknown { .. }
            | ReconcileLost { .. }
            | InputExpired
            | CodeNotKept
            | NoManifestDigest => "not-reconcilable",
            TaskChanged { .. } => "task-changed",
            NotJson => "unsupported-media-type",
            NoSuchSession | NoSuchCell => "not-found",
            NotASessionTask => "forbidden",
            CellInProgress { .. } => "cell-in-progress",
            SessionClosed => "session-closed",
            SessionExpired => "session-expired",
            SessionFull { .. } => "session-cell-limit",
            CheckpointInvalid(_) => "checkpoint-invalid",
            CheckpointGone { .. } => "checkpoint-gone",
            SessionsUnsupported => "sessions-unsupported",
        }
    }

    /// What went wrong, for a person (one line; never internal detail).
    pub fn detail(&self) -> String {
        use Refusal::*;
        match self {
            BadRequestId => {
                "`request_id` must be 1-128 of A-Z a-z 0-9 . _ : -, and not `.` or `..`".into()
            }
            UnknownTask => "no such task".into(),
            TaskNotPermitted => "the actor may not use this task".into(),
            CodeNotAccepted => "this task runs a fixed program and accepts no code".into(),
            CodeRequired => "this task needs `code`".into(),
            CodeTooLarge { max } => format!("`code` must be at most {max} bytes without NUL"),
            TooManyArgs { max } => format!("this task takes at most {max} args"),
            BadArg { index } => format!(
                "args[{index}]: at most 256 characters, no control characters, not a path (no leading `/`, no `..`)"
            ),
            InputCount { expected } => format!("this task takes exactly {expected} input(s)"),
            BadInputId { index } => {
                format!("inputs[{index}]: not an input id (ids come from POST /v1/inputs)")
            }
            NoSuchInput { index } => format!("inputs[{index}]: no such input"),
            InputMediaType {
                index,
                media_type,
                accepted,
            } => format!("inputs[{index}]: media type {media_type} is not one of {accepted:?}"),
            InputTooLarge { index, max } => format!("inputs[{index}]: larger than {max} bytes"),
            RequestIdConflict => {
                "this request_id was used with a different request; use a new request_id".into()
            }
            Overloaded => "all run slots and the queue are full; retry later".into(),
            BadFileName => {
                "`name` must be 1-128 of A-Z a-z 0-9 . _ - and not start with `.`; it is never a path"
                    .into()
            }
            BadMediaType => "`media_type` must look like type/subtype".into(),
            UploadTooLarge { max } => format!("inputs are at most {max} bytes"),
            NoSuchRun => "no such run".into(),
            OutputsExpired => "the run's outputs were deleted by the task's retention".into(),
            NoArtifact { state } => format!(
                "the run's status is `{state}`; only a run with status `ok` has a verified artifact"
            ),
            NoReceipt { state } => format!("the run's status is `{state}` and it has no receipt"),
            NoLog { state } => format!(
                "the run's status is `{state}`: it has not ended, or its command never started, so it has no log"
            ),
            LogsExpired => "the run's logs were deleted by the task's retention".into(),
            StreamNotShown { stream } => format!(
                "the task shows none of its {stream} (its {stream}_bytes is 0): only its verified output leaves"
            ),
            NotYourRun => {
                "only the actor that submitted the run, or an operator, may cancel it".into()
            }
            NotCancellable { state } => {
                format!("the run has ended (`{state}`); only a queued or running run is cancelled")
            }
            NotOperator => "only an operator may reconcile runs".into(),
            ListOtherTenant => "only an operator may list another tenant's runs".into(),
            NotUnknown { state } => format!(
                "only runs with status `unknown` are reconciled; this one is `{state}`"
            ),
            ReconcileLost { decision } => format!(
                "another reconcile of this run decided first: it {decision}; this one changed nothing"
            ),
            TaskGone => "the task no longer exists".into(),
            RetryWithNetwork => "the task has network access: an external effect may have happened, so it cannot be retried; abandon it".into(),
            InputExpired => "an input of the run was deleted by retention; abandon it".into(),
            CodeNotKept => {
                "the run's code is not kept; abandon it and submit a new request_id".into()
            }
            TaskChanged {
                task,
                first,
                rebuilt,
            } => format!(
                "the task type `{task}` changed since the first attempt: that attempt's manifest digest is {first}, a retry would build {rebuilt}; it would be a different run, so it is refused; abandon it and submit the request under a new request_id"
            ),
            NoManifestDigest => "the first attempt's manifest digest was not recorded (an older version recorded this run), so a retry cannot be shown to run the same manifest; abandon it".into(),
            Malformed(d) => d.clone(),
            NotJson => "send the request as application/json".into(),
            RequestTooLarge { max } => format!("requests are at most {max} bytes"),
            NoSuchSession => "no such session".into(),
            NoSuchCell => "no such cell in this session".into(),
            NotASessionTask => "this task cannot be opened as a session: it takes no code, or its configuration turns sessions off".into(),
            CellInProgress { cell } => format!(
                "cell {cell} of this session is still queued or running; cells run one at a time: wait for its end and submit again"
            ),
            SessionClosed => "the session was ended; it takes no more cells (open a new session to go on)".into(),
            SessionExpired => "the session's lifetime has passed; it takes no more cells".into(),
            SessionFull { max } => format!("the session ran its {max} cells, the task's limit"),
            CheckpointInvalid(d) => d.clone(),
            CheckpointGone { cell, keep } => format!(
                "cell {cell}'s checkpoint is no longer kept (a session keeps those of its {keep} most recent cells); fork from a later cell"
            ),
            SessionsUnsupported => "this service's store keeps no sessions".into(),
        }
    }

    /// Seconds after which a retry may succeed (overload only).
    pub fn retry_after(&self) -> Option<u64> {
        matches!(self, Refusal::Overloaded).then_some(5)
    }

    /// Whether the request itself is malformed (the caller must change it), as opposed to
    /// well-formed but refused.
    pub fn is_invalid_request(&self) -> bool {
        self.code() == "invalid-request"
    }
}

impl std::fmt::Display for Refusal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {}", self.code(), self.detail())
    }
}

// ---------------------------------------------------------------------------------------------
// Field syntax

/// A request_id: 1-128 of `A-Z a-z 0-9 . _ : -`, never `.` or `..` (they would be path
/// segments in `Location: /v1/runs/{request_id}`).
pub fn valid_request_id(s: &str) -> bool {
    !s.is_empty()
        && s != "."
        && s != ".."
        && s.len() <= 128
        && s.chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | ':' | '-'))
}

/// An input id as the service issues them: `in_` and 32 lower-case hex digits.
pub fn valid_input_id(s: &str) -> bool {
    s.len() == 35
        && s.starts_with("in_")
        && s[3..]
            .chars()
            .all(|c| c.is_ascii_hexdigit() && !c.is_ascii_uppercase())
}

/// A command argument: at most 256 bytes, no control character, not a path.
pub fn valid_arg(s: &str) -> bool {
    s.len() <= 256 && !s.starts_with('/') && !s.contains("..") && !s.chars().any(|c| c.is_control())
}

/// An upload's file name: for people, never a path.
pub fn valid_file_name(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 128
        && !s.starts_with('.')
        && s.chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-'))
}

/// A media type: `type/subtype` of RFC 6838 characters, at most 127 bytes.
/// The same rule as the configuration's media types.
pub fn valid_media_type(s: &str) -> bool {
    crate::config::is_media_type(s)
}

// ---------------------------------------------------------------------------------------------
// Decisions

/// Whether `caller` may use `task` (it sees it in the catalogue and may run it).
pub fn may_use(config: &Config, caller: &Caller, task: &Task) -> bool {
    config.may_use(&caller.actor, &caller.tenant, task)
}

/// The request_id check, which comes before everything else (a recorded request_id is
/// answered from its record, even after the configuration changed).
pub fn check_request_id(request_id: &str) -> Result<(), Refusal> {
    if valid_request_id(request_id) {
        Ok(())
    } else {
        Err(Refusal::BadRequestId)
    }
}

/// A repeated request_id: the recorded run for the same body, a conflict for another.
pub fn check_replay(recorded_body_sha256: &str, body_sha256: &str) -> Result<(), Refusal> {
    if recorded_body_sha256 == body_sha256 {
        Ok(())
    } else {
        Err(Refusal::RequestIdConflict)
    }
}

/// Everything about a new run request that needs no store: the task exists and the caller
/// may use it, code and args fit the task, and the inputs are as many well-formed ids as the
/// task has slots. The next step, [`Checked::admit`], needs the inputs' records.
pub fn check_request<'c, 'r>(
    config: &'c Config,
    caller: &Caller,
    req: &'r RunRequest,
) -> Result<Checked<'c, 'r>, Refusal> {
    if !is_name(&req.task) {
        return Err(Refusal::UnknownTask);
    }
    let (name, task) = config
        .tasks
        .get_key_value(&req.task)
        .ok_or(Refusal::UnknownTask)?;
    if !may_use(config, caller, task) {
        return Err(Refusal::TaskNotPermitted);
    }
    match (task.code, &req.code) {
        (CodePolicy::Forbidden, Some(_)) => return Err(Refusal::CodeNotAccepted),
        (CodePolicy::Allowed, None) => return Err(Refusal::CodeRequired),
        (CodePolicy::Allowed, Some(c)) if c.len() > task.max_code_bytes || c.contains('\0') => {
            return Err(Refusal::CodeTooLarge {
                max: task.max_code_bytes,
            });
        }
        _ => {}
    }
    let args = req.args.as_deref().unwrap_or_default();
    if args.len() > task.max_args {
        return Err(Refusal::TooManyArgs { max: task.max_args });
    }
    if let Some(index) = args.iter().position(|a| !valid_arg(a)) {
        return Err(Refusal::BadArg { index });
    }
    if req.inputs.len() != task.inputs.len() {
        return Err(Refusal::InputCount {
            expected: task.inputs.len(),
        });
    }
    if let Some(index) = req.inputs.iter().position(|id| !valid_input_id(id)) {
        return Err(Refusal::BadInputId { index });
    }
    Ok(Checked {
        task_name: name,
        task,
        req,
    })
}

/// A run request that passed [`check_request`]: what remains is its inputs' records.
#[derive(Debug, Clone, Copy)]
pub struct Checked<'c, 'r> {
    pub task_name: &'c str,
    pub task: &'c Task,
    pub req: &'r RunRequest,
}

impl<'c> Checked<'c, '_> {
    /// The input ids whose records [`Checked::admit`] needs, in order.
    pub fn input_ids(&self) -> &[String] {
        &self.req.inputs
    }

    /// The decision, given the records of [`Checked::input_ids`] in the caller's tenant
    /// (None: no such input there).
    pub fn admit(self, rows: Vec<Option<InputRow>>) -> Result<Admitted<'c>, Refusal> {
        let inputs = check_inputs(self.task, rows)?;
        Ok(Admitted {
            task_name: self.task_name,
            task: self.task,
            request_id: self.req.request_id.clone(),
            inputs,
            code: self.req.code.clone(),
            args: self.req.args.clone().unwrap_or_default(),
        })
    }
}

/// The inputs' records (None: no such input in the caller's tenant) against the task's
/// slots, in order: each must exist, have an accepted media type and fit the slot's size.
pub fn check_inputs(task: &Task, rows: Vec<Option<InputRow>>) -> Result<Vec<InputRow>, Refusal> {
    let mut inputs = Vec::with_capacity(rows.len());
    for (index, (row, slot)) in rows.into_iter().zip(&task.inputs).enumerate() {
        // Another tenant's id and a missing id get the same answer.
        let row = row.ok_or(Refusal::NoSuchInput { index })?;
        if !slot.media_types.contains(&row.media_type) {
            return Err(Refusal::InputMediaType {
                index,
                media_type: row.media_type,
                accepted: slot.media_types.clone(),
            });
        }
        if row.bytes > slot.max_bytes {
            return Err(Refusal::InputTooLarge {
                index,
                max: slot.max_bytes,
            });
        }
        inputs.push(row);
    }
    Ok(inputs)
}

/// A run policy admitted: the task, the inputs' records, the code and the args.
#[derive(Debug, Clone)]
pub struct Admitted<'c> {
    pub task_name: &'c str,
    pub task: &'c Task,
    pub request_id: String,
    pub inputs: Vec<InputRow>,
    pub code: Option<String>,
    pub args: Vec<String>,
}

impl Admitted<'_> {
    /// The manifest this run implies, for a job expiring at `job_expires_at`.
    pub fn manifest(&self, job_expires_at: i64, paths: JobPaths<'_>) -> Manifest {
        manifest(
            self.task,
            &self.request_id,
            &self.args,
            &self.inputs,
            self.code.as_deref(),
            job_expires_at,
            paths,
        )
    }
}

/// Where a job's files are on the host, for its manifest.
#[derive(Debug, Clone, Copy)]
pub struct JobPaths<'a> {
    /// The content-addressed object store (`DATA/objects`).
    pub objects: &'a Path,
    /// The task's output schema file (`DATA/schemas/<sha256>.json`), if it has a schema.
    pub schema: Option<&'a Path>,
}

/// The manifest of a run. Everything comes from the task type and server-resolved ids: the
/// request contributes only its request_id, its args (checked by [`check_request`]) and the
/// contents (never the paths) of its inputs and code. The code is an inline input: the
/// sandbox's init writes it into memory inside the sandbox, and it never reaches the host's
/// disk (docs/server.md).
pub fn manifest(
    task: &Task,
    request_id: &str,
    args: &[String],
    inputs: &[InputRow],
    code: Option<&str>,
    job_expires_at: i64,
    paths: JobPaths<'_>,
) -> Manifest {
    let mut m = Manifest::for_command(task.command.iter().chain(args).cloned().collect());
    m.request_id = Some(request_id.to_string());
    for (slot, input) in task.inputs.iter().zip(inputs) {
        m.inputs.push(Input {
            source: paths
                .objects
                .join(&input.sha256)
                .to_string_lossy()
                .into_owned(),
            mount: slot.mount.clone(),
            mode: Mode::ReadOnly,
        });
    }
    if task.code == CodePolicy::Allowed {
        m.inline_inputs.push(InlineInput {
            mount: task.code_mount.clone(),
            content: code.unwrap_or_default().to_owned(),
        });
    }
    m.output = Some(task.output.path.clone());
    if let Some(schema) = paths.schema {
        m.output_schema = Some(schema.to_string_lossy().into_owned());
    }
    m.network = task.network.clone();
    m.isolation = task.isolation;
    m.image = task.image.clone();
    m.limits = task.limits;
    m.limits.output_mb = m
        .limits
        .output_mb
        .max(task.output.max_bytes.div_ceil(1024 * 1024));
    m.expires_at = jiff::Timestamp::from_second(job_expires_at)
        .ok()
        .map(|t| t.to_string());
    m.env = task.env.clone();
    m
}

/// An upload's name, media type and size.
pub fn check_upload(name: &str, media_type: &str, bytes: u64, max: u64) -> Result<(), Refusal> {
    check_upload_params(name, media_type)?;
    if bytes > max {
        return Err(Refusal::UploadTooLarge { max });
    }
    Ok(())
}

/// An upload's name and media type (checked before its body is read).
pub fn check_upload_params(name: &str, media_type: &str) -> Result<(), Refusal> {
    if !valid_file_name(name) {
        return Err(Refusal::BadFileName);
    }
    if !valid_media_type(media_type) {
        return Err(Refusal::BadMediaType);
    }
    Ok(())
}

/// Reading a run's artifact: only a verified one (state `ok`), not deleted by retention.
pub fn check_artifact(state: RunState, has_artifact: bool, deleted: bool) -> Result<(), Refusal> {
    if deleted {
        Err(Refusal::OutputsExpired)
    } else if !has_artifact || state != RunState::Ok {
        Err(Refusal::NoArtifact { state })
    } else {
        Ok(())
    }
}

/// Reading a run's receipt: it must have one, not deleted by retention.
pub fn check_receipt(state: RunState, has_receipt: bool, deleted: bool) -> Result<(), Refusal> {
    if deleted {
        Err(Refusal::OutputsExpired)
    } else if !has_receipt {
        Err(Refusal::NoReceipt { state })
    } else {
        Ok(())
    }
}

/// What an operator may do with a run: only operators reconcile, only `unknown` runs.
pub fn check_reconcile(caller: &Caller, state: RunState) -> Result<(), Refusal> {
    if !caller.operator {
        return Err(Refusal::NotOperator);
    }
    if state != RunState::Unknown {
        return Err(Refusal::NotUnknown { state });
    }
    Ok(())
}

/// Whether an `unknown` run may run again: its task still exists and has no network access
/// (nothing outside can have happened), and it runs a fixed program (code is not kept).
pub fn check_retry(task: Option<&Task>) -> Result<&Task, Refusal> {
    let task = task.ok_or(Refusal::TaskGone)?;
    if !matches!(task.network, Network::Deny) {
        return Err(Refusal::RetryWithNetwork);
    }
    Ok(task)
}

/// The inputs of a run to retry: all must still exist.
pub fn check_retry_inputs(rows: Vec<Option<InputRow>>) -> Result<Vec<InputRow>, Refusal> {
    rows.into_iter()
        .collect::<Option<Vec<_>>>()
        .ok_or(Refusal::InputExpired)
}

/// A retry runs the first attempt's manifest or nothing: `rebuilt` (the digest of the manifest
/// built now, `runner::manifest_digest`) must equal the digest recorded at admission.
pub fn check_retry_digest(task: &str, first: Option<&str>, rebuilt: &str) -> Result<(), Refusal> {
    match first {
        Some(f) if f == rebuilt => Ok(()),
        Some(f) => Err(Refusal::TaskChanged {
            task: task.to_owned(),
            first: f.to_owned(),
            rebuilt: rebuilt.to_owned(),
        }),
        None => Err(Refusal::NoManifestDigest),
    }
}

/// A run to retry must run a fixed program: the code is not kept after a run.
pub fn check_retry_code(task: &Task) -> Result<(), Refusal> {
    if task.code == CodePolicy::Allowed {
        return Err(Refusal::CodeNotKept);
    }
    Ok(())
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests;
