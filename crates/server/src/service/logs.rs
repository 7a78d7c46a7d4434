//! A run's full retained log of stdout or stderr (`GET /v1/runs/{request_id}/logs`): the bytes
//! exactly as the command wrote them (the first 1 MiB of each stream), whose sha256 the run
//! record's view and the receipt carry, so that a log an agent acted on can be verified. From
//! the store when it keeps logs (PostgreSQL: any replica answers), otherwise from this node's
//! job folder. Every copy of the task's secrets (env values, gateway-held credentials) is
//! overwritten with `*` byte for byte, as the record's views redact them; such a log is then
//! not the attested one, and says so. Untrusted bytes: a front door serves them as an
//! attachment, never as a page.

use super::failure::Failure;
use super::runs::get_checked;
use crate::app::AppState;
use crate::execution::streams::{Secrets, Streams, log_name};
use crate::policy::{Caller, Refusal};
use crate::util::now;

/// A run's log.
pub struct Log {
    pub bytes: Vec<u8>,
    /// `sha256:<hex>` as the record's view carries it (None once retention deleted the view,
    /// or when a secret was masked: the bytes are then not the ones attested).
    pub sha256: Option<String>,
    /// How many copies of a secret (a task env value, a gateway-held credential) were masked.
    pub masked: u64,
}

/// The log of `request_id`'s stdout (`stdout`) or stderr, audited as `log_read`.
pub(crate) async fn log(
    state: &AppState,
    caller: &Caller,
    request_id: &str,
    stdout: bool,
) -> Result<Log, Failure> {
    let t = now();
    let r = get_checked(state, caller, request_id, "log_read", |r| {
        if r.finished_at.is_none() {
            Err(Refusal::NoLog { state: r.status })
        } else if r.logs_expire_at <= t {
            Err(Refusal::LogsExpired)
        } else {
            Ok(())
        }
    })
    .await?;
    let view = r
        .streams
        .as_deref()
        .and_then(|s| serde_json::from_str::<Streams>(s).ok())
        .and_then(|s| if stdout { s.stdout } else { s.stderr });
    let sha256 = view.as_ref().and_then(|v| v.sha256.clone());
    // The task's secrets are masked in what is served, as in the record's views; without the
    // task (removed from the configuration) they are unknown, so nothing is served.
    let Some(task) = state.inner.config.tasks.get(&r.task) else {
        return Err(Failure::Refused(Refusal::TaskGone));
    };
    // A stream the task shows none of never leaves, whole or in part.
    let limit = if stdout {
        task.stdout_limit()
    } else {
        task.stderr_limit()
    };
    if limit == 0 {
        let stream = if stdout { "stdout" } else { "stderr" };
        return Err(Failure::Refused(Refusal::StreamNotShown { stream }));
    }
    let secrets = Secrets::of(task);
    let served = |mut bytes: Vec<u8>| {
        let masked = secrets.mask(&mut bytes);
        Log {
            bytes,
            sha256: if masked == 0 { sha256.clone() } else { None },
            masked,
        }
    };
    if let Some(bytes) = state.store().run_log(&r.job_id, stdout).await? {
        return Ok(served(bytes));
    }
    let path = crate::execution::runner::job_dir(state, &r.job_id).join(log_name(stdout));
    match std::fs::read(&path) {
        Ok(bytes) => Ok(served(bytes)),
        // A log is created at the stream's first byte: none for a command that wrote nothing.
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => match &view {
            Some(v) if v.bytes == 0 => Ok(served(Vec::new())),
            Some(_) => Err(Failure::Refused(Refusal::LogsExpired)),
            None if r.outputs_deleted => Err(Failure::Refused(Refusal::LogsExpired)),
            None => Err(Failure::Refused(Refusal::NoLog { state: r.status })),
        },
        Err(e) => {
            tracing::error!(job_id = %r.job_id, error = %e, "reading a run's log failed");
            Err(Failure::Internal)
        }
    }
}
