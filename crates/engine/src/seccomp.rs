//! The seccomp filter: a short deny-list of syscalls a sandboxed program has no business making.
//!
//! Why a deny-list and not an allow-list: the namespaces, the dropped capabilities and Landlock
//! are the boundary; seccomp removes kernel attack surface that stays reachable without
//! privileges (io_uring, userfaultfd, bpf, perf, keyrings, ptrace…) and makes every attempt
//! visible. Refused syscalls go to the sandbox's init through `SECCOMP_RET_USER_NOTIF`, which
//! records the name and answers `EPERM`; the report lists them as `{"kind":"syscall"}` denials.
//!
//! A few syscalls are decided by their arguments:
//! - `socket`/`socketpair`: an allow-list of address families — AF_UNIX, AF_INET, AF_INET6, and
//!   AF_NETLINK with NETLINK_ROUTE only (glibc's `getaddrinfo(AI_ADDRCONFIG)` and
//!   `if_nameindex` use it; it sees only the sandbox's own network namespace). Every other
//!   family (AF_VSOCK above all: vsock is not split per network namespace and reaches the
//!   hypervisor side of a VM; AF_PACKET, AF_ALG, AF_XDP, AF_KEY, AF_BLUETOOTH…) is answered
//!   `EAFNOSUPPORT`, another netlink protocol `EPROTONOSUPPORT`, and reported by name.
//! - Calls that change another process's limits or scheduling (`prlimit64`, `setpriority`,
//!   `sched_set*`, `ioprio_set`, `migrate_pages`, `move_pages`) are allowed on the caller
//!   itself only (pid/who 0; `prlimit64` may also read another's limits): as an ordinary user the
//!   command shares the init's uid, and `prlimit(1, RLIMIT_NOFILE, 0)` would wedge the init.
//!
//! A short filter also keeps start-up cheap (a 350-instruction allow-list costs ~0.25 ms to load).
//!
//! Fail-closed details: a foreign architecture (e.g. i386 `int 0x80`) kills the process; x32
//! syscall numbers get `ENOSYS`; `clone3` gets `ENOSYS` because its flags live in memory that a
//! filter cannot read, so libc falls back to `clone`, whose namespace flags are checked.
//!
//! seccompiler (rust-vmm) has no `SECCOMP_RET_USER_NOTIF` action, and libseccomp would add a C
//! library to the build, so this module assembles the few dozen instructions itself. The
//! assembler only emits forward jumps with checked offsets; the integration tests run every
//! denied syscall in a real sandbox and check both the errno and the report.

// BPF opcodes (linux/bpf_common.h).
// BPF_LD | BPF_W | BPF_ABS (0x00 | 0x00 | 0x20).
const BPF_LD_W_ABS: u16 = 0x20;
const BPF_JMP_JEQ_K: u16 = 0x05 | 0x10;
const BPF_JMP_JGE_K: u16 = 0x05 | 0x30;
const BPF_JMP_JSET_K: u16 = 0x05 | 0x40;
const BPF_RET_K: u16 = 0x06;

// Offsets into struct seccomp_data.
const OFF_NR: u32 = 0;
const OFF_ARCH: u32 = 4;
/// Low 32 bits of argument `i` (little-endian).
const fn off_arg_lo(i: u32) -> u32 {
    16 + 8 * i
}
/// High 32 bits of argument `i`.
const fn off_arg_hi(i: u32) -> u32 {
    20 + 8 * i
}

const RET_ALLOW: u32 = 0x7fff_0000;
const RET_KILL_PROCESS: u32 = 0x8000_0000;
const RET_USER_NOTIF: u32 = 0x7fc0_0000;
const RET_ERRNO: u32 = 0x0005_0000;

#[cfg(target_arch = "x86_64")]
const AUDIT_ARCH: u32 = 0xc000_003e; // AUDIT_ARCH_X86_64
#[cfg(target_arch = "aarch64")]
const AUDIT_ARCH: u32 = 0xc000_00b7; // AUDIT_ARCH_AARCH64

/// Namespace flags that `clone` must not carry (CLONE_NEWTIME is clone3/unshare-only).
const CLONE_NS_FLAGS: u32 = (libc::CLONE_NEWNS
    | libc::CLONE_NEWUTS
    | libc::CLONE_NEWIPC
    | libc::CLONE_NEWUSER
    | libc::CLONE_NEWPID
    | libc::CLONE_NEWNET
    | libc::CLONE_NEWCGROUP) as u32;

/// Address families `socket` and `socketpair` may create (see the module comment).
const ALLOWED_FAMILIES: [u32; 3] = [
    libc::AF_UNIX as u32,
    libc::AF_INET as u32,
    libc::AF_INET6 as u32,
];

/// Syscalls whose first argument is a pid: allowed when it is 0 (the caller) only.
const SELF_ONLY: &[(i64, &str)] = &[
    (libc::SYS_sched_setaffinity, "sched_setaffinity"),
    (libc::SYS_sched_setscheduler, "sched_setscheduler"),
    (libc::SYS_sched_setparam, "sched_setparam"),
    (libc::SYS_sched_setattr, "sched_setattr"),
    (libc::SYS_migrate_pages, "migrate_pages"),
    (libc::SYS_move_pages, "move_pages"),
    (libc::SYS_prlimit64, "prlimit64"),
    (libc::SYS_setpriority, "setpriority"),
    (libc::SYS_ioprio_set, "ioprio_set"),
];

/// `setpriority`'s `which` for a single process (linux/resource.h; libc's type differs
/// between glibc and musl).
const PRIO_PROCESS: u32 = 0;
/// `ioprio_set`'s `which` for a single process (linux/ioprio.h).
const IOPRIO_WHO_PROCESS: u32 = 1;

/// ioctls refused: injecting input into a terminal, and the Linux console's equivalents.
const DENIED_IOCTLS: &[(u32, &str)] = &[
    (libc::TIOCSTI as u32, "ioctl(TIOCSTI)"),
    (libc::TIOCLINUX as u32, "ioctl(TIOCLINUX)"),
];

/// Syscalls refused outright, with the name the report uses.
pub fn denied_syscalls() -> Vec<(i64, &'static str)> {
    let mut v: Vec<(i64, &'static str)> = vec![
        // Mount family and namespace changes.
        (libc::SYS_mount, "mount"),
        (libc::SYS_umount2, "umount2"),
        (libc::SYS_pivot_root, "pivot_root"),
        (libc::SYS_chroot, "chroot"),
        (libc::SYS_open_tree, "open_tree"),
        (libc::SYS_move_mount, "move_mount"),
        (libc::SYS_fsopen, "fsopen"),
        (libc::SYS_fsconfig, "fsconfig"),
        (libc::SYS_fsmount, "fsmount"),
        (libc::SYS_fspick, "fspick"),
        (libc::SYS_mount_setattr, "mount_setattr"),
        (libc::SYS_unshare, "unshare"),
        (libc::SYS_setns, "setns"),
        // Debugging and reading other processes.
        (libc::SYS_ptrace, "ptrace"),
        (libc::SYS_process_vm_readv, "process_vm_readv"),
        (libc::SYS_process_vm_writev, "process_vm_writev"),
        (libc::SYS_pidfd_getfd, "pidfd_getfd"),
        // Kernel attack surface reachable without privileges.
        (libc::SYS_bpf, "bpf"),
        (libc::SYS_perf_event_open, "perf_event_open"),
        (libc::SYS_userfaultfd, "userfaultfd"),
        (libc::SYS_io_uring_setup, "io_uring_setup"),
        (libc::SYS_io_uring_enter, "io_uring_enter"),
        (libc::SYS_io_uring_register, "io_uring_register"),
        (libc::SYS_keyctl, "keyctl"),
        (libc::SYS_add_key, "add_key"),
        (libc::SYS_request_key, "request_key"),
        (libc::SYS_fanotify_init, "fanotify_init"),
        // Watching the read-only binds of host directories shows host activity live.
        (libc::SYS_inotify_init1, "inotify_init1"),
        // Acting on another process's memory.
        (libc::SYS_process_madvise, "process_madvise"),
        (libc::SYS_open_by_handle_at, "open_by_handle_at"),
        (libc::SYS_name_to_handle_at, "name_to_handle_at"),
        // System administration.
        (libc::SYS_kexec_load, "kexec_load"),
        (libc::SYS_kexec_file_load, "kexec_file_load"),
        (libc::SYS_init_module, "init_module"),
        (libc::SYS_finit_module, "finit_module"),
        (libc::SYS_delete_module, "delete_module"),
        (libc::SYS_reboot, "reboot"),
        (libc::SYS_swapon, "swapon"),
        (libc::SYS_swapoff, "swapoff"),
        (libc::SYS_syslog, "syslog"),
        (libc::SYS_acct, "acct"),
        (libc::SYS_quotactl, "quotactl"),
        (libc::SYS_settimeofday, "settimeofday"),
        (libc::SYS_clock_settime, "clock_settime"),
        (libc::SYS_sethostname, "sethostname"),
        (libc::SYS_setdomainname, "setdomainname"),
        (libc::SYS_vhangup, "vhangup"),
        (libc::SYS_personality, "personality"),
    ];
    #[cfg(target_arch = "x86_64")]
    v.extend_from_slice(&[
        (libc::SYS_iopl, "iopl"),
        (libc::SYS_ioperm, "ioperm"),
        (libc::SYS_uselib, "uselib"),
        (libc::SYS_modify_ldt, "modify_ldt"),
        (libc::SYS_lookup_dcookie, "lookup_dcookie"),
        (libc::SYS_inotify_init, "inotify_init"),
    ]);
    v
}

/// The kernel's address family names by number (include/linux/socket.h).
const FAMILY_NAMES: [&str; 46] = [
    "AF_UNSPEC",
    "AF_UNIX",
    "AF_INET",
    "AF_AX25",
    "AF_IPX",
    "AF_APPLETALK",
    "AF_NETROM",
    "AF_BRIDGE",
    "AF_ATMPVC",
    "AF_X25",
    "AF_INET6",
    "AF_ROSE",
    "AF_DECnet",
    "AF_NETBEUI",
    "AF_SECURITY",
    "AF_KEY",
    "AF_NETLINK",
    "AF_PACKET",
    "AF_ASH",
    "AF_ECONET",
    "AF_ATMSVC",
    "AF_RDS",
    "AF_SNA",
    "AF_IRDA",
    "AF_PPPOX",
    "AF_WANPIPE",
    "AF_LLC",
    "AF_IB",
    "AF_MPLS",
    "AF_CAN",
    "AF_TIPC",
    "AF_BLUETOOTH",
    "AF_IUCV",
    "AF_RXRPC",
    "AF_ISDN",
    "AF_PHONET",
    "AF_IEEE802154",
    "AF_CAIF",
    "AF_ALG",
    "AF_NFC",
    "AF_VSOCK",
    "AF_KCM",
    "AF_QIPCRTR",
    "AF_SMC",
    "AF_XDP",
    "AF_MCTP",
];

/// The kernel's name of address family `family` (`AF_VSOCK`), or `family N` for a number it
/// does not name.
pub fn family_name(family: u32) -> String {
    FAMILY_NAMES
        .get(family as usize)
        .map(|s| s.to_string())
        .unwrap_or_else(|| format!("family {family}"))
}

fn is_socket_call(nr: i64) -> bool {
    nr == libc::SYS_socket || nr == libc::SYS_socketpair
}

/// The report name of a syscall refused by the filter, from its number and arguments.
pub fn syscall_name(nr: i64, args: &[u64; 6]) -> String {
    if nr == libc::SYS_clone {
        return "clone(namespace flags)".into();
    }
    if is_socket_call(nr) {
        let call = if nr == libc::SYS_socket {
            "socket"
        } else {
            "socketpair"
        };
        // The kernel reads `int` arguments: the low 32 bits, as the filter does.
        let family = args[0] as u32;
        return if family == libc::AF_NETLINK as u32 {
            format!("{call}(AF_NETLINK, protocol {})", args[2] as u32)
        } else {
            format!("{call}({})", family_name(family))
        };
    }
    if let Some((_, n)) = SELF_ONLY.iter().find(|(n, _)| *n == nr) {
        return format!("{n}(another process)");
    }
    if nr == libc::SYS_ioctl {
        let cmd = args[1] as u32;
        if let Some((_, n)) = DENIED_IOCTLS.iter().find(|(c, _)| *c == cmd) {
            return (*n).into();
        }
    }
    denied_syscalls()
        .into_iter()
        .find(|(n, _)| *n == nr)
        .map(|(_, s)| s.to_string())
        .unwrap_or_else(|| format!("syscall {nr}"))
}

/// The errno a refused syscall gets: a refused address family looks like one the kernel does
/// not have (EAFNOSUPPORT, which programs handle), a refused netlink protocol likewise
/// (EPROTONOSUPPORT); everything else EPERM.
pub fn refusal_errno(nr: i64, args: &[u64; 6]) -> i32 {
    if is_socket_call(nr) {
        if args[0] as u32 == libc::AF_NETLINK as u32 {
            libc::EPROTONOSUPPORT
        } else {
            libc::EAFNOSUPPORT
        }
    } else {
        libc::EPERM
    }
}

/// A jump target in the assembler.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Label {
    Next,
    ArchOk,
    Allow,
    Notify,
    Enosys,
    Clone,
    Ioctl,
    /// `socket`/`socketpair`: the family allow-list.
    Socket,
    /// The family is AF_NETLINK: the protocol decides.
    Netlink,
    /// A refused family / netlink protocol.
    DenyFamily,
    DenyProtocol,
    /// First argument must be 0 (the caller).
    SelfArg0,
    /// Second argument must be 0 (the caller), the first was checked.
    SelfArg1,
    Prlimit,
    Setpriority,
    IoprioSet,
    /// The right half of a node of the syscall-number search tree.
    Tree(u16),
}

enum Insn {
    Ld(u32),
    Jmp(u16, u32, Label, Label),
    Ret(u32),
    Mark(Label),
}

/// A filter that does not assemble: a jump of the program is wrong (a bug of ours, found by
/// the tests that build every filter).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AssembleError {
    #[error("seccomp: label {0:?} undefined")]
    UndefinedLabel(Label),
    #[error("seccomp: backward jump to {0:?}")]
    BackwardJump(Label),
    #[error("seccomp: jump to {label:?} too far ({offset})")]
    TooFar { label: Label, offset: usize },
}

/// Assembles the filter. `notify`: refused syscalls go to the listener (true) or fail with
/// EPERM without a report (false, for kernels without user notification).
pub fn build_filter(notify: bool) -> Result<Vec<libc::sock_filter>, AssembleError> {
    use Insn::*;
    use Label::*;
    let mut p: Vec<Insn> = vec![
        Ld(OFF_ARCH),
        Jmp(BPF_JMP_JEQ_K, AUDIT_ARCH, ArchOk, Next),
        Ret(RET_KILL_PROCESS),
        Mark(ArchOk),
        Ld(OFF_NR),
    ];
    #[cfg(target_arch = "x86_64")]
    p.push(Jmp(BPF_JMP_JGE_K, 0x4000_0000, Enosys, Next));
    // Every syscall number with something to do, searched as a balanced binary tree: a few
    // comparisons per syscall instead of one per entry. That matters at load time, when the
    // kernel runs the filter for every syscall number to fill its per-syscall allow cache.
    let mut special: Vec<(u32, Label)> = denied_syscalls()
        .into_iter()
        .map(|(nr, _)| (nr as u32, Notify))
        .collect();
    special.push((libc::SYS_clone3 as u32, Enosys));
    special.push((libc::SYS_clone as u32, Clone));
    special.push((libc::SYS_ioctl as u32, Ioctl));
    special.push((libc::SYS_socket as u32, Socket));
    special.push((libc::SYS_socketpair as u32, Socket));
    for (nr, _) in SELF_ONLY {
        let to = match *nr {
            libc::SYS_prlimit64 => Prlimit,
            libc::SYS_setpriority => Setpriority,
            libc::SYS_ioprio_set => IoprioSet,
            _ => SelfArg0,
        };
        special.push((*nr as u32, to));
    }
    special.sort_unstable_by_key(|e| e.0);
    special.dedup_by_key(|e| e.0);
    let mut next_node = 0u16;
    search_tree(&special, &mut p, &mut next_node);
    p.push(Mark(Clone));
    p.push(Ld(off_arg_lo(0)));
    p.push(Jmp(BPF_JMP_JSET_K, CLONE_NS_FLAGS, Notify, Allow));
    p.push(Mark(Ioctl));
    p.push(Ld(off_arg_lo(1)));
    for (cmd, _) in DENIED_IOCTLS {
        p.push(Jmp(BPF_JMP_JEQ_K, *cmd, Notify, Next));
    }
    p.push(Ret(RET_ALLOW));
    // socket(family, type, protocol) and socketpair(family, type, protocol, sv).
    p.push(Mark(Socket));
    p.push(Ld(off_arg_lo(0)));
    for family in ALLOWED_FAMILIES {
        p.push(Jmp(BPF_JMP_JEQ_K, family, Allow, Next));
    }
    p.push(Jmp(
        BPF_JMP_JEQ_K,
        libc::AF_NETLINK as u32,
        Netlink,
        DenyFamily,
    ));
    p.push(Mark(Netlink));
    p.push(Ld(off_arg_lo(2)));
    p.push(Jmp(
        BPF_JMP_JEQ_K,
        libc::NETLINK_ROUTE as u32,
        Allow,
        DenyProtocol,
    ));
    // prlimit64(pid, resource, new, old): the caller's own, or a read (new == NULL).
    p.push(Mark(Prlimit));
    p.push(Ld(off_arg_lo(0)));
    p.push(Jmp(BPF_JMP_JEQ_K, 0, Allow, Next));
    p.push(Ld(off_arg_lo(2)));
    p.push(Jmp(BPF_JMP_JEQ_K, 0, Next, Notify));
    p.push(Ld(off_arg_hi(2)));
    p.push(Jmp(BPF_JMP_JEQ_K, 0, Allow, Notify));
    // setpriority(which, who, prio): PRIO_PROCESS of the caller only (PRIO_USER 0 would reach
    // every process of the caller's uid, the init's too when unprivileged).
    p.push(Mark(Setpriority));
    p.push(Ld(off_arg_lo(0)));
    p.push(Jmp(BPF_JMP_JEQ_K, PRIO_PROCESS, SelfArg1, Notify));
    // ioprio_set(which, who, ioprio): likewise IOPRIO_WHO_PROCESS of the caller only.
    p.push(Mark(IoprioSet));
    p.push(Ld(off_arg_lo(0)));
    p.push(Jmp(BPF_JMP_JEQ_K, IOPRIO_WHO_PROCESS, SelfArg1, Notify));
    p.push(Mark(SelfArg1));
    p.push(Ld(off_arg_lo(1)));
    p.push(Jmp(BPF_JMP_JEQ_K, 0, Allow, Notify));
    p.push(Mark(SelfArg0));
    p.push(Ld(off_arg_lo(0)));
    p.push(Jmp(BPF_JMP_JEQ_K, 0, Allow, Notify));
    p.push(Mark(Allow));
    p.push(Ret(RET_ALLOW));
    p.push(Mark(Notify));
    p.push(Ret(if notify {
        RET_USER_NOTIF
    } else {
        RET_ERRNO | libc::EPERM as u32
    }));
    p.push(Mark(DenyFamily));
    p.push(Ret(if notify {
        RET_USER_NOTIF
    } else {
        RET_ERRNO | libc::EAFNOSUPPORT as u32
    }));
    p.push(Mark(DenyProtocol));
    p.push(Ret(if notify {
        RET_USER_NOTIF
    } else {
        RET_ERRNO | libc::EPROTONOSUPPORT as u32
    }));
    p.push(Mark(Enosys));
    p.push(Ret(RET_ERRNO | libc::ENOSYS as u32));
    assemble(&p)
}

/// Emits a search over the sorted `(syscall number, target)` entries: the accumulator holds
/// the syscall number; a number not in the list is allowed.
fn search_tree(entries: &[(u32, Label)], p: &mut Vec<Insn>, next_node: &mut u16) {
    use Insn::*;
    if entries.len() <= 3 {
        for (nr, to) in entries {
            p.push(Jmp(BPF_JMP_JEQ_K, *nr, *to, Label::Next));
        }
        p.push(Ret(RET_ALLOW));
        return;
    }
    let mid = entries.len() / 2;
    let right = Label::Tree(*next_node);
    *next_node += 1;
    p.push(Jmp(BPF_JMP_JGE_K, entries[mid].0, right, Label::Next));
    search_tree(&entries[..mid], p, next_node);
    p.push(Mark(right));
    search_tree(&entries[mid..], p, next_node);
}

fn assemble(p: &[Insn]) -> Result<Vec<libc::sock_filter>, AssembleError> {
    // Program counter of every label (marks take no slot).
    let mut pcs: Vec<(Label, usize)> = Vec::new();
    let mut pc = 0usize;
    for i in p {
        match i {
            Insn::Mark(l) => pcs.push((*l, pc)),
            _ => pc += 1,
        }
    }
    let target = |l: Label, at: usize| -> Result<u8, AssembleError> {
        if l == Label::Next {
            return Ok(0);
        }
        let to = pcs
            .iter()
            .find(|(x, _)| *x == l)
            .map(|(_, t)| *t)
            .ok_or(AssembleError::UndefinedLabel(l))?;
        let off = to
            .checked_sub(at + 1)
            .ok_or(AssembleError::BackwardJump(l))?;
        u8::try_from(off).map_err(|_| AssembleError::TooFar {
            label: l,
            offset: off,
        })
    };
    let mut out = Vec::with_capacity(pc);
    for i in p {
        let at = out.len();
        match i {
            Insn::Mark(_) => {}
            Insn::Ld(off) => out.push(libc::sock_filter {
                code: BPF_LD_W_ABS,
                jt: 0,
                jf: 0,
                k: *off,
            }),
            Insn::Ret(k) => out.push(libc::sock_filter {
                code: BPF_RET_K,
                jt: 0,
                jf: 0,
                k: *k,
            }),
            Insn::Jmp(code, k, t, f) => out.push(libc::sock_filter {
                code: *code,
                jt: target(*t, at)?,
                jf: target(*f, at)?,
                k: *k,
            }),
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A tiny interpreter for the subset the assembler emits, to check the program's logic
    /// without loading it.
    fn run(prog: &[libc::sock_filter], nr: u32, arch: u32, args: [u64; 6]) -> u32 {
        let mut data = [0u8; 64];
        data[0..4].copy_from_slice(&nr.to_le_bytes());
        data[4..8].copy_from_slice(&arch.to_le_bytes());
        for (i, a) in args.iter().enumerate() {
            data[16 + 8 * i..24 + 8 * i].copy_from_slice(&a.to_le_bytes());
        }
        let (mut pc, mut acc) = (0usize, 0u32);
        loop {
            let i = prog[pc];
            match i.code {
                BPF_LD_W_ABS => {
                    let k = i.k as usize;
                    acc = u32::from_le_bytes([data[k], data[k + 1], data[k + 2], data[k + 3]]);
                    pc += 1;
                }
                BPF_RET_K => return i.k,
                c => {
                    let hit = match c {
                        BPF_JMP_JEQ_K => acc == i.k,
                        BPF_JMP_JGE_K => acc >= i.k,
                        BPF_JMP_JSET_K => acc & i.k != 0,
                        _ => panic!("opcode {c:#x}"),
                    };
                    pc += 1 + if hit { i.jt as usize } else { i.jf as usize };
                }
            }
        }
    }

    #[test]
    // The ioctl numbers' type differs between glibc (c_ulong) and musl (c_int).
    #[allow(clippy::unnecessary_cast)]
    fn filter_logic() {
        let p = build_filter(true).unwrap();
        let a = [0u64; 6];
        assert_eq!(run(&p, libc::SYS_read as u32, AUDIT_ARCH, a), RET_ALLOW);
        assert_eq!(
            run(&p, libc::SYS_ptrace as u32, AUDIT_ARCH, a),
            RET_USER_NOTIF
        );
        assert_eq!(
            run(&p, libc::SYS_mount as u32, AUDIT_ARCH, a),
            RET_USER_NOTIF
        );
        assert_eq!(
            run(&p, libc::SYS_read as u32, 0x4000_0003, a),
            RET_KILL_PROCESS
        );
        assert_eq!(
            run(&p, libc::SYS_clone3 as u32, AUDIT_ARCH, a),
            RET_ERRNO | libc::ENOSYS as u32
        );
        // A plain fork-like clone passes, one with CLONE_NEWUSER does not.
        let fork = [libc::SIGCHLD as u64, 0, 0, 0, 0, 0];
        assert_eq!(run(&p, libc::SYS_clone as u32, AUDIT_ARCH, fork), RET_ALLOW);
        let ns = [(libc::CLONE_NEWUSER | libc::SIGCHLD) as u64, 0, 0, 0, 0, 0];
        assert_eq!(
            run(&p, libc::SYS_clone as u32, AUDIT_ARCH, ns),
            RET_USER_NOTIF
        );
        // TIOCSTI is refused even with garbage in the upper half of the argument.
        let sti = [0, 0xdead_0000_0000_0000 | libc::TIOCSTI as u64, 0, 0, 0, 0];
        assert_eq!(
            run(&p, libc::SYS_ioctl as u32, AUDIT_ARCH, sti),
            RET_USER_NOTIF
        );
        let tcgets = [0, libc::TCGETS as u64, 0, 0, 0, 0];
        assert_eq!(
            run(&p, libc::SYS_ioctl as u32, AUDIT_ARCH, tcgets),
            RET_ALLOW
        );
        #[cfg(target_arch = "x86_64")]
        assert_eq!(
            run(&p, 0x4000_0000 | libc::SYS_ptrace as u32, AUDIT_ARCH, a),
            RET_ERRNO | libc::ENOSYS as u32
        );
        let p = build_filter(false).unwrap();
        assert_eq!(
            run(&p, libc::SYS_bpf as u32, AUDIT_ARCH, a),
            RET_ERRNO | libc::EPERM as u32
        );
    }

    #[test]
    fn every_syscall_number_gets_what_the_lists_say() {
        // The search tree against the plain lists, for every number a kernel could have.
        let p = build_filter(true).unwrap();
        let denied: Vec<u32> = denied_syscalls().iter().map(|(n, _)| *n as u32).collect();
        let plain = [0u64; 6];
        for nr in 0..1024u32 {
            // (With all-zero arguments socket's family is AF_UNSPEC, refused, and so is
            // ioprio_set's `which` 0; the other self-only calls target the caller, allowed.)
            let want = if denied.contains(&nr)
                || is_socket_call(nr as i64)
                || nr == libc::SYS_ioprio_set as u32
            {
                RET_USER_NOTIF
            } else if nr == libc::SYS_clone3 as u32 {
                RET_ERRNO | libc::ENOSYS as u32
            } else {
                RET_ALLOW
            };
            assert_eq!(run(&p, nr, AUDIT_ARCH, plain), want, "syscall {nr}");
        }
    }

    #[test]
    fn socket_families_are_an_allow_list() {
        let p = build_filter(true).unwrap();
        let q = build_filter(false).unwrap();
        for nr in [libc::SYS_socket, libc::SYS_socketpair] {
            for family in 0..=1024u64 {
                // Garbage in the upper half is ignored by the kernel, and so by the filter.
                for upper in [0u64, 0xffff_ffff_0000_0000] {
                    let args = [upper | family, libc::SOCK_STREAM as u64, 0, 0, 0, 0];
                    let allowed = ALLOWED_FAMILIES.contains(&(family as u32))
                        || family == libc::AF_NETLINK as u64;
                    let got = run(&p, nr as u32, AUDIT_ARCH, args);
                    let want = if allowed { RET_ALLOW } else { RET_USER_NOTIF };
                    assert_eq!(got, want, "{nr} family {family:#x}");
                    if !allowed {
                        assert_eq!(
                            run(&q, nr as u32, AUDIT_ARCH, args),
                            RET_ERRNO | libc::EAFNOSUPPORT as u32
                        );
                        assert_eq!(refusal_errno(nr, &args), libc::EAFNOSUPPORT);
                    }
                }
            }
            for proto in 0..32u64 {
                let args = [
                    libc::AF_NETLINK as u64,
                    libc::SOCK_RAW as u64,
                    proto,
                    0,
                    0,
                    0,
                ];
                let want = if proto == libc::NETLINK_ROUTE as u64 {
                    RET_ALLOW
                } else {
                    RET_USER_NOTIF
                };
                assert_eq!(run(&p, nr as u32, AUDIT_ARCH, args), want, "proto {proto}");
                if proto != 0 {
                    assert_eq!(refusal_errno(nr, &args), libc::EPROTONOSUPPORT);
                    assert_eq!(
                        syscall_name(nr, &args),
                        if nr == libc::SYS_socket {
                            format!("socket(AF_NETLINK, protocol {proto})")
                        } else {
                            format!("socketpair(AF_NETLINK, protocol {proto})")
                        }
                    );
                }
            }
        }
        assert_eq!(
            syscall_name(libc::SYS_socket, &[40, 1, 0, 0, 0, 0]),
            "socket(AF_VSOCK)"
        );
        assert_eq!(
            syscall_name(libc::SYS_socketpair, &[46, 1, 0, 0, 0, 0]),
            "socketpair(family 46)"
        );
    }

    #[test]
    fn limits_and_scheduling_of_other_processes_are_refused() {
        let p = build_filter(true).unwrap();
        let nr = |n: i64| n as u32;
        let a = |x: [u64; 6]| x;
        for (n, _) in SELF_ONLY {
            let pid_arg = if *n == libc::SYS_setpriority || *n == libc::SYS_ioprio_set {
                1
            } else {
                0
            };
            let which = if *n == libc::SYS_ioprio_set { 1 } else { 0 };
            let mut me = [0u64; 6];
            me[0] = if pid_arg == 1 { which } else { 0 };
            assert_eq!(run(&p, nr(*n), AUDIT_ARCH, me), RET_ALLOW, "{n} self");
            let mut other = me;
            other[pid_arg] = 1;
            other[2] = 0x7fff_0000_1000; // a `new` pointer for prlimit64
            assert_eq!(
                run(&p, nr(*n), AUDIT_ARCH, other),
                RET_USER_NOTIF,
                "{n} pid 1"
            );
            assert!(syscall_name(*n, &other).ends_with("(another process)"));
            assert_eq!(refusal_errno(*n, &other), libc::EPERM);
        }
        // prlimit64: reading another process's limits (new == NULL) is allowed; a `new`
        // pointer with a zero low half is still a pointer.
        let read = a([1, 7, 0, 0x7fff_0000_2000, 0, 0]);
        assert_eq!(
            run(&p, nr(libc::SYS_prlimit64), AUDIT_ARCH, read),
            RET_ALLOW
        );
        let high = a([1, 7, 0x7fff_0000_0000, 0, 0, 0]);
        assert_eq!(
            run(&p, nr(libc::SYS_prlimit64), AUDIT_ARCH, high),
            RET_USER_NOTIF
        );
        // setpriority / ioprio_set: another `which` than a single process is refused even
        // with who == 0 (PRIO_USER 0 is the caller's whole uid).
        for which in [1u64, 2] {
            let args = a([which, 0, 19, 0, 0, 0]);
            assert_eq!(
                run(&p, nr(libc::SYS_setpriority), AUDIT_ARCH, args),
                RET_USER_NOTIF
            );
        }
        for which in [2u64, 3] {
            let args = a([which, 0, 0, 0, 0, 0]);
            assert_eq!(
                run(&p, nr(libc::SYS_ioprio_set), AUDIT_ARCH, args),
                RET_USER_NOTIF
            );
        }
    }

    #[test]
    fn filter_is_short_and_shallow() {
        let p = build_filter(true).unwrap();
        assert!(p.len() < 200, "{} instructions", p.len());
        // Longest path an allowed syscall takes: a handful of comparisons, not one per entry.
        let steps = |nr: u32| {
            let (mut pc, mut n) = (0usize, 0);
            let mut acc = 0u32;
            loop {
                n += 1;
                let i = p[pc];
                match i.code {
                    BPF_LD_W_ABS => {
                        acc = if i.k == OFF_NR { nr } else { AUDIT_ARCH };
                        pc += 1;
                    }
                    BPF_RET_K => return n,
                    c => {
                        let hit = match c {
                            BPF_JMP_JEQ_K => acc == i.k,
                            BPF_JMP_JGE_K => acc >= i.k,
                            _ => acc & i.k != 0,
                        };
                        pc += 1 + if hit { i.jt as usize } else { i.jf as usize };
                    }
                }
            }
        };
        let deepest = (0..512).map(steps).max().unwrap();
        // (The argument checks of socket and prlimit64 add a few after the tree.)
        assert!(deepest <= 20, "deepest path {deepest} instructions");
    }
}
