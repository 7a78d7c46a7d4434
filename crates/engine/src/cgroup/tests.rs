//! The unit tests of [`super`] (cgroup limits and accounting): errors, file names, parsing.

use super::*;

#[test]
fn a_refused_cgroup_creation_names_the_step_the_path_and_the_error() {
    let t = tempfile::tempdir().unwrap();
    let parent = t.path().join("missing");
    let e = Cgroup::create_v2(&parent, "agentjail-test-0", 1 << 20, 8, None).unwrap_err();
    assert!(matches!(e, CgroupError::Mkdir { .. }), "{e:?}");
    assert_eq!(
        e.to_string(),
        format!(
            "mkdir {}/agentjail-test-0: No such file or directory (os error 2)",
            parent.display()
        )
    );
    // Refused for want of delegation: the fix is named; the reasons of v2 and v1 are
    // joined under one `cgroup:` as before.
    let e = CgroupError::Unusable(vec![
        CgroupError::Mkdir {
            path: "/sys/fs/cgroup/user.slice/agentjail-1-0".into(),
            source: io::Error::from_raw_os_error(libc::EACCES),
            hint: " (delegate it)",
        },
        CgroupError::NoV1,
    ]);
    assert_eq!(
        e.to_string(),
        "cgroup: mkdir /sys/fs/cgroup/user.slice/agentjail-1-0: Permission denied (os error 13) (delegate it); no cgroup v1 memory and pids hierarchies"
    );
}

#[test]
fn a_refused_cgroup_limit_names_the_file_and_the_value() {
    let t = tempfile::tempdir().unwrap();
    let f = t.path().join("no-such-dir/memory.max");
    let e = write(&f, "1048576").unwrap_err();
    assert_eq!(
        e.to_string(),
        format!(
            "write {} = 1048576: No such file or directory (os error 2)",
            f.display()
        )
    );
}

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
    let m = parse_mountinfo_line("30 1 0:26 / /sys/fs/cgroup rw - cgroup2 cgroup2 rw,nsdelegate")
        .unwrap();
    assert_eq!(m.fstype, "cgroup2");
    assert_eq!(unescape("a\\040b"), "a b");
}

/// A fake cgroup2 tree: each entry is (dir, controllers, subtree_control, procs).
fn tree(entries: &[(&str, &str, &str, &str)]) -> tempfile::TempDir {
    let d = tempfile::tempdir().unwrap();
    for (dir, ctl, sub, procs) in entries {
        let p = d.path().join(dir);
        fs::create_dir_all(&p).unwrap();
        fs::write(p.join("cgroup.controllers"), ctl).unwrap();
        fs::write(p.join("cgroup.subtree_control"), sub).unwrap();
        fs::write(p.join("cgroup.procs"), procs).unwrap();
    }
    d
}

#[test]
fn v2_base_for_each_placement() {
    let all = "cpu memory pids";
    // The root cgroup of a systemd host: its own cgroup passes the controllers down.
    let t = tree(&[("", all, all, "1\n")]);
    assert_eq!(find_v2_base(t.path(), t.path()).unwrap(), t.path());
    // A login session's scope, holding another process (pid 1 here, not ours): the
    // nearest ancestor that passes memory and pids down, never the scope itself.
    let t = tree(&[
        ("", all, all, ""),
        ("user.slice", all, all, ""),
        ("user.slice/user-0.slice", all, "memory pids", ""),
        (
            "user.slice/user-0.slice/session-1.scope",
            "memory pids",
            "",
            "1\n",
        ),
    ]);
    let own = t.path().join("user.slice/user-0.slice/session-1.scope");
    assert_eq!(
        find_v2_base(t.path(), &own).unwrap(),
        t.path().join("user.slice/user-0.slice")
    );
    assert_eq!(
        fs::read_to_string(own.join("cgroup.subtree_control")).unwrap(),
        "",
        "no controller enabled in a cgroup that is not ours"
    );
    // A leaf made by a claim (ours, or a parent's): its parent.
    let t = tree(&[
        ("", all, all, ""),
        ("run-u1.scope", all, "memory pids", ""),
        (
            "run-u1.scope/agentjail-supervisor-77",
            "memory pids",
            "",
            "77\n",
        ),
    ]);
    let own = t.path().join("run-u1.scope/agentjail-supervisor-77");
    assert_eq!(
        find_v2_base(t.path(), &own).unwrap(),
        t.path().join("run-u1.scope")
    );
    // Nothing passes the controllers down (a fresh boot without systemd, in the root
    // cgroup): refused with the fix, and the root left alone.
    let t = tree(&[("", all, "", "1\n")]);
    let e = find_v2_base(t.path(), t.path()).unwrap_err().to_string();
    assert!(e.contains("+memory +pids"), "{e}");
    assert_eq!(
        fs::read_to_string(t.path().join("cgroup.subtree_control")).unwrap(),
        ""
    );
    // No memory controller in v2 at all (bound to v1 hierarchies).
    let t = tree(&[("", "cpu", "", "")]);
    assert!(find_v2_base(t.path(), t.path()).is_err());
}

#[test]
fn ppid_of_a_child() {
    let c = std::process::Command::new("sleep")
        .arg("5")
        .spawn()
        .unwrap();
    assert_eq!(ppid(c.id()), Some(std::process::id()));
    let mut c = c;
    c.kill().unwrap();
    c.wait().unwrap();
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
