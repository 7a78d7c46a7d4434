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
}

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

fn v2_dir(ms: &[MountEntry], own: &[(String, Vec<String>, String)]) -> Option<PathBuf> {
    let m = ms.iter().find(|m| m.fstype == "cgroup2")?;
    let (_, _, path) = own.iter().find(|(id, c, _)| id == "0" && c.is_empty())?;
    own_dir(m, path)
}

fn has_controllers(dir: &Path, file: &str, wanted: &[&str]) -> bool {
    fs::read_to_string(dir.join(file))
        .map(|s| {
            let have: Vec<&str> = s.split_whitespace().collect();
            wanted.iter().all(|w| have.contains(w))
        })
        .unwrap_or(false)
}

fn write(path: &Path, value: &str) -> Result<(), String> {
    fs::write(path, value).map_err(|e| format!("write {} = {value}: {e}", path.display()))
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
    pub fn create(memory_bytes: u64, pids_max: u64) -> Result<Cgroup, String> {
        let ms = mounts().map_err(|e| format!("cgroup: cannot read /proc/self/mountinfo: {e}"))?;
        let own =
            own_cgroups().map_err(|e| format!("cgroup: cannot read /proc/self/cgroup: {e}"))?;
        let name = format!(
            "agentjail-{}-{}",
            std::process::id(),
            COUNTER.fetch_add(1, Ordering::Relaxed)
        );
        let mut reasons = Vec::new();
        match v2_dir(&ms, &own) {
            Some(dir) if has_controllers(&dir, "cgroup.controllers", &["memory", "pids"]) => {
                match Self::create_v2(&dir, &name, memory_bytes, pids_max) {
                    Ok(cg) => return Ok(cg),
                    Err(e) => reasons.push(e),
                }
            }
            Some(dir) => reasons.push(format!(
                "cgroup v2 at {} has no memory and pids controllers",
                dir.display()
            )),
            None => {}
        }
        match (v1_dir(&ms, &own, "memory"), v1_dir(&ms, &own, "pids")) {
            (Some(mem), Some(pids)) => {
                let cpu = v1_dir(&ms, &own, "cpuacct");
                match Self::create_v1(&mem, &pids, cpu.as_deref(), &name, memory_bytes, pids_max) {
                    Ok(cg) => return Ok(cg),
                    Err(e) => reasons.push(e),
                }
            }
            _ => reasons.push("no cgroup v1 memory and pids hierarchies".into()),
        }
        Err(format!("cgroup: {}", reasons.join("; ")))
    }

    fn create_v1(
        mem_parent: &Path,
        pids_parent: &Path,
        cpu_parent: Option<&Path>,
        name: &str,
        memory_bytes: u64,
        pids_max: u64,
    ) -> Result<Cgroup, String> {
        let memory = mem_parent.join(name);
        let pids = pids_parent.join(name);
        for parent in [Some(mem_parent), Some(pids_parent), cpu_parent]
            .into_iter()
            .flatten()
        {
            reap_stale(parent, name);
        }
        let mkdir = |p: &Path| fs::create_dir(p).map_err(|e| format!("mkdir {}: {e}", p.display()));
        mkdir(&memory)?;
        let cg = Cgroup {
            version: Version::V1,
            memory: memory.clone(),
            pids: pids.clone(),
            cpu: None,
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
        Ok(cg)
    }

    fn create_v2(
        parent: &Path,
        name: &str,
        memory_bytes: u64,
        pids_max: u64,
    ) -> Result<Cgroup, String> {
        if !has_controllers(parent, "cgroup.subtree_control", &["memory", "pids"]) {
            // A cgroup with processes cannot enable controllers for its children ("no internal
            // processes"): move ourselves into a leaf first, then enable them.
            let leaf = parent.join("agentjail-supervisor");
            let _ = fs::create_dir(&leaf);
            write(&leaf.join("cgroup.procs"), &std::process::id().to_string())?;
            write(&parent.join("cgroup.subtree_control"), "+memory +pids").map_err(|e| {
                format!("{e} (run under a delegated cgroup, e.g. systemd-run --user --scope -p Delegate=yes)")
            })?;
            let _ = fs::write(parent.join("cgroup.subtree_control"), "+cpu");
        }
        reap_stale(parent, name);
        let dir = parent.join(name);
        fs::create_dir(&dir).map_err(|e| format!("mkdir {}: {e}", dir.display()))?;
        let cg = Cgroup {
            version: Version::V2,
            memory: dir.clone(),
            pids: dir.clone(),
            cpu: None,
        };
        write(&dir.join("memory.max"), &memory_bytes.to_string())?;
        let _ = fs::write(dir.join("memory.swap.max"), "0");
        // Kill the whole group on OOM rather than one process, like the v1 behaviour users expect.
        let _ = fs::write(dir.join("memory.oom.group"), "1");
        write(&dir.join("pids.max"), &pids_max.to_string())?;
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
        v
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
    match Cgroup::create(64 * 1024 * 1024, 8) {
        Ok(cg) => {
            let v = cg.version;
            let msg = format!("{} (memory and pids limits can be applied)", v.name());
            drop(cg);
            (Some(v), msg)
        }
        Err(e) => (None, e),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn proc_cgroup_membership() {
        let v1 = "12:pids:/agentjail-7-0\n4:memory:/x/agentjail-7-0\n1:name=systemd:/\n0::/\n";
        assert!(lists(v1, "agentjail-7-0"));
        assert!(!lists(v1, "agentjail-7-1"));
        // Only one of the two v1 hierarchies is not enough; an exiting task shows `/`.
        assert!(!lists(
            "12:pids:/agentjail-7-0\n4:memory:/\n",
            "agentjail-7-0"
        ));
        assert!(lists("0::/user.slice/agentjail-7-0\n", "agentjail-7-0"));
        assert!(!lists("0::/agentjail-7-0-x\n", "agentjail-7-0"));
    }

    #[test]
    fn parses_mountinfo() {
        let m = parse_mountinfo_line(
            "36 25 0:32 /sub /sys/fs/cgroup/memory rw,relatime shared:14 - cgroup cgroup rw,memory",
        )
        .unwrap();
        assert_eq!(m.fstype, "cgroup");
        assert_eq!(m.root, "/sub");
        assert!(m.super_opts.contains(&"memory".to_string()));
        let d = own_dir(&m, "/sub/a/b").unwrap();
        assert_eq!(d, PathBuf::from("/sys/fs/cgroup/memory/a/b"));
        assert!(own_dir(&m, "/other").is_none());
        let m =
            parse_mountinfo_line("30 1 0:26 / /sys/fs/cgroup rw - cgroup2 cgroup2 rw,nsdelegate")
                .unwrap();
        assert_eq!(m.fstype, "cgroup2");
        assert_eq!(unescape("a\\040b"), "a b");
    }

    #[test]
    fn reads_flat_keyed_files() {
        let d = tempfile::tempdir().unwrap();
        let f = d.path().join("memory.events");
        fs::write(&f, "low 0\nhigh 0\nmax 4\noom 1\noom_kill 1\n").unwrap();
        assert_eq!(read_key(&f, "oom_kill"), Some(1));
        assert_eq!(read_key(&f, "max"), Some(4));
        assert_eq!(read_key(&f, "absent"), None);
    }
}
