//! The syscalls probes of `agentjail selftest` (see [`super`]).

use super::super::kit::{Env, Probe, Tier};
use super::common::*;

/// (probe id, syscall number, arguments, denial name). x86_64 numbers.
pub(super) const SYSCALLS: &[(&str, i64, &[i64], &str)] = &[
    ("syscall.ptrace", 101, &[16, 1, 0, 0], "ptrace"),
    ("syscall.mount", 165, &[0, 0, 0, 0, 0], "mount"),
    ("syscall.umount2", 166, &[0, 0], "umount2"),
    ("syscall.pivot_root", 155, &[0, 0], "pivot_root"),
    ("syscall.chroot", 161, &[0], "chroot"),
    ("syscall.unshare_user", 272, &[0x1000_0000], "unshare"),
    ("syscall.unshare_mount", 272, &[0x0002_0000], "unshare"),
    ("syscall.setns", 308, &[0, 0], "setns"),
    (
        "syscall.clone_newns",
        56,
        &[0x0002_0000 | 17, 0, 0, 0, 0],
        "clone(namespace flags)",
    ),
    ("syscall.bpf", 321, &[0, 0, 0], "bpf"),
    (
        "syscall.perf_event_open",
        298,
        &[0, 0, 0, 0, 0],
        "perf_event_open",
    ),
    ("syscall.io_uring_setup", 425, &[1, 0], "io_uring_setup"),
    ("syscall.userfaultfd", 323, &[0], "userfaultfd"),
    ("syscall.keyctl", 250, &[0, 0, 0], "keyctl"),
    ("syscall.add_key", 248, &[0, 0, 0, 0, 0], "add_key"),
    (
        "syscall.open_by_handle_at",
        304,
        &[0, 0, 0],
        "open_by_handle_at",
    ),
    ("syscall.kexec_load", 246, &[0, 0, 0, 0], "kexec_load"),
    (
        "syscall.kexec_file_load",
        320,
        &[0, 0, 0, 0, 0],
        "kexec_file_load",
    ),
    ("syscall.init_module", 175, &[0, 0, 0], "init_module"),
    ("syscall.finit_module", 313, &[0, 0, 0], "finit_module"),
    ("syscall.delete_module", 176, &[0, 0], "delete_module"),
    ("syscall.fsopen", 430, &[0, 0], "fsopen"),
    (
        "syscall.process_vm_readv",
        310,
        &[1, 0, 0, 0, 0, 0],
        "process_vm_readv",
    ),
];

macro_rules! sys_probe {
    ($id:literal, $what:literal) => {
        Probe {
            id: $id,
            layer: "seccomp (user notification)",
            attempt: $what,
            expect: "EPERM, and reported by name in the report's denials",
        }
    };
}

pub(super) const SYSCALL: &[Probe] = &[
    sys_probe!("syscall.ptrace", "ptrace(PTRACE_ATTACH, 1)"),
    sys_probe!("syscall.mount", "mount()"),
    sys_probe!("syscall.umount2", "umount2()"),
    sys_probe!("syscall.pivot_root", "pivot_root()"),
    sys_probe!("syscall.chroot", "chroot()"),
    sys_probe!("syscall.unshare_user", "unshare(CLONE_NEWUSER)"),
    sys_probe!("syscall.unshare_mount", "unshare(CLONE_NEWNS)"),
    sys_probe!("syscall.setns", "setns()"),
    sys_probe!("syscall.clone_newns", "clone(CLONE_NEWNS)"),
    Probe {
        id: "syscall.clone3",
        layer: "seccomp",
        attempt: "clone3() (its flags are in memory a filter cannot read)",
        expect: "ENOSYS from the filter, so libc falls back to clone(), whose flags are checked",
    },
    sys_probe!("syscall.bpf", "bpf()"),
    sys_probe!("syscall.perf_event_open", "perf_event_open()"),
    sys_probe!("syscall.io_uring_setup", "io_uring_setup()"),
    sys_probe!("syscall.userfaultfd", "userfaultfd()"),
    sys_probe!("syscall.keyctl", "keyctl()"),
    sys_probe!("syscall.add_key", "add_key()"),
    sys_probe!("syscall.open_by_handle_at", "open_by_handle_at()"),
    sys_probe!("syscall.kexec_load", "kexec_load()"),
    sys_probe!("syscall.kexec_file_load", "kexec_file_load()"),
    sys_probe!("syscall.init_module", "init_module() (module loading)"),
    sys_probe!("syscall.finit_module", "finit_module() (module loading)"),
    sys_probe!("syscall.delete_module", "delete_module()"),
    sys_probe!("syscall.fsopen", "fsopen() (the new mount API)"),
    sys_probe!("syscall.process_vm_readv", "process_vm_readv() on pid 1"),
    sys_probe!(
        "syscall.tiocsti",
        "ioctl(TIOCSTI): type into the caller's terminal"
    ),
    Probe {
        id: "syscall.control",
        layer: "control",
        attempt: "getpid()",
        expect: "works and is not reported (sentinel)",
    },
];

pub(super) fn syscall(env: &Env, tier: Tier) -> Verdicts {
    let mut body = String::new();
    for (id, nr, args, _) in SYSCALLS {
        let a: Vec<String> = args.iter().map(i64::to_string).collect();
        body.push_str(&format!("sys_call(\"{id}\", {nr}, {})\n", a.join(", ")));
    }
    body.push_str("sys_call(\"syscall.clone3\", 435, 0, 0)\n");
    body.push_str("import fcntl, termios\nattempt(\"syscall.tiocsti\", lambda: fcntl.ioctl(0, termios.TIOCSTI, b\"x\"))\n");
    body.push_str("sys_call(\"syscall.control\", 39)\n");
    let o = env.py(tier, &body, &[]);
    if !o.complete() {
        return all(SYSCALL, fail(o.incomplete()));
    }
    let check = |id: &'static str, needle: &str| {
        let r = res(&o, id);
        if r != "errno=1" {
            fail(format!("expected EPERM, got {r}"))
        } else if !o.denied("syscall", needle) {
            fail(format!(
                "EPERM, but no `{needle}` denial in the report (refused by the kernel, not by the filter)"
            ))
        } else {
            pass(format!("EPERM; reported as `{needle}`"))
        }
    };
    let mut v: Verdicts = SYSCALLS
        .iter()
        .map(|(id, _, _, needle)| (*id, check(id, needle)))
        .collect();
    v.push((
        "syscall.tiocsti",
        check("syscall.tiocsti", "ioctl(TIOCSTI)"),
    ));
    let c3 = res(&o, "syscall.clone3");
    v.push((
        "syscall.clone3",
        if c3 == "errno=38" {
            pass("ENOSYS (the kernel itself would answer EINVAL or EFAULT)")
        } else {
            fail(format!("expected ENOSYS, got {c3}"))
        },
    ));
    let ctl = res(&o, "syscall.control");
    v.push((
        "syscall.control",
        if ctl == "ok" && !o.denied("syscall", "getpid") {
            pass("getpid works, not reported")
        } else {
            fail(format!("getpid: {ctl}"))
        },
    ));
    v
}
