//! The server configuration: tenants, actors (bound to one tenant, authenticated by the sha256
//! of a bearer token), task types and server settings. TOML or YAML, recognised by content;
//! unknown fields are refused. [`Config::parse`] parses and validates; nothing here touches the
//! file system.

mod check;
mod session;
use check::is_sandbox_path_under;
pub use check::{is_media_type, is_name, is_sha256_digest};
pub use session::{Interpreter, SessionSettings};

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::PathBuf;

use agentjail_manifest::{EgressPolicy, Limits, Network, bounds};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// The shipped example configuration (`examples/server/config.toml`).
pub const EXAMPLE_CONFIG: &str = include_str!("../../../examples/server/config.toml");

/// Longest configuration file accepted.
pub const MAX_CONFIG_BYTES: usize = 1024 * 1024;

/// The whole configuration.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
#[schemars(title = "agentjail server configuration")]
pub struct Config {
    /// Server settings; every field has a default.
    #[serde(default)]
    pub server: ServerSettings,
    /// Tenants by name. Inputs and runs belong to exactly one tenant.
    #[serde(default)]
    pub tenants: BTreeMap<String, Tenant>,
    /// Actors (agents or people calling the API) by name, each bound to one tenant.
    #[serde(default)]
    pub actors: BTreeMap<String, Actor>,
    /// Task types by name: the typed tools an agent may call.
    #[serde(default)]
    pub tasks: BTreeMap<String, Task>,
}

/// What `serve` does with the self-test at start-up.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum SelftestMode {
    /// Do not run it.
    #[default]
    Off,
    /// Run it; log failed probes and start anyway.
    Warn,
    /// Run it; refuse to start when a probe failed or it could not run.
    Refuse,
}

/// Server settings.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ServerSettings {
    /// Address to listen on (default `127.0.0.1:8787`). Plain HTTP: put a TLS-terminating proxy
    /// in front for anything but loopback.
    #[serde(default)]
    pub listen: Option<SocketAddr>,
    /// Data directory (database, input store, job folders, audit log). Default:
    /// `$XDG_DATA_HOME/agentjail/server`, else `~/.local/share/agentjail/server`, else
    /// `./agentjail-data`.
    #[serde(default)]
    pub data_dir: Option<PathBuf>,
    /// The `agentjail` binary that runs one job (default: this executable).
    #[serde(default)]
    pub runner: Option<PathBuf>,
    /// Runs executing at once (default: the number of CPUs).
    #[serde(default)]
    pub max_concurrent_runs: Option<usize>,
    /// Runs waiting for a slot beyond `max_concurrent_runs`; more are refused with 429 (default 64).
    #[serde(default = "d_max_queued")]
    pub max_queued_runs: usize,
    /// Largest input upload in bytes (default 10 MiB).
    #[serde(default = "d_max_input")]
    pub max_input_bytes: u64,
    /// Largest JSON request body in bytes (default 1 MiB).
    #[serde(default = "d_max_request")]
    pub max_request_bytes: u64,
    /// Lifetime of a job id: a job not started within it is refused as `expired` (default 300).
    #[serde(default = "d_job_ttl")]
    pub job_ttl_seconds: u64,
    /// How long uploaded inputs are kept (default 7 days).
    #[serde(default = "d_week")]
    pub input_retention_seconds: u64,
    /// How often the retention sweep runs (default 300).
    #[serde(default = "d_sweep")]
    pub sweep_interval_seconds: u64,
    /// Run even where a sandbox protection cannot be applied (listed in each report).
    #[serde(default)]
    pub allow_degraded: bool,
    /// Run `agentjail selftest` (docs/selftest.md) before listening: `off` (default), `warn`
    /// (log failed probes, start anyway) or `refuse` (do not start when a probe failed). The
    /// result is on `/healthz` and in `/metrics`.
    #[serde(default)]
    pub selftest: SelftestMode,
    /// `Host` values the `/mcp` endpoint accepts (DNS-rebinding protection), e.g.
    /// `["mcp.example.com"]` or `["localhost:8787"]`. Default: loopback only (`localhost`,
    /// `127.0.0.1`, `::1`, any port).
    #[serde(default)]
    pub mcp_allowed_hosts: Option<Vec<String>>,
    /// Browser origins the `/mcp` endpoint accepts, with scheme (e.g. `https://app.example.com:443`).
    /// Default: none; a request carrying any other `Origin` header is refused (agents that are
    /// not browsers send none). While `mcp_allowed_hosts` is the loopback default, loopback
    /// origins (`http(s)://localhost|127.0.0.1|[::1]`, any port) are accepted too.
    #[serde(default)]
    pub mcp_allowed_origins: Vec<String>,
    /// Seconds a client has to send a request's headers; also how long an idle keep-alive
    /// connection stays open (default 10). A slower client is disconnected.
    #[serde(default = "d_header_timeout")]
    pub header_timeout_seconds: u64,
    /// Seconds a client has to send a request's whole body once its headers arrived (default
    /// 30); a slower upload gets `408` and the connection is closed. Also how long a client may
    /// read nothing of an answer (an artifact, an events stream) before it is disconnected.
    #[serde(default = "d_body_timeout")]
    pub body_timeout_seconds: u64,
    /// Open client connections at most (default 256); a connection beyond is closed at once.
    #[serde(default = "d_max_connections")]
    pub max_connections: usize,
    /// Authentication failures are audited as one `auth_failure` record per this many seconds
    /// at most, with the count of failures it stands for (default 10): anyone who reaches the
    /// port cannot grow the audit log without bound, and no failure goes uncounted.
    #[serde(default = "d_auth_audit")]
    pub auth_failure_audit_seconds: u64,
    /// The shared store of several replicas: a PostgreSQL connection URL
    /// (`postgres://user@host:port/db`) or key=value string. Default: none (the embedded
    /// SQLite database in the data directory). It must not hold a password (refused): the
    /// password comes from `database_password_file` or the `PGPASSWORD` environment variable.
    /// TLS is not supported yet: `sslmode=require`/`verify-ca`/`verify-full` is refused
    /// (docs/server.md, "PostgreSQL").
    #[serde(default)]
    pub database: Option<String>,
    /// File holding the PostgreSQL password (one line; mode 0600 or stricter, else refused).
    #[serde(default)]
    pub database_password_file: Option<PathBuf>,
    /// This replica's name in the shared store: each run records the node that runs it, and a
    /// replica's start-up reconcile marks only its own in-flight runs `unknown`. Default: the
    /// host name. Letters, digits, `.`, `_`, `-`; at most 64 bytes.
    #[serde(default)]
    pub node_id: Option<String>,
    /// PostgreSQL only: the lease of a claimed run, in seconds (default 30, 2 to 3600). The
    /// executor renews it every third of it; one that cannot renew it before it ends (by its own
    /// clock) kills the run's sandbox, and any node then marks the run `unknown`
    /// (docs/deploy.md, "Leases and fencing").
    #[serde(default = "d_lease")]
    pub lease_seconds: u64,
    /// The image store that task types' `image` digests are taken from (docs/images.md).
    /// Default: `<data_dir>/images` (its fingerprint key `<data_dir>/images.key`, beside it);
    /// fill it with `agentjail image import --store <data_dir>/images`.
    #[serde(default)]
    pub image_store: Option<PathBuf>,
}

fn d_lease() -> u64 {
    30
}

fn d_header_timeout() -> u64 {
    10
}
fn d_body_timeout() -> u64 {
    30
}
fn d_max_connections() -> usize {
    256
}
fn d_auth_audit() -> u64 {
    10
}

fn d_max_queued() -> usize {
    64
}
fn d_max_input() -> u64 {
    10 * 1024 * 1024
}
fn d_max_request() -> u64 {
    1024 * 1024
}
fn d_job_ttl() -> u64 {
    300
}
fn d_week() -> u64 {
    7 * 86_400
}
fn d_day() -> u64 {
    86_400
}
fn d_sweep() -> u64 {
    300
}

impl Default for ServerSettings {
    fn default() -> Self {
        ServerSettings {
            listen: None,
            data_dir: None,
            runner: None,
            max_concurrent_runs: None,
            max_queued_runs: d_max_queued(),
            max_input_bytes: d_max_input(),
            max_request_bytes: d_max_request(),
            job_ttl_seconds: d_job_ttl(),
            input_retention_seconds: d_week(),
            sweep_interval_seconds: d_sweep(),
            allow_degraded: false,
            selftest: SelftestMode::Off,
            mcp_allowed_hosts: None,
            mcp_allowed_origins: Vec::new(),
            header_timeout_seconds: d_header_timeout(),
            body_timeout_seconds: d_body_timeout(),
            max_connections: d_max_connections(),
            auth_failure_audit_seconds: d_auth_audit(),
            database: None,
            database_password_file: None,
            node_id: None,
            lease_seconds: d_lease(),
            image_store: None,
        }
    }
}

/// A tenant.
#[derive(Debug, Clone, Default, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Tenant {
    /// Free text for operators.
    #[serde(default)]
    pub description: String,
}

/// An actor: one bearer token, one tenant.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Actor {
    /// The tenant this actor acts for.
    pub tenant: String,
    /// Lower-case hex sha256 of the bearer token (`printf %s "$TOKEN" | sha256sum`). The token
    /// itself is never stored.
    pub token_sha256: String,
    /// May call `POST /v1/runs/{request_id}/reconcile` for runs of its tenant.
    #[serde(default)]
    pub operator: bool,
}

/// Whether a task runs code proposed by the caller.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum CodePolicy {
    /// The request carries `code`, written into the job folder and mounted read-only.
    Allowed,
    /// A fixed, reviewed program; a request with `code` is refused.
    Forbidden,
}

/// A task type: the typed tool an agent may call.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Task {
    /// What the task does, for the agent choosing it.
    pub description: String,
    /// The inputs, in order: a request names exactly this many input ids.
    #[serde(default)]
    pub inputs: Vec<InputSlot>,
    /// Whether the request's `code` runs (`allowed`, then required) or a fixed program does.
    pub code: CodePolicy,
    /// Where the code is mounted read-only (default `/input/code.py`).
    #[serde(default = "d_code_mount")]
    pub code_mount: String,
    /// Largest `code` accepted, in bytes (default 65536).
    #[serde(default = "d_code_bytes")]
    pub max_code_bytes: usize,
    /// Program and arguments, run inside the sandbox.
    pub command: Vec<String>,
    /// How many `args` a request may append to the command (default 0: none).
    #[serde(default)]
    pub max_args: usize,
    /// Fixed environment of the command.
    #[serde(default)]
    pub env: BTreeMap<String, String>,
    /// The one artifact the task produces.
    pub output: OutputSpec,
    /// `deny`, or an allowlist in the manifest's format (`{allow = [{host, ports}]}`).
    #[serde(default)]
    pub network: Network,
    /// The isolation tier this task requires: `native` (default) or `gvisor`.
    #[serde(default)]
    pub isolation: agentjail_manifest::Tier,
    /// The root file system its runs use: `sha256:<64 hex>`, an image in the service's image
    /// store (`server.image_store`; `agentjail image import`, docs/images.md). Checked at
    /// start-up (every file re-hashed): a missing or changed image refuses to start, naming
    /// the task. Default: none, the host image (the host's `/usr`, `/bin`, `/lib*` read-only;
    /// reports say `image_pinned: false`).
    #[serde(default)]
    pub image: Option<String>,
    /// Resource limits (the manifest's `limits`).
    #[serde(default)]
    pub limits: Limits,
    /// Actors allowed to use the task (by name).
    #[serde(default)]
    pub allowed_actors: Vec<String>,
    /// Tenants whose every actor may use the task.
    #[serde(default)]
    pub allowed_tenants: Vec<String>,
    /// PostgreSQL fleet only: the labels an executor must have (`worker --labels`) to claim
    /// this task's runs (default: none, any executor). Names as for tenants.
    #[serde(default)]
    pub labels: Vec<String>,
    /// How long outputs and logs of its runs are kept.
    #[serde(default)]
    pub retention: Retention,
    /// How many bytes of the command's stdout a run's record shows (HTTP, MCP), success or
    /// failure: the head and the tail, half each, terminal-sanitised, with the task's `env`
    /// values and gateway-held credentials redacted, marked as untrusted data. Default: 4096
    /// for tasks with `code = "allowed"` (a model learns from what its code printed), 0 for
    /// fixed programs (only their verified output leaves unless the operator says so); at
    /// most 65536. The byte count and the digest of the whole stream are always recorded.
    #[serde(default)]
    pub stdout_bytes: Option<u64>,
    /// The same for stderr (a failed run's traceback). (`stderr_tail_bytes` and
    /// `expose_stderr_bytes` are accepted as older names.)
    #[serde(default, alias = "stderr_tail_bytes", alias = "expose_stderr_bytes")]
    pub stderr_bytes: Option<u64>,
    /// What the tool description tells the model about the runtime (e.g. `Python 3.12 with
    /// pandas 2.2 and numpy`). Default: probed once at start-up from the command's Python
    /// interpreter (its version and which common third-party packages it can import); a
    /// command that is not Python gets no runtime line unless this is set. At most 300 bytes.
    #[serde(default)]
    pub runtime: Option<String>,
    /// Sessions of this task (`POST /v1/sessions`, code tasks only): their `/work` bound,
    /// their lifetime and their number of cells.
    #[serde(default)]
    pub session: SessionSettings,
}

/// Default of [`Task::stdout_bytes`] and [`Task::stderr_bytes`] for tasks with
/// `code = "allowed"`.
pub const DEFAULT_STREAM_BYTES: u64 = 4096;
/// Largest [`Task::stdout_bytes`] / [`Task::stderr_bytes`].
pub const MAX_STREAM_BYTES: u64 = 65536;

impl Task {
    fn stream_default(&self) -> u64 {
        match self.code {
            CodePolicy::Allowed => DEFAULT_STREAM_BYTES,
            CodePolicy::Forbidden => 0,
        }
    }

    /// How many bytes of stdout a run's record shows (0: none).
    pub fn stdout_limit(&self) -> u64 {
        self.stdout_bytes.unwrap_or_else(|| self.stream_default())
    }

    /// How many bytes of stderr a run's record shows (0: none).
    pub fn stderr_limit(&self) -> u64 {
        self.stderr_bytes.unwrap_or_else(|| self.stream_default())
    }
}

fn d_code_mount() -> String {
    "/input/code.py".into()
}
fn d_code_bytes() -> usize {
    64 * 1024
}

/// One input of a task.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct InputSlot {
    /// Where the input is mounted read-only, below `/input` or `/work`.
    pub mount: String,
    /// Accepted media types (the `media_type` given at upload), e.g. `text/csv`.
    pub media_types: Vec<String>,
    /// Largest accepted input in bytes.
    pub max_bytes: u64,
}

/// The artifact of a task.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct OutputSpec {
    /// Path in the sandbox, below `/output`.
    pub path: String,
    /// Media type the artifact is served with; `application/json` makes it inline JSON.
    pub media_type: String,
    /// Largest artifact in bytes.
    pub max_bytes: u64,
    /// JSON Schema (draft 2020-12) the artifact must satisfy: a table/map, or JSON text.
    #[serde(default)]
    pub schema: Option<SchemaSource>,
}

/// An inline JSON Schema: a structured value or a string holding JSON.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(untagged)]
pub enum SchemaSource {
    Text(String),
    Value(serde_json::Value),
}

impl SchemaSource {
    /// The schema as a JSON value.
    pub fn value(&self) -> Result<serde_json::Value, String> {
        match self {
            SchemaSource::Text(t) => {
                serde_json::from_str(t).map_err(|e| format!("schema is not JSON: {e}"))
            }
            SchemaSource::Value(v) => Ok(v.clone()),
        }
    }
}

/// Retention of a task's outputs and logs.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Retention {
    /// Seconds the artifact, receipt and report stay retrievable (default 1 day).
    #[serde(default = "d_day")]
    pub outputs_seconds: u64,
    /// Seconds the job folder (with the command's stdout/stderr) is kept (default 1 day).
    #[serde(default = "d_day")]
    pub logs_seconds: u64,
}

impl Default for Retention {
    fn default() -> Self {
        Retention {
            outputs_seconds: d_day(),
            logs_seconds: d_day(),
        }
    }
}

/// A configuration problem: one line naming the place.
#[derive(Debug, thiserror::Error)]
#[error("config: {0}")]
pub struct ConfigError(pub String);

fn err(s: impl Into<String>) -> ConfigError {
    ConfigError(s.into())
}

impl Config {
    /// Parses TOML or YAML (recognised by content: TOML when it parses as TOML) and validates.
    pub fn parse(text: &str) -> Result<Config, ConfigError> {
        if text.len() > MAX_CONFIG_BYTES {
            return Err(err("larger than 1 MiB"));
        }
        let cfg: Config = match toml::from_str::<Config>(text) {
            Ok(c) => c,
            Err(toml_err) => {
                let looks_toml = text.lines().any(|l| {
                    let l = l.trim_start();
                    l.starts_with('[') && !l.starts_with("[{") || l.contains(" = ")
                });
                if looks_toml {
                    return Err(err(
                        toml_err.message().to_string() + &toml_location(text, &toml_err)
                    ));
                }
                yaml_serde::from_str(text).map_err(|e| err(e.to_string().replace('\n', " ")))?
            }
        };
        cfg.validate()?;
        Ok(cfg)
    }

    /// Reads and parses a configuration file.
    pub fn load(path: &std::path::Path) -> Result<Config, ConfigError> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| err(format!("cannot read {}: {e}", path.display())))?;
        Config::parse(&text).map_err(|e| err(format!("{}: {}", path.display(), e.0)))
    }

    /// The built-in example configuration.
    pub fn example() -> Result<Config, ConfigError> {
        Config::parse(EXAMPLE_CONFIG)
    }

    /// The JSON Schema of the configuration.
    pub fn json_schema() -> serde_json::Value {
        serde_json::to_value(schemars::schema_for!(Config)).unwrap_or_default()
    }

    /// Checks cross-references and bounds.
    pub fn validate(&self) -> Result<(), ConfigError> {
        let s = &self.server;
        if s.max_concurrent_runs == Some(0) {
            return Err(err("server.max_concurrent_runs must be at least 1"));
        }
        if s.header_timeout_seconds == 0
            || s.body_timeout_seconds == 0
            || s.max_connections == 0
            || s.auth_failure_audit_seconds == 0
        {
            return Err(err(
                "server.header_timeout_seconds, body_timeout_seconds, max_connections and auth_failure_audit_seconds must be positive",
            ));
        }
        if !(2..=3600).contains(&s.lease_seconds) {
            return Err(err("server.lease_seconds must be 2 to 3600"));
        }
        if s.job_ttl_seconds == 0 || s.sweep_interval_seconds == 0 {
            return Err(err(
                "server.job_ttl_seconds and sweep_interval_seconds must be positive",
            ));
        }
        for name in self.tenants.keys() {
            if !is_name(name) {
                return Err(err(format!(
                    "tenant name {name:?}: use 1-64 of a-z 0-9 _ -"
                )));
            }
        }
        let mut hashes = std::collections::BTreeSet::new();
        for (name, a) in &self.actors {
            if !is_name(name) {
                return Err(err(format!("actor name {name:?}: use 1-64 of a-z 0-9 _ -")));
            }
            if !self.tenants.contains_key(&a.tenant) {
                return Err(err(format!(
                    "actors.{name}.tenant: no tenant {:?}",
                    a.tenant
                )));
            }
            let h = &a.token_sha256;
            if h.len() != 64
                || !h
                    .chars()
                    .all(|c| c.is_ascii_digit() || ('a'..='f').contains(&c))
            {
                return Err(err(format!(
                    "actors.{name}.token_sha256: must be 64 lower-case hex digits (the sha256 of the token, never the token)"
                )));
            }
            if !hashes.insert(h.clone()) {
                return Err(err(format!(
                    "actors.{name}.token_sha256: shared with another actor"
                )));
            }
        }
        for (name, t) in &self.tasks {
            self.validate_task(name, t)?;
        }
        Ok(())
    }

    fn validate_task(&self, name: &str, t: &Task) -> Result<(), ConfigError> {
        let at = |f: &str, r: String| err(format!("tasks.{name}.{f}: {r}"));
        if !is_name(name) {
            return Err(err(format!("task name {name:?}: use 1-64 of a-z 0-9 _ -")));
        }
        if t.command.is_empty() || t.command[0].is_empty() {
            return Err(at("command", "must name a program".into()));
        }
        if t.command.iter().any(|a| a.contains('\0')) {
            return Err(at("command", "contains a NUL byte".into()));
        }
        if t.inputs.len() > bounds::MAX_INPUTS - 1 {
            return Err(at(
                "inputs",
                format!("at most {} inputs", bounds::MAX_INPUTS - 1),
            ));
        }
        let mut mounts: Vec<&str> = Vec::new();
        for (i, slot) in t.inputs.iter().enumerate() {
            if !is_sandbox_path_under(&slot.mount, &["/input", "/work"]) {
                return Err(at(
                    &format!("inputs[{i}].mount"),
                    "must be a clean path below /input or /work".into(),
                ));
            }
            if slot.media_types.is_empty() || !slot.media_types.iter().all(|m| is_media_type(m)) {
                return Err(at(
                    &format!("inputs[{i}].media_types"),
                    "list at least one type/subtype".into(),
                ));
            }
            if slot.max_bytes == 0 {
                return Err(at(
                    &format!("inputs[{i}].max_bytes"),
                    "must be positive".into(),
                ));
            }
            mounts.push(&slot.mount);
        }
        if t.code == CodePolicy::Allowed {
            if !is_sandbox_path_under(&t.code_mount, &["/input", "/work"]) {
                return Err(at(
                    "code_mount",
                    "must be a clean path below /input or /work".into(),
                ));
            }
            mounts.push(&t.code_mount);
            if t.max_code_bytes == 0 || t.max_code_bytes > 1024 * 1024 {
                return Err(at("max_code_bytes", "must be within 1..=1048576".into()));
            }
        }
        for (i, a) in mounts.iter().enumerate() {
            for b in &mounts[i + 1..] {
                let nested = |x: &str, y: &str| {
                    x == y || x.strip_prefix(y).is_some_and(|r| r.starts_with('/'))
                };
                if nested(a, b) || nested(b, a) {
                    return Err(at("inputs", format!("mounts {a} and {b} overlap")));
                }
            }
        }
        if !is_sandbox_path_under(&t.output.path, &["/output"]) {
            return Err(at(
                "output.path",
                "must be a clean path below /output".into(),
            ));
        }
        if !is_media_type(&t.output.media_type) {
            return Err(at("output.media_type", "must be type/subtype".into()));
        }
        if t.output.max_bytes == 0 || t.output.max_bytes > bounds::MAX_OUTPUT_MB * 1024 * 1024 {
            return Err(at(
                "output.max_bytes",
                "must be positive and at most the output bound".into(),
            ));
        }
        if let Some(schema) = &t.output.schema {
            let v = schema.value().map_err(|r| at("output.schema", r))?;
            if !v.is_object() {
                return Err(at("output.schema", "must be a JSON object".into()));
            }
            jsonschema::options()
                .build(&v)
                .map_err(|e| at("output.schema", format!("not a valid JSON Schema: {e}")))?;
        }
        t.session.check().map_err(|(f, why)| at(f, why.into()))?;
        if t.session.interpreter.is_some()
            && (t.code != CodePolicy::Allowed || t.isolation != agentjail_manifest::Tier::Native)
        {
            let why = "a live session needs a task with code = \"allowed\" on the native tier";
            return Err(at("session.interpreter", why.into()));
        }
        if t.stdout_bytes.unwrap_or(0) > MAX_STREAM_BYTES {
            return Err(at("stdout_bytes", format!("at most {MAX_STREAM_BYTES}")));
        }
        if t.stderr_bytes.unwrap_or(0) > MAX_STREAM_BYTES {
            return Err(at("stderr_bytes", format!("at most {MAX_STREAM_BYTES}")));
        }
        if let Some(d) = &t.image
            && !is_sha256_digest(d)
        {
            return Err(at(
                "image",
                "must be `sha256:` and 64 lower-case hex digits (a digest `agentjail image import` printed)".into(),
            ));
        }
        if let Some(r) = &t.runtime
            && (r.len() > 300 || r.chars().any(char::is_control))
        {
            return Err(at(
                "runtime",
                "at most 300 bytes, no control characters".into(),
            ));
        }
        let l = &t.limits;
        let checks = [
            ("limits.seconds", l.seconds, 1, bounds::MAX_SECONDS),
            (
                "limits.memory_mb",
                l.memory_mb,
                bounds::MIN_MEMORY_MB,
                bounds::MAX_MEMORY_MB,
            ),
            ("limits.processes", l.processes, 1, bounds::MAX_PROCESSES),
            ("limits.output_mb", l.output_mb, 1, bounds::MAX_OUTPUT_MB),
        ];
        for (f, v, lo, hi) in checks {
            if v < lo || v > hi {
                return Err(at(f, format!("{v} is outside {lo}..={hi}")));
            }
        }
        if !(bounds::MIN_CPUS..=bounds::MAX_CPUS).contains(&l.cpus) {
            return Err(at(
                "limits.cpus",
                format!(
                    "{} is outside {}..={}",
                    l.cpus,
                    bounds::MIN_CPUS,
                    bounds::MAX_CPUS
                ),
            ));
        }
        if let Network::Allow(EgressPolicy { allow, .. }) = &t.network
            && (allow.is_empty()
                || allow
                    .iter()
                    .any(|r| r.host.is_empty() || r.ports.is_empty()))
        {
            return Err(at("network", "an allowlist needs hosts with ports".into()));
        }
        for a in &t.allowed_actors {
            if !self.actors.contains_key(a) {
                return Err(at("allowed_actors", format!("no actor {a:?}")));
            }
        }
        for tn in &t.allowed_tenants {
            if !self.tenants.contains_key(tn) {
                return Err(at("allowed_tenants", format!("no tenant {tn:?}")));
            }
        }
        if t.max_args > 64 {
            return Err(at("max_args", "at most 64".into()));
        }
        if let Some(l) = t.labels.iter().find(|l| !is_name(l)) {
            return Err(at("labels", format!("{l:?}: use 1-64 of a-z 0-9 _ -")));
        }
        Ok(())
    }

    /// The name and entry of the actor whose token hash equals sha256(`token`), compared in
    /// constant time against every actor.
    pub fn actor_for_token(&self, token: &str) -> Option<(&str, &Actor)> {
        use sha2::{Digest, Sha256};
        let presented: [u8; 32] = Sha256::digest(token.as_bytes()).into();
        let mut found = None;
        for (name, a) in &self.actors {
            let Some(stored) = decode_hex32(&a.token_sha256) else {
                continue;
            };
            if ct_eq(&presented, &stored) && found.is_none() {
                found = Some((name.as_str(), a));
            }
        }
        found
    }

    /// Whether `actor` (of `tenant`) may use `task`.
    pub fn may_use(&self, actor: &str, tenant: &str, task: &Task) -> bool {
        task.allowed_actors.iter().any(|a| a == actor)
            || task.allowed_tenants.iter().any(|t| t == tenant)
    }
}

fn toml_location(text: &str, e: &toml::de::Error) -> String {
    match e.span() {
        Some(span) => {
            let line = text[..span.start.min(text.len())].matches('\n').count() + 1;
            format!(" (line {line})")
        }
        None => String::new(),
    }
}

/// Constant-time equality of two 32-byte values.
pub fn ct_eq(a: &[u8; 32], b: &[u8; 32]) -> bool {
    let mut diff = 0u8;
    for i in 0..32 {
        diff |= a[i] ^ b[i];
    }
    std::hint::black_box(diff) == 0
}

fn decode_hex32(s: &str) -> Option<[u8; 32]> {
    if s.len() != 64 {
        return None;
    }
    let mut out = [0u8; 32];
    for (i, o) in out.iter_mut().enumerate() {
        *o = u8::from_str_radix(s.get(2 * i..2 * i + 2)?, 16).ok()?;
    }
    Some(out)
}

/// Lower-case hex sha256 of `data`.
pub fn sha256_hex(data: &[u8]) -> String {
    use sha2::{Digest, Sha256};
    agentjail_manifest::hex(&Sha256::digest(data))
}

#[cfg(test)]
mod tests;
