//! cgroup limits and accounting for one run: memory (no swap) and pids, plus CPU accounting.
//!
//! Works with cgroup v2 when the `memory` and `pids` controllers are available to the caller's
//! cgroup (pure v2 hosts, systemd delegation), and with cgroup v1 controller hierarchies
//! otherwise (hybrid hosts such as this project's CI machine). Each run gets its own child
//! cgroup below the caller's, named `agentjail-<pid>-<n>`, removed after the run. When neither
//! is usable (an ordinary user without delegation), [`Cgroup::create`] says why, and the caller
//! decides whether that is fatal (it is, unless `--allow-degraded`).
//!
//! Tested by the integration tests (memory hog → `memory_limit`, fork bomb → `pids` denial) on
//! v1; the v2 path shares the code that parses and writes, and its file names are checked by
//! unit tests, but this CI host has no v2 controllers to exercise it for real.

use std::fs;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::sync::atomic::{AtomicU32, Ordering};

/// Which cgroup version a run used.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Version {
    V1,
    V2,
}

impl Version {
    pub fn name(self) -> &'static str {
        match self {
            Version::V1 => "v1",
            Version::V2 => "v2",
        }
    }
}

/// The cgroup(s) of one run.
#[derive(Debug)]
pub struct Cgroup {
    pub version: Version,
    memory: PathBuf,
    pids: PathBuf,
    /// v1 cpuacct hierarchy, when mounted (v2 keeps cpu.stat in `memory`'s dir).
    cpu: Option<PathBuf>,
    /// v1 cpu controller's directory (CFS quota), when a CPU limit was asked for and the
    /// hierarchy is mounted apart from cpuacct's (otherwise the quota is set in `cpu`).
    cpu_ctl: Option<PathBuf>,
    /// The CPU quota asked for is in force.
    pub cpu_limited: bool,
}

/// CFS period of the CPU limit (v2 `cpu.max`, v1 `cpu.cfs_period_us`), in microseconds.
pub const CPU_PERIOD_US: u64 = 100_000;

/// Figures read after the run.
#[derive(Debug, Default, Clone, Copy)]
pub struct Stats {
    pub peak_memory_bytes: u64,
    pub oom_kills: u64,
    pub pids_refused: u64,
    pub cpu_ns: Option<u64>,
}

static COUNTER: AtomicU32 = AtomicU32::new(0);

struct MountEntry {
    root: String,
    mount_point: PathBuf,
    fstype: String,
    super_opts: Vec<String>,
}

fn mounts() -> io::Result<Vec<MountEntry>> {
    let text = fs::read_to_string("/proc/self/mountinfo")?;
    Ok(text.lines().filter_map(parse_mountinfo_line).collect())
}

fn parse_mountinfo_line(line: &str) -> Option<MountEntry> {
    let (left, right) = line.split_once(" - ")?;
    let l: Vec<&str> = left.split(' ').collect();
    let r: Vec<&str> = right.split(' ').collect();
    Some(MountEntry {
        root: unescape(l.get(3)?),
        mount_point: PathBuf::from(unescape(l.get(4)?)),
        fstype: r.first()?.to_string(),
        super_opts: r.get(2)?.split(',').map(str::to_owned).collect(),
    })
}

/// mountinfo escapes space, tab, newline and backslash as octal.
fn unescape(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'\\'
            && i + 3 < b.len()
            && b[i + 1..i + 4].iter().all(|c| (b'0'..=b'7').contains(c))
        {
            let v = (b[i + 1] - b'0') * 64 + (b[i + 2] - b'0') * 8 + (b[i + 3] - b'0');
            out.push(v);
            i += 4;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// (hierarchy-id, controllers, path) lines of /proc/self/cgroup.
fn own_cgroups() -> io::Result<Vec<(String, Vec<String>, String)>> {
    let text = fs::read_to_string("/proc/self/cgroup")?;
    Ok(text
        .lines()
        .filter_map(|l| {
            let mut it = l.splitn(3, ':');
            let id = it.next()?.to_string();
            let ctl = it
                .next()?
                .split(',')
                .filter(|s| !s.is_empty())
                .map(str::to_owned)
                .collect();
            let path = it.next()?.to_string();
            Some((id, ctl, path))
        })
        .collect())
}

/// The directory of our own cgroup in a hierarchy mounted at `m`.
fn own_dir(m: &MountEntry, own_path: &str) -> Option<PathBuf> {
    let rel = if m.root == "/" {
        own_path
    } else {
        own_path.strip_prefix(m.root.as_str())?
    };
    Some(m.mount_point.join(rel.trim_start_matches('/')))
}

fn v1_dir(ms: &[MountEntry], own: &[(String, Vec<String>, String)], ctl: &str) -> Option<PathBuf> {
    let m = ms
        .iter()
        .find(|m| m.fstype == "cgroup" && m.super_opts.iter().any(|o| o == ctl))?;
    let (_, _, path) = own.iter().find(|(_, c, _)| c.iter().any(|c| c == ctl))?;
    own_dir(m, path)
}

/// The cgroup2 mount point and our own cgroup's directory in it.
fn v2_dir(ms: &[MountEntry], own: &[(String, Vec<String>, String)]) -> Option<(PathBuf, PathBuf)> {
    let m = ms.iter().find(|m| m.fstype == "cgroup2")?;
    let (_, _, path) = own.iter().find(|(id, c, _)| id == "0" && c.is_empty())?;
    Some((m.mount_point.clone(), own_dir(m, path)?))
}

/// Controllers every run's cgroup needs.
const REQUIRED: [&str; 2] = ["memory", "pids"];
/// The leaf into which a process that claims its own cgroup moves itself (and its children)
/// so that the cgroup may pass controllers down ("no internal processes"); `<prefix><pid>`.
const LEAF_PREFIX: &str = "agentjail-supervisor-";

/// Where this process makes its runs' v2 cgroups, decided at its first run and kept: the
/// decision may move this process (see [`claim`]), after which its own cgroup is no longer the
/// place to decide from.
static V2_BASE: Mutex<Option<PathBuf>> = Mutex::new(None);
/// What [`claim`] changed, undone by [`release`].
static CLAIM: Mutex<Option<Claim>> = Mutex::new(None);

#[derive(Debug)]
struct Claim {
    own: PathBuf,
    leaf: PathBuf,
    enabled: Vec<&'static str>,
}

/// Why no usable cgroup could be made for a run: the reason the report's `degraded` list (or
/// the refusal) gives, each step with the path and the OS's answer.
#[derive(Debug, thiserror::Error)]
pub enum CgroupError {
    #[error("cgroup: cannot read /proc/self/mountinfo: {0}")]
    Mountinfo(#[source] io::Error),
    #[error("cgroup: cannot read /proc/self/cgroup: {0}")]
    OwnCgroups(#[source] io::Error),
    #[error("cgroup v2 at {} has no memory and pids controllers", .0.display())]
    NoV2Controllers(PathBuf),
    #[error("{} is not offered the memory and pids controllers by its parent", .0.display())]
    NotOffered(PathBuf),
    #[error("{} holds other processes too ({pids}), so it cannot pass controllers down", .dir.display())]
    NotAlone { dir: PathBuf, pids: String },
    /// `mkdir` of a cgroup (`hint`: what to do about it, or empty).
    #[error("mkdir {}: {source}{hint}", .path.display())]
    Mkdir {
        path: PathBuf,
        #[source]
        source: io::Error,
        hint: &'static str,
    },
    /// A write to a cgroup file.
    #[error("write {} = {value}: {source}", .path.display())]
    Write {
        path: PathBuf,
        value: String,
        #[source]
        source: io::Error,
    },
    #[error("no cgroup from {} up passes the memory and pids controllers down (agentjail enables controllers only in a cgroup of its own; on a host without systemd, as root: echo '+memory +pids +cpu' > {}/cgroup.subtree_control)", .own.display(), .mount.display())]
    NoDelegatingAncestor { own: PathBuf, mount: PathBuf },
    #[error("no cgroup v1 memory and pids hierarchies")]
    NoV1,
    /// Every way of cgroup v2 failed, for these reasons.
    #[error("cgroup v2: {}", join(.0))]
    V2(Vec<CgroupError>),
    /// Neither v2 nor v1 gave a cgroup, for these reasons.
    #[error("cgroup: {}", join(.0))]
    Unusable(Vec<CgroupError>),
}

fn join(reasons: &[CgroupError]) -> String {
    reasons
        .iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join("; ")
}

fn v2_base(mount: &Path, own: &Path) -> Result<PathBuf, CgroupError> {
    if let Ok(g) = V2_BASE.lock()
        && let Some(b) = g.as_ref()
        && b.is_dir()
    {
        return Ok(b.clone());
    }
    let b = find_v2_base(mount, own)?;
    if let Ok(mut g) = V2_BASE.lock() {
        *g = Some(b.clone());
    }
    Ok(b)
}

/// Chooses the cgroup under which the runs' cgroups are made, for every way a host places a
/// process, without enabling a controller anywhere but in a cgroup of agentjail's own:
/// 1. our cgroup already passes memory and pids down: the root cgroup of a systemd host (the
///    root may hold processes and enable controllers at once), or the parent of a leaf that a
///    process of ours made (rule 2, e.g. done by a long-lived parent);
/// 2. our cgroup holds only this process and its children (`systemd-run --scope`, a delegated
///    `Delegate=yes` unit, a delegated subtree chown'd to a user): [`claim`] it;
/// 3. else (a login session's scope, which holds the user's shell too; a service with other
///    processes) the nearest ancestor that passes memory and pids down, where creating a
///    cgroup needs root or delegation (the mkdir's EACCES is reported as such).
fn find_v2_base(mount: &Path, own: &Path) -> Result<PathBuf, CgroupError> {
    if !has_controllers(mount, "cgroup.controllers", &REQUIRED) {
        return Err(CgroupError::NoV2Controllers(mount.to_path_buf()));
    }
    if has_controllers(own, "cgroup.subtree_control", &REQUIRED) {
        return Ok(own.to_path_buf());
    }
    if let (Some(n), Some(parent)) = (own.file_name().and_then(|n| n.to_str()), own.parent())
        && n.starts_with(LEAF_PREFIX)
        && has_controllers(parent, "cgroup.subtree_control", &REQUIRED)
    {
        return Ok(parent.to_path_buf());
    }
    let mut reasons = Vec::new();
    if own != mount {
        match claim(own) {
            Ok(()) => return Ok(own.to_path_buf()),
            Err(e) => reasons.push(e),
        }
    }
    let mut a = own;
    while a != mount {
        let Some(p) = a.parent() else { break };
        a = p;
        if !a.starts_with(mount) {
            break;
        }
        if has_controllers(a, "cgroup.subtree_control", &REQUIRED) {
            return Ok(a.to_path_buf());
        }
    }
    reasons.push(CgroupError::NoDelegatingAncestor {
        own: own.to_path_buf(),
        mount: mount.to_path_buf(),
    });
    Err(CgroupError::V2(reasons))
}

/// The pids listed in a `cgroup.procs` file.
fn procs(dir: &Path) -> Vec<u32> {
    fs::read_to_string(dir.join("cgroup.procs"))
        .map(|s| s.lines().filter_map(|l| l.trim().parse().ok()).collect())
        .unwrap_or_default()
}

fn ppid(pid: u32) -> Option<u32> {
    let stat = fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // Field 4, after the parenthesised command name (which may contain spaces).
    stat.rsplit_once(')')?
        .1
        .split_whitespace()
        .nth(1)?
        .parse()
        .ok()
}

/// Makes our own cgroup `own` agentjail's: when it holds only this process and its children
/// (the sandbox init cloned ahead), moves them into the leaf `own/agentjail-supervisor-<pid>`
/// and enables memory and pids (and cpu, when offered) in `own`'s subtree_control, so that the
/// runs' cgroups can be its children. [`release`] undoes it.
fn claim(own: &Path) -> Result<(), CgroupError> {
    if !has_controllers(own, "cgroup.controllers", &REQUIRED) {
        return Err(CgroupError::NotOffered(own.to_path_buf()));
    }
    let me = std::process::id();
    let ours = procs(own);
    let foreign: Vec<String> = ours
        .iter()
        .filter(|&&p| p != me && ppid(p) != Some(me))
        .map(u32::to_string)
        .collect();
    if !foreign.is_empty() {
        return Err(CgroupError::NotAlone {
            dir: own.to_path_buf(),
            pids: foreign.join(" "),
        });
    }
    reap_stale_leaves(own);
    let leaf = own.join(format!("{LEAF_PREFIX}{me}"));
    match fs::create_dir(&leaf) {
        Ok(()) => {}
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
        Err(source) => {
            return Err(CgroupError::Mkdir {
                path: leaf,
                source,
                hint: "",
            });
        }
    }
    let undo = |enabled: &[&str]| {
        for c in enabled.iter().rev() {
            let _ = fs::write(own.join("cgroup.subtree_control"), format!("-{c}"));
        }
        for p in procs(&leaf) {
            let _ = fs::write(own.join("cgroup.procs"), p.to_string());
        }
        let _ = fs::remove_dir(&leaf);
    };
    for p in &ours {
        if let Err(e) = fs::write(leaf.join("cgroup.procs"), p.to_string())
            && e.raw_os_error() != Some(libc::ESRCH)
        {
            undo(&[]);
            return Err(CgroupError::Write {
                path: leaf.join("cgroup.procs"),
                value: p.to_string(),
                source: e,
            });
        }
    }
    let mut enabled: Vec<&'static str> = Vec::new();
    for c in ["memory", "pids", "cpu"] {
        if has_controllers(own, "cgroup.subtree_control", &[c])
            || !has_controllers(own, "cgroup.controllers", &[c])
        {
            continue;
        }
        match fs::write(own.join("cgroup.subtree_control"), format!("+{c}")) {
            Ok(()) => enabled.push(c),
            Err(_) if c == "cpu" => {}
            Err(e) => {
                undo(&enabled);
                return Err(CgroupError::Write {
                    path: own.join("cgroup.subtree_control"),
                    value: format!("+{c}"),
                    source: e,
                });
            }
        }
    }
    if let Ok(mut g) = CLAIM.lock() {
        *g = Some(Claim {
            own: own.to_path_buf(),
            leaf,
            enabled,
        });
    }
    Ok(())
}

/// Undoes what [`claim`] did, once this process makes no more runs (the runs' cgroups are gone
/// by then): disables the controllers it enabled, moves this process back into its cgroup and
/// removes the leaf. Call it before exiting; a process killed before can leave only an empty
/// leaf, which the next claim of that cgroup removes.
pub fn release() {
    let Some(c) = CLAIM.lock().ok().and_then(|mut g| g.take()) else {
        return;
    };
    if let Ok(mut g) = V2_BASE.lock() {
        *g = None;
    }
    for ctl in c.enabled.iter().rev() {
        let _ = fs::write(c.own.join("cgroup.subtree_control"), format!("-{ctl}"));
    }
    for p in procs(&c.leaf) {
        let _ = fs::write(c.own.join("cgroup.procs"), p.to_string());
    }
    let _ = fs::remove_dir(&c.leaf);
}

/// Removes empty leaves of claims whose process is gone.
fn reap_stale_leaves(own: &Path) {
    let Ok(entries) = fs::read_dir(own) else {
        return;
    };
    for e in entries.flatten() {
        let name = e.file_name();
        let Some(pid) = name
            .to_str()
            .and_then(|n| n.strip_prefix(LEAF_PREFIX))
            .and_then(|p| p.parse::<u32>().ok())
        else {
            continue;
        };
        if !Path::new(&format!("/proc/{pid}")).exists() {
            let _ = fs::remove_dir(e.path());
        }
    }
}

fn has_controllers(dir: &Path, file: &str, wanted: &[&str]) -> bool {
    fs::read_to_string(dir.join(file))
        .map(|s| {
            let have: Vec<&str> = s.split_whitespace().collect();
            wanted.iter().all(|w| have.contains(w))
        })
        .unwrap_or(false)
}

fn write(path: &Path, value: &str) -> Result<(), CgroupError> {
    fs::write(path, value).map_err(|source| CgroupError::Write {
        path: path.to_path_buf(),
        value: value.to_string(),
        source,
    })
}

fn read_u64(path: &Path) -> Option<u64> {
    fs::read_to_string(path).ok()?.trim().parse().ok()
}

/// Value of `key` in a flat-keyed file such as memory.events (`oom_kill 3`).
fn read_key(path: &Path, key: &str) -> Option<u64> {
    fs::read_to_string(path).ok()?.lines().find_map(|l| {
        let (k, v) = l.split_once(' ')?;
        if k == key {
            v.trim().parse().ok()
        } else {
            None
        }
    })
}

impl Cgroup {
    /// Creates the run's cgroup(s) with the memory and pids limits. `Err` carries the reason
    /// (for the report's `degraded` list) when no usable cgroup exists.
    /// `cpu_quota_us`: the CPU limit as a CFS quota per [`CPU_PERIOD_US`]; whether it could be
    /// set is in [`Cgroup::cpu_limited`] (the caller decides whether a run without it goes on).
    pub fn create(
        memory_bytes: u64,
        pids_max: u64,
        cpu_quota_us: Option<u64>,
    ) -> Result<Cgroup, CgroupError> {
        let ms = mounts().map_err(CgroupError::Mountinfo)?;
        let own = own_cgroups().map_err(CgroupError::OwnCgroups)?;
        let name = format!(
            "agentjail-{}-{}",
            std::process::id(),
            COUNTER.fetch_add(1, Ordering::Relaxed)
        );
        let mut reasons = Vec::new();
        if let Some((mount, dir)) = v2_dir(&ms, &own) {
            match v2_base(&mount, &dir).and_then(|base| {
                Self::create_v2(&base, &name, memory_bytes, pids_max, cpu_quota_us)
            }) {
                Ok(cg) => return Ok(cg),
                Err(e) => reasons.push(e),
            }
        }
        match (v1_dir(&ms, &own, "memory"), v1_dir(&ms, &own, "pids")) {
            (Some(mem), Some(pids)) => {
                let cpu = v1_dir(&ms, &own, "cpuacct");
                let cpu_ctl = cpu_quota_us.and_then(|_| v1_dir(&ms, &own, "cpu"));
                match Self::create_v1(
                    &mem,
                    &pids,
                    cpu.as_deref(),
                    &name,
                    memory_bytes,
                    pids_max,
                    cpu_ctl.as_deref().zip(cpu_quota_us),
                ) {
                    Ok(cg) => return Ok(cg),
                    Err(e) => reasons.push(e),
                }
            }
            _ => reasons.push(CgroupError::NoV1),
        }
        Err(CgroupError::Unusable(reasons))
    }

    fn create_v1(
        mem_parent: &Path,
        pids_parent: &Path,
        cpu_parent: Option<&Path>,
        name: &str,
        memory_bytes: u64,
        pids_max: u64,
        cpu_limit: Option<(&Path, u64)>,
    ) -> Result<Cgroup, CgroupError> {
        let memory = mem_parent.join(name);
        let pids = pids_parent.join(name);
        for parent in [
            Some(mem_parent),
            Some(pids_parent),
            cpu_parent,
            cpu_limit.map(|(p, _)| p),
        ]
        .into_iter()
        .flatten()
        {
            reap_stale(parent, name);
        }
        let mkdir = |p: &Path| {
            fs::create_dir(p).map_err(|source| CgroupError::Mkdir {
                path: p.to_path_buf(),
                source,
                hint: "",
            })
        };
        mkdir(&memory)?;
        let cg = Cgroup {
            version: Version::V1,
            memory: memory.clone(),
            pids: pids.clone(),
            cpu: None,
            cpu_ctl: None,
            cpu_limited: false,
        };
        // From here on, dropping `cg` on error removes what was created.
        let mut cg = cg;
        if let Err(e) = mkdir(&pids) {
            cg.pids = PathBuf::new();
            return Err(e);
        }
        write(
            &memory.join("memory.limit_in_bytes"),
            &memory_bytes.to_string(),
        )?;
        // With swap accounting, also forbid swapping past the limit.
        let memsw = memory.join("memory.memsw.limit_in_bytes");
        if memsw.exists() {
            write(&memsw, &memory_bytes.to_string())?;
        }
        let _ = fs::write(memory.join("memory.swappiness"), "0");
        write(&pids.join("pids.max"), &pids_max.to_string())?;
        if let Some(cp) = cpu_parent {
            let dir = cp.join(name);
            if fs::create_dir(&dir).is_ok() {
                cg.cpu = Some(dir);
            }
        }
        if let Some((cp, quota)) = cpu_limit {
            let dir = cp.join(name);
            let shared = cg.cpu.as_deref() == Some(dir.as_path());
            if shared || fs::create_dir(&dir).is_ok() {
                if !shared {
                    cg.cpu_ctl = Some(dir.clone());
                }
                cg.cpu_limited =
                    fs::write(dir.join("cpu.cfs_period_us"), CPU_PERIOD_US.to_string())
                        .and_then(|()| fs::write(dir.join("cpu.cfs_quota_us"), quota.to_string()))
                        .is_ok();
            }
        }
        Ok(cg)
    }

    fn create_v2(
        parent: &Path,
        name: &str,
        memory_bytes: u64,
        pids_max: u64,
        cpu_quota_us: Option<u64>,
    ) -> Result<Cgroup, CgroupError> {
        reap_stale(parent, name);
        let dir = parent.join(name);
        fs::create_dir(&dir).map_err(|source| CgroupError::Mkdir {
            path: dir.clone(),
            hint: if source.kind() == io::ErrorKind::PermissionDenied {
                // `systemd-run` is named only where it works (`delegation::Delegation`);
                // `agentjail check` names the fix for any other host.
                if crate::delegation::Delegation::probe(rustix::process::geteuid().as_raw())
                    .systemd_run_works()
                {
                    " (this user holds no delegated cgroup here: run under `systemd-run --user --scope -p Delegate=yes`, or as root)"
                } else {
                    " (this user holds no delegated cgroup here)"
                }
            } else {
                ""
            },
            source,
        })?;
        let cg = Cgroup {
            version: Version::V2,
            memory: dir.clone(),
            pids: dir.clone(),
            cpu: None,
            cpu_ctl: None,
            cpu_limited: false,
        };
        let mut cg = cg;
        write(&dir.join("memory.max"), &memory_bytes.to_string())?;
        let _ = fs::write(dir.join("memory.swap.max"), "0");
        // Kill the whole group on OOM rather than one process, like the v1 behaviour users expect.
        let _ = fs::write(dir.join("memory.oom.group"), "1");
        write(&dir.join("pids.max"), &pids_max.to_string())?;
        // The cpu controller is there when the parent passes it down (see `find_v2_base`).
        if let Some(quota) = cpu_quota_us
            && has_controllers(&dir, "cgroup.controllers", &["cpu"])
        {
            cg.cpu_limited =
                fs::write(dir.join("cpu.max"), format!("{quota} {CPU_PERIOD_US}")).is_ok();
        }
        Ok(cg)
    }

    /// The files through which the command's first process moves itself in (writing `0`):
    /// v1, the `tasks` file of each hierarchy; v2, `cgroup.procs`.
    ///
    /// Why not move it from outside through `cgroup.procs`: that takes the kernel's global
    /// cgroup_threadgroup_rwsem for writing, which waits for an RCU grace period (10–13 ms per
    /// run measured on this project's CI host with v1, more than the whole rest of a run). A
    /// thread that moves itself through v1's `tasks` skips that lock. v2 has no per-thread
    /// file for this (`cgroup.threads` needs threaded mode), so its move takes the lock.
    pub fn self_join_files(&self) -> Vec<PathBuf> {
        if self.version == Version::V2 {
            return vec![self.memory.join("cgroup.procs")];
        }
        let mut v = vec![self.memory.join("tasks"), self.pids.join("tasks")];
        v.extend(self.cpu.as_ref().map(|c| c.join("tasks")));
        v.extend(self.cpu_ctl.as_ref().map(|c| c.join("tasks")));
        v
    }

    /// v2: the run's cgroup directory, into which the payload is cloned (`CLONE_INTO_CGROUP`).
    pub fn clone_into_dir(&self) -> Option<&Path> {
        (self.version == Version::V2).then_some(self.memory.as_path())
    }

    /// The run's cgroup directory name (the same in every hierarchy).
    pub fn name(&self) -> &str {
        self.memory
            .file_name()
            .and_then(|n| n.to_str())
            .unwrap_or_default()
    }

    /// Reads the run's figures.
    pub fn stats(&self) -> Stats {
        match self.version {
            Version::V1 => Stats {
                peak_memory_bytes: read_u64(&self.memory.join("memory.max_usage_in_bytes"))
                    .unwrap_or(0),
                oom_kills: read_key(&self.memory.join("memory.oom_control"), "oom_kill")
                    .unwrap_or(0),
                pids_refused: read_key(&self.pids.join("pids.events"), "max").unwrap_or(0),
                cpu_ns: self
                    .cpu
                    .as_ref()
                    .and_then(|c| read_u64(&c.join("cpuacct.usage"))),
            },
            Version::V2 => Stats {
                peak_memory_bytes: read_u64(&self.memory.join("memory.peak")).unwrap_or(0),
                oom_kills: read_key(&self.memory.join("memory.events"), "oom_kill").unwrap_or(0),
                pids_refused: read_key(&self.pids.join("pids.events"), "max").unwrap_or(0),
                cpu_ns: read_key(&self.memory.join("cpu.stat"), "usage_usec").map(|u| u * 1000),
            },
        }
    }
}

/// Whether a `/proc/PID/cgroup` text places the process in the run's cgroup `name`: in the
/// memory and pids hierarchies (v1) or in the unified one (v2).
pub fn lists(proc_cgroup: &str, name: &str) -> bool {
    let suffix = format!("/{name}");
    let entries: Vec<(&str, &str)> = proc_cgroup
        .lines()
        .filter_map(|l| {
            let mut it = l.splitn(3, ':');
            let (_, ctls, path) = (it.next()?, it.next()?, it.next()?);
            Some((ctls, path))
        })
        .collect();
    let v2 = entries
        .iter()
        .any(|(ctls, path)| ctls.is_empty() && path.ends_with(&suffix));
    let v1 = ["memory", "pids"].iter().all(|c| {
        entries
            .iter()
            .any(|(ctls, path)| ctls.split(',').any(|x| x == *c) && path.ends_with(&suffix))
    });
    v1 || v2
}

impl Drop for Cgroup {
    /// Removes the run's cgroups. Called after the sandbox's pid namespace is gone, so they are
    /// empty; a short retry covers processes that are still being torn down.
    fn drop(&mut self) {
        let mut dirs = vec![self.memory.clone()];
        if self.pids != self.memory {
            dirs.push(self.pids.clone());
        }
        dirs.extend(self.cpu.clone());
        dirs.extend(self.cpu_ctl.clone());
        for d in dirs.into_iter().filter(|d| !d.as_os_str().is_empty()) {
            for _ in 0..200 {
                match fs::remove_dir(&d) {
                    Err(e) if e.raw_os_error() == Some(libc::EBUSY) => {
                        std::thread::sleep(std::time::Duration::from_millis(5))
                    }
                    _ => break,
                }
            }
        }
    }
}

/// Removes run cgroups left behind by supervisors that were killed before they could clean up
/// (SIGKILL runs no destructor), and a stale directory with the name we are about to use (its
/// pid was reused). Only empty cgroups can be removed, so a live run is never disturbed; a
/// cgroup whose supervisor still runs is skipped.
fn reap_stale(parent: &Path, ours: &str) {
    let Ok(entries) = fs::read_dir(parent) else {
        return;
    };
    for e in entries.flatten() {
        let name = e.file_name();
        let Some(name) = name.to_str() else { continue };
        let Some(pid) = name
            .strip_prefix("agentjail-")
            .and_then(|rest| rest.split('-').next())
            .and_then(|p| p.parse::<u32>().ok())
        else {
            continue;
        };
        let alive = pid == std::process::id() || Path::new(&format!("/proc/{pid}")).exists();
        if name == ours || !alive {
            let _ = fs::remove_dir(e.path());
        }
    }
}

/// What `agentjail check` says about cgroups on this host, for this user.
pub fn describe() -> (Option<Version>, String) {
    match Cgroup::create(64 * 1024 * 1024, 8, Some(CPU_PERIOD_US)) {
        Ok(cg) => {
            let v = cg.version;
            let msg = format!(
                "{} (memory and pids limits{} can be applied{})",
                v.name(),
                if cg.cpu_limited {
                    ", and the CPU limit,"
                } else {
                    ""
                },
                if cg.cpu_limited {
                    ""
                } else {
                    "; the CPU limit cannot: no cpu controller for this cgroup, so a run with limits.cpus needs --allow-degraded"
                }
            );
            drop(cg);
            (Some(v), msg)
        }
        Err(e) => (None, e.to_string()),
    }
}

#[cfg(test)]
mod tests;
