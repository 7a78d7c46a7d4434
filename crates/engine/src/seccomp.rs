//! The seccomp filter: a short deny-list of syscalls a sandboxed program has no business making.
//!
//! Why a deny-list and not an allow-list: the namespaces, the dropped capabilities and Landlock
//! are the boundary; seccomp removes kernel attack surface that stays reachable without
//! privileges (io_uring, userfaultfd, bpf, perf, keyrings, ptrace…) and makes every attempt
//! visible. Refused syscalls go to the sandbox's init through `SECCOMP_RET_USER_NOTIF`, which
//! records the name and answers `EPERM`; the report lists them as `{"kind":"syscall"}` denials.
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
    ]);
    v
}

/// The report name of a syscall number refused by the filter.
pub fn syscall_name(nr: i64, args: &[u64; 6]) -> String {
    if nr == libc::SYS_clone {
        return "clone(namespace flags)".into();
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

/// A jump target in the assembler.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Label {
    Next,
    ArchOk,
    Allow,
    Notify,
    Enosys,
    Clone,
    Ioctl,
    /// The right half of a node of the syscall-number search tree.
    Tree(u16),
}

enum Insn {
    Ld(u32),
    Jmp(u16, u32, Label, Label),
    Ret(u32),
    Mark(Label),
}

/// Assembles the filter. `notify`: refused syscalls go to the listener (true) or fail with
/// EPERM without a report (false, for kernels without user notification).
pub fn build_filter(notify: bool) -> Result<Vec<libc::sock_filter>, String> {
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
    p.push(Mark(Allow));
    p.push(Ret(RET_ALLOW));
    p.push(Mark(Notify));
    p.push(Ret(if notify {
        RET_USER_NOTIF
    } else {
        RET_ERRNO | libc::EPERM as u32
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

fn assemble(p: &[Insn]) -> Result<Vec<libc::sock_filter>, String> {
    // Program counter of every label (marks take no slot).
    let mut pcs: Vec<(Label, usize)> = Vec::new();
    let mut pc = 0usize;
    for i in p {
        match i {
            Insn::Mark(l) => pcs.push((*l, pc)),
            _ => pc += 1,
        }
    }
    let target = |l: Label, at: usize| -> Result<u8, String> {
        if l == Label::Next {
            return Ok(0);
        }
        let to = pcs
            .iter()
            .find(|(x, _)| *x == l)
            .map(|(_, t)| *t)
            .ok_or_else(|| format!("seccomp: label {l:?} undefined"))?;
        let off = to
            .checked_sub(at + 1)
            .ok_or_else(|| format!("seccomp: backward jump to {l:?}"))?;
        u8::try_from(off).map_err(|_| format!("seccomp: jump to {l:?} too far ({off})"))
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
            let want = if denied.contains(&nr) {
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
    fn filter_is_short_and_shallow() {
        let p = build_filter(true).unwrap();
        assert!(p.len() < 160, "{} instructions", p.len());
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
        assert!(deepest <= 16, "deepest path {deepest} instructions");
    }
}
