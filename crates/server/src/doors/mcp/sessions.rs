//! The session tools' calls (issue #34: open, run, get, fork, close), through the service's session functions (the ones the
//! HTTP routes call). A session is the caller's: the stdio server's actor, or the bearer
//! token's over `/mcp`; anyone else's session id is refused as a missing one is. A cell's
//! result is a run's ([`super::results::run_result`]) with the cell's place and workspace
//! digests added; a call with a `progressToken` gets the cell's live progress as a run does.

use rmcp::ErrorData as McpError;
use rmcp::RoleServer;
use rmcp::model::{CallToolResult, ContentBlock, MetaObject};
use rmcp::service::RequestContext;
use serde_json::{Value, json};

use super::catalogue::*;
use super::results::*;
use super::server::McpServer;
use super::session_tools::*;
use crate::config::Task;
use crate::service::{
    self, Caller, CellRequest, Failure, ForkRequest, SessionRequest, SessionView,
};
use crate::util::random_hex;

/// How to write a cell of `t`, for the model that opened the session.
fn usage(t: &Task, v: &SessionView) -> String {
    if t.session.interpreter.is_some() {
        return format!(
            "Call session_run with session_id {} and Python code; this session is live: each cell's code runs in the session's resident Python interpreter, kept in one sandbox for the session, so variables, imports and definitions persist between cells, and so do the files under /work. A cell returns what it printed (stdout, stderr) and its status; it needs no output file. Limits: {} s per cell (then it is interrupted), {} cells (used: {}), until {}; an idle session's interpreter ends (its variables with it; /work is kept, and the cell's result says so). Call session_close when done.",
            v.session_id, t.limits.seconds, v.max_cells, v.cells, v.expires_at
        );
    }
    let mut s = format!(
        "Call session_run with session_id {} and code; each cell runs as `{}` with the code at {}, in a fresh process starting from the /work the previous cell left: keep state in files under /work (variables do not survive). ",
        v.session_id,
        t.command.join(" "),
        t.code_mount
    );
    if !t.inputs.is_empty() {
        let mounts: Vec<&str> = t.inputs.iter().map(|i| i.mount.as_str()).collect();
        s.push_str(&format!(
            "The inputs are mounted read-only at {}. ",
            mounts.join(", ")
        ));
    }
    s.push_str(&format!(
        "A cell ends ok when it writes {} ({}). Limits: {} s per cell, {} cells (used: {}), until {}. Call session_close when done.",
        t.output.path, t.output.media_type, t.limits.seconds, v.max_cells, v.cells, v.expires_at
    ));
    s
}

fn s<'a>(args: &'a Value, k: &str) -> Option<&'a str> {
    args.get(k).and_then(Value::as_str)
}

/// A refusal as the call's answer: an invalid request as `-32602`, anything else as a tool
/// error whose code and detail the model can read.
fn refused(e: Failure, rid: Option<String>, task: Option<String>) -> Result<Done, McpError> {
    match e {
        Failure::Refused(r) if r.is_invalid_request() => {
            Err(McpError::invalid_params(r.detail(), None))
        }
        e => Ok(Done {
            reason: Some(format!("{}: {}", e.code(), e.detail())),
            result: denied(&e, rid.as_deref()),
            outcome: "denied",
            task,
            request_id: rid,
            status: None,
        }),
    }
}

fn session_done(body: Value, text: String, task: String, rid: String) -> Done {
    let mut r = CallToolResult::success(vec![ContentBlock::text(text), text_json(&body)]);
    r.structured_content = Some(body);
    Done {
        result: r,
        outcome: "ok",
        task: Some(task),
        request_id: Some(rid),
        status: None,
        reason: None,
    }
}

/// A request id the caller did not give: a random one (a retried call acts again).
fn request_id_or_random(args: &Value) -> Result<String, McpError> {
    match s(args, "request_id") {
        Some(r) => Ok(r.to_owned()),
        None => Ok(format!(
            "mcp-{}",
            random_hex(16).map_err(|_| McpError::internal_error("randomness", None))?
        )),
    }
}

/// Most cells `session_get` lists (the service's pages are walked up to it).
const MAX_LISTED_CELLS: usize = 1000;

impl McpServer {
    pub(super) async fn session_open(
        &self,
        caller: &Caller,
        args: &Value,
    ) -> Result<Done, McpError> {
        let tasks = session_tasks(&self.state, caller);
        check_args(&open_tool(&tasks).schema_as_json_value(), args)?;
        let request_id = request_id_or_random(args)?;
        let task = s(args, "task").unwrap_or_default().to_owned();
        let inputs = args
            .get("inputs")
            .and_then(Value::as_array)
            .map(|a| {
                a.iter()
                    .filter_map(|v| v.as_str().map(str::to_owned))
                    .collect()
            })
            .unwrap_or_default();
        let req = SessionRequest {
            request_id: request_id.clone(),
            task: task.clone(),
            inputs,
        };
        match service::open_session(&self.state, caller, req).await {
            Ok((v, created)) => {
                let Some(t) = self.state.inner.config.tasks.get(&v.task) else {
                    return Err(McpError::internal_error("the task is gone", None));
                };
                let how = usage(t, &v);
                let text = format!(
                    "Session {} {} for task {}. {how}",
                    v.session_id,
                    if created { "opened" } else { "(opened before)" },
                    v.task
                );
                let mut body = serde_json::to_value(&v).unwrap_or_default();
                body["usage"] = json!(how);
                Ok(session_done(body, text, task, request_id))
            }
            Err(e) => refused(e, Some(request_id), Some(task)),
        }
    }

    pub(super) async fn session_close(
        &self,
        caller: &Caller,
        args: &Value,
    ) -> Result<Done, McpError> {
        check_args(&close_tool().schema_as_json_value(), args)?;
        let id = s(args, "session_id").unwrap_or_default();
        match service::close_session(&self.state, caller, id).await {
            Ok(v) => {
                let text = format!(
                    "Session {} is {} after {} cell(s); it takes no more cells.",
                    v.session_id, v.state, v.cells
                );
                let (task, rid) = (v.task.clone(), v.request_id.clone());
                let body = serde_json::to_value(&v).unwrap_or_default();
                Ok(session_done(body, text, task, rid))
            }
            Err(e) => refused(e, None, None),
        }
    }

    /// `session_get`: the session (`GET /v1/sessions/{id}`) and a summary of its cells
    /// (`GET /v1/sessions/{id}/cells`, every page).
    pub(super) async fn session_get(
        &self,
        caller: &Caller,
        args: &Value,
    ) -> Result<Done, McpError> {
        check_args(&get_tool().schema_as_json_value(), args)?;
        let id = s(args, "session_id").unwrap_or_default();
        let v = match service::get_session(&self.state, caller, id).await {
            Ok(v) => v,
            Err(e) => return refused(e, None, None),
        };
        let mut cells = Vec::new();
        let mut cursor: Option<String> = None;
        loop {
            let page = match service::list_session_cells(
                &self.state,
                caller,
                id,
                cursor.as_deref(),
                Some(100),
            )
            .await
            {
                Ok(p) => p,
                Err(e) => return refused(e, None, Some(v.task.clone())),
            };
            for c in &page.cells {
                let mut one = json!({
                    "cell": c.cell, "step_id": c.cell_request_id, "status": c.run.status,
                    "workspace_after": c.workspace.after,
                });
                if let Some(r) = &c.run.reason {
                    one["reason"] = json!(r);
                }
                cells.push(one);
            }
            cursor = page.next_cursor;
            if cursor.is_none() || cells.len() >= MAX_LISTED_CELLS {
                break;
            }
        }
        let listed: Vec<String> = cells
            .iter()
            .map(|c| {
                format!(
                    "{} {} {}",
                    c["cell"],
                    c["step_id"].as_str().unwrap_or(""),
                    c["status"].as_str().unwrap_or("")
                )
            })
            .collect();
        let text = format!(
            "Session {} ({}) is {}: {} of {} cell(s) used, until {}; /work now: {}.{}",
            v.session_id,
            v.task,
            v.state,
            v.cells,
            v.max_cells,
            v.expires_at,
            v.workspace_sha256.as_deref().unwrap_or("empty"),
            if listed.is_empty() {
                String::new()
            } else {
                format!(" Cells (index step_id status): {}.", listed.join("; "))
            }
        );
        let (task, rid) = (v.task.clone(), v.request_id.clone());
        let mut body = serde_json::to_value(&v).unwrap_or_default();
        body["cell_list"] = Value::Array(cells);
        Ok(session_done(body, text, task, rid))
    }

    /// `session_fork`: `POST /v1/sessions/{id}/fork`.
    pub(super) async fn session_fork(
        &self,
        caller: &Caller,
        args: &Value,
    ) -> Result<Done, McpError> {
        check_args(&fork_tool().schema_as_json_value(), args)?;
        let id = s(args, "session_id").unwrap_or_default();
        let request_id = request_id_or_random(args)?;
        let req = ForkRequest {
            request_id: request_id.clone(),
            cell: args.get("cell").and_then(Value::as_u64),
        };
        match service::fork_session(&self.state, caller, id, req).await {
            Ok((v, created)) => {
                let Some(t) = self.state.inner.config.tasks.get(&v.task) else {
                    return Err(McpError::internal_error("the task is gone", None));
                };
                let how = usage(t, &v);
                let from = v
                    .forked_from
                    .as_ref()
                    .map_or(String::new(), |f| match f.cell {
                        Some(c) => format!(" from /work as cell {c} of {} left it", f.session_id),
                        None => format!(" from the head of {}", f.session_id),
                    });
                let text = format!(
                    "Session {} {}{from}; the original is unchanged. {how}",
                    v.session_id,
                    if created { "forked" } else { "(forked before)" },
                );
                let task = v.task.clone();
                let mut body = serde_json::to_value(&v).unwrap_or_default();
                body["usage"] = json!(how);
                Ok(session_done(body, text, task, request_id))
            }
            Err(e) => refused(e, Some(request_id), None),
        }
    }

    pub(super) async fn session_run(
        &self,
        caller: &Caller,
        args: &Value,
        ctx: &RequestContext<RoleServer>,
    ) -> Result<Done, McpError> {
        check_args(&run_tool(usize::MAX).schema_as_json_value(), args)?;
        let id = s(args, "session_id").unwrap_or_default();
        let code = s(args, "code").unwrap_or_default().to_owned();
        let plan =
            match service::plan_session_cell(&self.state, caller, id, s(args, "step_id"), &code)
                .await
            {
                Ok(p) => p,
                Err(e) => return refused(e, None, None),
            };
        let limit = self
            .state
            .inner
            .config
            .tasks
            .get(&plan.task)
            .map_or(0, |t| t.limits.seconds);
        let progress = ctx.meta.get_progress_token().map(|token| {
            tokio::spawn(super::progress::live(
                self.state.clone(),
                caller.clone(),
                plan.run_request_id.clone(),
                limit,
                token,
                ctx.peer.clone(),
            ))
        });
        let req = CellRequest {
            request_id: plan.request_id.clone(),
            code,
        };
        let r =
            service::session_cell(&self.state, caller, id, req, true, Some(ctx.ct.clone())).await;
        if let Some(p) = progress {
            p.abort();
        }
        let c = match r {
            Ok(c) => c,
            Err(e) => return refused(e, None, Some(plan.task)),
        };
        let (mut result, outcome) = run_result(&self.state, &c.run, false);
        let cell = json!({
            "session_id": c.session_id, "cell": c.cell, "step_id": c.cell_request_id,
            "step_id_derived": plan.derived, "replayed": plan.recorded,
            "workspace": {"before": c.workspace.before, "after": c.workspace.after},
        });
        let head = format!(
            "Cell {} of session {} (step_id {}{}): {}; /work before: {}, after: {}.",
            c.cell,
            c.session_id,
            c.cell_request_id,
            if plan.recorded {
                "; a repeat of a recorded step: its result, nothing ran again"
            } else {
                ""
            },
            c.run.status,
            c.workspace.before.as_deref().unwrap_or("empty"),
            c.workspace.after.as_deref().unwrap_or("none kept")
        );
        result.content.insert(0, ContentBlock::text(head));
        let mut meta = result.meta.take().unwrap_or_else(MetaObject::default);
        if let Some(Value::Object(m)) = meta.0.get_mut(META_KEY)
            && let Value::Object(extra) = cell
        {
            m.extend(extra);
        }
        result.meta = Some(meta);
        Ok(Done {
            reason: c.run.reason.clone(),
            result,
            outcome,
            task: Some(plan.task),
            request_id: Some(c.run.request_id.clone()),
            status: Some(c.run.status.into()),
        })
    }
}
