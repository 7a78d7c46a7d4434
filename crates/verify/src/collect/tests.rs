//! The unit tests of [`super`] (collecting the output directory): hostile entries and bounds.

use super::*;
use std::os::fd::AsFd;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{MetadataExt, PermissionsExt, symlink};

struct Fixture {
    _tmp: tempfile::TempDir,
    src: PathBuf,
    dest: PathBuf,
    canary: PathBuf,
}

const CANARY: &[u8] = b"CANARY-SECRET-HOST-CONTENT";

fn fixture() -> Fixture {
    let tmp = tempfile::tempdir().unwrap();
    let src = tmp.path().join("output");
    let dest = tmp.path().join("staging");
    std::fs::create_dir(&src).unwrap();
    std::fs::create_dir(&dest).unwrap();
    std::fs::set_permissions(&dest, std::fs::Permissions::from_mode(0o700)).unwrap();
    let canary = tmp.path().join("canary.txt");
    std::fs::write(&canary, CANARY).unwrap();
    Fixture {
        _tmp: tmp,
        src,
        dest,
        canary,
    }
}

fn run(f: &Fixture, budget: u64) -> CollectReport {
    let fd = open_dir(&f.src).unwrap();
    collect(fd.as_fd(), &f.dest, budget).unwrap()
}

fn reason_of<'a>(r: &'a CollectReport, path: &str) -> &'a str {
    r.rejected
        .iter()
        .find(|x| x.path == path)
        .map(|x| x.reason.as_str())
        .unwrap_or_else(|| panic!("{path} not rejected: {r:?}"))
}

fn mkfifo(path: &Path) {
    let c = std::ffi::CString::new(path.as_os_str().as_bytes()).unwrap();
    rustix::fs::mknodat(
        rustix::fs::CWD,
        c.as_c_str(),
        FileType::Fifo,
        Mode::from_raw_mode(0o666),
        0,
    )
    .unwrap();
}

/// Every file under `dir`, recursively, with its content.
fn staged(dir: &Path) -> Vec<(PathBuf, Vec<u8>)> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_owned()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).unwrap() {
            let p = e.unwrap().path();
            let m = std::fs::symlink_metadata(&p).unwrap();
            if m.is_dir() {
                stack.push(p);
            } else {
                assert!(m.is_file(), "{p:?} in staging is not a regular file");
                out.push((p.clone(), std::fs::read(&p).unwrap()));
            }
        }
    }
    out.sort();
    out
}

fn assert_canary_not_copied(f: &Fixture) {
    for (p, content) in staged(&f.dest) {
        assert!(
            !content.windows(CANARY.len()).any(|w| w == CANARY),
            "canary copied into {p:?}"
        );
    }
}

#[test]
fn normal_tree_copies_exactly() {
    let f = fixture();
    std::fs::write(f.src.join("summary.json"), b"{\"a\":1}").unwrap();
    std::fs::create_dir_all(f.src.join("sub/deeper")).unwrap();
    std::fs::create_dir(f.src.join("empty")).unwrap();
    std::fs::write(f.src.join("sub/b.txt"), b"hello").unwrap();
    std::fs::write(f.src.join("sub/deeper/c.bin"), [0u8, 1, 2, 255]).unwrap();
    std::fs::write(f.src.join("zero"), b"").unwrap();
    let r = run(&f, 1 << 20);
    assert!(r.rejected.is_empty(), "{r:?}");
    let paths: Vec<&str> = r.files.iter().map(|x| x.path.as_str()).collect();
    assert_eq!(
        paths,
        ["sub/b.txt", "sub/deeper/c.bin", "summary.json", "zero"]
    );
    let b = &r.files[0];
    assert_eq!(b.bytes, 5);
    assert_eq!(b.sha256, agentjail_manifest::sha256_digest(b"hello"));
    assert_eq!(std::fs::read(f.dest.join("sub/b.txt")).unwrap(), b"hello");
    assert_eq!(
        std::fs::read(f.dest.join("sub/deeper/c.bin")).unwrap(),
        [0u8, 1, 2, 255]
    );
    assert!(f.dest.join("empty").is_dir());
    let m = std::fs::metadata(f.dest.join("summary.json")).unwrap();
    assert_eq!(m.mode() & 0o777, 0o600);
    let m = std::fs::metadata(f.dest.join("sub/deeper")).unwrap();
    assert_eq!(m.mode() & 0o777, 0o700);
}

/// Into memory: over a tree with every kind of hostile entry, the same report as into a
/// staging folder, each accepted file's content exactly, the budget the same, and nothing
/// written anywhere (the staging folder of the memory walk stays empty).
#[test]
fn into_memory_the_same_walk_and_nothing_written() {
    let f = fixture();
    std::fs::write(f.src.join("summary.json"), b"{\"a\":1}").unwrap();
    std::fs::create_dir_all(f.src.join("sub/deeper")).unwrap();
    std::fs::write(f.src.join("sub/deeper/c.bin"), [0u8, 1, 2, 255]).unwrap();
    std::fs::write(f.src.join("big"), vec![b'b'; 300]).unwrap();
    symlink(&f.canary, f.src.join("link-to-canary")).unwrap();
    std::fs::hard_link(&f.canary, f.src.join("canary-hardlink")).unwrap();
    mkfifo(&f.src.join("fifo"));
    std::fs::write(f.src.join("bad\u{1b}name"), b"x").unwrap();
    let fd = open_dir(&f.src).unwrap();
    let mem = collect_to_memory(fd.as_fd(), 200, Some("summary.json")).unwrap();
    assert!(staged(&f.dest).is_empty(), "the memory walk wrote files");
    let on_disk = run(&f, 200);
    assert_eq!(mem.report, on_disk);
    let paths: Vec<&str> = mem.report.files.iter().map(|x| x.path.as_str()).collect();
    assert_eq!(paths, ["sub/deeper/c.bin", "summary.json"]);
    // Only the kept path's content is held; the other file is listed all the same.
    assert_eq!(
        mem.contents,
        [("summary.json".to_string(), b"{\"a\":1}".to_vec())]
    );
    let fd = open_dir(&f.src).unwrap();
    let deep = collect_to_memory(fd.as_fd(), 200, Some("sub/deeper/c.bin")).unwrap();
    assert_eq!(deep.report, on_disk);
    assert_eq!(
        deep.contents,
        [("sub/deeper/c.bin".to_string(), vec![0u8, 1, 2, 255])]
    );
    for (_, c) in &mem.contents {
        assert!(!c.windows(CANARY.len()).any(|w| w == CANARY));
    }
    assert_eq!(
        reason_of(&mem.report, "big"),
        "output exceeds its limit of 200 bytes"
    );
    assert_eq!(reason_of(&mem.report, "link-to-canary"), "symlink refused");
    assert_eq!(
        reason_of(&mem.report, "canary-hardlink"),
        "hard link refused"
    );
    assert_eq!(reason_of(&mem.report, "fifo"), "FIFO refused");
}

#[test]
fn symlinks_are_refused_and_never_followed() {
    let f = fixture();
    symlink(&f.canary, f.src.join("link-to-canary")).unwrap();
    symlink("../canary.txt", f.src.join("relative-link")).unwrap();
    symlink(f.canary.parent().unwrap(), f.src.join("dir-link")).unwrap();
    symlink("/etc", f.src.join("etc")).unwrap();
    std::fs::write(f.src.join("ok.txt"), b"fine").unwrap();
    let r = run(&f, 1 << 20);
    for p in ["link-to-canary", "relative-link", "dir-link", "etc"] {
        assert_eq!(reason_of(&r, p), "symlink refused");
    }
    assert_eq!(r.files.len(), 1);
    assert_eq!(r.files[0].path, "ok.txt");
    assert_canary_not_copied(&f);
    assert!(!f.dest.join("etc").exists());
}

#[test]
fn hard_links_are_refused() {
    let f = fixture();
    // A hard link to a host file (same filesystem), and two links to one file inside.
    std::fs::hard_link(&f.canary, f.src.join("canary-hardlink")).unwrap();
    std::fs::write(f.src.join("a"), b"x").unwrap();
    std::fs::hard_link(f.src.join("a"), f.src.join("b")).unwrap();
    let r = run(&f, 1 << 20);
    assert_eq!(reason_of(&r, "canary-hardlink"), "hard link refused");
    assert_eq!(reason_of(&r, "a"), "hard link refused");
    assert_eq!(reason_of(&r, "b"), "hard link refused");
    assert!(r.files.is_empty());
    assert_canary_not_copied(&f);
}

#[test]
fn fifo_socket_are_refused_without_blocking() {
    let f = fixture();
    mkfifo(&f.src.join("fifo"));
    let sub = f.src.join("sub");
    std::fs::create_dir(&sub).unwrap();
    let _listener = std::os::unix::net::UnixListener::bind(sub.join("sock")).unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    let (src, dest) = (f.src.clone(), f.dest.clone());
    std::thread::spawn(move || {
        let fd = open_dir(&src).unwrap();
        let _ = tx.send(collect(fd.as_fd(), &dest, 1 << 20).unwrap());
    });
    let r = rx
        .recv_timeout(std::time::Duration::from_secs(10))
        .expect("collect blocked on a FIFO");
    assert_eq!(reason_of(&r, "fifo"), "FIFO refused");
    assert_eq!(reason_of(&r, "sub/sock"), "socket refused");
    assert!(r.files.is_empty());
}

#[test]
fn unsafe_names_are_refused_and_escaped() {
    let f = fixture();
    std::fs::write(f.src.join("bad\nname"), b"x").unwrap();
    std::fs::write(f.src.join("esc\x1b[31m"), b"x").unwrap();
    std::fs::write(f.src.join("rtl\u{202E}txt.exe"), b"x").unwrap();
    let non_utf8 = std::ffi::OsStr::from_bytes(b"bad\xff");
    std::fs::write(f.src.join(non_utf8), b"x").unwrap();
    std::fs::create_dir(f.src.join("dir\tname")).unwrap();
    std::fs::write(f.src.join("dir\tname/inner"), b"x").unwrap();
    std::fs::write(f.src.join("fine name (1).txt"), b"x").unwrap();
    let r = run(&f, 1 << 20);
    assert_eq!(reason_of(&r, "bad\\nname"), "unsafe name");
    assert_eq!(reason_of(&r, "esc\\u{1b}[31m"), "unsafe name");
    assert_eq!(reason_of(&r, "rtl\\u{202e}txt.exe"), "unsafe name");
    assert_eq!(reason_of(&r, "bad\\xff"), "unsafe name");
    assert_eq!(reason_of(&r, "dir\\tname"), "unsafe name");
    assert_eq!(r.rejected.len(), 5);
    assert_eq!(r.files.len(), 1);
    assert_eq!(r.files[0].path, "fine name (1).txt");
    for rej in &r.rejected {
        assert!(!rej.path.chars().any(|c| c.is_control()), "{rej:?}");
    }
}

#[test]
fn the_byte_bound_is_exact_over_many_files() {
    let f = fixture();
    // 1024 files of 1 KiB: exactly 1 MiB passes.
    for i in 0..1024 {
        std::fs::write(f.src.join(format!("f{i:04}")), vec![b'x'; 1024]).unwrap();
    }
    let r = run(&f, 1 << 20);
    assert!(r.rejected.is_empty(), "{:?}", r.rejected);
    assert_eq!(r.files.iter().map(|x| x.bytes).sum::<u64>(), 1 << 20);
    // One byte more is refused, the file that crosses the bound only.
    let f = fixture();
    std::fs::write(f.src.join("a"), vec![b'x'; 1 << 19]).unwrap();
    std::fs::write(f.src.join("b"), vec![b'x'; (1 << 19) + 1]).unwrap();
    let r = run(&f, 1 << 20);
    assert_eq!(r.files.len(), 1);
    assert_eq!(
        reason_of(&r, "b"),
        "output exceeds its limit of 1048576 bytes"
    );
}

#[test]
fn the_list_of_refused_entries_is_bounded_and_counts_the_rest() {
    let f = fixture();
    for i in 0..600 {
        symlink(&f.canary, f.src.join(format!("l{i:03}"))).unwrap();
    }
    let r = run(&f, 1 << 20);
    let max = agentjail_manifest::report::MAX_REJECTED_LISTED;
    assert_eq!(r.rejected.len(), max);
    assert_eq!(r.rejected_dropped, 600 - max as u64);
    assert_eq!(r.rejected[0].path, "l000");
    assert_canary_not_copied(&f);
}

#[test]
fn byte_budget_is_enforced() {
    let f = fixture();
    std::fs::write(f.src.join("a-small"), vec![b'a'; 60]).unwrap();
    std::fs::write(f.src.join("b-big"), vec![b'b'; 200]).unwrap();
    std::fs::write(f.src.join("c-fits"), vec![b'c'; 40]).unwrap();
    std::fs::write(f.src.join("d-over"), vec![b'd'; 1]).unwrap();
    let r = run(&f, 100);
    assert_eq!(
        reason_of(&r, "b-big"),
        "output exceeds its limit of 100 bytes"
    );
    assert_eq!(
        reason_of(&r, "d-over"),
        "output exceeds its limit of 100 bytes"
    );
    let paths: Vec<&str> = r.files.iter().map(|x| x.path.as_str()).collect();
    assert_eq!(paths, ["a-small", "c-fits"]);
    assert!(!f.dest.join("b-big").exists());
    assert!(!f.dest.join("d-over").exists());
    assert_eq!(r.files.iter().map(|x| x.bytes).sum::<u64>(), 100);
}

#[test]
fn entry_count_is_bounded() {
    let f = fixture();
    for i in 0..(MAX_ENTRIES + 50) {
        std::fs::write(f.src.join(format!("f{i:05}")), b"").unwrap();
    }
    let r = run(&f, 1 << 20);
    assert_eq!(r.files.len(), MAX_ENTRIES);
    assert_eq!(r.rejected.len(), 1);
    assert!(r.rejected[0].reason.starts_with("more than 10000 entries"));
}

#[test]
fn deep_nesting_is_bounded() {
    let f = fixture();
    let mut p = f.src.clone();
    for i in 0..30 {
        p.push(format!("d{i}"));
    }
    std::fs::create_dir_all(&p).unwrap();
    std::fs::write(p.join("deep.txt"), b"x").unwrap();
    let mut ok = f.src.clone();
    for i in 0..(MAX_DEPTH - 1) {
        ok.push(format!("d{i}"));
    }
    std::fs::write(ok.join("at-limit.txt"), b"x").unwrap();
    let r = run(&f, 1 << 20);
    let limit_path: Vec<String> = (0..MAX_DEPTH).map(|i| format!("d{i}")).collect();
    assert_eq!(
        reason_of(&r, &limit_path.join("/")),
        "directory nested deeper than 16 levels refused"
    );
    assert_eq!(r.files.len(), 1);
    assert_eq!(r.files[0].path.split('/').count(), MAX_DEPTH);
}

#[test]
fn openat2_flags_refuse_symlinks_even_without_the_pre_check() {
    // The second barrier, used if an entry were swapped for a symlink after fstatat.
    let f = fixture();
    symlink(&f.canary, f.src.join("link")).unwrap();
    std::fs::create_dir(f.src.join("d")).unwrap();
    symlink("/etc", f.src.join("d/etc")).unwrap();
    let dir = open_dir(&f.src).unwrap();
    for (path, flags) in [
        ("link", open_flags()),
        ("d/etc", open_flags() | OFlags::DIRECTORY),
        ("d/etc/passwd", open_flags()),
        ("../canary.txt", open_flags()),
    ] {
        let e = rustix::fs::openat2(&dir, path, flags, Mode::empty(), RESOLVE).unwrap_err();
        assert!(
            matches!(e, Errno::LOOP | Errno::XDEV | Errno::NOTDIR),
            "{path}: {e:?}"
        );
        if e == Errno::LOOP {
            assert_eq!(errno_reason(e, "cannot open"), "symlink refused");
        }
    }
}

#[test]
fn works_from_an_o_path_descriptor() {
    // The engine may hold /output only as an O_PATH (or fsmount) descriptor.
    let f = fixture();
    std::fs::create_dir(f.src.join("d")).unwrap();
    std::fs::write(f.src.join("d/x"), b"x").unwrap();
    let fd = rustix::fs::open(
        &f.src,
        OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC,
        Mode::empty(),
    )
    .unwrap();
    let r = collect(fd.as_fd(), &f.dest, 10).unwrap();
    assert_eq!(r.files.len(), 1);
    assert_eq!(r.files[0].path, "d/x");
}

#[test]
fn staging_must_be_private_and_empty() {
    let f = fixture();
    let fd = open_dir(&f.src).unwrap();
    std::fs::set_permissions(&f.dest, std::fs::Permissions::from_mode(0o755)).unwrap();
    assert!(matches!(
        collect(fd.as_fd(), &f.dest, 10),
        Err(CollectError::StagingNotPrivate { .. })
    ));
    std::fs::set_permissions(&f.dest, std::fs::Permissions::from_mode(0o700)).unwrap();
    std::fs::write(f.dest.join("leftover"), b"").unwrap();
    assert!(matches!(
        collect(fd.as_fd(), &f.dest, 10),
        Err(CollectError::StagingNotPrivate { .. })
    ));
    let file = File::open(&f.canary).unwrap();
    assert!(matches!(
        collect(file.as_fd(), &f.dest, 10),
        Err(CollectError::SourceNotDirectory)
    ));
}
