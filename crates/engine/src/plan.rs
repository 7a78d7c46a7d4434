//! The sandbox's file system and process parameters as data: a list of setup operations built
//! from a validated manifest (in the supervisor, before any namespace exists), interpreted in
//! order by the sandbox's init. Reviewers can read the list on its own (`agentjail run
//! --dry-run` prints it), and it is the only source of the Landlock rules, so the mounts and the
//! Landlock policy cannot disagree.

use std::path::{Path, PathBuf};

use agentjail_manifest::ValidatedManifest;
use serde::{Deserialize, Serialize};

/// uid and gid of the sandbox user inside the sandbox.
pub const SANDBOX_ID: u32 = 65534;
/// The sandbox's host name.
pub const HOSTNAME: &str = "agentjail";
/// Port of the egress gateway's proxy endpoint on the sandbox's loopback (when the manifest
/// has a network allowlist). Fixed, so that the environment can name it before the sandbox
/// exists; the network namespace is the sandbox's own, so nothing else can hold it.
pub const PROXY_PORT: u16 = 3128;
/// Default PATH inside the sandbox.
pub const DEFAULT_PATH: &str = "/usr/local/bin:/usr/bin:/bin";

/// What the payload may do below a path (its Landlock rule).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Access {
    /// Read and execute files, list directories.
    ReadExec,
    /// Read files and list directories.
    Read,
    /// Read and write a device file (and its ioctls).
    Device,
    /// Everything but creating device nodes; `exec` also allows executing files.
    Write { exec: bool },
    /// List the directory itself only.
    ListOnly,
}

/// The sandbox's /proc shows only the processes the caller may ptrace (`hidepid=2`, i.e.
/// "invisible", understood by every kernel since 3.3): the command (uid 65534) sees its own
/// processes but not the init — uid 0 of the user namespace as root, and non-dumpable in
/// either mode — whose command line is the caller's (the init is a clone of the supervisor).
pub const PROC_OPTIONS: &std::ffi::CStr = c"hidepid=2";

/// One setup step, applied below the new root. Paths are absolute sandbox paths.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "snake_case")]
pub enum Op {
    /// Recursive read-only, nosuid, nodev bind of a host path.
    BindRo {
        src: PathBuf,
        dest: String,
        dir: bool,
    },
    /// Bind of a host device node (read-write, nosuid).
    Device { src: PathBuf, dest: String },
    /// A fresh tmpfs.
    Tmpfs {
        dest: String,
        size_bytes: u64,
        inodes: u64,
        mode: u32,
        exec: bool,
    },
    /// A fresh procfs for the sandbox's pid namespace, mounted with [`PROC_OPTIONS`].
    Proc { dest: String },
    /// A symbolic link.
    Symlink { target: String, dest: String },
    /// A small file written into the (later read-only) root.
    File { dest: String, content: String },
    /// A read-only input given by value: written into a tmpfs of its own outside the new root
    /// and bound read-only at `dest` (also below the writable `/work`). Its bytes never reach
    /// the host's disk.
    Inline { dest: String, content: String },
    /// A file input the sandbox user cannot read on the host (root mode): the supervisor
    /// copied its bytes into a sealed memfd sent with the plan ([`crate::copies`]); the init
    /// writes `len` bytes from `offset` of it into a tmpfs of its own, bound read-only at
    /// `dest` like an inline input. The host file is not changed.
    Copy { dest: String, offset: u64, len: u64 },
}

/// Inodes of the `/output` tmpfs: a little more than the collector examines
/// (`agentjail_verify::collect::MAX_ENTRIES`, 10 000), so that its own "more than 10000
/// entries" refusal is what a payload meets, not ENOSPC.
pub const OUTPUT_INODES: u64 = 10_240;

/// Size of the `/output` tmpfs for the manifest's byte bound (`limits.output_mb`).
///
/// The bound is on the files' bytes, and the collector enforces it exactly (it counts the bytes
/// it copies, a sum over every file). tmpfs counts pages instead: a file of 1 byte takes a page,
/// so a tmpfs of exactly the bound would refuse output within it (one file of exactly the bound,
/// or many small files summing to it). The tmpfs gets one page per inode of headroom: every
/// file, directory or symlink wastes less than a page, so files within the bound always fit.
/// The headroom cannot be used to pass more than the bound (the collector refuses it); it is
/// memory charged to the run's memory cgroup like the rest of the tmpfs, and less than `/tmp`
/// or `/work` may hold (each up to the memory limit).
pub fn output_tmpfs_bytes(limits: &agentjail_manifest::Limits) -> u64 {
    let page = rustix::param::page_size() as u64;
    limits
        .output_bytes()
        .saturating_add(OUTPUT_INODES.saturating_mul(page))
}

/// Everything the init needs to build the sandbox and start the command. The supervisor hands
/// it to the init (which exists before the plan does, see `supervisor::Prespawned`) as JSON.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct Plan {
    pub ops: Vec<Op>,
    /// Landlock rules for the payload: (sandbox path, access).
    pub rules: Vec<(String, Access)>,
    pub argv: Vec<String>,
    pub env: Vec<(String, String)>,
    pub cwd: String,
    pub limits: agentjail_manifest::Limits,
    /// The egress gateway's listening port inside the sandbox, when the network is allowed.
    pub proxy_port: Option<u16>,
    /// The workspace restored into and collected from /work ([`crate::workspace`]).
    #[serde(default)]
    pub workspace: Option<crate::workspace::WorkspacePlan>,
}

/// The sandbox's CA bundle when the manifest binds credentials to hosts: the image's bundle
/// plus the run's credential CA.
pub const CA_BUNDLE: &str = "/etc/agentjail/ca-bundle.pem";

/// Where the image's CA bundle is looked for (Debian/Ubuntu/Alpine, Fedora/RHEL, others).
const SYSTEM_CA_BUNDLES: &[&str] = &[
    "/etc/ssl/certs/ca-certificates.crt",
    "/etc/pki/tls/certs/ca-bundle.crt",
    "/etc/ssl/cert.pem",
];

/// Variables that OpenSSL (and Python's ssl), requests, curl, Node, pip and git read for a CA
/// bundle.
const CA_BUNDLE_VARS: &[&str] = &[
    "SSL_CERT_FILE",
    "REQUESTS_CA_BUNDLE",
    "CURL_CA_BUNDLE",
    "NODE_EXTRA_CA_CERTS",
    "PIP_CERT",
    "GIT_SSL_CAINFO",
];

/// Where the sandbox's system directories (and the curated parts of /etc) come from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RootImage {
    /// The host's /usr, /bin, /lib*…, bound read-only (identified, not content-pinned).
    Host,
    /// An image from the content-addressed store, checked against its record before the run.
    Stored { digest: String, rootfs: PathBuf },
}

/// Top-level names of an image that the sandbox provides itself and never takes from it.
const RESERVED: &[&str] = &[
    "etc", "dev", "proc", "sys", "tmp", "work", "output", "input", "run",
];

/// A stored image's top-level directories (bound read-only) and symlinks (recreated), except
/// the ones the sandbox provides itself. Files at the top level are ignored.
pub fn image_system_ops(rootfs: &Path) -> Vec<Op> {
    let mut names: Vec<String> = std::fs::read_dir(rootfs)
        .map(|rd| {
            rd.filter_map(|e| e.ok())
                .filter_map(|e| e.file_name().to_str().map(str::to_owned))
                .collect()
        })
        .unwrap_or_default();
    names.sort();
    let mut ops = Vec::new();
    for name in names {
        if RESERVED.contains(&name.as_str()) {
            continue;
        }
        let p = rootfs.join(&name);
        match std::fs::symlink_metadata(&p) {
            Ok(m) if m.file_type().is_symlink() => {
                if let Ok(t) = std::fs::read_link(&p) {
                    ops.push(Op::Symlink {
                        target: t.to_string_lossy().into_owned(),
                        dest: format!("/{name}"),
                    });
                }
            }
            Ok(m) if m.is_dir() => ops.push(Op::BindRo {
                src: p,
                dest: format!("/{name}"),
                dir: true,
            }),
            _ => {}
        }
    }
    ops
}

/// The host directories that form the default (host) image, with how each is reproduced.
pub fn host_system_ops() -> Vec<Op> {
    let mut ops = Vec::new();
    for dir in [
        "/usr", "/bin", "/sbin", "/lib", "/lib64", "/lib32", "/libx32",
    ] {
        let p = Path::new(dir);
        match std::fs::symlink_metadata(p) {
            Ok(m) if m.file_type().is_symlink() => {
                if let Ok(t) = std::fs::read_link(p) {
                    ops.push(Op::Symlink {
                        target: t.to_string_lossy().into_owned(),
                        dest: dir.to_string(),
                    });
                }
            }
            Ok(m) if m.is_dir() => ops.push(Op::BindRo {
                src: p.to_owned(),
                dest: dir.to_string(),
                dir: true,
            }),
            _ => {}
        }
    }
    ops
}

/// The sandbox's /etc: generated files, plus read-only pieces of the image's /etc (the host's
/// for the host image) that programs need and that hold no secrets. From a stored image,
/// pieces that are symlinks are skipped (a bind source is opened without following links).
fn etc_ops(root: &RootImage) -> Vec<Op> {
    let file = |name: &str, content: String| Op::File {
        dest: format!("/etc/{name}"),
        content,
    };
    let mut ops = vec![
        file(
            "passwd",
            "root:x:0:0:root:/nonexistent:/usr/sbin/nologin\nnobody:x:65534:65534:agentjail sandbox user:/work:/usr/sbin/nologin\n".into(),
        ),
        file("group", "root:x:0:\nnogroup:x:65534:\n".into()),
        file(
            "hosts",
            format!("127.0.0.1\tlocalhost {HOSTNAME}\n::1\tlocalhost ip6-localhost\n"),
        ),
        file("hostname", format!("{HOSTNAME}\n")),
        file(
            "nsswitch.conf",
            "passwd: files\ngroup: files\nshadow: files\nhosts: files dns\nnetworks: files\nprotocols: files\nservices: files\n".into(),
        ),
        file("resolv.conf", String::new()),
    ];
    // Read-only pieces of the host's /etc that programs need and that hold no secrets:
    // the loader cache, the public CA certificates, the alternatives symlinks, and the
    // protocol/service tables.
    for (src, dir) in [
        ("/etc/ld.so.cache", false),
        ("/etc/ssl/certs", true),
        ("/etc/alternatives", true),
        ("/etc/protocols", false),
        ("/etc/services", false),
        ("/etc/mime.types", false),
    ] {
        let p = match root {
            RootImage::Host => Path::new(src).to_owned(),
            RootImage::Stored { rootfs, .. } => rootfs.join(src.trim_start_matches('/')),
        };
        let meta = match root {
            RootImage::Host => std::fs::metadata(&p),
            // No symlink anywhere below the image's root: a symlinked `etc` or `etc/ssl` is
            // skipped here (the bind would refuse it and fail every run).
            RootImage::Stored { rootfs, .. } => lstat_no_symlinks(rootfs, src),
        };
        let ok = match meta {
            Ok(m) => m.is_dir() == dir && (dir || m.is_file()),
            Err(_) => false,
        };
        if ok {
            ops.push(Op::BindRo {
                src: p,
                dest: src.to_string(),
                dir,
            });
        }
    }
    ops
}

fn dev_ops() -> Vec<Op> {
    let mut ops = vec![Op::Tmpfs {
        dest: "/dev".into(),
        size_bytes: 64 * 1024,
        inodes: 64,
        mode: 0o755,
        exec: false,
    }];
    for d in ["null", "zero", "full", "random", "urandom", "tty"] {
        ops.push(Op::Device {
            src: PathBuf::from(format!("/dev/{d}")),
            dest: format!("/dev/{d}"),
        });
    }
    for (t, l) in [
        ("/proc/self/fd", "/dev/fd"),
        ("/proc/self/fd/0", "/dev/stdin"),
        ("/proc/self/fd/1", "/dev/stdout"),
        ("/proc/self/fd/2", "/dev/stderr"),
    ] {
        ops.push(Op::Symlink {
            target: t.into(),
            dest: l.into(),
        });
    }
    ops
}

/// The ops every plan on `root` starts with, whatever the manifest: the system directories,
/// the curated /etc, /dev and /proc; and how many of them are the system directories.
fn base_ops(root: &RootImage) -> (Vec<Op>, usize) {
    let mut ops = match root {
        RootImage::Host => host_system_ops(),
        RootImage::Stored { rootfs, .. } => image_system_ops(rootfs),
    };
    let system = ops.len();
    ops.extend(etc_ops(root));
    ops.extend(dev_ops());
    ops.push(Op::Proc {
        dest: "/proc".into(),
    });
    (ops, system)
}

/// The ops every plan on the host image starts with (see [`Plan::for_root`]). The sandbox's
/// init applies them while the supervisor is still parsing and checking the request, then
/// the rest of the plan once it arrives; a plan that does not start with them (a stored
/// image, or a host that changed in between) is built from scratch instead.
pub fn host_prefix() -> Vec<Op> {
    base_ops(&RootImage::Host).0
}

impl Plan {
    /// Builds the plan for a validated manifest on the host image.
    pub fn new(vm: &ValidatedManifest) -> Plan {
        Plan::for_root(vm, &RootImage::Host)
    }

    /// Builds the plan for a validated manifest on the given root image. Only the system
    /// directories and the curated /etc pieces depend on the image; /dev, /proc, the tmpfs
    /// mounts and the inputs are the same ops on every image.
    pub fn for_root(vm: &ValidatedManifest, root: &RootImage) -> Plan {
        let m = &vm.manifest;
        let limits = m.limits;
        let (mut ops, system) = base_ops(root);
        let mut rules: Vec<(String, Access)> = vec![("/".into(), Access::ListOnly)];
        for op in &ops[..system] {
            if let Op::BindRo { dest, .. } = op {
                rules.push((dest.clone(), Access::ReadExec));
            }
        }
        rules.push(("/etc".into(), Access::Read));
        for d in ["null", "zero", "full", "random", "urandom", "tty"] {
            rules.push((format!("/dev/{d}"), Access::Device));
        }
        rules.push(("/proc".into(), Access::Read));
        // Scratch space is memory-backed and charged to the run's memory cgroup, so its size
        // is bounded by the memory limit as well as by these sizes.
        let scratch = limits.memory_bytes();
        for dest in ["/tmp", "/work"] {
            ops.push(Op::Tmpfs {
                dest: dest.into(),
                size_bytes: scratch,
                inodes: 65_536,
                mode: 0o700,
                exec: true,
            });
            rules.push((dest.into(), Access::Write { exec: true }));
        }
        ops.push(Op::Tmpfs {
            dest: "/output".into(),
            size_bytes: output_tmpfs_bytes(&limits),
            inodes: OUTPUT_INODES,
            mode: 0o700,
            exec: false,
        });
        rules.push(("/output".into(), Access::Write { exec: false }));
        for input in &vm.inputs {
            ops.push(Op::BindRo {
                src: input.host_path.clone(),
                dest: input.mount.clone(),
                dir: input.is_dir,
            });
            rules.push((input.mount.clone(), Access::ReadExec));
        }
        for input in &vm.inline {
            ops.push(Op::Inline {
                dest: input.mount.clone(),
                content: input.content.clone(),
            });
            rules.push((input.mount.clone(), Access::ReadExec));
        }
        let mut env: Vec<(String, String)> = vec![
            ("PATH".into(), DEFAULT_PATH.into()),
            ("HOME".into(), "/work".into()),
            ("LANG".into(), "C.UTF-8".into()),
            ("TMPDIR".into(), "/tmp".into()),
        ];
        let proxy_port = match m.network {
            agentjail_manifest::Network::Deny => None,
            agentjail_manifest::Network::Allow(_) => Some(PROXY_PORT),
        };
        if let Some(port) = proxy_port {
            // Both spellings: curl reads only the lowercase http_proxy, others the uppercase.
            let url = format!("http://127.0.0.1:{port}");
            for k in [
                "HTTP_PROXY",
                "HTTPS_PROXY",
                "ALL_PROXY",
                "http_proxy",
                "https_proxy",
                "all_proxy",
            ] {
                env.push((k.into(), url.clone()));
            }
            env.push(("NO_PROXY".into(), String::new()));
            env.push(("no_proxy".into(), String::new()));
        }
        for (k, v) in &m.env {
            env.retain(|(ek, _)| ek != k);
            env.push((k.clone(), v.clone()));
        }
        Plan {
            ops,
            rules,
            argv: m.command.clone(),
            env,
            cwd: "/work".into(),
            limits,
            proxy_port,
            workspace: crate::workspace::WorkspacePlan::of(vm),
        }
    }

    /// Makes the sandbox trust the run's credential CA (`ca_pem`, a certificate only): writes
    /// [`CA_BUNDLE`] (the image's CA bundle plus that certificate) and points the usual
    /// variables at it, unless the manifest's `env` sets them.
    pub fn add_ca_bundle(&mut self, root: &RootImage, ca_pem: &str) {
        let system = SYSTEM_CA_BUNDLES
            .iter()
            .find_map(|p| {
                let path = match root {
                    RootImage::Host => Path::new(p).to_owned(),
                    RootImage::Stored { rootfs, .. } => rootfs.join(p.trim_start_matches('/')),
                };
                std::fs::read_to_string(path).ok()
            })
            .unwrap_or_default();
        let mut content = system;
        if !content.is_empty() && !content.ends_with('\n') {
            content.push('\n');
        }
        content.push_str("# agentjail: this run's credential CA (docs/network.md)\n");
        content.push_str(ca_pem);
        self.ops.push(Op::File {
            dest: CA_BUNDLE.into(),
            content,
        });
        for k in CA_BUNDLE_VARS {
            if !self.env.iter().any(|(ek, _)| ek == k) {
                self.env.push(((*k).into(), CA_BUNDLE.into()));
            }
        }
    }

    /// The host image's parts (system directories and curated /etc), for its identity.
    pub fn image_description() -> Vec<String> {
        host_prefix()
            .iter()
            .filter_map(|op| match op {
                Op::BindRo { src, dest, .. } => Some(format!("{}={dest}", src.display())),
                Op::Symlink { target, dest } => Some(format!("{dest}->{target}")),
                _ => None,
            })
            .collect()
    }
}

/// `lstat` of `rel` below `root`, refusing (as NotFound) when any component of `rel` before the
/// last is not a real directory (a symlink included).
fn lstat_no_symlinks(root: &Path, rel: &str) -> std::io::Result<std::fs::Metadata> {
    let mut p = root.to_path_buf();
    let parts: Vec<&str> = rel.split('/').filter(|c| !c.is_empty()).collect();
    for (i, c) in parts.iter().enumerate() {
        p.push(c);
        let m = std::fs::symlink_metadata(&p)?;
        if i + 1 == parts.len() {
            return Ok(m);
        }
        if !m.file_type().is_dir() {
            return Err(std::io::ErrorKind::NotFound.into());
        }
    }
    Err(std::io::ErrorKind::NotFound.into())
}

#[cfg(test)]
mod tests {
    use super::*;
    use agentjail_manifest::{Manifest, SourcePolicy};

    /// `true` as a validated manifest, sources relative to `dir`.
    fn validated_true(dir: &Path) -> ValidatedManifest {
        Manifest::for_command(vec!["true".into()])
            .validate(
                &SourcePolicy {
                    base_dir: dir.into(),
                    roots: None,
                },
                jiff::Timestamp::now(),
            )
            .unwrap()
    }

    #[test]
    fn plan_has_no_host_etc_wholesale_and_no_secrets() {
        let d = tempfile::tempdir().unwrap();
        let vm = validated_true(d.path());
        let p = Plan::new(&vm);
        for op in &p.ops {
            if let Op::BindRo { src, .. } = op {
                let s = src.to_string_lossy();
                assert!(s != "/etc" && !s.starts_with("/etc/ssl/private"), "{s}");
                assert!(
                    !s.starts_with("/home") && !s.starts_with("/root") && !s.starts_with("/var")
                );
                assert!(!s.starts_with("/sys") && !s.starts_with("/proc"));
            }
        }
        // Every mount point the payload may write to is a tmpfs.
        for (path, acc) in &p.rules {
            if let Access::Write { .. } = acc {
                assert!(
                    p.ops
                        .iter()
                        .any(|o| matches!(o, Op::Tmpfs { dest, .. } if dest == path))
                );
            }
        }
        assert!(p.env.iter().any(|(k, v)| k == "HOME" && v == "/work"));
    }

    #[test]
    fn the_credential_ca_joins_the_image_bundle_and_the_manifest_env_wins() {
        let d = tempfile::tempdir().unwrap();
        let mut m = Manifest::for_command(vec!["true".into()]);
        m.env
            .insert("NODE_EXTRA_CA_CERTS".into(), "/input/mine.pem".into());
        let vm = m
            .validate(
                &SourcePolicy {
                    base_dir: d.path().into(),
                    roots: None,
                },
                jiff::Timestamp::now(),
            )
            .unwrap();
        let mut p = Plan::new(&vm);
        let ca = "-----BEGIN CERTIFICATE-----\nRUNCA\n-----END CERTIFICATE-----\n";
        p.add_ca_bundle(&RootImage::Host, ca);
        let content = p
            .ops
            .iter()
            .find_map(|o| match o {
                Op::File { dest, content } if dest == CA_BUNDLE => Some(content.clone()),
                _ => None,
            })
            .unwrap();
        assert!(content.ends_with(ca), "the run's CA is in the bundle");
        if let Ok(system) = std::fs::read_to_string(SYSTEM_CA_BUNDLES[0]) {
            assert!(content.starts_with(&system), "the image's bundle is kept");
        }
        assert!(!content.contains("PRIVATE KEY"));
        let env = |k: &str| {
            p.env
                .iter()
                .filter(|(ek, _)| ek == k)
                .map(|(_, v)| v.clone())
                .collect::<Vec<_>>()
        };
        assert_eq!(env("SSL_CERT_FILE"), vec![CA_BUNDLE.to_string()]);
        assert_eq!(env("REQUESTS_CA_BUNDLE"), vec![CA_BUNDLE.to_string()]);
        assert_eq!(
            env("NODE_EXTRA_CA_CERTS"),
            vec!["/input/mine.pem".to_string()]
        );
    }

    #[test]
    fn host_plans_start_with_the_host_prefix_and_image_plans_do_not() {
        let d = tempfile::tempdir().unwrap();
        let vm = validated_true(d.path());
        let prefix = host_prefix();
        assert!(prefix.iter().any(|o| matches!(o, Op::Proc { .. })));
        let host = Plan::new(&vm);
        assert!(host.ops.starts_with(&prefix));
        // What follows the prefix depends on the manifest: the tmpfs mounts, then inputs.
        assert!(matches!(&host.ops[prefix.len()], Op::Tmpfs { dest, .. } if dest == "/tmp"));
        let rootfs = d.path().join("rootfs");
        std::fs::create_dir_all(rootfs.join("usr")).unwrap();
        let image = Plan::for_root(
            &vm,
            &RootImage::Stored {
                digest: "sha256:00".into(),
                rootfs,
            },
        );
        assert!(!image.ops.starts_with(&prefix));
    }
}
