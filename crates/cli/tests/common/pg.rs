//! A throwaway PostgreSQL cluster for one test: `initdb` and `pg_ctl` (Debian's packages) run
//! as an unprivileged user (`postgres`, else `nobody`, via `setpriv`) in a temporary folder,
//! listening on 127.0.0.1 at a free port (password authentication, scram-sha-256) and on a
//! unix socket in that folder (trust, for the test's own `psql`). Stopped (`immediate`) and
//! deleted on drop. Missing binaries: [`super::skip`] (a panic under CI).

#![allow(dead_code, clippy::unwrap_used, clippy::expect_used)]

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

/// The role the tests connect as, and its password (passed to `serve` as PGPASSWORD only).
pub const USER: &str = "agentjail";
pub const PASSWORD: &str = "pg-pw-7d41c9e0";
pub const DB: &str = "agentjail";

pub struct Pg {
    dir: tempfile::TempDir,
    bin: PathBuf,
    /// The unprivileged user's (uid, gid); None when the test is not root (runs as itself).
    owner: Option<(u32, u32)>,
    pub port: u16,
    /// The address it listens on (127.0.0.1, or its test host's, see [`Pg::start_on`]).
    pub host: String,
    /// The command prefix that puts its processes on a test host (`nsenter --net=… --`).
    wrap: Vec<String>,
}

/// The folder holding initdb and pg_ctl: the newest /usr/lib/postgresql/*/bin, else PATH.
fn bindir() -> Option<PathBuf> {
    let mut dirs: Vec<(u32, PathBuf)> = std::fs::read_dir("/usr/lib/postgresql")
        .ok()?
        .flatten()
        .filter_map(|e| {
            let v = e.file_name().to_str()?.parse::<u32>().ok()?;
            let b = e.path().join("bin");
            b.join("initdb").exists().then_some((v, b))
        })
        .collect();
    dirs.sort();
    dirs.pop().map(|(_, b)| b).or_else(|| {
        ["/usr/local/bin", "/usr/bin"]
            .iter()
            .map(PathBuf::from)
            .find(|d| d.join("initdb").exists() && d.join("pg_ctl").exists())
    })
}

fn user_ids(name: &str) -> Option<(u32, u32)> {
    let pw = std::fs::read_to_string("/etc/passwd").ok()?;
    pw.lines().find_map(|l| {
        let f: Vec<&str> = l.split(':').collect();
        (f.first() == Some(&name))
            .then(|| Some((f.get(2)?.parse().ok()?, f.get(3)?.parse().ok()?)))?
    })
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

impl Pg {
    /// A fresh, running cluster with database [`DB`] owned by [`USER`]; None (after
    /// [`super::skip`]) when PostgreSQL or setpriv is missing.
    pub fn start() -> Option<Pg> {
        Pg::start_on(Vec::new(), "127.0.0.1")
    }

    /// [`Pg::start`] on a test host: its processes start behind `wrap` (e.g.
    /// [`super::netns::Topology::wrap`]) and it listens on `host` (that host's address) as well
    /// as its unix socket; password clients are accepted from the subnets of its interfaces
    /// (`samenet`).
    pub fn start_on(wrap: Vec<String>, host: &str) -> Option<Pg> {
        let Some(bin) = bindir() else {
            super::skip("PostgreSQL's initdb/pg_ctl not found (apt-get install postgresql)");
            return None;
        };
        let psql_ok = Command::new("psql").arg("--version").output().is_ok();
        if !psql_ok && !bin.join("psql").exists() {
            super::skip("psql not found (apt-get install postgresql-client)");
            return None;
        }
        let owner = if super::is_root() {
            if Command::new("setpriv").arg("--version").output().is_err() {
                super::skip("setpriv not found (util-linux)");
                return None;
            }
            Some(user_ids("postgres").or_else(|| user_ids("nobody")).unwrap())
        } else {
            None
        };
        let dir = tempfile::Builder::new()
            .prefix("agentjail-pg-")
            .tempdir()
            .unwrap();
        if let Some((u, g)) = owner {
            std::os::unix::fs::chown(dir.path(), Some(u), Some(g)).unwrap();
        }
        let pw = dir.path().join("pw");
        std::fs::write(&pw, PASSWORD).unwrap();
        if let Some((u, g)) = owner {
            std::os::unix::fs::chown(&pw, Some(u), Some(g)).unwrap();
        }
        let pg = Pg {
            dir,
            bin,
            owner,
            port: free_port(),
            host: host.to_string(),
            wrap,
        };
        let data = pg.data();
        let o = pg.as_owner(
            "initdb",
            &[
                "-D",
                data.to_str().unwrap(),
                "-U",
                USER,
                "--auth-local=trust",
                "--auth-host=scram-sha-256",
                "--pwfile",
                pw.to_str().unwrap(),
                "-E",
                "UTF8",
                "--no-sync",
            ],
        );
        assert!(
            o.status.success(),
            "initdb failed: {}",
            String::from_utf8_lossy(&o.stderr)
        );
        if pg.host != "127.0.0.1" {
            use std::io::Write;
            let mut hba = std::fs::OpenOptions::new()
                .append(true)
                .open(data.join("pg_hba.conf"))
                .unwrap();
            writeln!(hba, "host all all samenet scram-sha-256").unwrap();
        }
        pg.pg_ctl_start();
        pg.psql_db("postgres", &format!("CREATE DATABASE {DB}"));
        Some(pg)
    }

    fn data(&self) -> PathBuf {
        self.dir.path().join("data")
    }

    /// The socket folder (also the cluster's folder).
    pub fn socket_dir(&self) -> &Path {
        self.dir.path()
    }

    fn as_owner(&self, prog: &str, args: &[&str]) -> Output {
        let exe = self.bin.join(prog);
        let mut c = match self.owner {
            Some((u, g)) => {
                let mut c = self.command("setpriv");
                c.arg(format!("--reuid={u}"))
                    .arg(format!("--regid={g}"))
                    .arg("--clear-groups")
                    .arg(&exe);
                c
            }
            None => self.command(exe.to_str().unwrap()),
        };
        c.args(args)
            .current_dir(self.dir.path())
            .env_remove("PGPASSWORD")
            .output()
            .unwrap()
    }

    /// `prog` behind the test host's prefix, if any.
    fn command(&self, prog: &str) -> Command {
        match self.wrap.split_first() {
            Some((first, rest)) => {
                let mut c = Command::new(first);
                c.args(rest).arg(prog);
                c
            }
            None => Command::new(prog),
        }
    }

    fn pg_ctl_start(&self) {
        let opts = format!(
            "-c listen_addresses={} -p {} -k {} -c fsync=off -c max_connections=200",
            self.host,
            self.port,
            self.dir.path().display()
        );
        let log = self.dir.path().join("log");
        let o = self.as_owner(
            "pg_ctl",
            &[
                "-D",
                self.data().to_str().unwrap(),
                "-o",
                &opts,
                "-l",
                log.to_str().unwrap(),
                "-w",
                "-t",
                "60",
                "start",
            ],
        );
        assert!(
            o.status.success(),
            "pg_ctl start failed: {}\n{}",
            String::from_utf8_lossy(&o.stderr),
            std::fs::read_to_string(&log).unwrap_or_default()
        );
    }

    /// Stops the cluster (fast shutdown: open connections are cut).
    pub fn stop(&self) {
        let o = self.as_owner(
            "pg_ctl",
            &[
                "-D",
                self.data().to_str().unwrap(),
                "-m",
                "fast",
                "-w",
                "stop",
            ],
        );
        assert!(
            o.status.success(),
            "pg_ctl stop: {}",
            String::from_utf8_lossy(&o.stderr)
        );
    }

    /// Starts the cluster again after [`Pg::stop`].
    pub fn start_again(&self) {
        self.pg_ctl_start();
    }

    /// The URL `serve --database` takes (no password: PGPASSWORD carries it).
    pub fn url(&self) -> String {
        format!(
            "postgres://{USER}@{}:{}/{DB}?sslmode=disable",
            self.host, self.port
        )
    }

    /// `psql` on `db` over the unix socket, quiet, tuples only, unaligned, stopping at the
    /// first error.
    fn psql_command(&self, db: &str) -> Command {
        let psql = if self.bin.join("psql").exists() {
            self.bin.join("psql")
        } else {
            PathBuf::from("psql")
        };
        let mut c = Command::new(psql);
        c.args(["-X", "-q", "-t", "-A", "-v", "ON_ERROR_STOP=1", "-h"])
            .arg(self.dir.path())
            .args(["-p", &self.port.to_string(), "-U", USER, "-d", db])
            .env_remove("PGPASSWORD");
        c
    }

    fn psql_db(&self, db: &str, sql: &str) -> String {
        let o = self.psql_command(db).args(["-c", sql]).output().unwrap();
        assert!(
            o.status.success(),
            "psql {sql:?}: {}",
            String::from_utf8_lossy(&o.stderr)
        );
        String::from_utf8_lossy(&o.stdout).trim().to_string()
    }

    /// How many records of the audit chain are `event`s of `request_id`.
    pub fn audited(&self, event: &str, request_id: &str) -> String {
        self.psql(&format!(
            "SELECT count(*) FROM audit_log WHERE record::jsonb->>'event' = '{event}' AND record::jsonb->>'request_id' = '{request_id}'"
        ))
    }

    /// Holds the session-level advisory lock `key` in a `psql` session of its own until the
    /// returned guard is dropped (the session ends, and the lock with it).
    pub fn hold_advisory_lock(&self, key: i64) -> HeldLock {
        use std::io::{BufRead, BufReader, Write};
        use std::process::Stdio;
        let mut child = self
            .psql_command(DB)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        let mut stdin = child.stdin.take().unwrap();
        writeln!(stdin, "SELECT pg_advisory_lock({key}), 'locked';").unwrap();
        stdin.flush().unwrap();
        let mut line = String::new();
        BufReader::new(child.stdout.take().unwrap())
            .read_line(&mut line)
            .unwrap();
        assert!(line.contains("locked"), "the advisory lock: {line:?}");
        HeldLock {
            child,
            _stdin: stdin,
        }
    }

    /// Waits (at most 30 s) until a session of an agentjail node waits on the advisory lock
    /// `key` (a one-bigint key is held as (classid, objid) = (high, low 32 bits)); `alive` is
    /// asked on each round (false: the node exited first).
    pub fn wait_advisory_waiter(&self, key: i64, what: &str, mut alive: impl FnMut() -> bool) {
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
        let waiting = format!(
            "SELECT count(*) > 0 FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid
             WHERE a.application_name = 'agentjail' AND l.locktype = 'advisory' AND NOT l.granted
             AND ((l.classid::bigint << 32) | l.objid::bigint) = {key}"
        );
        while self.psql(&waiting) != "t" {
            assert!(alive(), "the node exited before {what} reached its lock");
            assert!(
                std::time::Instant::now() < deadline,
                "{what} never reached its lock"
            );
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
    }

    /// Makes the insert of an audit record of `event` for `request_id` wait on the advisory
    /// lock `key` (a trigger; the caller holds `key` with [`Pg::hold_advisory_lock`]): the
    /// node appending it waits inside its append's transaction, holding what that takes.
    pub fn hold_audit_insert(&self, name: &str, event: &str, request_id: &str, key: i64) {
        self.psql(&format!(
            "CREATE FUNCTION {name}() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN IF NEW.record::jsonb->>'event' = '{event}' AND NEW.record::jsonb->>'request_id' = '{request_id}' THEN PERFORM pg_advisory_xact_lock({key}); END IF; RETURN NEW; END $$; CREATE TRIGGER {name} BEFORE INSERT ON audit_log FOR EACH ROW EXECUTE FUNCTION {name}()"
        ));
    }

    /// Runs `sql` in [`DB`] over the unix socket; its output (tuples only, unaligned).
    pub fn psql(&self, sql: &str) -> String {
        self.psql_db(DB, sql)
    }
}

/// A `psql` session holding an advisory lock; ended (and the lock released) when dropped.
pub struct HeldLock {
    child: std::process::Child,
    _stdin: std::process::ChildStdin,
}

impl Drop for HeldLock {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Pg {
    fn drop(&mut self) {
        let _ = self.as_owner(
            "pg_ctl",
            &[
                "-D",
                self.data().to_str().unwrap_or_default(),
                "-m",
                "immediate",
                "-w",
                "stop",
            ],
        );
    }
}

/// A temporary folder others may enter (the sandbox user is an unprivileged host uid), named
/// `agentjail-<what>-test-…`; removed when dropped.
pub fn tempdir(what: &str) -> tempfile::TempDir {
    use std::os::unix::fs::PermissionsExt;
    let d = tempfile::Builder::new()
        .prefix(&format!("agentjail-{what}-test-"))
        .tempdir()
        .unwrap();
    std::fs::set_permissions(d.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    d
}

/// An `agentjail` process on a PostgreSQL database (`serve` or `worker`), its stderr collected;
/// continued (if stopped) and killed when dropped.
pub struct Node {
    pub child: std::process::Child,
    log: std::sync::Arc<std::sync::Mutex<String>>,
    pub dir: PathBuf,
}

impl Node {
    /// Starts `agentjail ARGS --config DIR/config.toml --data-dir DIR/data --database URL`
    /// (`cfg`: the configuration's text; the password in PGPASSWORD) and reads its stderr up to
    /// the first line containing `ready`, which it returns; None when the process ended first.
    pub fn spawn(
        dir: &Path,
        url: &str,
        cfg: &str,
        args: &[&str],
        ready: &str,
    ) -> (Node, Option<String>) {
        Node::spawn_on(&[], dir, url, cfg, args, ready)
    }

    /// [`Node::spawn`] behind the command prefix `wrap` (e.g. `nsenter --net=… --`, which
    /// execs the binary: the node's pid is the binary's).
    pub fn spawn_on(
        wrap: &[String],
        dir: &Path,
        url: &str,
        cfg: &str,
        args: &[&str],
        ready: &str,
    ) -> (Node, Option<String>) {
        use std::io::{BufRead, BufReader};
        use std::os::unix::fs::PermissionsExt;
        use std::process::Stdio;
        std::fs::create_dir_all(dir).unwrap();
        std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o755)).unwrap();
        let cfg_path = dir.join("config.toml");
        std::fs::write(&cfg_path, cfg).unwrap();
        let mut cmd = match wrap.split_first() {
            Some((first, rest)) => {
                let mut c = Command::new(first);
                c.args(rest).arg(super::bin());
                c
            }
            None => Command::new(super::bin()),
        };
        let mut child = cmd
            .args(args)
            .arg("--config")
            .arg(&cfg_path)
            .arg("--data-dir")
            .arg(dir.join("data"))
            .args(["--database", url])
            .env("PGPASSWORD", PASSWORD)
            .env("AGENTJAIL_LOG", "info")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let mut lines = BufReader::new(child.stderr.take().unwrap()).lines();
        let log = std::sync::Arc::new(std::sync::Mutex::new(String::new()));
        let mut found = None;
        for line in lines.by_ref() {
            let line = line.unwrap();
            log.lock().unwrap().push_str(&(line.clone() + "\n"));
            if line.contains(ready) {
                found = Some(line);
                break;
            }
        }
        let l2 = log.clone();
        std::thread::spawn(move || {
            for line in lines.map_while(Result::ok) {
                l2.lock().unwrap().push_str(&(line + "\n"));
            }
        });
        let node = Node {
            child,
            log,
            dir: dir.to_path_buf(),
        };
        (node, found)
    }

    /// [`Node::spawn`], which must reach its `ready` line (else a panic with its stderr).
    pub fn start(dir: &Path, url: &str, cfg: &str, args: &[&str], ready: &str) -> (Node, String) {
        Node::start_on(&[], dir, url, cfg, args, ready)
    }

    /// `agentjail serve --listen 127.0.0.1:0` as a [`Node::start`] in `dir` on `url` with the
    /// configuration `cfg`; returns it and its base URL (`http://127.0.0.1:PORT`).
    pub fn serve(dir: &Path, url: &str, cfg: &str) -> (Node, String) {
        let (node, line) = Node::start(
            dir,
            url,
            cfg,
            &["serve", "--listen", "127.0.0.1:0"],
            "listening on ",
        );
        (node, base_of(&line))
    }

    /// [`Node::start`] behind the command prefix `wrap` (see [`Node::spawn_on`]).
    pub fn start_on(
        wrap: &[String],
        dir: &Path,
        url: &str,
        cfg: &str,
        args: &[&str],
        ready: &str,
    ) -> (Node, String) {
        let (node, found) = Node::spawn_on(wrap, dir, url, cfg, args, ready);
        let found = found.unwrap_or_else(|| panic!("{args:?} did not start:\n{}", node.log()));
        (node, found)
    }

    /// Waits up to `secs` seconds for the process to exit by itself (panics with its stderr
    /// otherwise) and returns how it ended.
    pub fn wait_exit(&mut self, secs: u64) -> std::process::ExitStatus {
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(secs);
        loop {
            if let Some(s) = self.child.try_wait().unwrap() {
                return s;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "the process did not stop:\n{}",
                self.log()
            );
            std::thread::sleep(std::time::Duration::from_millis(100));
        }
    }

    /// Its stderr so far.
    pub fn log(&self) -> String {
        self.log.lock().unwrap().clone()
    }

    pub fn pid(&self) -> i32 {
        self.child.id() as i32
    }

    /// Job folders this node created: one per execution it started (the tests' tasks print a
    /// line, and a run's job folder is made for its first byte of log).
    pub fn job_folders(&self) -> Vec<String> {
        std::fs::read_dir(self.dir.join("data/jobs"))
            .map(|d| {
                d.flatten()
                    .map(|e| e.file_name().to_string_lossy().into_owned())
                    .collect()
            })
            .unwrap_or_default()
    }

    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Node {
    fn drop(&mut self) {
        // A stopped process cannot die of SIGKILL until it is continued.
        let _ = Command::new("kill")
            .args(["-CONT", &self.pid().to_string()])
            .stderr(std::process::Stdio::null())
            .status();
        self.kill();
    }
}

/// The base URL a node logged in its "listening on" line.
pub fn base_of(line: &str) -> String {
    let base = line
        .split("listening on ")
        .nth(1)
        .and_then(|r| r.split_whitespace().next())
        .unwrap()
        .to_string();
    if base.starts_with("http") {
        base
    } else {
        format!("http://{base}")
    }
}

/// A throwaway cluster with `serve` replicas (each with `slots` run slots; the first one's
/// data directory is [`Fleet::data`]) and `worker`s, all on one configuration (a 3-second
/// lease prepended to `cfg`, which must have no `[server]` table of its own).
pub struct Fleet {
    /// The replicas, then the workers (dropped, and so killed, before the cluster).
    pub nodes: Vec<Node>,
    /// A client of each replica, in order.
    pub apis: Vec<super::serve::Api>,
    pub data: PathBuf,
    pub pg: Pg,
    /// The workers' configuration.
    cfg: String,
    _dir: tempfile::TempDir,
}

impl Fleet {
    /// None when PostgreSQL is missing (after [`super::skip`], which fails under CI).
    pub fn start(cfg: &str, slots: &str, replicas: usize, workers: usize) -> Option<Fleet> {
        let pg = Pg::start()?;
        let dir = tempdir("fleet-sessions");
        let server = |id: &str| format!("[server]\nnode_id = \"{id}\"\nlease_seconds = 3\n{cfg}");
        let (mut nodes, mut apis) = (Vec::new(), Vec::new());
        for i in 0..replicas.max(1) {
            let name = format!("serve{i}");
            let (node, line) = Node::start(
                &dir.path().join(&name),
                &pg.url(),
                &server(&name),
                &["serve", "--listen", "127.0.0.1:0", "--slots", slots],
                "listening on ",
            );
            apis.push(super::serve::Api::new(&base_of(&line)));
            nodes.push(node);
        }
        let mut f = Fleet {
            nodes,
            apis,
            data: dir.path().join("serve0").join("data"),
            pg,
            cfg: server("api"),
            _dir: dir,
        };
        for i in 0..workers {
            f.add_worker(&format!("w{i}"));
        }
        Some(f)
    }

    /// Starts one more `worker --slots 1 --node-id ID`.
    pub fn add_worker(&mut self, id: &str) {
        let (w, _) = Node::start(
            &self._dir.path().join(id),
            &self.pg.url(),
            &self.cfg,
            &["worker", "--slots", "1", "--node-id", id],
            "claiming runs",
        );
        self.nodes.push(w);
    }

    /// The stored bytes of session checkpoint `sha` (its row in `checkpoints`).
    pub fn checkpoint(&self, sha: &str) -> Vec<u8> {
        let hex = self.pg.psql(&format!(
            "SELECT encode(bytes, 'hex') FROM checkpoints WHERE sha256 = '{sha}'"
        ));
        assert!(!hex.is_empty(), "checkpoint {sha} is not in the database");
        (0..hex.len())
            .step_by(2)
            .map(|i| u8::from_str_radix(&hex[i..i + 2], 16).unwrap())
            .collect()
    }

    /// Overwrites the stored bytes of checkpoint `sha` (a tampering with the store).
    pub fn set_checkpoint(&self, sha: &str, bytes: &[u8]) {
        let hex: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
        self.pg.psql(&format!(
            "UPDATE checkpoints SET bytes = decode('{hex}', 'hex') WHERE sha256 = '{sha}'"
        ));
    }
}
