//! The PostgreSQL schema: its migrations, kept apart from the code that applies them
//! ([`super::migrate`], under an advisory lock) and the queries that use the tables. Nothing
//! here refers to any other module.

/// Schema migrations, applied in order; `schema_migrations` holds the versions applied.
pub(super) const MIGRATIONS: &[&str] = &[
    // 1: objects (input content), inputs, runs (with their owning node), the audit chain.
    "CREATE TABLE objects (
        sha256 TEXT PRIMARY KEY,
        content BYTEA NOT NULL,
        created_at BIGINT NOT NULL
    );
    CREATE TABLE inputs (
        id TEXT PRIMARY KEY,
        tenant TEXT NOT NULL,
        sha256 TEXT NOT NULL,
        name TEXT NOT NULL,
        media_type TEXT NOT NULL,
        bytes BIGINT NOT NULL,
        created_at BIGINT NOT NULL,
        expires_at BIGINT NOT NULL
    );
    CREATE INDEX inputs_sha ON inputs(sha256);
    CREATE TABLE runs (
        tenant TEXT NOT NULL,
        request_id TEXT NOT NULL,
        body_sha256 TEXT NOT NULL,
        task TEXT NOT NULL,
        actor TEXT NOT NULL,
        job_id TEXT NOT NULL UNIQUE,
        job_expires_at BIGINT NOT NULL,
        status TEXT NOT NULL,
        reason TEXT,
        created_at BIGINT NOT NULL,
        started_at BIGINT,
        finished_at BIGINT,
        inputs TEXT NOT NULL,
        report TEXT,
        receipt TEXT,
        artifact BYTEA,
        artifact_sha256 TEXT,
        outputs_expire_at BIGINT NOT NULL,
        logs_expire_at BIGINT NOT NULL,
        outputs_deleted BOOLEAN NOT NULL DEFAULT FALSE,
        args TEXT NOT NULL DEFAULT '[]',
        manifest_digest TEXT,
        node_id TEXT NOT NULL,
        PRIMARY KEY (tenant, request_id)
    );
    CREATE INDEX runs_status ON runs(status);
    CREATE INDEX runs_node_status ON runs(node_id, status);
    CREATE TABLE audit_log (
        seq BIGINT PRIMARY KEY,
        hash TEXT NOT NULL,
        record TEXT NOT NULL
    );",
    // 2: the queue (docs/deploy.md, "Leases and fencing"): what an executor needs to run a
    // run it did not admit (`spec`: its inputs' records and code), the labels it needs, and
    // the claim: `owner`, a fencing token from `run_fence` (new on every claim) and the
    // lease's end (the database's clock). Live executors in `workers`; the cluster-wide
    // count of expired leases in `cluster_counters`.
    "ALTER TABLE runs ADD COLUMN spec TEXT;
    ALTER TABLE runs ADD COLUMN labels TEXT[] NOT NULL DEFAULT '{}';
    ALTER TABLE runs ADD COLUMN owner TEXT;
    ALTER TABLE runs ADD COLUMN fence BIGINT;
    ALTER TABLE runs ADD COLUMN lease_expires_at TIMESTAMPTZ;
    CREATE SEQUENCE run_fence;
    CREATE INDEX runs_queue ON runs(created_at) WHERE status = 'queued' AND owner IS NULL;
    CREATE INDEX runs_leases ON runs(lease_expires_at) WHERE owner IS NOT NULL AND status IN ('queued', 'running');
    CREATE TABLE workers (
        node_id TEXT PRIMARY KEY,
        slots INTEGER NOT NULL,
        labels TEXT[] NOT NULL,
        started_at TIMESTAMPTZ NOT NULL DEFAULT now(),
        heartbeat_at TIMESTAMPTZ NOT NULL DEFAULT now()
    );
    CREATE TABLE cluster_counters (name TEXT PRIMARY KEY, value BIGINT NOT NULL);
    INSERT INTO cluster_counters (name, value) VALUES ('expired_leases', 0);",
    // 3: one audit chain per node (docs/server.md, "PostgreSQL"): `chain` names the node that
    // appended the record (`''`: the one chain of the versions before, closed now), each chain
    // numbered from 1; `audit_heads` holds each chain's last record, for the cross-anchors.
    "ALTER TABLE audit_log ADD COLUMN chain TEXT NOT NULL DEFAULT '';
    ALTER TABLE audit_log DROP CONSTRAINT audit_log_pkey;
    ALTER TABLE audit_log ADD PRIMARY KEY (chain, seq);
    CREATE TABLE audit_heads (chain TEXT PRIMARY KEY, seq BIGINT NOT NULL, hash TEXT NOT NULL);
    INSERT INTO audit_heads (chain, seq, hash)
        SELECT '', seq, hash FROM audit_log ORDER BY seq DESC LIMIT 1;",
    // 4: what the record shows of the command's stdout and stderr (JSON,
    // `execution::streams::Streams`), written when the run ends; NULL before, for a run whose
    // command never started, and again once retention deleted the outputs.
    "ALTER TABLE runs ADD COLUMN streams TEXT;
    ALTER TABLE runs ADD COLUMN stdout_log BYTEA;
    ALTER TABLE runs ADD COLUMN stderr_log BYTEA;
    ALTER TABLE runs ADD COLUMN cancel_requested BOOLEAN NOT NULL DEFAULT FALSE;
    CREATE INDEX runs_tenant_created ON runs(tenant, created_at);
    CREATE INDEX runs_created ON runs(created_at);",
    // 5: a run's denials as they happened (`execution::denials`: JSON lines, at most 64, from
    // the executor's job folder while the run goes on, whole at its end), for followers on
    // any replica; cleared with the logs.
    "ALTER TABLE runs ADD COLUMN denials_log BYTEA;",
    // 6: sessions and their cells (crate::storage::pg::sessions, the twins of SQLite's
    // migration 5), and the session checkpoints every node reads (`checkpoints`: the
    // workspace archives, content-addressed by the sha256 of `bytes`, hashed again before a
    // cell restores one; deleted by the retention sweep once nothing refers to them).
    "CREATE TABLE sessions (
        session_id TEXT PRIMARY KEY,
        tenant TEXT NOT NULL,
        actor TEXT NOT NULL,
        request_id TEXT NOT NULL,
        body_sha256 TEXT NOT NULL,
        task TEXT NOT NULL,
        inputs TEXT NOT NULL,
        created_at BIGINT NOT NULL,
        expires_at BIGINT NOT NULL,
        closed_at BIGINT,
        head_sha256 TEXT,
        last_receipt_sha256 TEXT,
        cells BIGINT NOT NULL DEFAULT 0,
        forked_from TEXT,
        forked_cell BIGINT,
        cells_before BIGINT NOT NULL DEFAULT 0,
        keep_checkpoints BIGINT NOT NULL,
        UNIQUE (tenant, request_id)
    );
    CREATE TABLE session_cells (
        session_id TEXT NOT NULL REFERENCES sessions(session_id),
        cell BIGINT NOT NULL,
        request_id TEXT NOT NULL,
        body_sha256 TEXT NOT NULL,
        tenant TEXT NOT NULL,
        run_request_id TEXT NOT NULL,
        before_sha256 TEXT,
        after_sha256 TEXT,
        head_after TEXT,
        receipt_sha256 TEXT,
        chain_after TEXT,
        created_at BIGINT NOT NULL,
        PRIMARY KEY (session_id, cell),
        UNIQUE (session_id, request_id)
    );
    CREATE TABLE checkpoints (
        sha256 TEXT PRIMARY KEY,
        bytes BYTEA NOT NULL,
        created_at BIGINT NOT NULL
    );",
    // 7: whether an executor is draining (SIGTERM: it claims no more and finishes the runs it
    // holds), written with its heartbeat, for the operator console's Fleet page.
    "ALTER TABLE workers ADD COLUMN draining BOOLEAN NOT NULL DEFAULT FALSE;",
    // 8: live sessions on the fleet (crate::execution::live_fleet): a live session's cell names
    // its session (`live_cell_of`: claimed only by the executor whose interpreter holds the
    // session, or by any executor when none does), and the resident interpreter's own run
    // names the session it holds (`interpreter_of`), under its lease like any run. And what
    // each node publishes of itself with its heartbeat (`workers.facts`, crate::node_facts:
    // its host's isolation facts, receipt key, self-test) for the console's Health page.
    "ALTER TABLE runs ADD COLUMN live_cell_of TEXT;
    ALTER TABLE runs ADD COLUMN interpreter_of TEXT;
    CREATE INDEX runs_interpreter_of ON runs (interpreter_of) WHERE interpreter_of IS NOT NULL;
    ALTER TABLE workers ADD COLUMN facts TEXT;",
    // 9: a live session's checkpoint on request on the fleet (crate::storage::pg::live_checkpoints):
    // a replica asks (`checkpoint_asked`, a counter), the executor holding the interpreter
    // answers the asks up to the one it read (`checkpoint_done`) with the result
    // (`checkpoint_result`: JSON, the digest or why none).
    "ALTER TABLE sessions ADD COLUMN checkpoint_asked BIGINT NOT NULL DEFAULT 0;
    ALTER TABLE sessions ADD COLUMN checkpoint_done BIGINT NOT NULL DEFAULT 0;
    ALTER TABLE sessions ADD COLUMN checkpoint_result TEXT;",
];
