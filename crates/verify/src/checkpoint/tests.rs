//! A tree with files, folders and an exec bit makes the same archive twice; the archive
//! extracts into an empty folder as the same tree (collected again: the same digest); hostile
//! archives are refused by `check`.

use super::*;
use std::os::fd::AsFd;
use std::os::unix::fs::PermissionsExt;

fn tree(root: &std::path::Path) {
    std::fs::create_dir_all(root.join("sub/deep")).unwrap();
    std::fs::create_dir(root.join("empty")).unwrap();
    std::fs::write(root.join("a.txt"), b"alpha").unwrap();
    std::fs::write(root.join("sub/deep/b.txt"), b"beta").unwrap();
    std::fs::write(root.join("run.sh"), b"#!/bin/sh\n").unwrap();
    std::fs::set_permissions(root.join("run.sh"), std::fs::Permissions::from_mode(0o700)).unwrap();
}

fn ck(dir: &std::path::Path) -> Checkpoint {
    let fd = crate::collect::open_dir(dir).unwrap();
    build(fd.as_fd(), 1 << 20, 100).unwrap()
}

#[test]
fn equal_trees_equal_archives_and_a_round_trip() {
    let (a, b, c) = (
        tempfile::tempdir().unwrap(),
        tempfile::tempdir().unwrap(),
        tempfile::tempdir().unwrap(),
    );
    tree(a.path());
    std::thread::sleep(std::time::Duration::from_millis(20));
    tree(b.path());
    let (ca, cb) = (ck(a.path()), ck(b.path()));
    assert!(ca.report.sha256.is_some());
    assert_eq!(ca.archive, cb.archive);
    assert_eq!(ca.report.files, 3);
    assert_eq!(ca.report.bytes, 19);
    let archive = ca.archive.unwrap();
    let fd = crate::collect::open_dir(c.path()).unwrap();
    extract(&archive, fd.as_fd(), 1 << 20, 100).unwrap();
    assert_eq!(
        std::fs::read(c.path().join("sub/deep/b.txt")).unwrap(),
        b"beta"
    );
    let m = std::fs::metadata(c.path().join("run.sh")).unwrap();
    assert_eq!(m.permissions().mode() & 0o777, 0o755);
    assert_eq!(ck(c.path()).report.sha256, ca.report.sha256);
}

#[test]
fn bounds_refuse_the_whole_checkpoint() {
    let a = tempfile::tempdir().unwrap();
    tree(a.path());
    let fd = crate::collect::open_dir(a.path()).unwrap();
    let small = build(fd.as_fd(), 6, 100).unwrap();
    assert!(small.archive.is_none() && small.report.sha256.is_none());
    assert!(
        small
            .report
            .rejected
            .iter()
            .any(|r| r.reason.contains("limit"))
    );
    let few = build(fd.as_fd(), 1 << 20, 3).unwrap();
    assert!(few.archive.is_none());
    assert!(
        few.report
            .rejected
            .iter()
            .any(|r| r.reason.contains("more than 3"))
    );
}

/// A one-entry archive with a raw header: `name`, type flag, content.
fn raw(name: &[u8], kind: u8, data: &[u8]) -> Vec<u8> {
    let mut h = tar::Header::new_ustar();
    h.as_old_mut().name[..name.len()].copy_from_slice(name);
    h.set_mode(0o644);
    h.set_size(data.len() as u64);
    h.set_entry_type(tar::EntryType::new(kind));
    h.set_cksum();
    let mut v = h.as_bytes().to_vec();
    v.extend_from_slice(data);
    v.resize(v.len().div_ceil(512) * 512 + 1024, 0);
    v
}

#[test]
fn hostile_archives_are_refused() {
    for (name, kind, data, why) in [
        (&b"../x"[..], b'0', &b"x"[..], ".."),
        (b"/etc/x", b'0', b"x", "absolute"),
        (b"l", b'2', b"", "symlink"),
        (b"h", b'1', b"", "hard link"),
        (b"p", b'6', b"", "FIFO"),
        (b"d", b'3', b"", "device"),
        (b"a\x1bb", b'0', b"x", "unsafe"),
        (b"nodir/x", b'0', b"x", "folder"),
        (b"big", b'0', &[0u8; 100][..], "limit"),
    ] {
        let err = check(&raw(name, kind, data), 10, 10).unwrap_err();
        assert!(err.contains(why), "{err}");
    }
    let mut dup = raw(b"f", b'0', b"x");
    dup.truncate(1024);
    dup.extend(raw(b"f", b'0', b"y"));
    assert!(check(&dup, 10, 10).unwrap_err().contains("duplicate"));
}
