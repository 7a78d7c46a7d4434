//! Execution: what happens between an admitted run and its recorded end.
//!
//! - [`runner`]: admission into this node's run slots, the job folder, spawning the
//!   `agentjail run` process and the lifeline protocol with it, collecting and verifying its
//!   outputs, and the lease and fencing checks around finishing a run; the retention sweeper.
//! - [`streams`]: what a finished run's record shows of the command's stdout and stderr (head
//!   and tail within the task's budget, sanitised, secrets redacted), from the job folder's logs.
//! - [`denials`]: a run's denials as they happen, from the runner's lifeline into the job
//!   folder's `denials.jsonl`, for its followers.
//! - [`fleet`]: the executor of a PostgreSQL deployment: claims queued runs, renews their
//!   leases, expires those of lost nodes, and reports this node's status; [`lease`]: a
//!   claimed run's lease renewals and the streaming of its output to the database.
//! - [`checkpoints`]: a session's workspace checkpoints, stored content-addressed and checked
//!   against their names; what a session's cell adds to its manifest.
//! - [`live`]: live sessions' sandboxes (one per session, a resident interpreter run through
//!   the same runner path as a run) and the control socket their cells go over;
//!   [`live_cell`]: what a live cell's answer comes to; [`live_fleet`]: live sessions on the
//!   fleet (the executor holding a session's interpreter, its cells routed there).
//!
//! Each writer of a run here tells the run's followers on this node when it wrote
//! ([`crate::news`]): the log drains, the denials' writer, the start and the end.
//!
//! Uses the shared state ([`crate::app`]), policy and storage; never the service or a front
//! door (the service calls in here, not the other way round).

pub mod checkpoints;
pub mod denials;
pub mod fleet;
pub mod lease;
pub mod live;
pub mod live_cell;
pub mod live_fleet;
pub mod runner;
pub mod streams;
