//! A claimed run's lease on this executor (docs/deploy.md, "Leases and fencing"): its
//! heartbeat, which renews it every lease/3 and cancels [`Lease::lost`] when a renewal is
//! refused or none succeeds before its end, and the streaming of its output to the database
//! for followers on other nodes. Used by the executor's claimed runs
//! ([`super::fleet`]) and by the live sessions' interpreters ([`super::live_fleet`]).

use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio_util::sync::CancellationToken;

use super::runner::{self, Job, Lease, LeaseEnd};
use crate::app::AppState;
use crate::storage::pg::PgStore;
use agentjail_engine::lifeline::boottime_ns;

pub(crate) fn count_heartbeat(kind: &'static str, result: &'static str) {
    metrics::counter!("agentjail_heartbeats_total", "kind" => kind, "result" => result)
        .increment(1);
}

pub(crate) fn lease_of(state: &AppState) -> Duration {
    Duration::from_secs(state.inner.config.server.lease_seconds)
}

/// A run's lease held by this executor: its heartbeat and the streaming of its output to the
/// database run until [`Held::end`].
pub(crate) struct Held {
    done: CancellationToken,
    heartbeat: tokio::task::JoinHandle<()>,
    streaming: tokio::task::JoinHandle<()>,
}

impl Held {
    /// Stops renewing the lease (the run's end is recorded) and streaming its output.
    pub(crate) async fn end(mut self) {
        self.done.cancel();
        let _ = (&mut self.heartbeat).await;
        let _ = (&mut self.streaming).await;
    }
}

impl Drop for Held {
    /// An execution dropped before its end (aborted) stops renewing its lease too: the lease
    /// runs out and the sweep marks the run `unknown`, never held by this node for good.
    fn drop(&mut self) {
        self.done.cancel();
    }
}

/// Starts renewing the lease of `job_id` (claimed with `fence`, the claim sent at
/// `claimed_at`) and streaming its output; the [`Lease`] its execution gets.
pub(crate) fn hold_lease(
    state: &AppState,
    queue: &PgStore,
    job_id: &str,
    fence: i64,
    claimed_at: (Instant, u64),
) -> (Lease, Held) {
    let lease = lease_of(state);
    let lost = CancellationToken::new();
    let done = CancellationToken::new();
    let end = Arc::new(tokio::sync::watch::Sender::new(LeaseEnd::after(
        claimed_at.0,
        claimed_at.1,
        lease,
    )));
    let heartbeat = tokio::spawn(heartbeat(
        state.clone(),
        queue.clone(),
        job_id.to_owned(),
        fence,
        lease,
        end.clone(),
        lost.clone(),
        done.clone(),
    ));
    let streaming = tokio::spawn(stream_logs(
        state.clone(),
        queue.clone(),
        job_id.to_owned(),
        done.clone(),
    ));
    let l = Lease {
        queue: queue.clone(),
        fence,
        lost,
        end,
    };
    (
        l,
        Held {
            done,
            heartbeat,
            streaming,
        },
    )
}

/// Executes `job` (claimed with `fence` at `claimed_at`) under its lease, in `permit`'s run
/// slot.
pub(crate) async fn execute_leased(
    state: AppState,
    queue: PgStore,
    mut job: Job,
    fence: i64,
    claimed_at: (Instant, u64),
    permit: Option<tokio::sync::OwnedSemaphorePermit>,
) {
    let (lease, held) = hold_lease(&state, &queue, &job.job_id, fence, claimed_at);
    job.lease = Some(lease);
    runner::execute(state, job, None, permit).await;
    held.end().await;
}

/// How often a running run's new output goes to the database, for followers on other nodes.
const STREAM_EVERY: Duration = Duration::from_millis(250);
/// Most bytes of one stream sent to the database at once.
const STREAM_BYTES: u64 = 256 * 1024;

/// Until `done`: appends what the run's logs and live denials in this node's job folder hold
/// beyond what the database has to its stored copies, every [`STREAM_EVERY`]
/// (`GET /v1/runs/{id}/events` on any node reads them). Bounded like the files (the runner
/// passes at most 1 MiB of each stream; the denials are at most
/// [`super::denials::LOG_LIMIT`]).
async fn stream_logs(state: AppState, queue: PgStore, job_id: String, done: CancellationToken) {
    use super::streams::{log_name, read_from};
    let dir = runner::job_dir(&state, &job_id);
    let mut sent = [0u64; 3];
    loop {
        tokio::select! {
            _ = done.cancelled() => return,
            _ = tokio::time::sleep(STREAM_EVERY) => {}
        }
        for (i, name) in [log_name(true), log_name(false), super::denials::NAME]
            .into_iter()
            .enumerate()
        {
            let Some(b) =
                read_from(&dir.join(name), sent[i], STREAM_BYTES).filter(|b| !b.is_empty())
            else {
                continue;
            };
            let appended = match i {
                0 | 1 => queue.append_log(&job_id, i == 0, sent[i], &b).await,
                _ => queue.append_denials(&job_id, sent[i], &b).await,
            };
            match appended {
                Ok(()) => sent[i] += b.len() as u64,
                Err(e) => {
                    tracing::warn!(%job_id, error = %e, "sending a running run's output to the database failed; retrying")
                }
            }
        }
    }
}

/// Renews the lease every `lease`/3 until `done`; cancels `lost` when a renewal is refused or
/// when the lease's end (as of the last renewal sent, by this process's monotonic clock)
/// passes without a successful one. Each successful renewal moves `shared`, which the runner
/// receives ([`crate::execution::runner::LeaseEnd`]).
#[allow(clippy::too_many_arguments)]
async fn heartbeat(
    state: AppState,
    queue: PgStore,
    job_id: String,
    fence: i64,
    lease: Duration,
    shared: Arc<tokio::sync::watch::Sender<LeaseEnd>>,
    lost: CancellationToken,
    done: CancellationToken,
) {
    let every = lease / 3;
    let mut deadline = shared.borrow().lease;
    loop {
        let deadline_t = tokio::time::Instant::from_std(deadline);
        tokio::select! {
            _ = done.cancelled() => return,
            _ = tokio::time::sleep_until(deadline_t) => {
                tracing::error!(%job_id, fence, "no lease renewal succeeded before the lease ended: killing the sandbox");
                lost.cancel();
                return;
            }
            _ = tokio::time::sleep(every) => {}
        }
        let (sent, sent_boot) = (Instant::now(), boottime_ns());
        let r = tokio::select! {
            _ = done.cancelled() => return,
            _ = tokio::time::sleep_until(deadline_t) => {
                tracing::error!(%job_id, fence, "no lease renewal succeeded before the lease ended: killing the sandbox");
                lost.cancel();
                return;
            }
            r = queue.heartbeat(&job_id, fence, lease) => r,
        };
        match r {
            Ok(Some(cancel)) => {
                count_heartbeat("lease", "ok");
                // A cancel asked for on any node: the run's own cancellation kills its sandbox
                // (until it is registered, the next renewal asks again).
                if cancel && runner::cancel_here(&state, &job_id) {
                    tracing::info!(%job_id, "cancel requested: killing the run");
                }
                let end = LeaseEnd::after(sent, sent_boot, lease);
                deadline = end.lease;
                shared.send_replace(end);
            }
            Ok(None) => {
                if done.is_cancelled() {
                    return;
                }
                count_heartbeat("lease", "refused");
                tracing::error!(%job_id, fence, "the lease renewal was refused (the lease expired or was taken): killing the sandbox");
                lost.cancel();
                return;
            }
            Err(e) => {
                count_heartbeat("lease", "failed");
                tracing::warn!(%job_id, fence, error = %e, "renewing the lease failed; retrying until the lease ends");
            }
        }
    }
}
