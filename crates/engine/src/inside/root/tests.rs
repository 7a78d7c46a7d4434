//! The unit tests of [`super`] (building the sandbox's root): the calls each op of a plan
//! makes, recorded by the [`Recorder`] double.

use super::*;
use crate::plan::Plan;
use crate::root_sys::Recorder;
use crate::step::{SetupError, StepResult};
use agentjail_manifest::{Manifest, SourcePolicy};

fn bind(src: &str, dest: &str, dir: bool) -> Op {
    Op::BindRo {
        src: src.into(),
        dest: dest.into(),
        dir,
    }
}

/// Applies `ops`; a failure as the `(step, error)` pair the init sends.
fn run(rec: &mut Recorder, ops: &[Op]) -> StepResult<()> {
    let mut made = Made::default();
    ops.iter()
        .try_for_each(|op| apply(rec, op, &mut made))
        .map_err(SetupError::from)
}

const RO: u64 = libc::MOUNT_ATTR_RDONLY | libc::MOUNT_ATTR_NOSUID | libc::MOUNT_ATTR_NODEV;

#[test]
fn a_bind_opens_without_symlinks_then_mounts_then_makes_read_only() {
    let mut rec = Recorder::default();
    rec.dirs.insert("/oldroot/usr".into());
    run(&mut rec, &[bind("/usr", "/usr", true)]).unwrap();
    assert_eq!(
        rec.calls,
        [
            "open_source /oldroot/usr".to_string(),
            "fstat /oldroot/usr".into(),
            "mkdir_all /newroot/usr".into(),
            "bind fd:/oldroot/usr /newroot/usr recursive=true".into(),
            format!("set_attrs /newroot/usr {RO:#x}"),
        ]
    );
}

#[test]
fn a_file_bind_gets_a_mount_file_and_parents_are_made_once() {
    let mut rec = Recorder::default();
    run(
        &mut rec,
        &[
            bind("/etc/hosts", "/etc/hosts", false),
            Op::File {
                dest: "/etc/passwd".into(),
                content: "x".into(),
            },
        ],
    )
    .unwrap();
    let mkdirs: Vec<_> = rec
        .calls
        .iter()
        .filter(|c| c.starts_with("mkdir"))
        .collect();
    assert_eq!(mkdirs, ["mkdir_all /newroot/etc"]);
    assert!(
        rec.calls
            .contains(&"create_mount_file /newroot/etc/hosts".into())
    );
    assert_eq!(
        rec.calls.last().unwrap(),
        "write_file /newroot/etc/passwd 1"
    );
}

/// An inline input: its own tmpfs in the staging root (outside /newroot), sized for the
/// content, the file written there, then bound read-only at its mount; each input gets its
/// own tmpfs.
#[test]
fn an_inline_input_is_staged_in_its_own_tmpfs_and_bound_read_only() {
    let mut rec = Recorder::default();
    let inline = |dest: &str, content: &str| Op::Inline {
        dest: dest.into(),
        content: content.into(),
    };
    run(
        &mut rec,
        &[
            inline("/input/code.py", "print(1)"),
            inline("/work/conf", &"x".repeat(5000)),
        ],
    )
    .unwrap();
    let page = rustix::param::page_size();
    let flags = (MountFlags::NOSUID | MountFlags::NODEV).bits();
    assert_eq!(
        rec.calls,
        [
            "mkdir /inline0".to_string(),
            format!(
                "mount agentjail /inline0 tmpfs {flags:#x} size={},nr_inodes=2,mode=0755",
                2 * page
            ),
            "write_file /inline0/content 8".into(),
            "mkdir_all /newroot/input".into(),
            "create_mount_file /newroot/input/code.py".into(),
            "bind /inline0/content /newroot/input/code.py recursive=false".into(),
            format!("set_attrs /newroot/input/code.py {RO:#x}"),
            "mkdir /inline1".into(),
            format!(
                "mount agentjail /inline1 tmpfs {flags:#x} size={},nr_inodes=2,mode=0755",
                5000usize.div_ceil(page) * page + page
            ),
            "write_file /inline1/content 5000".into(),
            "mkdir_all /newroot/work".into(),
            "create_mount_file /newroot/work/conf".into(),
            "bind /inline1/content /newroot/work/conf recursive=false".into(),
            format!("set_attrs /newroot/work/conf {RO:#x}"),
        ]
    );
}

#[test]
fn a_source_that_is_no_longer_a_directory_is_not_bound() {
    let mut rec = Recorder::default();
    let e = run(&mut rec, &[bind("/data", "/input/data", true)])
        .unwrap_err()
        .into_pair();
    assert_eq!(
        e,
        (
            "open /data".into(),
            "openat2(O_PATH, RESOLVE_NO_SYMLINKS): is no longer a directory".into()
        )
    );
    assert!(
        !rec.calls.iter().any(|c| c.starts_with("bind")),
        "{:?}",
        rec.calls
    );
}

#[test]
fn a_failed_call_ends_the_plan_naming_its_step_and_the_errno() {
    let mut rec = Recorder {
        fail_on: Some("bind".into()),
        ..Recorder::default()
    };
    let ops = [
        bind("/etc/hosts", "/etc/hosts", false),
        Op::Proc {
            dest: "/proc".into(),
        },
    ];
    let (step, error) = run(&mut rec, &ops).unwrap_err().into_pair();
    assert_eq!(step, "bind /etc/hosts -> /etc/hosts");
    assert!(error.starts_with("mount(MS_BIND|MS_REC): "), "{error}");
    assert!(error.contains("os error 1"), "{error}");
    assert!(
        rec.calls.last().unwrap().starts_with("bind"),
        "{:?}",
        rec.calls
    );
    // Read-only failure: named as such.
    let mut rec = Recorder {
        fail_on: Some("set_attrs".into()),
        ..Recorder::default()
    };
    let (step, _) = run(&mut rec, &ops).unwrap_err().into_pair();
    assert_eq!(step, "make /etc/hosts read-only");
}

#[test]
fn the_whole_host_plan_mounts_only_below_the_new_root_and_binds_read_only() {
    let d = tempfile::tempdir().unwrap();
    let vm = Manifest::for_command(vec!["true".into()])
        .validate(
            &SourcePolicy {
                base_dir: d.path().into(),
                roots: None,
            },
            jiff::Timestamp::now(),
        )
        .unwrap();
    let plan = Plan::new(&vm);
    let mut rec = Recorder::default();
    for op in &plan.ops {
        if let Op::BindRo { src, dir: true, .. } = op {
            rec.dirs.insert(format!("/oldroot{}", src.display()));
        }
    }
    finish_root(&mut rec, &plan.ops, &mut Made::default()).unwrap();
    let calls = &rec.calls;
    for (i, c) in calls.iter().enumerate() {
        let w: Vec<&str> = c.split(' ').collect();
        match w[0] {
            "bind" => {
                assert!(w[2].starts_with("/newroot/"), "{c}");
                if w[3] == "recursive=true" {
                    assert_eq!(calls[i + 1], format!("set_attrs {} {RO:#x}", w[2]));
                }
            }
            "mount" => assert!(w[2].starts_with("/newroot/"), "{c}"),
            "open_source" => assert!(w[1].starts_with("/oldroot/"), "{c}"),
            _ => {}
        }
    }
    let n = calls.len();
    assert_eq!(
        calls[n - 5..],
        [
            format!(
                "remount /newroot {:#x}",
                (MountFlags::BIND | MountFlags::RDONLY | MountFlags::NOSUID | MountFlags::NODEV)
                    .bits()
            ),
            "chdir /newroot".into(),
            "pivot_root . .".into(),
            "unmount_detach .".into(),
            "chdir /".into(),
        ]
    );
}
