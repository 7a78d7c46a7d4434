//! The task catalogue as a caller sees it (`GET /v1/tasks`, the MCP tools).

use serde::Serialize;
use serde_json::Value;
use utoipa::ToSchema;

use crate::app::AppState;
use crate::config::CodePolicy;
use crate::policy;
pub use crate::policy::Caller;

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
    /// The pinned image (`sha256:…`) the task's runs use; absent: the host image.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub image: Option<String>,
    /// The resident interpreter of the task's sessions (`python`: a live session keeps its
    /// variables, imports and definitions between cells); absent: each cell is a fresh
    /// process and only `/work` carries over (docs/api.md, "Live sessions").
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<String>, example = "python")]
    pub interpreter: Option<String>,
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
                image: t.image.clone(),
                interpreter: t
                    .session
                    .interpreter
                    .filter(|_| t.session.enabled)
                    .map(|i| match i {
                        crate::config::Interpreter::Python => "python".to_owned(),
                    }),
                request_schema: serde_json::json!({
                    "type": "object", "additionalProperties": false,
                    "required": required, "properties": props,
                }),
            }
        })
        .collect()
}
