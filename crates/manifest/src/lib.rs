//! # agentjail-manifest
//!
//! The one description of an agentjail run. A [`Manifest`] says what runs (command, environment),
//! on what (read-only inputs, an optional pinned image), what may come out (one output path,
//! optionally checked against a JSON Schema), with which network access and under which limits.
//! The CLI flags of `agentjail run`, manifest files (YAML or JSON) and the orchestrator all build
//! this same type; nothing else describes a run.
//!
//! Parsing ([`Manifest::parse`]) has no side effects and refuses unknown fields with their line.
//! Validation ([`Manifest::validate`]) resolves and checks everything that can be checked before
//! the first syscall of a run (mount points, source paths, limits, expiry) and yields a
//! [`ValidatedManifest`], the only form the engine accepts. The checks of paths and sources are
//! in `paths.rs`, the bound on YAML aliases in `yaml.rs`, the limits' [`bounds`] in theirs.
//!
//! The run report ([`report::RunReport`]) lives here too, because every consumer (CLI, verifier,
//! receipts, orchestrator) speaks it.
//!
//! Tested by unit tests in this crate and by the CLI's integration tests, which run real manifests.

pub mod bounds;
mod error;
mod paths;
pub mod report;
pub mod results;
pub mod session;
pub mod text;
pub mod workspace;
mod yaml;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

pub use error::ManifestError;
use error::field;
pub use paths::{SandboxPathError, SourcePolicy, normalize_sandbox_path};
use paths::{input_mount, resolve_source, under};
pub use yaml::MAX_YAML_EXPANSION;
use yaml::check_yaml_expansion;

/// Version tag of the manifest format. Bumped on any incompatible change.
pub const MANIFEST_SCHEMA: &str = "agentjail.manifest/v1";

/// One run, as the user or the orchestrator describes it.
///
/// Every field has a default except `command`. Unknown fields are refused.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
#[schemars(title = "agentjail manifest (agentjail.manifest/v1)")]
pub struct Manifest {
    /// Caller's identifier for this run; recorded in the report and the receipt.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub request_id: Option<String>,
    /// Digest of the root filesystem image the run must use: a digest-pinned image in the local
    /// store (`agentjail image import`, docs/images.md), or the host image's identity (printed by
    /// `agentjail check`). Omitted: the unpinned host image. A digest that is neither, or a stored
    /// image whose content changed, refuses the run. Same as `image_digest`; give one of them.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image: Option<String>,
    /// The older spelling of `image`. If both are given they must be equal.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image_digest: Option<String>,
    /// The identity the command runs as. Only `nonroot` (uid/gid 65534 inside) exists.
    #[serde(default)]
    pub user: User,
    /// Read-only inputs bound into the sandbox.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub inputs: Vec<Input>,
    /// Small read-only files given by value (e.g. model-proposed code): each is written into a
    /// memory file system of its own inside the sandbox and bound read-only at its `mount`;
    /// nothing of it reaches the host's disk. `agentjail serve` passes a request's `code` so.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub inline_inputs: Vec<InlineInput>,
    /// The one artifact the run must produce, e.g. `/output/summary.json`. When set, the run is
    /// `ok` only if exactly this file exists and passes verification; other files are dropped.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub output: Option<String>,
    /// JSON Schema (draft 2020-12) the output must satisfy; a path relative to the manifest's
    /// folder (CLI) or a schema stored by the orchestrator.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub output_schema: Option<String>,
    /// Network access: `deny` (loopback only, no DNS, no route).
    #[serde(default)]
    pub network: Network,
    /// Resource limits.
    #[serde(default)]
    pub limits: Limits,
    /// Refuse to start at or after this instant (RFC 3339, e.g. `2030-01-01T00:00:00Z`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(with = "Option<String>", extend("format" = "date-time"))]
    pub expires_at: Option<String>,
    /// Program and arguments. A program without `/` is looked up in the sandbox's PATH.
    pub command: Vec<String>,
    /// Environment of the command. Nothing of the caller's environment leaks in; these are added
    /// to the sandbox defaults (`PATH`, `HOME`, `LANG`, `TMPDIR`), and may override them.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub env: BTreeMap<String, String>,
    /// Isolation tier: `native` (namespaces, Landlock, seccomp on the host kernel; the
    /// default) or `gvisor` (the command runs on gVisor's user-space kernel, `runsc`).
    #[serde(default, skip_serializing_if = "Tier::is_native")]
    pub isolation: Tier,
    /// The sandbox's `/work` as state: restored from a checkpoint, collected into one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub workspace: Option<workspace::Workspace>,
    /// The run as a cell of a session (set by the service): the session's id, the cell's
    /// index and the previous cell's receipt digest, carried by the receipt's predicate.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub session: Option<session::Session>,
}

/// Isolation tier of a run.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum Tier {
    /// The host kernel, behind namespaces, Landlock, seccomp and cgroups.
    #[default]
    Native,
    /// gVisor's user-space kernel (`runsc`) between the command and the host kernel.
    Gvisor,
}

impl Tier {
    /// True for the default tier (kept out of serialized manifests, so their digests stay).
    pub fn is_native(&self) -> bool {
        *self == Tier::Native
    }
}

/// The sandbox user. One value today; an enum so that a manifest asking for `root` is refused.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum User {
    /// uid 65534, gid 65534 inside the sandbox; an unprivileged uid on the host.
    #[default]
    Nonroot,
}

/// A read-only input.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Input {
    /// Host path of a file or directory, relative to the manifest's folder (or absolute, inside
    /// an allowed source root). Symlinks are followed when resolving, then the result is checked.
    pub source: String,
    /// Where it appears in the sandbox: below `/input` or `/work`.
    pub mount: String,
    /// Only `read-only` exists.
    #[serde(default)]
    pub mode: Mode,
}

/// A read-only file given by value (see [`Manifest::inline_inputs`]).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct InlineInput {
    /// Where it appears in the sandbox: below `/input` or `/work`, like an input's mount.
    pub mount: String,
    /// The file's content, UTF-8 text of at most 1 MiB.
    pub content: String,
}

/// Access mode of an input.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub enum Mode {
    #[default]
    #[serde(rename = "read-only")]
    ReadOnly,
}

/// Network policy: `deny`, or an allowlist served by the egress gateway.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(from = "NetworkRepr", into = "NetworkRepr")]
#[schemars(with = "NetworkRepr")]
pub enum Network {
    /// A network namespace with loopback alone: no route, no DNS.
    #[default]
    Deny,
    /// Loopback alone, plus a proxy endpoint inside the sandbox that reaches only the
    /// allowed destinations.
    Allow(EgressPolicy),
}

/// The only word accepted for `network`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum NetworkWord {
    Deny,
}

/// How `network` is written: `deny`, or `{allow: [...], allow_private: [...]}`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(
    untagged,
    expecting = "field `network` must be `deny` or a map with `allow` (and optionally `allow_private`)"
)]
pub enum NetworkRepr {
    Word(NetworkWord),
    Policy(EgressPolicy),
}

impl From<NetworkRepr> for Network {
    fn from(r: NetworkRepr) -> Network {
        match r {
            NetworkRepr::Word(NetworkWord::Deny) => Network::Deny,
            NetworkRepr::Policy(p) => Network::Allow(p),
        }
    }
}

impl From<Network> for NetworkRepr {
    fn from(n: Network) -> NetworkRepr {
        match n {
            Network::Deny => NetworkRepr::Word(NetworkWord::Deny),
            Network::Allow(p) => NetworkRepr::Policy(p),
        }
    }
}

/// Destinations the egress gateway may connect to.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct EgressPolicy {
    /// Allowed destinations. A request matching none is refused.
    pub allow: Vec<AllowRule>,
    /// CIDRs that may be reached even though they are private, loopback or link-local
    /// (e.g. `127.0.0.1/32` in tests). Empty by default.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub allow_private: Vec<String>,
    /// Secrets the gateway adds to requests for one allowed host, so that they never enter
    /// the sandbox. For such a host the gateway terminates the sandbox's TLS with a per-run CA
    /// (docs/network.md, "Credentials"). Empty by default.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub credentials: Vec<Credential>,
    /// A PEM file of CA certificates the gateway trusts when it opens its own TLS connection
    /// to a credentialed host, instead of the host's system bundle (a private CA, tests).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub upstream_ca_file: Option<String>,
}

/// A secret bound to a destination: the gateway adds `header: <secret>` to requests to `host`
/// whose path starts with one of `paths`, and strips any header of that name the sandbox sent.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Credential {
    /// An exact host name (no wildcard, no IP address) that an `allow` rule admits.
    pub host: String,
    /// The request header that carries the secret, e.g. `Authorization`.
    pub header: String,
    /// Where the supervisor reads the secret: `env:NAME` (its own environment, never the
    /// task's `env`) or `file:/absolute/path` (one trailing newline removed).
    pub value_from: String,
    /// Path prefixes (each starting with `/`) of the requests that get the header; others
    /// go without it.
    pub paths: Vec<String>,
    /// Request methods that get the header (default: GET, HEAD, POST, PUT, PATCH, DELETE);
    /// others go without it. TRACE, TRACK and CONNECT are never allowed here.
    #[serde(default = "Credential::default_methods")]
    pub methods: Vec<String>,
    /// Destination ports whose requests get the header (default: 443); a connection to the
    /// host on another allowed port is a plain tunnel and never carries it.
    #[serde(default = "Credential::default_ports")]
    pub ports: Vec<u16>,
}

impl Credential {
    /// The methods a credential is added to when `methods` is not given.
    pub const DEFAULT_METHODS: [&'static str; 6] =
        ["GET", "HEAD", "POST", "PUT", "PATCH", "DELETE"];

    fn default_methods() -> Vec<String> {
        Self::DEFAULT_METHODS
            .iter()
            .map(|m| (*m).to_owned())
            .collect()
    }

    fn default_ports() -> Vec<u16> {
        vec![443]
    }
}

/// One allowed destination.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct AllowRule {
    /// An exact host name (`api.example.com`), or one wildcard label at the left
    /// (`*.example.com`, matching subdomains only).
    pub host: String,
    /// Allowed ports (at least one).
    pub ports: Vec<u16>,
}

/// Resource limits of one run. Each must be within [`bounds`].
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Limits {
    /// Wall-clock limit in seconds (default 30, at most 86400).
    #[serde(default = "Limits::default_seconds")]
    pub seconds: u64,
    /// Memory of the whole process tree in MiB, page cache and tmpfs included (default 256).
    #[serde(default = "Limits::default_memory_mb")]
    pub memory_mb: u64,
    /// Processes and threads of the whole tree (default 16, at most 4096).
    #[serde(default = "Limits::default_processes")]
    pub processes: u64,
    /// Total bytes under /output in MiB (default 5).
    #[serde(default = "Limits::default_output_mb")]
    pub output_mb: u64,
    /// With a network allowlist: MiB the sandbox may send through the egress gateway, all
    /// connections together (default 16).
    #[serde(default = "Limits::default_network_up_mb")]
    pub network_up_mb: u64,
    /// With a network allowlist: MiB the sandbox may receive through the gateway (default 256).
    #[serde(default = "Limits::default_network_down_mb")]
    pub network_down_mb: u64,
    /// With a network allowlist: connections through the gateway over the run (default 64).
    #[serde(default = "Limits::default_network_connections")]
    pub network_connections: u64,
    /// CPU time per wall-clock time of the whole tree, in CPUs (fractional: 0.5 is half of one
    /// CPU; default 1, 0.01 ..= 1024). A cgroup CPU quota (v2 `cpu.max`, v1 CFS quota) over a
    /// 100 ms period.
    #[serde(default = "Limits::default_cpus")]
    pub cpus: f64,
}

impl Limits {
    fn default_seconds() -> u64 {
        30
    }
    fn default_memory_mb() -> u64 {
        256
    }
    fn default_processes() -> u64 {
        16
    }
    fn default_output_mb() -> u64 {
        5
    }
    fn default_network_up_mb() -> u64 {
        16
    }
    fn default_network_down_mb() -> u64 {
        256
    }
    fn default_network_connections() -> u64 {
        64
    }
    fn default_cpus() -> f64 {
        1.0
    }
    /// The CFS quota of `cpus` per `period_us`.
    pub fn cpu_quota_us(&self, period_us: u64) -> u64 {
        ((self.cpus * period_us as f64).round() as u64).max(1000)
    }
    /// Memory limit in bytes.
    pub fn memory_bytes(&self) -> u64 {
        self.memory_mb * 1024 * 1024
    }
    /// Output limit in bytes.
    pub fn output_bytes(&self) -> u64 {
        self.output_mb * 1024 * 1024
    }
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            seconds: Self::default_seconds(),
            memory_mb: Self::default_memory_mb(),
            processes: Self::default_processes(),
            output_mb: Self::default_output_mb(),
            network_up_mb: Self::default_network_up_mb(),
            network_down_mb: Self::default_network_down_mb(),
            network_connections: Self::default_network_connections(),
            cpus: Self::default_cpus(),
        }
    }
}

/// A manifest that passed every check that can be made before a run, with inputs resolved.
#[derive(Debug, Clone)]
pub struct ValidatedManifest {
    pub manifest: Manifest,
    /// Resolved inputs, in manifest order.
    pub inputs: Vec<ResolvedInput>,
    /// The inline inputs, their mounts normalized, in manifest order.
    pub inline: Vec<InlineInput>,
    /// The output schema, resolved to a host path (CLI mode).
    pub output_schema_path: Option<PathBuf>,
    /// sha256 of the canonical JSON form of `manifest` (RFC 8785), `sha256:<hex>`.
    pub digest: String,
    /// The `workspace` section, checked, its checkpoint resolved to a host path.
    pub workspace: Option<workspace::ResolvedWorkspace>,
}

/// An input whose source was resolved on the host.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ResolvedInput {
    /// Canonical host path (symlinks resolved).
    pub host_path: PathBuf,
    /// Absolute, normalized sandbox path.
    pub mount: String,
    /// True for a directory, false for a regular file.
    pub is_dir: bool,
}

impl Manifest {
    /// A manifest for `command` with every other field at its default.
    pub fn for_command(command: Vec<String>) -> Manifest {
        Manifest {
            request_id: None,
            image: None,
            image_digest: None,
            user: User::Nonroot,
            inputs: Vec::new(),
            inline_inputs: Vec::new(),
            output: None,
            output_schema: None,
            network: Network::Deny,
            limits: Limits::default(),
            expires_at: None,
            command,
            env: BTreeMap::new(),
            isolation: Tier::Native,
            workspace: None,
            session: None,
        }
    }

    /// Parses a manifest from text. JSON is recognised by content (a leading `{`), anything else
    /// is read as YAML. Unknown fields and wrong types are refused with their line.
    pub fn parse(text: &str) -> Result<Manifest, ManifestError> {
        if text.trim_start().starts_with('{') {
            serde_json::from_str(text).map_err(|e| ManifestError::Syntax(e.to_string()))
        } else {
            check_yaml_expansion(text)?;
            yaml_serde::from_str(text).map_err(|e| ManifestError::Syntax(one_line(&e.to_string())))
        }
    }

    /// Reads and parses a manifest file; the file's folder becomes the base of relative sources.
    pub fn load(path: &Path) -> Result<Manifest, ManifestError> {
        let meta = std::fs::metadata(path).map_err(|source| ManifestError::Read {
            path: path.to_owned(),
            source,
        })?;
        if meta.len() > 1024 * 1024 {
            return Err(ManifestError::Syntax(format!(
                "{} is larger than 1 MiB",
                path.display()
            )));
        }
        let text = std::fs::read_to_string(path).map_err(|source| ManifestError::Read {
            path: path.to_owned(),
            source,
        })?;
        Manifest::parse(&text)
    }

    /// The JSON Schema of the manifest format, generated from these types.
    pub fn json_schema() -> serde_json::Value {
        serde_json::to_value(schemars::schema_for!(Manifest)).unwrap_or_default()
    }

    /// The image the manifest pins (`image`, else `image_digest`), if any.
    pub fn pinned_image(&self) -> Option<&str> {
        self.image.as_deref().or(self.image_digest.as_deref())
    }

    /// sha256 over the RFC 8785 canonical JSON form, as `sha256:<hex>`. A manifest that has no
    /// canonical form (a non-finite number) is an error, never the digest of empty bytes: the
    /// digest is signed into receipts.
    pub fn canonical_digest(&self) -> Result<String, ManifestError> {
        let bytes = serde_jcs::to_vec(self)
            .map_err(|e| ManifestError::Syntax(format!("no canonical JSON form: {e}")))?;
        Ok(format!("sha256:{}", hex(&Sha256::digest(&bytes))))
    }

    /// Checks everything that can be checked before a run, resolving input sources under
    /// `policy`. `now` is the instant expiry is judged against.
    pub fn validate(
        self,
        policy: &SourcePolicy,
        now: jiff::Timestamp,
    ) -> Result<ValidatedManifest, ManifestError> {
        let m = self;
        if let Some(id) = &m.request_id
            && (id.is_empty() || id.len() > 128 || !id.chars().all(is_id_char))
        {
            return Err(field(
                "request_id",
                "must be 1-128 characters of A-Z a-z 0-9 . _ : -",
            ));
        }
        for (name, v) in [("image", &m.image), ("image_digest", &m.image_digest)] {
            if let Some(d) = v
                && (!d.starts_with("sha256:") || d.len() > 128 || d.chars().any(|c| c.is_control()))
            {
                return Err(field(name, "must have the form sha256:<hex>"));
            }
        }
        if let (Some(a), Some(b)) = (&m.image, &m.image_digest)
            && a != b
        {
            return Err(field(
                "image",
                "`image` and `image_digest` name different digests; give one of them",
            ));
        }
        check_limits(&m.limits)?;
        if let Some(exp) = &m.expires_at {
            let t: jiff::Timestamp = exp.parse().map_err(|e| {
                field(
                    "expires_at",
                    format!("not an RFC 3339 instant ({e}); e.g. 2030-01-01T00:00:00Z"),
                )
            })?;
            if t <= now {
                return Err(field(
                    "expires_at",
                    format!("the manifest expired at {t}; refusing to start"),
                ));
            }
        }
        check_command(&m.command)?;
        check_env(&m.env)?;

        if m.inputs.len() > bounds::MAX_INPUTS {
            return Err(field(
                "inputs",
                format!("at most {} inputs", bounds::MAX_INPUTS),
            ));
        }
        if m.inline_inputs.len() > bounds::MAX_INLINE_INPUTS {
            return Err(field(
                "inline_inputs",
                format!("at most {} inline inputs", bounds::MAX_INLINE_INPUTS),
            ));
        }
        // Every mount so far (inputs, then inline inputs): no two may overlap.
        let mut mounts: Vec<String> = Vec::new();
        let mut inputs: Vec<ResolvedInput> = Vec::with_capacity(m.inputs.len());
        for (i, input) in m.inputs.iter().enumerate() {
            let name = format!("inputs[{i}].mount");
            let mount = input_mount(&input.mount, &mounts).map_err(|r| field(&name, r))?;
            mounts.push(mount.clone());
            let host_path = resolve_source(&input.source, policy)
                .map_err(|r| field(format!("inputs[{i}].source"), r.to_string()))?;
            let meta = std::fs::metadata(&host_path).map_err(|e| {
                field(
                    format!("inputs[{i}].source"),
                    format!("{}: {e}", input.source),
                )
            })?;
            if !(meta.is_file() || meta.is_dir()) {
                return Err(field(
                    format!("inputs[{i}].source"),
                    format!("{} is neither a regular file nor a directory", input.source),
                ));
            }
            inputs.push(ResolvedInput {
                host_path,
                mount,
                is_dir: meta.is_dir(),
            });
        }
        let mut inline = Vec::with_capacity(m.inline_inputs.len());
        for (i, input) in m.inline_inputs.iter().enumerate() {
            let name = format!("inline_inputs[{i}].mount");
            let mount = input_mount(&input.mount, &mounts).map_err(|r| field(&name, r))?;
            mounts.push(mount.clone());
            if input.content.len() > bounds::MAX_INLINE_BYTES {
                return Err(field(
                    format!("inline_inputs[{i}].content"),
                    format!("at most {} bytes", bounds::MAX_INLINE_BYTES),
                ));
            }
            inline.push(InlineInput {
                mount,
                content: input.content.clone(),
            });
        }

        if let Some(out) = &m.output {
            let p = normalize_sandbox_path(out).map_err(|r| field("output", r.to_string()))?;
            if !under(&p, "/output") {
                return Err(field("output", format!("{p} is not below /output")));
            }
        }
        let output_schema_path = match &m.output_schema {
            None => None,
            Some(s) => {
                if m.output.is_none() {
                    return Err(field(
                        "output_schema",
                        "needs `output`: the schema applies to that one file",
                    ));
                }
                Some(resolve_source(s, policy).map_err(|r| field("output_schema", r.to_string()))?)
            }
        };
        let workspace = m
            .workspace
            .as_ref()
            .map(|w| workspace::check(w, policy, m.isolation == Tier::Gvisor))
            .transpose()?;
        if let Some(s) = &m.session {
            session::check(s)?;
        }
        let digest = m.canonical_digest()?;
        Ok(ValidatedManifest {
            workspace,
            manifest: m,
            inputs,
            inline,
            output_schema_path,
            digest,
        })
    }
}

impl ValidatedManifest {
    /// The output path relative to /output (e.g. `summary.json`), when one is named.
    pub fn output_relative(&self) -> Option<String> {
        self.manifest.output.as_deref().and_then(|o| {
            normalize_sandbox_path(o)
                .ok()
                .and_then(|p| p.strip_prefix("/output/").map(str::to_owned))
        })
    }
}

fn is_id_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | ':' | '-')
}

fn check_limits(l: &Limits) -> Result<(), ManifestError> {
    use bounds::*;
    let checks: [(&str, u64, u64, u64); 7] = [
        ("limits.seconds", l.seconds, 1, MAX_SECONDS),
        (
            "limits.memory_mb",
            l.memory_mb,
            MIN_MEMORY_MB,
            MAX_MEMORY_MB,
        ),
        ("limits.processes", l.processes, 1, MAX_PROCESSES),
        ("limits.output_mb", l.output_mb, 1, MAX_OUTPUT_MB),
        ("limits.network_up_mb", l.network_up_mb, 1, MAX_NETWORK_MB),
        (
            "limits.network_down_mb",
            l.network_down_mb,
            1,
            MAX_NETWORK_MB,
        ),
        (
            "limits.network_connections",
            l.network_connections,
            1,
            MAX_NETWORK_CONNECTIONS,
        ),
    ];
    for (name, v, lo, hi) in checks {
        if v < lo || v > hi {
            return Err(field(name, format!("{v} is outside {lo}..={hi}")));
        }
    }
    check_cpus(l.cpus)
}

/// `limits.cpus` within [`bounds::MIN_CPUS`] ..= [`bounds::MAX_CPUS`] (NaN is refused too).
pub fn check_cpus(cpus: f64) -> Result<(), ManifestError> {
    if !(bounds::MIN_CPUS..=bounds::MAX_CPUS).contains(&cpus) {
        return Err(field(
            "limits.cpus",
            format!(
                "{cpus} is outside {}..={}",
                bounds::MIN_CPUS,
                bounds::MAX_CPUS
            ),
        ));
    }
    Ok(())
}

fn check_command(cmd: &[String]) -> Result<(), ManifestError> {
    if cmd.is_empty() || cmd[0].is_empty() {
        return Err(field("command", "must name a program"));
    }
    if cmd.len() > bounds::MAX_ARGS {
        return Err(field(
            "command",
            format!("at most {} words", bounds::MAX_ARGS),
        ));
    }
    for (i, a) in cmd.iter().enumerate() {
        if a.contains('\0') {
            return Err(field(format!("command[{i}]"), "contains a NUL byte"));
        }
        if a.len() > bounds::MAX_ARG_BYTES {
            return Err(field(format!("command[{i}]"), "is too long"));
        }
    }
    Ok(())
}

fn check_env(env: &BTreeMap<String, String>) -> Result<(), ManifestError> {
    if env.len() > bounds::MAX_ENV {
        return Err(field(
            "env",
            format!("at most {} variables", bounds::MAX_ENV),
        ));
    }
    for (k, v) in env {
        let ok_key = !k.is_empty()
            && k.len() <= 256
            && k.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
            && !k.starts_with(|c: char| c.is_ascii_digit());
        if !ok_key {
            return Err(field(
                "env",
                format!("{k:?} is not a variable name (A-Z a-z 0-9 _, not starting with a digit)"),
            ));
        }
        if v.contains('\0') || v.len() > bounds::MAX_ENV_VALUE {
            return Err(field(
                format!("env.{k}"),
                "contains a NUL byte or is too long",
            ));
        }
        // LD_* would let a value steer the dynamic loader of every program in the sandbox;
        // that is the command's business only if the manifest's author means it, so it is
        // allowed, but it cannot reach anything the sandbox does not already expose.
    }
    Ok(())
}

fn one_line(s: &str) -> String {
    s.split_whitespace().collect::<Vec<_>>().join(" ")
}

/// Lowercase hex of bytes.
pub fn hex(bytes: &[u8]) -> String {
    use std::fmt::Write;
    let mut s = String::with_capacity(bytes.len() * 2);
    for b in bytes {
        let _ = write!(s, "{b:02x}");
    }
    s
}

/// `sha256:<hex>` of bytes.
pub fn sha256_digest(bytes: &[u8]) -> String {
    format!("sha256:{}", hex(&Sha256::digest(bytes)))
}

#[cfg(test)]
mod tests;
