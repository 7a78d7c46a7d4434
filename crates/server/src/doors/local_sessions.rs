//! The local session door (`agentjail session`, issue #34): the session service (open, cell,
//! get, close: the functions the HTTP routes call, so the same policy, checkpoints, receipts
//! and audit records) for one local user, over a Unix socket, one JSON request per line and one
//! JSON answer per line. The socket lives in the user's private directory (made 0700 by the
//! CLI) and is 0600 itself; on top of that every connection's peer credentials (SO_PEERCRED)
//! are checked, so a process of another uid is refused even if it can reach the socket. The
//! daemon exits when its last session has ended (closed or expired) or on `close_all`, and
//! removes its socket and the sessions' checkpoints. A session id the daemon did not open (or already closed) is
//! `not-found`, as the service says for a missing one.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::{UnixListener, UnixStream};

use crate::app::{AppState, ServerError};
use crate::config::Config;
use crate::service::{self, Caller, CellRequest, SessionRequest};
use crate::util::random_hex;

/// What the daemon is started with.
pub struct LocalOptions {
    /// The configuration (its task types; the CLI's built-in one or the user's file).
    pub config: Config,
    /// Where SQLite, checkpoints and the receipt key live.
    pub data_dir: PathBuf,
    /// The socket's path (in a 0700 directory of the user's).
    pub socket: PathBuf,
    /// Names the configuration, so that a client with another one is told, not confused.
    pub config_id: String,
    pub allow_degraded: bool,
}

/// A request on the socket.
#[derive(Debug, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "snake_case", deny_unknown_fields)]
pub enum Request {
    /// Open a session of `task` as `actor` (default: the configuration's only actor).
    Open {
        task: String,
        #[serde(default)]
        actor: Option<String>,
        config_id: String,
    },
    /// Run a cell and wait for it.
    Cell { session_id: String, code: String },
    /// The sessions this daemon holds.
    List,
    /// End one session.
    Close { session_id: String },
    /// End every session (the daemon then exits).
    CloseAll,
}

/// Most bytes of one request line (a cell's code is bounded by its task's `max_code_bytes`).
const MAX_LINE: u64 = 16 << 20;

/// The refusal of a connection from another uid (the CLI shows `detail`).
pub fn peer_refusal(owner: u32, peer: u32) -> String {
    format!(
        "this session daemon serves uid {owner} only; the connection from uid {peer} was refused (SO_PEERCRED)"
    )
}

struct Daemon {
    state: AppState,
    config_id: String,
    owner: u32,
    /// The open sessions this daemon made, and whose they are.
    sessions: Mutex<BTreeMap<String, Caller>>,
    last_activity: Mutex<Instant>,
    stop: tokio::sync::Notify,
}

fn refusal(code: &str, detail: impl Into<String>) -> Value {
    json!({"ok": false, "error": code, "detail": detail.into()})
}

fn failure(e: service::Failure) -> Value {
    refusal(e.code(), e.detail())
}

impl Daemon {
    fn caller_of(&self, id: &str) -> Option<Caller> {
        self.sessions.lock().ok()?.get(id).cloned()
    }

    fn forget(&self, id: &str) {
        if let Ok(mut s) = self.sessions.lock() {
            s.remove(id);
            if s.is_empty() {
                self.stop.notify_one();
            }
        }
    }

    fn actor(&self, name: Option<&str>) -> Result<Caller, Value> {
        let actors = &self.state.inner.config.actors;
        let name = match name {
            Some(n) => n.to_owned(),
            None if actors.len() == 1 => actors.keys().next().cloned().unwrap_or_default(),
            None => {
                return Err(refusal(
                    "malformed",
                    "the configuration has several actors: give --actor NAME",
                ));
            }
        };
        match actors.get(&name) {
            Some(a) => Ok(Caller {
                actor: name,
                tenant: a.tenant.clone(),
                operator: a.operator,
            }),
            None => Err(refusal(
                "malformed",
                format!("no actor `{name}` in the configuration"),
            )),
        }
    }

    async fn answer(&self, req: Request) -> Value {
        match req {
            Request::Open {
                task,
                actor,
                config_id,
            } => {
                if config_id != self.config_id {
                    return refusal(
                        "config-mismatch",
                        format!(
                            "the running session daemon uses {}, not {config_id}: stop its sessions first (`agentjail session stop --all`) or use another --state-dir",
                            self.config_id
                        ),
                    );
                }
                let caller = match self.actor(actor.as_deref()) {
                    Ok(c) => c,
                    Err(v) => return v,
                };
                let request_id = match random_hex(16) {
                    Ok(h) => format!("cli-{h}"),
                    Err(_) => return refusal("internal", "no randomness"),
                };
                let req = SessionRequest {
                    request_id,
                    task,
                    inputs: Vec::new(),
                };
                match service::open_session(&self.state, &caller, req).await {
                    Ok((v, _)) => {
                        if let Ok(mut s) = self.sessions.lock() {
                            s.insert(v.session_id.clone(), caller);
                        }
                        json!({"ok": true, "session": v})
                    }
                    Err(e) => failure(e),
                }
            }
            Request::Cell { session_id, code } => {
                let Some(caller) = self.caller_of(&session_id) else {
                    return refusal("not-found", "no such session");
                };
                let request_id = match random_hex(16) {
                    Ok(h) => format!("cli-{h}"),
                    Err(_) => return refusal("internal", "no randomness"),
                };
                let req = CellRequest { request_id, code };
                match service::session_cell(&self.state, &caller, &session_id, req, true, None)
                    .await
                {
                    Ok(c) => json!({"ok": true, "cell": c}),
                    Err(e) => {
                        if matches!(e.code(), "session-closed" | "session-expired") {
                            self.forget(&session_id);
                        }
                        failure(e)
                    }
                }
            }
            Request::List => {
                let held: Vec<(String, Caller)> = self
                    .sessions
                    .lock()
                    .map(|s| s.iter().map(|(k, v)| (k.clone(), v.clone())).collect())
                    .unwrap_or_default();
                let mut out = Vec::new();
                for (id, caller) in held {
                    if let Ok(v) = service::get_session(&self.state, &caller, &id).await {
                        out.push(json!(v));
                    }
                }
                json!({"ok": true, "sessions": out})
            }
            Request::Close { session_id } => {
                let Some(caller) = self.caller_of(&session_id) else {
                    return refusal("not-found", "no such session");
                };
                let r = service::close_session(&self.state, &caller, &session_id).await;
                self.forget(&session_id);
                // None left: the daemon is exiting (the client waits for its socket to go).
                let remaining = self.sessions.lock().map_or(0, |s| s.len());
                match r {
                    Ok(v) => json!({"ok": true, "session": v, "remaining": remaining}),
                    Err(e) => failure(e),
                }
            }
            Request::CloseAll => {
                let closed = self.close_all().await;
                self.stop.notify_one();
                json!({"ok": true, "closed": closed, "remaining": 0})
            }
        }
    }

    async fn close_all(&self) -> Vec<String> {
        let held: Vec<(String, Caller)> = self
            .sessions
            .lock()
            .map(|mut s| std::mem::take(&mut *s).into_iter().collect())
            .unwrap_or_default();
        let mut closed = Vec::new();
        for (id, caller) in held {
            if service::close_session(&self.state, &caller, &id)
                .await
                .is_ok()
            {
                closed.push(id);
            }
        }
        closed
    }

    /// Drops the sessions that ended on their own (expired); true when none is left and
    /// nobody asked anything for a while (a daemon whose first opening failed exits too).
    async fn idle(&self) -> bool {
        let held: Vec<(String, Caller)> = self
            .sessions
            .lock()
            .map(|s| s.iter().map(|(k, v)| (k.clone(), v.clone())).collect())
            .unwrap_or_default();
        for (id, caller) in &held {
            match service::get_session(&self.state, caller, id).await {
                Ok(v) if v.state == "open" => {}
                _ => self.forget(id),
            }
        }
        let quiet = self
            .last_activity
            .lock()
            .map(|t| t.elapsed() > Duration::from_secs(20))
            .unwrap_or(true);
        quiet && self.sessions.lock().map(|s| s.is_empty()).unwrap_or(true)
    }

    async fn connection(self: Arc<Self>, stream: UnixStream) {
        let (read, mut write) = stream.into_split();
        // The kernel's word on who is at the other end, not anything the client says.
        let peer = match write.as_ref().peer_cred() {
            Ok(c) => c.uid(),
            Err(e) => {
                tracing::warn!(error = %e, "no peer credentials: connection refused");
                return;
            }
        };
        if peer != self.owner {
            tracing::warn!(peer, "a connection from another uid was refused");
            let line = refusal("forbidden", peer_refusal(self.owner, peer)).to_string() + "\n";
            let _ = write.write_all(line.as_bytes()).await;
            return;
        }
        let mut lines = BufReader::new(read.take(MAX_LINE)).lines();
        while let Ok(Some(line)) = lines.next_line().await {
            if let Ok(mut t) = self.last_activity.lock() {
                *t = Instant::now();
            }
            let answer = match serde_json::from_str::<Request>(&line) {
                Ok(req) => self.answer(req).await,
                Err(e) => refusal("malformed", format!("bad request: {e}")),
            };
            if let Ok(mut t) = self.last_activity.lock() {
                *t = Instant::now();
            }
            let out = answer.to_string() + "\n";
            if write.write_all(out.as_bytes()).await.is_err() {
                return;
            }
        }
    }
}

fn bind(socket: &Path) -> Result<UnixListener, ServerError> {
    use std::os::unix::fs::PermissionsExt;
    // A socket left by a daemon that died: the CLI found nobody answering on it.
    let _ = std::fs::remove_file(socket);
    let l = UnixListener::bind(socket)
        .map_err(|e| ServerError::Io(format!("cannot listen on {}: {e}", socket.display())))?;
    std::fs::set_permissions(socket, std::fs::Permissions::from_mode(0o600))
        .map_err(|e| ServerError::Io(format!("{}: {e}", socket.display())))?;
    Ok(l)
}

/// Serves the sessions until the last one ends; blocks. Builds its own runtime.
pub fn serve_blocking(opts: LocalOptions) -> Result<(), ServerError> {
    let _ = tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_ansi(false)
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("AGENTJAIL_LOG")
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .try_init();
    let mut config = opts.config;
    config.server.data_dir = Some(opts.data_dir.clone());
    let crate::app::Launch {
        data_dir,
        runner,
        allow_degraded,
        rt,
    } = crate::app::Launch::resolve(&config, opts.allow_degraded, "session")?;
    rt.block_on(async move {
        let state = AppState::open(config, &data_dir, runner, allow_degraded)?;
        crate::execution::runner::spawn_sweeper(state.clone());
        let listener = bind(&opts.socket)?;
        let d = Arc::new(Daemon {
            state,
            config_id: opts.config_id,
            owner: rustix::process::getuid().as_raw(),
            sessions: Mutex::new(BTreeMap::new()),
            last_activity: Mutex::new(Instant::now()),
            stop: tokio::sync::Notify::new(),
        });
        tracing::info!(socket = %opts.socket.display(), "session daemon listening");
        let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
            .map_err(|e| ServerError::Io(e.to_string()))?;
        let mut tick = tokio::time::interval(Duration::from_secs(5));
        loop {
            tokio::select! {
                a = listener.accept() => match a {
                    Ok((s, _)) => { tokio::spawn(d.clone().connection(s)); }
                    Err(e) => {
                        tracing::warn!(error = %e, "accept failed");
                        tokio::time::sleep(Duration::from_millis(50)).await;
                    }
                },
                _ = d.stop.notified() => {
                    if d.sessions.lock().map(|s| s.is_empty()).unwrap_or(true) { break; }
                }
                _ = tick.tick() => { if d.idle().await { break; } }
                _ = term.recv() => { d.close_all().await; break; }
            }
        }
        // No new client finds a daemon that is going away; the answers in flight go out
        // meanwhile.
        let _ = std::fs::remove_file(&opts.socket);
        // Every session it held is closed: their workspaces' checkpoints go (nothing can
        // resume or fork a closed session); the database, audit log and receipt key stay. A
        // stopping client waits for both to be gone.
        let _ = std::fs::remove_dir_all(crate::execution::checkpoints::dir(d.state.data_dir()));
        tokio::time::sleep(Duration::from_millis(100)).await;
        tracing::info!("no session left: the session daemon exits");
        Ok(())
    })
}
