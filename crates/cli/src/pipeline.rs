//! One run end to end: image check, engine, collection, verification, delivery, receipt and
//! report. `agentjail run` calls it (the orchestrator too, through a child `agentjail run
//! --lifeline`).
//!
//! Nothing is half-written: output is collected into a private staging folder next to the
//! destination, verified there, and moved into the destination only when the run passed; the
//! report and receipt are written to a temporary file and renamed. Collecting and verifying
//! `/output` is in `pipeline/output.rs`.

use std::path::{Path, PathBuf};

use agentjail_engine::{Outcome, RunOptions, timing};
use agentjail_manifest::ValidatedManifest;
use agentjail_manifest::report::{OutputFile, RunReport, Status};
use agentjail_verify::receipt::{self, ReceiptKey};

mod output;
mod workspace;
use output::{Dest, verify_output};

/// Where the results of a run go on the host.
#[derive(Debug, Clone, Default)]
pub struct Delivery {
    /// Folder that receives verified output (created if absent; must be empty).
    pub output_dir: Option<PathBuf>,
    /// Where to write the run report.
    pub report: Option<PathBuf>,
    /// Where to write the signed receipt.
    pub receipt: Option<PathBuf>,
    /// Signing key (default: the user's data directory).
    pub key: Option<PathBuf>,
    /// The files go to a service's job folder (`run --job-dir`): delivered output is private
    /// (folders 0700, files 0600, as the service keeps them) instead of 0644, and the report
    /// and receipt are not fsync'd: the service reads them once the runner exited and records
    /// them in its own store, durably, before it answers; after a crash before that, the run
    /// is `unknown` whatever the folder holds.
    pub for_service: bool,
    /// `run --results-on-lifeline` (for `agentjail serve`): the verified artifact, the receipt
    /// and the report go back to the service over the lifeline (a socket), in
    /// [`agentjail_manifest::results`] frames, and nothing is written to any file: the output
    /// is collected into memory ([`agentjail_verify::collect::collect_to_memory`]) and
    /// verified there. `output_dir`, `report` and `receipt` are then `None`.
    pub results: Option<std::sync::Arc<std::os::fd::OwnedFd>>,
    /// Where to write the workspace checkpoint (manifest `workspace.collect`), atomically.
    pub workspace_out: Option<PathBuf>,
}

/// What a finished run produced.
#[derive(Debug)]
pub struct Finished {
    pub report: RunReport,
    /// The named output's verified content, when the manifest names one and it passed.
    pub artifact: Option<Vec<u8>>,
    pub exit_code: i32,
}

/// A failure that prevents the run from starting (exit 125) with its one-line message.
#[derive(Debug)]
pub struct SetupFailure(pub String);

/// Checks the output folder before anything runs.
pub fn check_output_dir(dir: &Path) -> Result<(), SetupFailure> {
    match std::fs::symlink_metadata(dir) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(SetupFailure(format!("--output-dir {}: {e}", dir.display()))),
        Ok(m) if !m.is_dir() => Err(SetupFailure(format!(
            "--output-dir {} exists and is not a directory",
            dir.display()
        ))),
        Ok(_) => {
            let mut it = std::fs::read_dir(dir)
                .map_err(|e| SetupFailure(format!("--output-dir {}: {e}", dir.display())))?;
            if it.next().is_some() {
                Err(SetupFailure(format!(
                    "--output-dir {} is not empty; refusing to mix a run's output with other files",
                    dir.display()
                )))
            } else {
                Ok(())
            }
        }
    }
}

/// Note for reports of runs on the host image.
pub const HOST_IMAGE_NOTE: &str = "root is the unpinned host image: the host's /usr, /bin and /lib* bound read-only; its digest identifies this machine's state, its content is not pinned or verified (pin an image with `image: sha256:…`, docs/images.md)";

/// Decides the run's root image: the host image when the manifest pins none or pins the host
/// image's identity; otherwise a stored image, which must be in `store` (default store when
/// `None`) and pass the per-run check. Never falls back to the host. `Err` is the refusal.
pub fn select_root(
    vm: &ValidatedManifest,
    store: Option<&Path>,
) -> Result<(String, agentjail_engine::RootImage), String> {
    let host = agentjail_engine::image::host_image_identity();
    let field = if vm.manifest.image.is_some() {
        "image"
    } else {
        "image_digest"
    };
    match vm.manifest.pinned_image() {
        None => Ok((host, agentjail_engine::RootImage::Host)),
        Some(want) if want == host => Ok((host, agentjail_engine::RootImage::Host)),
        Some(want) => {
            let s = agentjail_image::Store::at(store);
            match s.resolve(want) {
                Ok(rootfs) => Ok((
                    want.to_string(),
                    agentjail_engine::RootImage::Stored {
                        digest: want.to_string(),
                        rootfs,
                    },
                )),
                Err(agentjail_image::ImageError::NotFound { .. }) => Err(format!(
                    "manifest field `{field}`: {want} does not match the image actually used: it is neither the host image ({host}) nor in the image store {}; refusing to run (import it with `agentjail image import`)",
                    s.root().display()
                )),
                Err(agentjail_image::ImageError::BadDigest(_)) => Err(format!(
                    "manifest field `{field}`: {want} does not match the image actually used (host image {host}) and is not a sha256 digest of a stored image; refusing to run"
                )),
                Err(e) => Err(format!("manifest field `{field}`: {e}")),
            }
        }
    }
}

/// Records in the report whether the root was pinned, and a pinned image's SBOM digest.
fn annotate_image(report: &mut RunReport, root: &agentjail_engine::RootImage) {
    match root {
        agentjail_engine::RootImage::Host => {
            report.image_pinned = false;
            report.image_note = Some(HOST_IMAGE_NOTE.into());
        }
        agentjail_engine::RootImage::Stored { digest, rootfs } => {
            report.image_pinned = true;
            report.image_note = None;
            // What the image holds by its package records (`agentjail image show --sbom`):
            // read beneath its root, never through a symlink (agentjail_image::sbom).
            match agentjail_image::sbom::digest(rootfs, digest) {
                Ok((_, d)) => report.image_sbom = Some(d),
                Err(e) => {
                    report.image_sbom = None;
                    report.image_note = Some(format!("no SBOM for this image: {e}"));
                }
            }
        }
    }
}

/// Runs, verifies, delivers and records one validated manifest (images from the default store).
pub fn execute(
    vm: &ValidatedManifest,
    opts: &RunOptions,
    delivery: &Delivery,
) -> Result<Finished, SetupFailure> {
    execute_in(vm, opts, delivery, None)
}

/// [`execute`] with pinned images taken from the store at `store`.
pub fn execute_in(
    vm: &ValidatedManifest,
    opts: &RunOptions,
    delivery: &Delivery,
    store: Option<&Path>,
) -> Result<Finished, SetupFailure> {
    timing::init_from_env();
    timing::mark("pipeline: start");
    if let Some(d) = &delivery.output_dir {
        check_output_dir(d)?;
    }
    if delivery.workspace_out.is_some() && !vm.workspace.as_ref().is_some_and(|w| w.collect) {
        return Err(SetupFailure(
            "--workspace-out needs the manifest's `workspace` with `collect: true`".into(),
        ));
    }
    let schema = match &vm.output_schema_path {
        Some(p) => Some(load_schema(p)?),
        None => None,
    };
    // Load (or create) the signing key before the run, so a key problem costs no run.
    let signs =
        delivery.receipt.is_some() || (delivery.results.is_some() && delivery.key.is_some());
    let key = if signs {
        let path = delivery
            .key
            .clone()
            .unwrap_or_else(receipt::default_key_path);
        Some(ReceiptKey::load_or_create(&path).map_err(|e| SetupFailure(e.to_string()))?)
    } else {
        None
    };
    timing::mark("pipeline: key, schema");
    let selected = select_root(vm, store);
    if let Ok((d, agentjail_engine::RootImage::Stored { .. })) = &selected {
        // What `image gc` keeps recently used images by; best effort.
        let _ = agentjail_image::Store::at(store).mark_used(d);
    }
    timing::mark("pipeline: root selected");
    let (image, root) = match &selected {
        Ok((d, r)) => (Some(d.clone()), Some(r.clone())),
        Err(_) => (None, None),
    };
    let refusal = match selected {
        Err(msg) => Some(msg),
        Ok(_) => match &vm.manifest.network {
            agentjail_manifest::Network::Allow(p) => agentjail_egress::compile_policy(p)
                .err()
                .map(|e| format!("manifest field `network`: {e}")),
            agentjail_manifest::Network::Deny => None,
        }
        .or_else(|| {
            (euid_is_root() && vm.manifest.isolation == agentjail_manifest::Tier::Native)
                .then(|| vm.inputs.iter().find_map(|i| unreadable_input(i).err()))
                .flatten()
        }),
    };
    // The checkpoint to restore: read once, checked against its digest and bounds, now.
    let mut restore = None;
    let refusal = refusal.or_else(|| match workspace::read_restore(vm) {
        Ok(bytes) => {
            restore = bytes.map(std::sync::Arc::new);
            None
        }
        Err(e) => Some(e),
    });
    let (Some(image), Some(root), None) = (image.clone(), root.clone(), refusal.clone()) else {
        let msg = refusal.unwrap_or_default();
        let mut r = RunReport::setup_error(vm.manifest.limits, msg.clone());
        r.request_id = vm.manifest.request_id.clone();
        r.manifest_digest = Some(vm.digest.clone());
        // Nothing ran: `image` is the image this run would have had (the pinned one when it
        // was selected, else the host image's identity, as a reference for the caller).
        r.image = image.or_else(|| Some(agentjail_engine::image::host_image_identity()));
        r.image_pinned = matches!(root, Some(agentjail_engine::RootImage::Stored { .. }));
        write_report(delivery, &r)?;
        return Err(SetupFailure(msg));
    };

    timing::mark("pipeline: checks done");
    // With an --output-dir, its staging folder is made now, so that a problem there costs no
    // run; without one, only after the run and only if the command left something in /output.
    let mut staging = match &delivery.output_dir {
        Some(d) => Some(make_staging(d)?),
        None => None,
    };

    // The service learns that the command may run from here on: a runner that dies without
    // a report after this leaves an unknown outcome, one that dies before it ran nothing. A
    // service that cannot be told is gone: nothing is started.
    if let Some(fd) = &delivery.results {
        send_frame(fd, agentjail_manifest::results::STARTING, &[])
            .map_err(|e| SetupFailure(format!("lifeline: announcing the start: {e}")))?;
    }
    let opts = &RunOptions {
        workspace_restore: restore,
        ..opts.clone()
    };
    let Outcome {
        mut report,
        output_dir,
        work_dir,
        output_full,
        cleanup,
        ..
    } = agentjail_engine::run_on(vm, opts, Some(image), &root);
    timing::mark("pipeline: engine returned");
    annotate_image(&mut report, &root);
    // `--allow-degraded` ran without something: said every time, not only in the report.
    if let Some(line) = degraded_line(&report) {
        errln!("agentjail: degraded: {line}");
    }

    let mut artifact = None;
    if let Some(fd) = output_dir.as_ref() {
        let fd = std::os::fd::AsFd::as_fd(fd);
        if staging.is_none()
            && delivery.results.is_none()
            && agentjail_verify::collect::has_entries(fd)
        {
            staging = Some(
                tempfile::Builder::new()
                    .prefix("agentjail-output-")
                    .permissions(private_dir())
                    .tempdir()
                    .map_err(|e| SetupFailure(format!("cannot create a staging folder: {e}")))?,
            );
        }
        let stage = staging.as_ref().map(|s| s.path());
        let dest = match (stage, &delivery.results) {
            (_, Some(_)) => Dest::Memory,
            (Some(s), None) => Dest::Dir(s),
            (None, None) => Dest::Empty,
        };
        verify_output(
            vm,
            &mut report,
            fd,
            dest,
            output_full,
            schema.as_ref(),
            &mut artifact,
        );
        drop(output_dir);
        if report.status == Status::Ok
            || (report.status == Status::OutputRejected && vm.manifest.output.is_none())
        {
            if let (Some(d), Some(stage)) = (&delivery.output_dir, stage)
                && deliver(stage, d, &report.output.files, delivery.for_service)?
                && let Some(t) = staging.take()
            {
                // The staging folder became the output folder: nothing is left to remove.
                let _ = t.keep();
            }
        } else {
            artifact = None;
        }
    }

    let checkpoint = workspace::collect(
        vm,
        &mut report,
        work_dir.as_ref().map(std::os::fd::AsFd::as_fd),
    );
    drop(work_dir);
    if let (Some(path), Some(bytes)) = (&delivery.workspace_out, &checkpoint) {
        write_atomic(path, bytes)?;
    }

    // What is signed must be true: an input that cannot be hashed fails the run.
    let signed = match &key {
        Some(key) if report.status != Status::SetupError => Some(sign_receipt(key, vm, &report)?),
        _ => None,
    };
    if let (Some(path), Some(env)) = (&delivery.receipt, &signed) {
        write_file(path, env.as_bytes(), !delivery.for_service)?;
    }
    if let Some(fd) = &delivery.results {
        // A session's cell: the collected checkpoint goes back to the service, which checks
        // it against the report's digest (`agentjail_manifest::results::WORKSPACE`).
        let checkpoint = checkpoint
            .as_deref()
            .filter(|_| vm.manifest.session.is_some());
        send_results(
            fd,
            &report,
            signed.as_deref(),
            artifact.as_deref(),
            checkpoint,
        )?;
    }
    timing::mark("pipeline: output verified, receipt signed");
    write_report(delivery, &report)?;
    timing::mark("pipeline: report written");
    // Reap the sandbox's init and remove its cgroup (see `Outcome::cleanup`).
    drop(cleanup);
    timing::mark("pipeline: init reaped, cgroup removed");
    let exit_code = report.status.exit_code(report.exit_code, report.signal);
    Ok(Finished {
        report,
        artifact,
        exit_code,
    })
}

/// What a `--allow-degraded` run went without, in one line (`None` when nothing): e.g.
/// `no cgroup (memory and pids bounded by rlimits only)`. The report's
/// `isolation.degraded` has each reason in full.
///
/// The gVisor tier's own notes (`gvisor: …`: its Sentry instead of a seccomp listener, its
/// gofer instead of Landlock, no CPU time) are what the tier the user chose does by design,
/// the same on every run (docs/isolation.md): they stay in the report and are not said here,
/// where only a protection that was not applied belongs.
pub fn degraded_line(report: &RunReport) -> Option<String> {
    let d: Vec<&String> = report
        .isolation
        .degraded
        .iter()
        .filter(|e| !e.starts_with("gvisor:"))
        .collect();
    // A refused run (no `--allow-degraded`) lists what it lacked too, but ran without nothing.
    if d.is_empty() || report.status == Status::SetupError {
        return None;
    }
    let mut parts: Vec<String> = Vec::new();
    for e in d {
        let part = if e.starts_with("cgroup") {
            "no cgroup (memory and pids bounded by rlimits only)".to_string()
        } else if e.starts_with("cpu:") {
            "no CPU limit (CPU time bounded by the wall-clock limit only)".to_string()
        } else if e.starts_with("landlock") {
            "no Landlock (file access bounded by the mount namespace only)".to_string()
        } else {
            e.to_string()
        };
        if !parts.contains(&part) {
            parts.push(part);
        }
    }
    Some(parts.join("; "))
}

/// Whether the effective uid is root (the `Uid:` line's second field).
fn euid_is_root() -> bool {
    std::fs::read_to_string("/proc/self/status")
        .map(|s| {
            s.lines()
                .any(|l| l.starts_with("Uid:") && l.split_whitespace().nth(2) == Some("0"))
        })
        .unwrap_or(false)
}

/// As root, the sandbox user is a dedicated unprivileged host uid, to which only the "other"
/// permission bits of an input apply (the bind mount itself is made with the init's
/// privileges, so the folders above the input do not matter). A file input it cannot read is
/// given to it as a read-only copy in memory by the engine ([`agentjail_engine::copies`],
/// which refuses one over its bound). A folder is not copied: one holding what the sandbox
/// user cannot read would fail inside with a bare "Permission denied", so it is refused here
/// instead, naming the entry and the fix; it is checked with what it holds (up to 10 000
/// entries).
fn unreadable_input(i: &agentjail_manifest::ResolvedInput) -> Result<(), String> {
    use std::os::unix::fs::PermissionsExt;
    if !i.is_dir {
        return Ok(());
    }
    let refuse = |p: &Path, is_dir: bool, mode: u32| {
        let (what, fix) = if is_dir {
            ("the folder", "o+rx")
        } else {
            ("the file", "o+r")
        };
        Err(format!(
            "input {} ({}): the sandbox user cannot read {what} {} (mode {:04o}): as root, agentjail runs the sandbox as an unprivileged uid, to which only the permissions for others apply (a file given as an input by itself is copied into the sandbox instead, a folder is not); fix: chmod {fix} {}, or give the file by itself",
            i.mount,
            i.host_path.display(),
            p.display(),
            mode & 0o7777,
            p.display()
        ))
    };
    let mut stack = vec![(i.host_path.clone(), i.is_dir)];
    let mut seen = 0usize;
    while let Some((p, is_dir)) = stack.pop() {
        seen += 1;
        if seen > 10_000 {
            break;
        }
        let Ok(m) = std::fs::symlink_metadata(&p) else {
            continue;
        };
        let mode = m.permissions().mode();
        if is_dir {
            if mode & 0o005 != 0o005 {
                return refuse(&p, true, mode);
            }
            if let Ok(rd) = std::fs::read_dir(&p) {
                for e in rd.flatten() {
                    if let Ok(t) = e.file_type() {
                        if t.is_dir() {
                            stack.push((e.path(), true));
                        } else if t.is_file() {
                            stack.push((e.path(), false));
                        }
                    }
                }
            }
        } else if m.is_file() && mode & 0o004 == 0 {
            return refuse(&p, false, mode);
        }
    }
    Ok(())
}

fn load_schema(p: &Path) -> Result<agentjail_verify::schema::SchemaChecker, SetupFailure> {
    let bytes = std::fs::read(p)
        .map_err(|e| SetupFailure(format!("output_schema {}: {e}", p.display())))?;
    let v: serde_json::Value = serde_json::from_slice(&bytes)
        .map_err(|e| SetupFailure(format!("output_schema {}: not JSON: {e}", p.display())))?;
    agentjail_verify::schema::SchemaChecker::compile(&v)
        .map_err(|e| SetupFailure(format!("output_schema {}: {e}", p.display())))
}

/// The run's signed receipt (a DSSE envelope, as JSON) over its report, inputs and output.
fn sign_receipt(
    key: &ReceiptKey,
    vm: &ValidatedManifest,
    report: &RunReport,
) -> Result<String, SetupFailure> {
    let inputs = vm
        .inputs
        .iter()
        .map(|i| {
            agentjail_verify::digest::input_digest(&i.host_path)
                .map(|d| (i.mount.clone(), d))
                .map_err(|e| SetupFailure(format!("input {}: {e}; no receipt", i.mount)))
        })
        .chain(vm.inline.iter().map(|i| {
            Ok((
                i.mount.clone(),
                agentjail_verify::digest::bytes_digest(i.content.as_bytes()),
            ))
        }))
        .collect::<Result<Vec<_>, _>>()?;
    let mut statement = receipt::statement(report, &inputs, &report.output.files)
        .map_err(|e| SetupFailure(e.to_string()))?;
    // A session's cell: the receipt binds the session, the cell and the previous receipt.
    statement.predicate.session = vm.manifest.session.clone();
    let env = receipt::sign_statement(key, &statement).map_err(|e| SetupFailure(e.to_string()))?;
    Ok(env.to_json())
}

/// Sends a run's results to the service over the lifeline: the verified artifact (status
/// `ok` only) and the signed receipt; the report follows ([`write_report`]), and the service
/// takes it as the end of the results.
fn send_results(
    fd: &std::os::fd::OwnedFd,
    report: &RunReport,
    receipt: Option<&str>,
    artifact: Option<&[u8]>,
    checkpoint: Option<&[u8]>,
) -> Result<(), SetupFailure> {
    use agentjail_manifest::results::{ARTIFACT, RECEIPT, WORKSPACE};
    let fail = |e: std::io::Error| SetupFailure(format!("lifeline: sending the results: {e}"));
    if report.status == Status::Ok
        && let Some(a) = artifact
    {
        send_frame(fd, ARTIFACT, a).map_err(fail)?;
    }
    if let Some(c) = checkpoint {
        send_frame(fd, WORKSPACE, c).map_err(fail)?;
    }
    if let Some(r) = receipt {
        send_frame(fd, RECEIPT, r.as_bytes()).map_err(fail)?;
    }
    Ok(())
}

/// Writes one results frame ([`agentjail_manifest::results`]) to the lifeline socket, whole
/// (it waits while the service reads), with `MSG_NOSIGNAL`: a service that is gone is an
/// error here, never a SIGPIPE. After one failed send nothing more is sent (a frame cut
/// short would leave the rest of the stream misread).
pub fn send_frame(fd: &std::os::fd::OwnedFd, tag: u8, body: &[u8]) -> std::io::Result<()> {
    use std::sync::atomic::{AtomicBool, Ordering};
    static BROKEN: AtomicBool = AtomicBool::new(false);
    if BROKEN.load(Ordering::Relaxed) {
        return Err(std::io::Error::other("the lifeline failed before"));
    }
    let head = agentjail_manifest::results::header(tag, body.len() as u64);
    for mut part in [&head[..], body] {
        while !part.is_empty() {
            match rustix::net::send(fd, part, rustix::net::SendFlags::NOSIGNAL) {
                Ok(0) => {
                    BROKEN.store(true, Ordering::Relaxed);
                    return Err(std::io::ErrorKind::WriteZero.into());
                }
                Ok(n) => part = part.get(n..).unwrap_or_default(),
                Err(rustix::io::Errno::INTR) => {}
                Err(e) => {
                    BROKEN.store(true, Ordering::Relaxed);
                    return Err(e.into());
                }
            }
        }
    }
    Ok(())
}

fn private_dir() -> std::fs::Permissions {
    use std::os::unix::fs::PermissionsExt;
    std::fs::Permissions::from_mode(0o700)
}

fn make_staging(dest: &Path) -> Result<tempfile::TempDir, SetupFailure> {
    let parent = match dest.parent() {
        Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
        _ => PathBuf::from("."),
    };
    std::fs::create_dir_all(&parent)
        .map_err(|e| SetupFailure(format!("--output-dir {}: {e}", dest.display())))?;
    tempfile::Builder::new()
        .prefix(".agentjail-staging-")
        .permissions(private_dir())
        .tempdir_in(&parent)
        .map_err(|e| {
            SetupFailure(format!(
                "cannot create a staging folder in {}: {e}",
                parent.display()
            ))
        })
}

/// Moves verified files from the staging folder into the destination (same file system):
/// files 0644 for a person; `private` (a service's job folder), folders 0700 and files 0600.
/// Returns true when the staging folder itself became the destination: a destination that
/// does not exist yet, and a staging folder that holds exactly the files delivered, at its
/// top level (the usual case: one artifact). Then no folder is made and none removed, one
/// inode less created and one less freed per run (on an ext4 without a journal, every create
/// walks past the inodes freed in the last 30 s; docs/performance.md).
fn deliver(
    stage: &Path,
    dest: &Path,
    files: &[OutputFile],
    private: bool,
) -> Result<bool, SetupFailure> {
    use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
    let fail =
        |e: std::io::Error| SetupFailure(format!("delivering output to {}: {e}", dest.display()));
    if stage_becomes_dest(stage, dest, files, private) {
        return Ok(true);
    }
    let mut folders = std::fs::DirBuilder::new();
    folders.recursive(true);
    if private {
        folders.mode(0o700);
    }
    folders.create(dest).map_err(fail)?;
    for f in files {
        let to = dest.join(&f.path);
        if let Some(p) = to.parent() {
            folders.create(p).map_err(fail)?;
        }
        std::fs::rename(stage.join(&f.path), &to).map_err(fail)?;
        // Staged files are the staging folder's (0600 by the copy); a person gets 0644.
        if !private {
            let _ = std::fs::set_permissions(&to, std::fs::Permissions::from_mode(0o644));
        }
    }
    Ok(false)
}

/// [`deliver`]'s short way: renames the staging folder to `dest` when `dest` does not exist
/// and the folder holds exactly `files`, all at its top level, with the modes the long way
/// would give (a person: files 0644 and the folder as `mkdir` makes it under the umask; a
/// service: the staging modes, 0700 and 0600, already). False (nothing changed) otherwise.
fn stage_becomes_dest(stage: &Path, dest: &Path, files: &[OutputFile], private: bool) -> bool {
    use std::os::unix::fs::PermissionsExt;
    if files.is_empty()
        || files.iter().any(|f| f.path.contains('/'))
        || !matches!(std::fs::symlink_metadata(dest), Err(e) if e.kind() == std::io::ErrorKind::NotFound)
    {
        return false;
    }
    let Ok(entries) = std::fs::read_dir(stage) else {
        return false;
    };
    let mut staged = 0;
    for e in entries {
        let Ok(e) = e else { return false };
        let regular = e.file_type().is_ok_and(|t| t.is_file());
        let name = e.file_name();
        if !regular || !files.iter().any(|f| std::ffi::OsStr::new(&f.path) == name) {
            return false;
        }
        staged += 1;
    }
    if staged != files.len() {
        return false;
    }
    if !private {
        let Some(umask) = own_umask() else {
            return false;
        };
        for f in files {
            if std::fs::set_permissions(stage.join(&f.path), PermissionsExt::from_mode(0o644))
                .is_err()
            {
                return false;
            }
        }
        if std::fs::set_permissions(stage, PermissionsExt::from_mode(0o777 & !umask)).is_err() {
            return false;
        }
    }
    // RENAME_NOREPLACE: a `dest` made meanwhile (an empty folder would be replaced by a plain
    // rename) sends the files the long way.
    rustix::fs::renameat_with(
        rustix::fs::CWD,
        stage,
        rustix::fs::CWD,
        dest,
        rustix::fs::RenameFlags::NOREPLACE,
    )
    .is_ok()
}

/// This process's umask, from `/proc/self/status` (reading it with umask(2) would change it
/// for a moment, for every thread).
fn own_umask() -> Option<u32> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let v = status.lines().find_map(|l| l.strip_prefix("Umask:"))?;
    u32::from_str_radix(v.trim(), 8).ok()
}

fn write_report(delivery: &Delivery, r: &RunReport) -> Result<(), SetupFailure> {
    if let Some(fd) = &delivery.results {
        let bytes = serde_json::to_vec(r)
            .map_err(|e| SetupFailure(format!("cannot encode the report: {e}")))?;
        return send_frame(fd, agentjail_manifest::results::REPORT, &bytes)
            .map_err(|e| SetupFailure(format!("lifeline: sending the report: {e}")));
    }
    if let Some(p) = &delivery.report {
        let mut bytes = serde_json::to_vec_pretty(r)
            .map_err(|e| SetupFailure(format!("cannot encode the report: {e}")))?;
        bytes.push(b'\n');
        write_file(p, &bytes, !delivery.for_service)?;
    }
    Ok(())
}

/// Writes a file through a temporary sibling and a rename, so readers never see half of it.
pub fn write_atomic(path: &Path, bytes: &[u8]) -> Result<(), SetupFailure> {
    write_file(path, bytes, true)
}

/// [`write_atomic`], fsync'd before the rename only when `durable`.
fn write_file(path: &Path, bytes: &[u8], durable: bool) -> Result<(), SetupFailure> {
    use std::io::Write;
    let fail = |e: std::io::Error| SetupFailure(format!("cannot write {}: {e}", path.display()));
    let dir = match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
        _ => PathBuf::from("."),
    };
    let mut tmp = tempfile::NamedTempFile::new_in(&dir).map_err(fail)?;
    tmp.write_all(bytes).map_err(fail)?;
    if durable {
        tmp.as_file().sync_all().map_err(fail)?;
    }
    tmp.persist(path).map_err(|e| fail(e.error))?;
    Ok(())
}
