//! The executors of a PostgreSQL deployment (docs/deploy.md, "The fleet"; "Leases and
//! fencing"): `agentjail worker` and `serve --slots N` claim queued runs from the database and
//! run them, each under a lease renewed by a heartbeat and a fencing token that conditions
//! every write of the run. Every node also sweeps expired leases and publishes the cluster's
//! gauges.
//!
//! - Claiming: [`crate::storage::pg::PgStore::claim`] (`FOR UPDATE SKIP LOCKED`, oldest first, labels
//!   matched), only while this node has a free run slot (the slot is taken first). An idle
//!   executor polls every [`POLL`] (no LISTEN/NOTIFY: a pooled connection cannot hold a
//!   LISTEN, and a poll also finds runs given back by an expired claim).
//! - Heartbeat: every lease/3, `UPDATE … WHERE fence = $token AND lease not expired`. A
//!   refused renewal, or no successful one before the lease's end measured from the moment the
//!   last renewal was *sent* (this process's monotonic clock, so never later than the
//!   database's end), cancels [`crate::execution::runner::Lease::lost`]: the runner is killed, its sandbox
//!   dies with it, and nothing more of the run is recorded.
//! - The runner enforces the lease too, so that a paused or stuck executor (whose runner
//!   lives on) cannot leave a payload running past it: every successful renewal is sent to
//!   the runner over its lifeline as the time by which its sandbox must be dead, on
//!   `CLOCK_BOOTTIME` (a suspended host's time counts), [`crate::execution::runner::payload_margin`]
//!   before the lease's end; the runner kills the sandbox then unless a newer one came
//!   ([`agentjail_engine::lifeline`]).
//! - Sweeping: [`crate::storage::pg::PgStore::expire_leases`] on every node every lease/3.
//! - The node's own state ([`NodeStatus`]: last heartbeat, slots busy, draining) is what a
//!   worker's `/healthz` and `/readyz` answer from ([`crate::doors::worker_http`]).

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

use super::lease::{count_heartbeat, hold_lease, lease_of};
use crate::app::AppState;
use crate::execution::runner::{self, Job};
use crate::storage::pg::{Claimed, JobSpec, PgStore};
use crate::util::now;
use agentjail_engine::lifeline::boottime_ns;

/// How often a node records the other nodes' audit chain heads in its own chain (when one
/// moved): a record older than this is anchored by every live node.
pub const ANCHOR_EVERY: Duration = Duration::from_secs(5);

/// How often an idle executor looks for work.
pub const POLL: Duration = Duration::from_millis(250);

/// The cluster gauges, at zero until the first reading (present from start-up).
pub(crate) fn zero_cluster_metrics() {
    metrics::gauge!("agentjail_cluster_queue_depth").set(0.0);
    metrics::gauge!("agentjail_cluster_oldest_queued_seconds").set(0.0);
    metrics::gauge!("agentjail_cluster_live_workers").set(0.0);
    metrics::counter!("agentjail_cluster_expired_leases_total").absolute(0);
    metrics::counter!("agentjail_fenced_writes_total").increment(0);
}

/// This executor's own state, for its probes and its slot gauges.
#[derive(Debug, Default)]
pub struct NodeStatus {
    /// When this node's row in `workers` was last renewed successfully (monotonic clock).
    last_heartbeat: std::sync::Mutex<Option<Instant>>,
    /// Claimed runs this node is executing now.
    busy: AtomicUsize,
    /// Set at SIGTERM: no more claims; the runs held finish.
    draining: AtomicBool,
}

impl NodeStatus {
    /// How long ago the node's heartbeat last succeeded; None: never yet.
    pub fn heartbeat_age(&self) -> Option<Duration> {
        self.last_heartbeat
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .map(|t| t.elapsed())
    }
    fn heartbeat_ok(&self) {
        *self
            .last_heartbeat
            .lock()
            .unwrap_or_else(|e| e.into_inner()) = Some(Instant::now());
    }
    /// Claimed runs executing now.
    pub fn busy(&self) -> usize {
        self.busy.load(Ordering::Acquire)
    }
    /// Whether the node stopped claiming (SIGTERM) and is finishing its runs.
    pub fn draining(&self) -> bool {
        self.draining.load(Ordering::Acquire)
    }
    /// Stop claiming: from now on the readiness probe answers 503.
    pub fn set_draining(&self) {
        self.draining.store(true, Ordering::Release);
    }
}

/// Counts one claimed run as busy (in [`NodeStatus`] and the slot gauges) until dropped.
struct Busy {
    status: Arc<NodeStatus>,
    slots: usize,
}

impl Busy {
    fn new(status: Arc<NodeStatus>, slots: usize) -> Busy {
        let busy = status.busy.fetch_add(1, Ordering::AcqRel) + 1;
        slot_gauges(busy, slots);
        Busy { status, slots }
    }
}

impl Drop for Busy {
    fn drop(&mut self) {
        let busy = self
            .status
            .busy
            .fetch_sub(1, Ordering::AcqRel)
            .saturating_sub(1);
        slot_gauges(busy, self.slots);
    }
}

fn slot_gauges(busy: usize, slots: usize) {
    metrics::gauge!("agentjail_worker_slots_busy").set(busy as f64);
    metrics::gauge!("agentjail_worker_slots_free").set(slots.saturating_sub(busy) as f64);
}

/// An executor's own families, at zero from start-up: its slots and its heartbeats (the
/// node's row, `kind="node"`; the runs' leases, `kind="lease"`: `ok`, `failed` (the database
/// did not answer; retried until the lease ends), `refused` (the lease was gone: the sandbox
/// is killed)).
pub(crate) fn zero_executor_metrics(slots: usize) {
    metrics::describe_gauge!(
        "agentjail_worker_slots_busy",
        "Run slots of this executor running a claimed run"
    );
    metrics::describe_gauge!(
        "agentjail_worker_slots_free",
        "Run slots of this executor free"
    );
    metrics::describe_counter!(
        "agentjail_heartbeats_total",
        "Heartbeats of this executor: kind node (its workers row) or lease (a run's lease), result ok, failed or refused"
    );
    slot_gauges(0, slots);
    for (kind, result) in [
        ("node", "ok"),
        ("node", "failed"),
        ("lease", "ok"),
        ("lease", "failed"),
        ("lease", "refused"),
    ] {
        metrics::counter!("agentjail_heartbeats_total", "kind" => kind, "result" => result)
            .increment(0);
    }
}

/// Every node of a PostgreSQL deployment: sweeps expired leases and refreshes the cluster
/// gauges, until `stop`.
pub fn spawn_cluster_tasks(state: AppState, queue: PgStore, stop: CancellationToken) {
    let every = (lease_of(&state) / 3).max(Duration::from_secs(1));
    tokio::spawn(async move {
        let mut anchored: Option<Instant> = None;
        loop {
            sweep_leases(&queue).await;
            match queue.forget_gone_nodes(FORGET_NODES_AFTER).await {
                Ok(0) => {}
                Ok(n) => tracing::info!(nodes = n, "forgot nodes gone for an hour"),
                Err(e) => tracing::warn!(error = %e, "forgetting gone nodes failed"),
            }
            if anchored.is_none_or(|t| t.elapsed() >= ANCHOR_EVERY) {
                match queue.anchor().await {
                    Ok(_) => anchored = Some(Instant::now()),
                    Err(e) => tracing::warn!(error = %e, "anchoring the other audit chains failed"),
                }
            }
            match queue.cluster_gauges(lease_of(&state) * 2).await {
                Ok(g) => {
                    metrics::gauge!("agentjail_cluster_queue_depth").set(g.queue_depth as f64);
                    metrics::gauge!("agentjail_cluster_oldest_queued_seconds")
                        .set(g.oldest_queued_seconds as f64);
                    metrics::gauge!("agentjail_cluster_live_workers").set(g.live_workers as f64);
                    metrics::counter!("agentjail_cluster_expired_leases_total")
                        .absolute(g.expired_leases.max(0) as u64);
                }
                Err(e) => tracing::warn!(error = %e, "reading the cluster gauges failed"),
            }
            tokio::select! {
                _ = tokio::time::sleep(every) => {}
                _ = stop.cancelled() => return,
            }
        }
    });
}

async fn sweep_leases(queue: &PgStore) {
    match queue.expire_leases(now()).await {
        Ok((expired, requeued)) => {
            if requeued > 0 {
                tracing::warn!(
                    requeued,
                    "claims that expired before their runs started went back to the queue"
                );
            }
            for e in expired {
                tracing::warn!(request_id = %e.run.request_id, job_id = %e.run.job_id, owner = %e.owner, "a lease expired while its run was running: marked unknown; an operator reconciles it");
                // Audited (`run_unknown`) in the marking's transaction.
                metrics::counter!("agentjail_unknown_outcomes_total").increment(1);
            }
        }
        Err(e) => tracing::warn!(error = %e, "sweeping expired leases failed"),
    }
}

/// The executor: claims runs while this node has free run slots, runs each under its lease,
/// until `stop`; then claims no more and waits for the runs it holds to finish. Also keeps
/// this node's row in `workers` fresh.
pub async fn run_executor(
    state: AppState,
    queue: PgStore,
    labels: Vec<String>,
    stop: CancellationToken,
    status: Arc<NodeStatus>,
) {
    let lease = lease_of(&state);
    let slots = state.inner.slots;
    // The node's heartbeat goes on while it drains (it is alive, finishing the runs it holds)
    // and says so at once when the drain starts; it ends when the executor has finished.
    let finished = CancellationToken::new();
    let alive = spawn_heartbeat(
        queue.clone(),
        slots,
        labels.clone(),
        status.clone(),
        lease / 3,
        stop.clone(),
        finished.clone(),
    );
    let held_cells = tokio::spawn(claim_held_cells(state.clone(), queue.clone(), stop.clone()));
    let mut running = JoinSet::new();
    loop {
        while running.try_join_next().is_some() {}
        let permit = tokio::select! {
            p = state.inner.run_slots.clone().acquire_owned() => p,
            _ = stop.cancelled() => break,
        };
        let Ok(permit) = permit else { break };
        if stop.is_cancelled() {
            break;
        }
        // Read before the claim leaves: the lease ends after these, by the database's clock.
        let sent = (Instant::now(), boottime_ns());
        match queue.claim(&labels, lease).await {
            Ok(Some(c)) => {
                tracing::info!(request_id = %c.run.request_id, job_id = %c.run.job_id, fence = c.fence, "claimed a run");
                let busy = Busy::new(status.clone(), slots);
                running.spawn(run_claimed(
                    state.clone(),
                    queue.clone(),
                    c,
                    Some(permit),
                    sent,
                    Some(busy),
                ));
            }
            Ok(None) => {
                drop(permit);
                tokio::select! {
                    _ = tokio::time::sleep(POLL) => {}
                    _ = stop.cancelled() => break,
                }
            }
            Err(e) => {
                drop(permit);
                tracing::warn!(error = %e, "claiming a run failed; retrying");
                tokio::select! {
                    _ = tokio::time::sleep(Duration::from_secs(1)) => {}
                    _ = stop.cancelled() => break,
                }
            }
        }
    }
    let held = running.len();
    if held > 0 {
        tracing::info!(
            runs = held,
            "stopping: claiming no more runs; waiting for the runs this executor holds"
        );
    }
    while running.join_next().await.is_some() {}
    let _ = held_cells.await;
    // The live sessions' interpreters held here end as at their idle end (their workspaces
    // checkpointed): their next cells go to any executor.
    super::live::close_all(&state).await;
    finished.cancel();
    let _ = alive.await;
    if let Err(e) = queue.worker_gone().await {
        tracing::warn!(error = %e, "removing this executor from the workers table failed");
    }
}

/// Until `stop`: claims the queued cells of the live sessions whose interpreters this node
/// holds (they need no run slot: the interpreter holds one), and waits for them at the end.
async fn claim_held_cells(state: AppState, queue: PgStore, stop: CancellationToken) {
    let lease = lease_of(&state);
    let mut running = JoinSet::new();
    // A cell queued for a session is told at once (PgStore::live_news); the poll finds the
    // rest (cells given back, notifications lost while the database session was re-made).
    let mut news = queue.live_news();
    // Sessions whose checkpoint ask is being answered here (one at a time each).
    let answering: std::sync::Arc<std::sync::Mutex<std::collections::HashSet<String>>> =
        Default::default();
    while !stop.is_cancelled() {
        while running.try_join_next().is_some() {}
        state.inner.live.prune();
        answer_checkpoints(&state, &queue, &answering, &mut running).await;
        let claimed = if state.inner.live.is_empty() {
            Ok(None)
        } else {
            let sent = (Instant::now(), boottime_ns());
            queue.claim_held(lease).await.map(|c| c.map(|c| (c, sent)))
        };
        match claimed {
            Ok(Some((c, sent))) => {
                tracing::info!(request_id = %c.run.request_id, job_id = %c.run.job_id, fence = c.fence, "claimed a live session's cell");
                running.spawn(run_claimed(
                    state.clone(),
                    queue.clone(),
                    c,
                    None,
                    sent,
                    None,
                ));
                continue;
            }
            Ok(None) => {}
            Err(e) => tracing::warn!(error = %e, "claiming a live session's cell failed; retrying"),
        }
        tokio::select! {
            _ = tokio::time::sleep(POLL) => {}
            _ = news.changed() => {}
            _ = stop.cancelled() => break,
        }
    }
    while running.join_next().await.is_some() {}
}

/// Starts answering the checkpoint asks of the sessions this node holds
/// ([`super::live_fleet::answer_checkpoint`]), each session's one at a time.
async fn answer_checkpoints(
    state: &AppState,
    queue: &PgStore,
    answering: &std::sync::Arc<std::sync::Mutex<std::collections::HashSet<String>>>,
    running: &mut JoinSet<()>,
) {
    let held = state.inner.live.ids();
    if held.is_empty() {
        return;
    }
    let asks = match queue.checkpoints_asked(&held).await {
        Ok(a) => a,
        Err(e) => {
            tracing::warn!(error = %e, "reading the checkpoint asks failed; retrying");
            return;
        }
    };
    for a in asks {
        let fresh = answering
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(a.session_id.clone());
        if !fresh {
            continue;
        }
        let (state, queue, answering) = (state.clone(), queue.clone(), answering.clone());
        running.spawn(async move {
            let sid = a.session_id.clone();
            super::live_fleet::answer_checkpoint(&state, &queue, a).await;
            answering
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .remove(&sid);
        });
    }
}

/// This node's row in `workers`, renewed every `every` (slots, labels, whether it drains;
/// the first write also sets its start) until `finished`. When `stop` is cancelled (a drain
/// begins) it is written once at once, to say so.
fn spawn_heartbeat(
    queue: PgStore,
    slots: usize,
    labels: Vec<String>,
    status: Arc<NodeStatus>,
    every: Duration,
    stop: CancellationToken,
    finished: CancellationToken,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let (mut told_drain, mut first) = (false, true);
        loop {
            match queue
                .worker_alive(
                    slots,
                    &labels,
                    status.draining(),
                    first,
                    &crate::node_facts::facts().to_string(),
                )
                .await
            {
                Ok(()) => {
                    first = false;
                    status.heartbeat_ok();
                    count_heartbeat("node", "ok");
                }
                Err(e) => {
                    count_heartbeat("node", "failed");
                    tracing::warn!(error = %e, "recording this node as live failed");
                }
            }
            tokio::select! {
                _ = tokio::time::sleep(every) => {}
                _ = stop.cancelled(), if !told_drain => told_drain = true,
                _ = finished.cancelled() => return,
            }
        }
    })
}

/// Runs one claimed run under its lease: the heartbeat renews it; the run's writes are fenced.
/// `permit` is its run slot (None: a cell of a live session this node holds, whose
/// interpreter holds one; crate::execution::live_fleet).
async fn run_claimed(
    state: AppState,
    queue: PgStore,
    c: Claimed,
    permit: Option<tokio::sync::OwnedSemaphorePermit>,
    claimed_at: (Instant, u64),
    busy: Option<Busy>,
) {
    let run = c.run;
    let (lease_h, held) = hold_lease(&state, &queue, &run.job_id, c.fence, claimed_at);
    let spec: Result<JobSpec, _> = serde_json::from_str(&c.spec);
    let args: Result<Vec<String>, _> = serde_json::from_str(&run.args);
    let live = spec
        .as_ref()
        .ok()
        .and_then(|s| s.session.as_ref())
        .is_some_and(|c| c.live);
    // A session's cell starts from the session's head checkpoint, read from the database and
    // hashed here before anything runs: a missing or tampered one ends the cell as a set-up
    // error, never half-restored. (A live session's cell runs in its interpreter, which
    // restores the head it reads when it starts.)
    let restored = match spec.as_ref().ok().and_then(|s| s.session.as_ref()) {
        Some(cell) if !live => match cell.restore.as_deref() {
            Some(sha) => super::checkpoints::materialise(&state.inner.data_dir, &queue, sha).await,
            None => Ok(()),
        },
        _ => Ok(()),
    };
    match (spec, args, restored) {
        (_, _, Err(why)) => {
            drop(permit);
            tracing::error!(job_id = %run.job_id, %why, "a claimed cell's checkpoint was refused");
            let who = runner::RunIds::of(&run);
            runner::end_claim_as_setup_error(&queue, c.fence, who, &why).await;
        }
        (Ok(spec), Ok(args), Ok(())) if live => {
            let claimed = super::live_fleet::Claimed {
                run,
                spec,
                args,
                lease: lease_h,
            };
            super::live_fleet::run_cell(&state, &queue, claimed, permit).await;
        }
        (Ok(spec), Ok(args), Ok(())) => {
            let job = Job {
                tenant: run.tenant,
                actor: run.actor,
                request_id: run.request_id,
                task: run.task,
                job_id: run.job_id,
                // The database decided how long the job id has left; on this host's clock.
                job_expires_at: now() + c.job_left,
                inputs: spec.inputs,
                code: spec.code,
                args,
                cancel: None,
                lease: Some(lease_h),
                session: spec.session,
            };
            runner::execute(state, job, None, permit).await;
        }
        _ => {
            drop(permit);
            tracing::error!(job_id = %run.job_id, "a claimed run's spec or args cannot be read; ended as a set-up error");
            let who = runner::RunIds::of(&run);
            let reason = "the queued run's record cannot be read";
            runner::end_claim_as_setup_error(&queue, c.fence, who, reason).await;
        }
    }
    held.end().await;
    drop(busy);
}

/// A started fleet node: its stop token, its executor (when it has run slots), its state.
pub struct Started {
    /// Cancelled at a graceful stop: no more claims, no more sweeps.
    pub stop: CancellationToken,
    /// The executor, to wait for at a graceful stop (it finishes the runs it holds).
    pub exec: Option<tokio::task::JoinHandle<()>>,
    /// This node's heartbeat, busy slots and draining flag.
    pub status: Arc<NodeStatus>,
}

/// How long a node that stopped its heartbeat (and holds no run) stays listed in `workers`
/// (the console's Fleet page shows it as not live meanwhile).
const FORGET_NODES_AFTER: Duration = Duration::from_secs(3600);

/// The least time between two of this node's `runs_changed` notifications.
const TELL_EVERY: Duration = Duration::from_millis(250);

/// On PostgreSQL: starts this node's lease sweeper and gauges, and its executor when it has
/// run slots. None on SQLite.
pub fn start(state: &AppState, labels: Vec<String>) -> Option<Started> {
    let queue = state.inner.queue.clone()?;
    let stop = CancellationToken::new();
    let status = Arc::new(NodeStatus::default());
    spawn_cluster_tasks(state.clone(), queue.clone(), stop.clone());
    // Runs registered or changed on any node wake this node's live runs lists (the console);
    // this node's own changes are told to the others, at most one notification per
    // `TELL_EVERY`.
    let mut changed = queue.runs_changed();
    let news = state.clone();
    tokio::spawn(async move {
        while changed.changed().await.is_ok() {
            news.inner.news.changed_elsewhere();
        }
    });
    let mut local = state.inner.news.local_changes();
    let teller = queue.clone();
    tokio::spawn(async move {
        while local.changed().await.is_ok() {
            tokio::time::sleep(TELL_EVERY).await;
            local.borrow_and_update();
            if let Err(e) = teller.tell_runs_changed().await {
                tracing::debug!(error = %e, "telling the other nodes of a run's change failed");
            }
        }
    });
    if state.inner.slots == 0 {
        // An API replica without run slots is in `workers` too (slots 0), so that the
        // console's Fleet page lists every node; it claims nothing, and its heartbeat ends
        // with `stop`.
        spawn_heartbeat(
            queue.clone(),
            0,
            Vec::new(),
            status.clone(),
            lease_of(state) / 3,
            stop.clone(),
            stop.clone(),
        );
    }
    let exec = (state.inner.slots > 0).then(|| {
        zero_executor_metrics(state.inner.slots);
        tokio::spawn(run_executor(
            state.clone(),
            queue,
            labels,
            stop.child_token(),
            status.clone(),
        ))
    });
    Some(Started { stop, exec, status })
}
