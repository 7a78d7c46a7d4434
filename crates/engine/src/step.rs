//! The steps of setting up a run, typed: what a set-up failure names (the report's
//! `sandbox setup failed at `STEP`: SYSCALL: ERROR`) and the system call the step makes, as
//! nsjail and firecracker's jailer name both. The supervisor's steps, the init's, the
//! payload's; building the root has its own [`RootStep`] (with the recording double of
//! [`crate::root_sys`]), wrapped here as [`Step::Root`].

use std::fmt;

use crate::root_sys::{RootError, RootStep};

/// A step of setting up a run. Its words (`Display`) are the report's `step`, the same as
/// before these were typed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Step {
    // The supervisor's.
    /// The engine runs in a single-threaded process (`unshare(CLONE_NEWUSER)` needs it).
    SingleThreaded,
    CreateControlChannels,
    CloneNamespaces,
    /// `uid_map`, `gid_map` or `setgroups` of the init, with what was written.
    WriteIdMap {
        file: &'static str,
        content: String,
    },
    EncodePlan,
    CreatePlanMemfd,
    WritePlan,
    /// A control message to the init (which died when this fails).
    SendToInit,
    /// A cgroup file or directory the payload joins through.
    OpenCgroupFile(std::path::PathBuf),
    GatewayResolver,
    StartGateway,
    /// A proxy socket came without a network allowlist (an internal inconsistency).
    GatewayPolicy,

    // The init's.
    SetParentDeathSignal,
    CreateNetworkNamespace,
    BringLoopbackUp,
    SetHostName,
    WaitForIdMaps,
    MakeInitNonDumpable,
    WaitForPlan,
    ReadPlan,
    ListenOnProxyPort,
    HandOverProxySocket,
    BlockSigchld,
    OpenOutput,
    OpenWork,
    RestoreWorkspace,
    ReceiveCgroups,
    ReportReady,
    CreatePayloadSocket,
    StartCommand,
    MakeRootPrivate,
    MountStagingTmpfs,
    MkdirStaging(&'static str),
    PivotToStaging,
    ChdirStagingRoot,
    MountNewRootTmpfs,
    DiscardHostRoot,
    /// The init's event loop, while the command runs: what it was doing.
    EventLoop(&'static str),
    /// Building the root.
    Root(RootStep),

    // The payload's.
    JoinCgroups,
    /// Reading `/proc/self/cgroup` after joining.
    ReadOwnCgroup,
    /// The kernel does not list the payload in the run's cgroup after joining.
    CheckCgroupJoined,
    CreateCgroupNamespace,
    /// `stdout` or `stderr` onto the command's pipe.
    RedirectOutput(&'static str),
    OpenDevNull,
    RedirectStdin,
    ChdirCwd(String),
    LockSecurebits,
    DropBoundingSet,
    ClearAmbientCapabilities,
    BecomeSandboxUser,
    ClearCapabilities,
    SetRlimit(&'static str),
    Landlock,
    /// The kernel's Landlock falls short of what the run requires (a refusal of ours).
    LandlockRefused,
    LandlockOpen(String),
    SetNoNewPrivs,
    BuildSeccompFilter,
    InstallSeccompFilter,
    ReportApplied,
    CloseInheritedFds,
    /// The command line or the environment holds a NUL byte.
    Command,
    Env,
}

impl fmt::Display for Step {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        use Step::*;
        let words = match self {
            SingleThreaded => "check that the engine runs single-threaded",
            CreateControlChannels => "create the control socket and pipes",
            CloneNamespaces => "create the sandbox namespaces",
            WriteIdMap { file, content } => {
                return write!(f, "write {file} of the sandbox ({content:?})");
            }
            EncodePlan => "encode the plan",
            CreatePlanMemfd => "create the plan's memfd",
            WritePlan => "write the plan",
            SendToInit => "talk to the sandbox init",
            OpenCgroupFile(p) => return write!(f, "open {}", p.display()),
            GatewayResolver => "egress gateway: resolver",
            StartGateway => "egress gateway",
            GatewayPolicy => "egress gateway: policy",
            SetParentDeathSignal => "set parent-death signal",
            CreateNetworkNamespace => "create the network namespace",
            BringLoopbackUp => "bring loopback up",
            SetHostName => "set host name",
            WaitForIdMaps => "wait for the id maps",
            MakeInitNonDumpable => "make the init non-dumpable",
            WaitForPlan => "wait for the plan",
            ReadPlan => "read the plan",
            ListenOnProxyPort => "listen on the proxy port",
            HandOverProxySocket => "hand the proxy socket over",
            BlockSigchld => "block SIGCHLD",
            OpenOutput => "open /output",
            OpenWork => "open /work",
            RestoreWorkspace => "restore the workspace",
            ReceiveCgroups => "receive the run's cgroups",
            ReportReady => "report ready",
            CreatePayloadSocket => "create payload socket",
            StartCommand => "start the command",
            MakeRootPrivate => "make / private",
            MountStagingTmpfs => "mount staging tmpfs on /tmp",
            MkdirStaging(d) => return write!(f, "mkdir {d}"),
            PivotToStaging => "pivot_root(/tmp, /tmp/oldroot)",
            ChdirStagingRoot => "chdir /",
            MountNewRootTmpfs => "mount new root tmpfs",
            DiscardHostRoot => "discard the host root",
            EventLoop(what) => return write!(f, "the init's event loop: {what}"),
            Root(r) => return r.fmt(f),
            JoinCgroups | ReadOwnCgroup | CheckCgroupJoined => "join the run's cgroups",
            CreateCgroupNamespace => "create the cgroup namespace",
            RedirectOutput(which) => which,
            OpenDevNull => "open /dev/null",
            RedirectStdin => "stdin",
            ChdirCwd(d) => return write!(f, "chdir {d}"),
            LockSecurebits => "lock securebits",
            DropBoundingSet => "drop bounding set",
            ClearAmbientCapabilities => "clear ambient capabilities",
            BecomeSandboxUser => "become the sandbox user",
            ClearCapabilities => "clear capabilities",
            SetRlimit(name) => return write!(f, "setrlimit {name}"),
            Landlock | LandlockRefused => "landlock",
            LandlockOpen(p) => return write!(f, "landlock: open {p}"),
            SetNoNewPrivs => "set no_new_privs",
            BuildSeccompFilter => "build seccomp filter",
            InstallSeccompFilter => "install seccomp filter",
            ReportApplied => "report applied protections",
            CloseInheritedFds => "close inherited fds",
            Command => "command",
            Env => "env",
        };
        f.write_str(words)
    }
}

impl Step {
    /// The system call (or library call) the step makes; `None` for a step that is a check of
    /// ours rather than a call whose error is reported.
    pub(crate) fn syscall(&self) -> Option<&'static str> {
        use Step::*;
        Some(match self {
            // Checks of ours, and the gateway's set-up, whose errors name their cause.
            SingleThreaded | GatewayPolicy | CheckCgroupJoined | LandlockRefused
            | GatewayResolver | StartGateway | RestoreWorkspace => return None,
            CreateControlChannels => "socketpair, pipe2",
            CloneNamespaces => {
                "clone3(CLONE_NEWUSER|CLONE_NEWNS|CLONE_NEWPID|CLONE_NEWIPC|CLONE_NEWUTS)"
            }
            WriteIdMap { .. } => "write",
            EncodePlan => "serde_json::to_vec",
            CreatePlanMemfd => "memfd_create",
            WritePlan => "write",
            SendToInit | HandOverProxySocket | ReportReady | ReportApplied => "sendmsg(SCM_RIGHTS)",
            OpenCgroupFile(_) | OpenDevNull | OpenOutput | OpenWork => "open",
            SetParentDeathSignal => "prctl(PR_SET_PDEATHSIG)",
            CreateNetworkNamespace => "unshare(CLONE_NEWNET)",
            BringLoopbackUp => "ioctl(SIOCSIFFLAGS)",
            SetHostName => "sethostname",
            WaitForIdMaps | WaitForPlan | ReceiveCgroups => "recvmsg",
            MakeInitNonDumpable => "prctl(PR_SET_DUMPABLE)",
            ReadPlan => "read",
            ListenOnProxyPort => "bind, listen",
            BlockSigchld => "sigprocmask, signalfd",
            CreatePayloadSocket => "socketpair",
            StartCommand => "clone(CLONE_VM|CLONE_VFORK)",
            MakeRootPrivate => "mount(MS_PRIVATE|MS_REC)",
            MountStagingTmpfs | MountNewRootTmpfs => "mount(tmpfs)",
            MkdirStaging(_) => "mkdir",
            PivotToStaging => "pivot_root",
            ChdirStagingRoot | ChdirCwd(_) => "chdir",
            DiscardHostRoot => "umount2(MNT_DETACH)",
            EventLoop(_) => "poll, read, ioctl(SECCOMP_IOCTL_NOTIF_*)",
            Root(r) => r.syscall(),
            JoinCgroups => "write cgroup.procs",
            ReadOwnCgroup => "read /proc/self/cgroup",
            CreateCgroupNamespace => "unshare(CLONE_NEWCGROUP)",
            RedirectOutput(_) | RedirectStdin => "dup2",
            LockSecurebits => "prctl(PR_SET_SECUREBITS)",
            DropBoundingSet => "prctl(PR_CAPBSET_DROP)",
            ClearAmbientCapabilities => "prctl(PR_CAP_AMBIENT_CLEAR_ALL)",
            BecomeSandboxUser => "setgroups, setresgid, setresuid",
            ClearCapabilities => "capset",
            SetRlimit(_) => "setrlimit",
            Landlock => "landlock_create_ruleset, landlock_add_rule, landlock_restrict_self",
            LandlockOpen(_) => "open(O_PATH)",
            SetNoNewPrivs => "prctl(PR_SET_NO_NEW_PRIVS)",
            BuildSeccompFilter => "assemble the BPF program",
            InstallSeccompFilter => "seccomp(SECCOMP_SET_MODE_FILTER)",
            CloseInheritedFds => "close_range(CLOSE_RANGE_CLOEXEC)",
            Command | Env => "CString::new",
        })
    }
}

/// What a failed step says: the error of the call, or (for a check of ours) the reason.
pub(crate) type Source = Box<dyn std::error::Error + Send + Sync>;

/// A failed set-up step: the step and its cause. Shown as `STEP: SYSCALL: CAUSE` (the
/// syscall left out for a check of ours).
#[derive(Debug, thiserror::Error)]
#[error("{step}: {}", self.reason())]
pub(crate) struct SetupError {
    pub(crate) step: Step,
    #[source]
    pub(crate) source: Source,
}

impl SetupError {
    pub(crate) fn new(step: Step, source: impl Into<Source>) -> SetupError {
        SetupError {
            step,
            source: source.into(),
        }
    }

    /// Everything after the step's words: the system call and the error.
    pub(crate) fn reason(&self) -> String {
        match self.step.syscall() {
            Some(call) => format!("{call}: {}", self.source),
            None => self.source.to_string(),
        }
    }

    /// The `(step, error)` pair of the control messages (`SetupFailed`), which the supervisor
    /// shows as `sandbox setup failed at `STEP`: ERROR`.
    pub(crate) fn into_pair(self) -> (String, String) {
        let reason = self.reason();
        (self.step.to_string(), reason)
    }
}

impl From<RootError> for SetupError {
    fn from(e: RootError) -> SetupError {
        SetupError {
            step: Step::Root(e.step),
            source: Box::new(e.source),
        }
    }
}

/// The result of a set-up step.
pub(crate) type StepResult<T> = Result<T, SetupError>;

/// One step's result, or a [`SetupError`] naming it. (The init's and the payload's steps
/// go through `inside::step`, which also marks them for `AGENTJAIL_DEBUG_TIMING`; this module
/// depends on no other of the engine but `root_sys`.)
pub(crate) fn step<T, E: Into<Source>>(s: Step, r: Result<T, E>) -> StepResult<T> {
    r.map_err(|e| SetupError::new(s, e))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io;

    fn eperm() -> io::Error {
        io::Error::from_raw_os_error(libc::EPERM)
    }

    #[test]
    fn a_refused_seccomp_load_names_the_step_and_the_syscall() {
        let e = SetupError::new(Step::InstallSeccompFilter, eperm());
        assert_eq!(
            e.to_string(),
            "install seccomp filter: seccomp(SECCOMP_SET_MODE_FILTER): Operation not permitted (os error 1)"
        );
        let (step, error) = e.into_pair();
        assert_eq!(step, "install seccomp filter");
        assert_eq!(
            error,
            "seccomp(SECCOMP_SET_MODE_FILTER): Operation not permitted (os error 1)"
        );
    }

    #[test]
    fn a_refused_cgroup_join_and_namespace_name_the_step_and_the_syscall() {
        let e = SetupError::new(Step::JoinCgroups, eperm());
        assert_eq!(
            e.to_string(),
            "join the run's cgroups: write cgroup.procs: Operation not permitted (os error 1)"
        );
        let e = SetupError::new(
            Step::CreateCgroupNamespace,
            io::Error::from_raw_os_error(libc::EINVAL),
        );
        assert_eq!(
            e.to_string(),
            "create the cgroup namespace: unshare(CLONE_NEWCGROUP): Invalid argument (os error 22)"
        );
    }

    #[test]
    fn a_check_of_ours_names_the_step_without_a_syscall() {
        let e = SetupError::new(Step::SingleThreaded, "internal: 3 threads");
        assert_eq!(
            e.to_string(),
            "check that the engine runs single-threaded: internal: 3 threads"
        );
    }

    #[test]
    fn steps_with_arguments_keep_their_words() {
        let e = SetupError::new(Step::SetRlimit("nofile"), eperm());
        assert_eq!(
            e.into_pair().0,
            "setrlimit nofile",
            "the report's step is the same words as before the steps were typed"
        );
        assert_eq!(
            Step::EventLoop("read SIGCHLD").to_string(),
            "the init's event loop: read SIGCHLD"
        );
        let e = SetupError::new(
            Step::WriteIdMap {
                file: "uid_map",
                content: "0 0 1\n".into(),
            },
            eperm(),
        );
        assert_eq!(
            e.to_string(),
            "write uid_map of the sandbox (\"0 0 1\\n\"): write: Operation not permitted (os error 1)"
        );
    }

    #[test]
    fn a_root_step_keeps_the_words_and_syscall_of_its_root_error() {
        let r = RootError {
            step: RootStep::PivotRoot,
            source: eperm(),
        };
        assert_eq!(
            SetupError::from(r).into_pair(),
            (
                "pivot_root(., .)".to_string(),
                "pivot_root: Operation not permitted (os error 1)".to_string()
            )
        );
    }
}
