//! The raw system calls that neither rustix nor a maintained crate wraps, or that must run at
//! exactly one point (clone3 into new namespaces, a clone sharing memory or born in a cgroup,
//! seccomp with a listener, the notification ioctls, execve). Nothing here forks.
//! Every `unsafe` block of the engine lives in this module, each with the invariant it relies on.

use std::ffi::CString;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};

/// Result of [`clone_sandbox`].
pub enum Cloned {
    /// In the parent: the child's pid (in our pid namespace) and a pidfd for it.
    Parent { pid: i32, pidfd: OwnedFd },
    /// In the child.
    Child,
}

/// `clone3` with the given namespace flags and `CLONE_PIDFD`, behaving like `fork`.
///
/// Must only be called from a single-threaded process (checked by the caller): the child gets
/// a copy of the address space with one thread, and user namespaces cannot be created from a
/// multi-threaded process anyway.
pub fn clone_sandbox(ns_flags: u64) -> io::Result<Cloned> {
    let mut pidfd: libc::c_int = -1;
    // SAFETY: clone_args is plain data; zeroed is a valid value for every field.
    let mut args: libc::clone_args = unsafe { std::mem::zeroed() };
    args.flags = ns_flags | libc::CLONE_PIDFD as u64;
    args.pidfd = &mut pidfd as *mut libc::c_int as u64;
    args.exit_signal = libc::SIGCHLD as u64;
    // SAFETY: `args` and `pidfd` outlive the call; without CLONE_VM the child runs on a copy of
    // our memory, so returning into Rust code in both processes is sound (as with fork), and
    // the caller guarantees that no other thread holds a lock the child could need.
    let ret = unsafe {
        libc::syscall(
            libc::SYS_clone3,
            &mut args as *mut libc::clone_args,
            std::mem::size_of::<libc::clone_args>(),
        )
    };
    match ret {
        -1 => Err(io::Error::last_os_error()),
        0 => Ok(Cloned::Child),
        pid => Ok(Cloned::Parent {
            pid: pid as i32,
            // SAFETY: the kernel stored a new, owned pidfd in `pidfd` because CLONE_PIDFD was set
            // and the call succeeded.
            pidfd: unsafe { OwnedFd::from_raw_fd(pidfd) },
        }),
    }
}

/// Moves this process into new namespaces of the kinds in `flags` (`CLONE_NEW*`): the gVisor
/// tier's private mount namespace, the init's network and cgroup namespaces.
/// Called from single-threaded processes only.
pub fn unshare(flags: libc::c_int) -> io::Result<()> {
    // SAFETY: unshare with namespace flags only changes which namespaces this process belongs
    // to; it touches no memory, and no other thread exists to be surprised by the change.
    if unsafe { libc::unshare(flags) } == -1 {
        Err(io::Error::last_os_error())
    } else {
        Ok(())
    }
}

/// Starts `child` in a new process that shares this one's memory until it execs or exits, on a
/// stack of its own, while this process waits (`CLONE_VM | CLONE_VFORK`, what `posix_spawn`
/// does). It saves `fork`'s copy of the page tables and the copy-on-write faults that follow
/// (~0.2 ms here). Returns the child's pid.
///
/// The caller guarantees, and `inside::payload_main` is written to keep it: the process is
/// single-threaded (nothing else runs while the child uses the shared memory); `child` never
/// returns normally (it ends in execve or `_exit`); and it frees nothing this process
/// allocated (what it allocates itself stays allocated: a small leak in the waiting process).
/// File descriptors, credentials, signal handlers, the working directory, umask, rlimits,
/// Landlock and seccomp are the child's own (no CLONE_FILES, CLONE_FS, CLONE_SIGHAND,
/// CLONE_THREAD).
pub fn spawn_sharing_memory(child: &mut dyn FnMut()) -> io::Result<i32> {
    const STACK: usize = 1 << 20;
    const GUARD: usize = 64 << 10;
    extern "C" fn trampoline(arg: *mut libc::c_void) -> libc::c_int {
        // SAFETY: `arg` is the `&mut &mut dyn FnMut()` passed to clone below, alive until the
        // child execs or exits because the parent is suspended until then (CLONE_VFORK).
        let f = unsafe { &mut *(arg as *mut &mut dyn FnMut()) };
        f();
        // `child` is not meant to return; if it does, end this process, never the caller's.
        // SAFETY: _exit ends only this process and touches no shared state.
        unsafe { libc::_exit(127) }
    }
    // SAFETY: a fresh private anonymous mapping; checked for failure below.
    let stack = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            STACK,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_STACK,
            -1,
            0,
        )
    };
    if stack == libc::MAP_FAILED {
        return Err(io::Error::last_os_error());
    }
    // A guard at the low end, so that an overflow faults instead of writing below the stack.
    // SAFETY: the range is inside the mapping just made.
    let guarded = unsafe { libc::mprotect(stack, GUARD, libc::PROT_NONE) };
    let mut f: &mut dyn FnMut() = child;
    let ret = if guarded == -1 {
        -1
    } else {
        // SAFETY: the stack pointer is the top of a mapping of STACK bytes (16-byte aligned:
        // mmap returns page-aligned memory), used only by the child; the argument outlives the
        // child's use of it (see `trampoline`); the caller's guarantees above make sharing the
        // memory sound for the child's lifetime before exec.
        unsafe {
            libc::clone(
                trampoline,
                (stack as *mut u8).add(STACK) as *mut libc::c_void,
                libc::CLONE_VM | libc::CLONE_VFORK | libc::SIGCHLD,
                &mut f as *mut &mut dyn FnMut() as *mut libc::c_void,
            )
        }
    };
    let err = io::Error::last_os_error();
    // SAFETY: the child has exec'd or exited (CLONE_VFORK), so nothing uses the stack any more.
    unsafe { libc::munmap(stack, STACK) };
    if ret == -1 { Err(err) } else { Ok(ret) }
}

/// `CLONE_INTO_CGROUP` (Linux ≥ 5.7; not in every libc target's constants).
const CLONE_INTO_CGROUP: u64 = 0x2_0000_0000;

/// Starts `child` in a new process that is born in the cgroup v2 directory `cgroup`
/// (`clone3` with `CLONE_INTO_CGROUP`, Linux ≥ 5.7), while this process waits until the child
/// execs or exits (`CLONE_VFORK`). Born there, the child never runs outside the cgroup, and no
/// migration takes the kernel's global cgroup_threadgroup_rwsem. The kernel checks the
/// permission as for a write to `cgroup.procs` by this process. Returns the child's pid; an
/// error (ENOSYS, E2BIG or EINVAL before 5.7) leaves the caller to start it otherwise.
///
/// The child runs on a copy of this process's memory (no `CLONE_VM`: clone3 would need a
/// stack set up in assembly), as after `fork`. The caller guarantees that the process is
/// single-threaded and that `child` never returns normally (it ends in execve or `_exit`).
pub fn spawn_into_cgroup(
    cgroup: std::os::fd::BorrowedFd<'_>,
    child: &mut dyn FnMut(),
) -> io::Result<i32> {
    // SAFETY: clone_args is plain data; zeroed is a valid value for every field.
    let mut args: libc::clone_args = unsafe { std::mem::zeroed() };
    args.flags = libc::CLONE_VFORK as u64 | CLONE_INTO_CGROUP;
    args.exit_signal = libc::SIGCHLD as u64;
    args.cgroup = cgroup.as_raw_fd() as u64;
    // SAFETY: `args` outlives the call; without CLONE_VM the child runs on a copy of our
    // memory, so continuing in Rust code in both processes is sound (as with fork), and the
    // caller guarantees that no other thread holds a lock the child could need.
    let ret = unsafe {
        libc::syscall(
            libc::SYS_clone3,
            &mut args as *mut libc::clone_args,
            std::mem::size_of::<libc::clone_args>(),
        )
    };
    match ret {
        -1 => Err(io::Error::last_os_error()),
        0 => {
            child();
            // SAFETY: _exit ends only this (child) process.
            unsafe { libc::_exit(127) }
        }
        pid => Ok(pid as i32),
    }
}

/// Number of threads of this process, from /proc/self/stat (field 20).
pub fn thread_count() -> Option<u64> {
    let stat = std::fs::read_to_string("/proc/self/stat").ok()?;
    let after = &stat[stat.rfind(')')? + 2..];
    after.split(' ').nth(17)?.parse().ok()
}

/// `mount_setattr(path, AT_RECURSIVE, attr_set)`: adds mount attributes (e.g. read-only) to a
/// mount and every mount below it, keeping flags the kernel locked.
pub fn mount_setattr_recursive(path: &CString, attr_set: u64) -> io::Result<()> {
    // SAFETY: mount_attr is plain data; zeroed is valid.
    let mut attr: libc::mount_attr = unsafe { std::mem::zeroed() };
    attr.attr_set = attr_set;
    // SAFETY: `path` is a valid NUL-terminated string and `attr` a valid struct; both outlive
    // the call, which only reads them.
    let ret = unsafe {
        libc::syscall(
            libc::SYS_mount_setattr,
            libc::AT_FDCWD,
            path.as_ptr(),
            (libc::AT_RECURSIVE | libc::AT_SYMLINK_NOFOLLOW) as libc::c_uint,
            &mut attr as *mut libc::mount_attr,
            std::mem::size_of::<libc::mount_attr>(),
        )
    };
    if ret == -1 {
        Err(io::Error::last_os_error())
    } else {
        Ok(())
    }
}

/// Marks every fd from `first` on close-on-exec.
pub fn cloexec_from(first: u32) -> io::Result<()> {
    // SAFETY: close_range with CLOSE_RANGE_CLOEXEC only sets flags; it touches no memory.
    // (The raw syscall: musl has no close_range wrapper.)
    let ret = unsafe {
        libc::syscall(
            libc::SYS_close_range,
            first,
            u32::MAX,
            libc::CLOSE_RANGE_CLOEXEC,
        )
    };
    if ret == -1 {
        Err(io::Error::last_os_error())
    } else {
        Ok(())
    }
}

/// `seccomp(SECCOMP_SET_MODE_FILTER, flags, prog)`; returns the listener fd when
/// `SECCOMP_FILTER_FLAG_NEW_LISTENER` is in `flags`. no_new_privs must be set.
pub fn seccomp_set_filter(prog: &[libc::sock_filter], flags: u32) -> io::Result<Option<OwnedFd>> {
    if crate::weaken::test_weakened("seccomp") {
        return Ok(None);
    }
    let fprog = libc::sock_fprog {
        len: prog.len() as u16,
        filter: prog.as_ptr() as *mut libc::sock_filter,
    };
    // SAFETY: `fprog` points at `prog`, which outlives the call; the kernel copies the program.
    let ret = unsafe {
        libc::syscall(
            libc::SYS_seccomp,
            libc::SECCOMP_SET_MODE_FILTER,
            flags,
            &fprog as *const libc::sock_fprog,
        )
    };
    if ret < 0 {
        return Err(io::Error::last_os_error());
    }
    if flags & libc::SECCOMP_FILTER_FLAG_NEW_LISTENER as u32 != 0 {
        // SAFETY: with NEW_LISTENER the return value is a new fd that we now own.
        Ok(Some(unsafe { OwnedFd::from_raw_fd(ret as RawFd) }))
    } else {
        Ok(None)
    }
}

/// Kernel `struct seccomp_notif` (include/uapi/linux/seccomp.h).
#[repr(C)]
#[derive(Default, Clone, Copy)]
pub struct SeccompNotif {
    pub id: u64,
    pub pid: u32,
    pub flags: u32,
    pub nr: i32,
    pub arch: u32,
    pub instruction_pointer: u64,
    pub args: [u64; 6],
}

/// Kernel `struct seccomp_notif_resp`.
#[repr(C)]
#[derive(Default, Clone, Copy)]
struct SeccompNotifResp {
    id: u64,
    val: i64,
    error: i32,
    flags: u32,
}

// _IOWR('!', 0, struct seccomp_notif) and _IOWR('!', 1, struct seccomp_notif_resp).
const SECCOMP_IOCTL_NOTIF_RECV: libc::c_ulong = 0xc050_2100;
const SECCOMP_IOCTL_NOTIF_SEND: libc::c_ulong = 0xc018_2101;

/// Receives one pending notification from a seccomp listener.
pub fn notif_recv(listener: &OwnedFd) -> io::Result<SeccompNotif> {
    let mut n = SeccompNotif::default();
    // SAFETY: `n` is a correctly sized, writable `struct seccomp_notif` (size checked by a test
    // against the ioctl number's encoded size) that outlives the call.
    let ret = unsafe {
        libc::ioctl(
            listener.as_raw_fd(),
            SECCOMP_IOCTL_NOTIF_RECV as libc::Ioctl,
            &mut n as *mut SeccompNotif,
        )
    };
    if ret == -1 {
        Err(io::Error::last_os_error())
    } else {
        Ok(n)
    }
}

/// Answers a notification: the syscall fails with `errno`.
pub fn notif_deny(listener: &OwnedFd, id: u64, errno: i32) -> io::Result<()> {
    let mut r = SeccompNotifResp {
        id,
        val: 0,
        error: -errno,
        flags: 0,
    };
    // SAFETY: `r` is a correctly sized `struct seccomp_notif_resp` that outlives the call.
    let ret = unsafe {
        libc::ioctl(
            listener.as_raw_fd(),
            SECCOMP_IOCTL_NOTIF_SEND as libc::Ioctl,
            &mut r as *mut SeccompNotifResp,
        )
    };
    if ret == -1 {
        Err(io::Error::last_os_error())
    } else {
        Ok(())
    }
}

/// Blocks SIGCHLD and returns a signalfd that becomes readable when a child changes state.
pub fn sigchld_fd() -> io::Result<OwnedFd> {
    // SAFETY: sigset_t is plain data; sigemptyset initialises it.
    let mut set: libc::sigset_t = unsafe { std::mem::zeroed() };
    // SAFETY: `set` is a valid sigset_t for the duration of these calls.
    unsafe {
        libc::sigemptyset(&mut set);
        libc::sigaddset(&mut set, libc::SIGCHLD);
        if libc::sigprocmask(libc::SIG_BLOCK, &set, std::ptr::null_mut()) == -1 {
            return Err(io::Error::last_os_error());
        }
    }
    // SAFETY: `set` is valid; -1 asks for a new fd.
    let fd = unsafe { libc::signalfd(-1, &set, libc::SFD_CLOEXEC | libc::SFD_NONBLOCK) };
    if fd == -1 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: signalfd returned a new fd that we own.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// Restores the default signal mask and dispositions (in the payload, before exec).
pub fn reset_signals() {
    // SAFETY: sigset_t is plain data; the calls only read/write it and the process's masks.
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        libc::sigprocmask(libc::SIG_SETMASK, &set, std::ptr::null_mut());
        for sig in [
            libc::SIGPIPE,
            libc::SIGCHLD,
            libc::SIGINT,
            libc::SIGTERM,
            libc::SIGHUP,
        ] {
            libc::signal(sig, libc::SIG_DFL);
        }
    }
}

/// Waits for any child without blocking. Returns (pid, raw wait status).
pub fn wait_any_nohang() -> Option<(i32, i32)> {
    let mut status = 0;
    // SAFETY: `status` is a valid out pointer.
    let pid = unsafe { libc::waitpid(-1, &mut status, libc::WNOHANG | libc::__WALL) };
    if pid > 0 { Some((pid, status)) } else { None }
}

/// Waits (blocking) for any child; None when there are no children left.
pub fn wait_any() -> Option<(i32, i32)> {
    let mut status = 0;
    loop {
        // SAFETY: `status` is a valid out pointer.
        let pid = unsafe { libc::waitpid(-1, &mut status, libc::__WALL) };
        if pid > 0 {
            return Some((pid, status));
        }
        if io::Error::last_os_error().raw_os_error() != Some(libc::EINTR) {
            return None;
        }
    }
}

/// Sends SIGKILL to every process this process may signal (in the sandbox init: every other
/// process of the sandbox's pid namespace).
pub fn kill_all_others() {
    // SAFETY: kill has no memory effects.
    unsafe {
        libc::kill(-1, libc::SIGKILL);
    }
}

/// Resource usage of all waited-for descendants.
pub fn rusage_children() -> libc::rusage {
    // SAFETY: rusage is plain data; getrusage fills it.
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: `ru` is a valid out pointer.
    unsafe {
        libc::getrusage(libc::RUSAGE_CHILDREN, &mut ru);
    }
    ru
}

/// Brings the loopback interface of the current network namespace up.
pub fn loopback_up() -> io::Result<()> {
    // SAFETY: plain socket creation; the fd is wrapped immediately.
    let fd = unsafe { libc::socket(libc::AF_INET, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0) };
    if fd == -1 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: fd is a new socket we own.
    let sock = unsafe { OwnedFd::from_raw_fd(fd) };
    // SAFETY: ifreq is plain data; zeroed is valid.
    let mut ifr: libc::ifreq = unsafe { std::mem::zeroed() };
    for (d, s) in ifr.ifr_name.iter_mut().zip(b"lo\0") {
        *d = *s as libc::c_char;
    }
    ifr.ifr_ifru.ifru_flags = (libc::IFF_UP | libc::IFF_RUNNING) as libc::c_short;
    // SAFETY: `ifr` is a valid ifreq naming "lo"; SIOCSIFFLAGS reads it.
    let ret = unsafe {
        libc::ioctl(
            sock.as_raw_fd(),
            libc::SIOCSIFFLAGS as libc::Ioctl,
            &mut ifr,
        )
    };
    if ret == -1 {
        Err(io::Error::last_os_error())
    } else {
        Ok(())
    }
}

/// Sets real, effective and saved gids/uids (process-wide: glibc's wrappers) and clears the
/// supplementary groups when `clear_groups` (not allowed where setgroups is denied).
pub fn become_user(uid: u32, gid: u32, clear_groups: bool) -> io::Result<()> {
    // SAFETY: these calls take plain integers; setgroups with size 0 reads no memory.
    unsafe {
        if clear_groups && libc::setgroups(0, std::ptr::null()) == -1 {
            return Err(io::Error::last_os_error());
        }
        if libc::setresgid(gid, gid, gid) == -1 {
            return Err(io::Error::last_os_error());
        }
        if libc::setresuid(uid, uid, uid) == -1 {
            return Err(io::Error::last_os_error());
        }
    }
    Ok(())
}

/// Makes the process `cmd` starts get SIGKILL when the thread that starts it ends
/// (`PR_SET_PDEATHSIG`, set between fork and exec), and refuses to exec if this process has
/// already ended by then: a helper (runsc) never outlives the runner that accounts for it.
/// The thread that calls `spawn` must be the one that waits for the child.
pub fn die_with_parent(cmd: &mut std::process::Command) {
    use std::os::unix::process::CommandExt;
    let parent = std::process::id() as libc::pid_t;
    // SAFETY: the closure runs in the child between fork and exec: it only calls prctl and
    // getppid (async-signal-safe) and builds an io::Error from an errno (no allocation).
    unsafe {
        cmd.pre_exec(move || {
            if libc::prctl(
                libc::PR_SET_PDEATHSIG,
                libc::SIGKILL as libc::c_ulong,
                0,
                0,
                0,
            ) != 0
            {
                return Err(io::Error::last_os_error());
            }
            if libc::getppid() != parent {
                return Err(io::Error::from_raw_os_error(libc::ESRCH));
            }
            Ok(())
        });
    }
}

/// Starts a new session (detaches from any controlling terminal).
pub fn setsid() {
    // SAFETY: no memory effects.
    unsafe {
        libc::setsid();
    }
}

/// Duplicates `from` onto `to` (clearing close-on-exec on `to`).
pub fn dup2(from: RawFd, to: RawFd) -> io::Result<()> {
    // SAFETY: dup2 on integers; `to` is one of 0/1/2, which we intend to replace.
    if unsafe { libc::dup2(from, to) } == -1 {
        Err(io::Error::last_os_error())
    } else {
        Ok(())
    }
}

/// `execve`; returns only on failure.
pub fn execve(path: &CString, argv: &[CString], envp: &[CString]) -> io::Error {
    let mut a: Vec<*const libc::c_char> = argv.iter().map(|s| s.as_ptr()).collect();
    a.push(std::ptr::null());
    let mut e: Vec<*const libc::c_char> = envp.iter().map(|s| s.as_ptr()).collect();
    e.push(std::ptr::null());
    // SAFETY: `path`, every string and both NULL-terminated pointer arrays outlive the call.
    unsafe {
        libc::execve(path.as_ptr(), a.as_ptr(), e.as_ptr());
    }
    io::Error::last_os_error()
}

/// A read-only private mapping of a whole sealed memfd (see [`map_sealed`]).
pub struct Mapped {
    ptr: *mut libc::c_void,
    len: usize,
}

impl std::ops::Deref for Mapped {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        if self.len == 0 {
            return &[];
        }
        // SAFETY: `ptr` is a live read-only mapping of `len` bytes (made in `map_sealed`,
        // unmapped only on drop) of a memfd sealed against writes, shrinking and growing, so
        // its bytes neither change nor vanish while borrowed.
        unsafe { std::slice::from_raw_parts(self.ptr as *const u8, self.len) }
    }
}

impl Drop for Mapped {
    fn drop(&mut self) {
        if self.len != 0 {
            // SAFETY: unmaps exactly the mapping made in `map_sealed`, once.
            unsafe { libc::munmap(self.ptr, self.len) };
        }
    }
}

/// Maps the whole of `fd`, a memfd sealed with `F_SEAL_WRITE | F_SEAL_SHRINK | F_SEAL_GROW`
/// (checked here), read-only: its bytes without a copy (the pages stay the memfd's).
pub fn map_sealed(fd: &OwnedFd) -> io::Result<Mapped> {
    use rustix::fs::SealFlags;
    let seals = rustix::fs::fcntl_get_seals(fd)?;
    if !seals.contains(SealFlags::WRITE | SealFlags::SHRINK | SealFlags::GROW) {
        return Err(io::Error::other("the memfd is not sealed"));
    }
    let len = usize::try_from(rustix::fs::fstat(fd)?.st_size).map_err(io::Error::other)?;
    if len == 0 {
        return Ok(Mapped {
            ptr: std::ptr::null_mut(),
            len: 0,
        });
    }
    // SAFETY: a new private read-only mapping of `len` bytes of an open fd; failure checked.
    let ptr = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            len,
            libc::PROT_READ,
            libc::MAP_PRIVATE,
            fd.as_raw_fd(),
            0,
        )
    };
    if ptr == libc::MAP_FAILED {
        return Err(io::Error::last_os_error());
    }
    Ok(Mapped { ptr, len })
}

/// Runs `child` in a forked copy of the calling process and waits for it: `Ok(Ok(code))` when
/// it exited with `code`, `Ok(Err(signal))` when a signal ended it, `Err` when fork failed.
/// The copy has memory of its own, so what it writes to a tmpfs is charged to its cgroup (a
/// process sharing another's memory is charged to that one's). For the payload, whose other
/// half (the init) is suspended in `clone` until it execs: no lock is held in the copy.
pub fn fork_and_wait(child: &mut dyn FnMut() -> i32) -> io::Result<Result<i32, i32>> {
    // SAFETY: fork has no preconditions; the caller is single-threaded (the payload: the init
    // it shares memory with is suspended by CLONE_VFORK, holding no lock), so the copy may
    // allocate. The copy only runs `child` and then _exit.
    let pid = unsafe { libc::fork() };
    if pid < 0 {
        return Err(io::Error::last_os_error());
    }
    if pid == 0 {
        // A panic must not unwind out of the copy into its caller's code (which would go on
        // as a second payload): it ends the copy like a failure.
        let code =
            std::panic::catch_unwind(std::panic::AssertUnwindSafe(&mut *child)).unwrap_or(101);
        exit_now(code);
    }
    let mut status = 0;
    loop {
        // SAFETY: waits for our own child; `status` is a valid out-pointer.
        let r = unsafe { libc::waitpid(pid, &mut status, 0) };
        if r == pid {
            break;
        }
        let e = io::Error::last_os_error();
        if e.kind() != io::ErrorKind::Interrupted {
            return Err(e);
        }
    }
    if libc::WIFEXITED(status) {
        Ok(Ok(libc::WEXITSTATUS(status)))
    } else {
        Ok(Err(libc::WTERMSIG(status)))
    }
}

/// Ends the process at once, without running destructors or flushing stdio of the parent's
/// copy (the correct exit for a forked child).
pub fn exit_now(code: i32) -> ! {
    // SAFETY: _exit never returns and has no preconditions.
    unsafe { libc::_exit(code) }
}

/// Drops every capability from the bounding set (needs CAP_SETPCAP in our user namespace).
pub fn drop_bounding_set() -> io::Result<()> {
    for cap in 0..=63 {
        // SAFETY: prctl with integer arguments only.
        let ret = unsafe { libc::prctl(libc::PR_CAPBSET_DROP, cap, 0, 0, 0) };
        if ret == -1 {
            let e = io::Error::last_os_error();
            // EINVAL marks the end of the capabilities this kernel knows.
            if e.raw_os_error() == Some(libc::EINVAL) {
                break;
            }
            return Err(e);
        }
    }
    Ok(())
}

/// Sets locked securebits so that no exec can give capabilities back to uid 0 (there is none
/// here, but the bits make it a kernel guarantee).
pub fn lock_securebits() -> io::Result<()> {
    // SECBIT_NOROOT | SECBIT_NOROOT_LOCKED | SECBIT_NO_SETUID_FIXUP | ..._LOCKED |
    // SECBIT_KEEP_CAPS_LOCKED | SECBIT_NO_CAP_AMBIENT_RAISE | ..._LOCKED
    const BITS: libc::c_ulong = 0x01 | 0x02 | 0x04 | 0x08 | 0x20 | 0x40 | 0x80;
    // SAFETY: prctl with integer arguments only.
    if unsafe { libc::prctl(libc::PR_SET_SECUREBITS, BITS, 0, 0, 0) } == -1 {
        Err(io::Error::last_os_error())
    } else {
        Ok(())
    }
}

/// Landlock ABI version of the running kernel (0 when unsupported).
pub fn landlock_abi() -> u32 {
    // SAFETY: landlock_create_ruleset(NULL, 0, LANDLOCK_CREATE_RULESET_VERSION) only returns a
    // number; it reads no memory.
    let v = unsafe {
        libc::syscall(
            libc::SYS_landlock_create_ruleset,
            std::ptr::null::<u8>(),
            0usize,
            1u32,
        )
    };
    if v < 0 { 0 } else { v as u32 }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn notif_structs_match_the_ioctl_encoding() {
        // The size is encoded in bits 16..30 of the ioctl number.
        assert_eq!(
            (SECCOMP_IOCTL_NOTIF_RECV >> 16) & 0x3fff,
            std::mem::size_of::<SeccompNotif>() as libc::c_ulong
        );
        assert_eq!(
            (SECCOMP_IOCTL_NOTIF_SEND >> 16) & 0x3fff,
            std::mem::size_of::<SeccompNotifResp>() as libc::c_ulong
        );
    }

    #[test]
    fn thread_count_reads_this_process() {
        assert!(thread_count().unwrap_or(0) >= 1);
    }
}
