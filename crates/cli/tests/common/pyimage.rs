//! A small root file system assembled offline from the host's python3: the interpreter, the
//! shared libraries `ldd` lists, the stdlib modules a given script loads, and dash as
//! `/bin/sh`; packed as a one-layer OCI layout for `agentjail image import`. Used by the image
//! tests (crates/cli/tests/image.rs, image_tasks.rs).

use std::path::{Path, PathBuf};
use std::process::Command;

pub const PY: &str = "/usr/bin/python3";

/// Copies a host file to the same absolute path below `root`, resolving symlinks in the
/// file's own name into a copy.
pub fn copy_in(root: &Path, host: &Path) {
    let dest = root.join(host.strip_prefix("/").unwrap());
    if dest.exists() {
        return;
    }
    std::fs::create_dir_all(dest.parent().unwrap()).unwrap();
    let real = std::fs::canonicalize(host).unwrap();
    std::fs::copy(&real, &dest).unwrap();
}

fn ldd(bin: &Path) -> Vec<PathBuf> {
    let o = Command::new("ldd").arg(bin).output().unwrap();
    String::from_utf8_lossy(&o.stdout)
        .lines()
        .filter_map(|l| {
            l.split_whitespace()
                .find(|w| w.starts_with('/'))
                .map(PathBuf::from)
        })
        .collect()
}

/// Builds `DIR/rootfs` (DIR emptied first): python3, the libraries it links, every module file
/// that `script` (run by the host's python3) has loaded when it ends, and `/bin/sh`.
/// Returns the rootfs.
pub fn python_rootfs(d: &Path, script: &str) -> PathBuf {
    let _ = std::fs::remove_dir_all(d);
    std::fs::create_dir_all(d).unwrap();
    let root = d.join("rootfs");
    std::fs::create_dir_all(&root).unwrap();
    let script = format!(
        "{script}\nimport sys\nfor m in list(sys.modules.values()):\n    f = getattr(m, '__file__', None)\n    if f: print(f)\n"
    );
    let o = Command::new(PY).args(["-c", &script]).output().unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let mut files: Vec<PathBuf> = vec![PathBuf::from(PY)];
    for l in String::from_utf8_lossy(&o.stdout).lines() {
        let p = PathBuf::from(l);
        if p.is_absolute() && p.exists() {
            files.push(p);
        }
    }
    let mut bins = vec![PathBuf::from(PY)];
    if let Ok(sh) = std::fs::canonicalize("/bin/sh") {
        bins.push(sh);
    }
    for f in files
        .iter()
        .filter(|f| f.extension().map(|e| e == "so").unwrap_or(false))
    {
        bins.push(f.clone());
    }
    for b in &bins {
        copy_in(&root, b);
        for lib in ldd(b) {
            copy_in(&root, &lib);
        }
    }
    for f in &files {
        copy_in(&root, f);
    }
    // python3 is a symlink on the host; the copy is the real binary under the same name.
    if let Ok(sh) = std::fs::canonicalize("/bin/sh") {
        let dest = root.join("bin");
        std::fs::create_dir_all(&dest).unwrap();
        std::fs::copy(sh, dest.join("sh")).unwrap();
    }
    root
}

/// Packs `rootfs` as a one-layer OCI layout in `dir`; returns the image digest.
pub fn oci_layout(rootfs: &Path, dir: &Path) -> String {
    let layer = agentjail_image::layout::tar_dir(rootfs).unwrap();
    let gz = agentjail_image::layout::gzip(&layer).unwrap();
    agentjail_image::layout::write_oci_layout(dir, &[gz]).unwrap()
}
