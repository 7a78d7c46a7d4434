//! `agentjail image …`: the digest-pinned image store (docs/images.md).

use std::path::PathBuf;

use agentjail_image::{Limits, Store};

#[derive(clap::Args, Clone)]
pub struct StoreArg {
    /// Image store directory [default: $XDG_DATA_HOME/agentjail/images].
    #[arg(long, value_name = "DIR", env = "AGENTJAIL_IMAGE_STORE")]
    store: Option<PathBuf>,
}

#[derive(clap::Subcommand)]
pub enum ImageCmd {
    /// Import an OCI image layout (directory or tar of one) or a plain root file system
    /// (directory or tarball); every blob is checked against its digest first. Prints the digest.
    Import {
        path: PathBuf,
        #[command(flatten)]
        store: StoreArg,
        /// Refuse archives with more entries than this (all layers together) [default: 500000].
        #[arg(long, value_name = "N")]
        max_entries: Option<u64>,
        /// Refuse images whose files add up to more than this, in MiB [default: 16384].
        #[arg(long, value_name = "N")]
        max_total_mb: Option<u64>,
        /// Print the stored record (JSON) instead of the digest.
        #[arg(long)]
        json: bool,
    },
    /// Build a new image on a stored one: pip installs a hashed lock file in a sandbox whose
    /// only way out is the egress gateway to the package index, and what it installed becomes
    /// a layer on the base (add-only). The same base, lock file and index give the same
    /// digest. Prints the digest; exit 1 when the lock file or the install is refused.
    Build(super::image_build::BuildArgs),
    /// List stored images.
    Ls {
        #[command(flatten)]
        store: StoreArg,
        #[arg(long)]
        json: bool,
    },
    /// Remove a stored image.
    Rm {
        digest: String,
        #[command(flatten)]
        store: StoreArg,
    },
    /// Remove the images that no task type of the given service configurations names and no
    /// run used (nor import added) within the retention window; prints each removal.
    Gc {
        /// A service configuration whose task types' `image` digests are kept (repeatable).
        /// Its image store (`server.image_store`, else `<data_dir>/images`) is the default store.
        #[arg(long, value_name = "FILE", required = true)]
        config: Vec<PathBuf>,
        /// Image store directory [default: the first configuration's].
        #[arg(long, value_name = "DIR")]
        store: Option<PathBuf>,
        /// Keep images a run used, or that were imported, within this many days [default: 7].
        #[arg(long, value_name = "DAYS", default_value_t = 7)]
        keep_days: u64,
        /// Print what would be removed; remove nothing.
        #[arg(long)]
        dry_run: bool,
    },
    /// Show a stored image: its record and the packages installed in it (Debian's and
    /// Python's own records, read from inside the image), or with `--sbom` its CycloneDX SBOM.
    Show {
        digest: String,
        #[command(flatten)]
        store: StoreArg,
        /// Print the SBOM (CycloneDX 1.5 JSON; its sha256 is the `sbom` digest `show` prints).
        #[arg(long, conflicts_with = "json")]
        sbom: bool,
        /// Print the record, the SBOM's digest and the packages as JSON.
        #[arg(long)]
        json: bool,
    },
    /// Compare a stored image's Python distributions with a lock file (`requirements.txt`
    /// with exact pins): each pin the image has at another version (`changed`) or lacks
    /// (`added`). Exit 0 when the image matches every pin, 1 when it does not or a line is
    /// not an exact pin, 125 when the image or the lock file cannot be read.
    Outdated {
        digest: String,
        /// The lock file (pip's `requirements.txt` format, `name==version` lines).
        #[arg(long, value_name = "FILE")]
        requirements: PathBuf,
        #[command(flatten)]
        store: StoreArg,
        #[arg(long)]
        json: bool,
    },
    /// Re-hash a stored image's every file against its record; exit 1 and list what changed.
    Verify {
        digest: String,
        #[command(flatten)]
        store: StoreArg,
        #[arg(long)]
        json: bool,
    },
}

pub fn dispatch(c: ImageCmd) -> Result<u8, String> {
    match c {
        ImageCmd::Build(a) => super::image_build::build(a),
        ImageCmd::Import {
            path,
            store,
            max_entries,
            max_total_mb,
            json,
        } => {
            let mut limits = Limits::default();
            if let Some(n) = max_entries {
                limits.max_entries = n;
            }
            if let Some(mb) = max_total_mb {
                limits.max_total_bytes = mb.saturating_mul(1 << 20);
            }
            let s = Store::at(store.store.as_deref());
            let imp = s.import(&path, &limits).map_err(|e| e.to_string())?;
            if json {
                outln!(
                    "{}",
                    serde_json::to_string_pretty(&imp.record).unwrap_or_default()
                );
            } else {
                outln!("{}", imp.record.digest);
            }
            if imp.already_present {
                errln!(
                    "agentjail image: {} was already in the store",
                    imp.record.digest
                );
            }
            if imp.record.dropped_count > 0 {
                errln!(
                    "agentjail image: {} entr(y/ies) not reproduced (device nodes, FIFOs, setuid bits, xattrs); see `image ls --json`",
                    imp.record.dropped_count
                );
            }
            Ok(0)
        }
        ImageCmd::Ls { store, json } => {
            let s = Store::at(store.store.as_deref());
            let all = s.list().map_err(|e| e.to_string())?;
            let now = jiff::Timestamp::now();
            if json {
                let v: Vec<serde_json::Value> = all
                    .iter()
                    .map(|r| match r {
                        Ok(r) => {
                            let mut v = serde_json::to_value(r).unwrap_or_default();
                            v["age_seconds"] = serde_json::json!(age(r, now));
                            v["last_used"] =
                                serde_json::json!(s.last_used(&r.digest).map(|t| t.to_string()));
                            v
                        }
                        Err(e) => serde_json::json!({ "error": e.to_string() }),
                    })
                    .collect();
                outln!("{}", serde_json::to_string_pretty(&v).unwrap_or_default());
            } else if all.is_empty() {
                outln!(
                    "no images (in {}; add one with `agentjail image import`)",
                    s.root().display()
                );
            } else {
                outln!(
                    "{:<71}  {:<10} {:>9} {:>8}  {:>6}  {:>9}  BASE / SOURCE",
                    "DIGEST",
                    "KIND",
                    "SIZE",
                    "FILES",
                    "AGE",
                    "USED"
                );
                for r in all {
                    match r {
                        Ok(r) => outln!(
                            "{:<71}  {:<10} {:>9} {:>8}  {:>6}  {:>9}  base {}, from {}",
                            r.digest,
                            r.kind,
                            human_bytes(r.bytes),
                            r.entries,
                            human_age(age(&r, now)),
                            s.last_used(&r.digest)
                                .map(|t| human_age(secs_between(t, now)) + " ago")
                                .unwrap_or_else(|| "never".into()),
                            r.base.as_deref().unwrap_or("unknown"),
                            r.source
                        ),
                        Err(e) => outln!("{e}"),
                    }
                }
            }
            Ok(0)
        }
        ImageCmd::Gc {
            config,
            store,
            keep_days,
            dry_run,
        } => gc(&config, store, keep_days, dry_run),
        ImageCmd::Rm { digest, store } => {
            Store::at(store.store.as_deref())
                .remove(&digest)
                .map_err(|e| e.to_string())?;
            errln!("agentjail image: removed {digest}");
            Ok(0)
        }
        ImageCmd::Show {
            digest,
            store,
            sbom,
            json,
        } => show(&Store::at(store.store.as_deref()), &digest, sbom, json),
        ImageCmd::Outdated {
            digest,
            requirements,
            store,
            json,
        } => outdated(
            &Store::at(store.store.as_deref()),
            &digest,
            &requirements,
            json,
        ),
        ImageCmd::Verify {
            digest,
            store,
            json,
        } => {
            let v = Store::at(store.store.as_deref())
                .verify(&digest)
                .map_err(|e| e.to_string())?;
            if json {
                outln!("{}", serde_json::to_string_pretty(&v).unwrap_or_default());
            } else if v.ok {
                outln!("{digest}: ok (every file matches the record)");
            } else {
                outln!("{digest}: CHANGED since import");
                for c in &v.changes {
                    outln!("  {c}");
                }
            }
            Ok(if v.ok { 0 } else { 1 })
        }
    }
}

/// Seconds from `a` to `b` (0 if `b` is earlier).
/// `image show`: the SBOM is made from the image as stored, after its fingerprint check; the
/// digest printed is that of the exact bytes `--sbom` prints.
fn show(s: &Store, digest: &str, sbom: bool, json: bool) -> Result<u8, String> {
    let r = s.record(digest).map_err(|e| e.to_string())?;
    let doc = s.sbom(digest).map_err(|e| e.to_string())?;
    let text = agentjail_image::sbom::text(&doc);
    if sbom {
        out!("{text}");
        return Ok(0);
    }
    let sbom_sha256 = agentjail_manifest::sha256_digest(text.as_bytes());
    let packages: Vec<(&str, &str, &str)> = doc["components"]
        .as_array()
        .map(|a| {
            a.iter()
                .map(|c| {
                    let purl = c["purl"].as_str().unwrap_or("");
                    let eco = if purl.starts_with("pkg:deb/") {
                        "deb"
                    } else {
                        "pypi"
                    };
                    (
                        eco,
                        c["name"].as_str().unwrap_or(""),
                        c["version"].as_str().unwrap_or(""),
                    )
                })
                .collect()
        })
        .unwrap_or_default();
    let count = |e: &str| packages.iter().filter(|p| p.0 == e).count();
    if json {
        let mut v = serde_json::to_value(&r).unwrap_or_default();
        v["sbom_sha256"] = serde_json::json!(sbom_sha256);
        v["packages"] = serde_json::json!(
            packages
                .iter()
                .map(|(e, n, ver)| serde_json::json!({"ecosystem": e, "name": n, "version": ver}))
                .collect::<Vec<_>>()
        );
        outln!("{}", serde_json::to_string_pretty(&v).unwrap_or_default());
        return Ok(0);
    }
    outln!("{}", r.digest);
    outln!(
        "  {}, {} in {} files, imported {} from {}",
        r.kind,
        human_bytes(r.bytes),
        r.entries,
        r.created,
        r.source
    );
    outln!("  base: {}", r.base.as_deref().unwrap_or("unknown"));
    outln!(
        "  packages: {} Debian, {} Python (SBOM {sbom_sha256}: `agentjail image show {} --sbom`)",
        count("deb"),
        count("pypi"),
        r.digest
    );
    // Names and versions are the image's words: shown inert (no terminal escapes).
    for (e, n, ver) in &packages {
        outln!("    {e:<4} {} {}", shown(n), shown(ver));
    }
    Ok(0)
}

/// Text from an image or a lock file, made inert for a terminal (control characters shown
/// escaped) and bounded.
fn shown(s: &str) -> String {
    agentjail_manifest::text::printable(s, 300)
}

/// `image outdated`: the image's Python distributions (from its package records, after its
/// fingerprint check) against a lock file's exact pins.
fn outdated(s: &Store, digest: &str, lock: &std::path::Path, json: bool) -> Result<u8, String> {
    use agentjail_image::requirements;
    use std::io::Read;
    let mut text = String::new();
    std::fs::File::open(lock)
        .and_then(|f| {
            f.take(requirements::MAX_BYTES + 1)
                .read_to_string(&mut text)
        })
        .map_err(|e| format!("{}: {e}", lock.display()))?;
    if text.len() as u64 > requirements::MAX_BYTES {
        return Err(format!(
            "{}: larger than {} MiB; not a lock file",
            lock.display(),
            requirements::MAX_BYTES >> 20
        ));
    }
    let parsed = requirements::parse(&text);
    if parsed.pins.is_empty() && parsed.not_pinned.is_empty() {
        return Err(format!(
            "{}: no requirement in it (expected `name==version` lines)",
            lock.display()
        ));
    }
    let installed = s.packages(digest).map_err(|e| e.to_string())?;
    let changes = requirements::compare(&installed, &parsed);
    let moving: Vec<_> = changes.iter().filter(|c| c.change != "same").collect();
    let code = u8::from(!moving.is_empty() || !parsed.not_pinned.is_empty());
    if json {
        let v = serde_json::json!({
            "image": digest,
            "requirements": lock.display().to_string(),
            "up_to_date": code == 0,
            "changes": changes,
            "not_pinned": parsed.not_pinned,
        });
        outln!("{}", serde_json::to_string_pretty(&v).unwrap_or_default());
        return Ok(code);
    }
    for c in &moving {
        let marker = c
            .marker
            .as_deref()
            .map(|m| format!("  (; {m})"))
            .unwrap_or_default();
        match c.image.as_deref() {
            Some(v) => outln!(
                "changed  {} {} -> {}{}",
                c.name,
                shown(v),
                c.lock,
                shown(&marker)
            ),
            None => outln!("added    {} {}{}", c.name, c.lock, shown(&marker)),
        }
    }
    for l in &parsed.not_pinned {
        outln!("not pinned (not compared): {}", shown(l));
    }
    if code == 0 {
        outln!("{digest}: matches the lock file ({} pins)", changes.len());
    } else {
        outln!(
            "{digest}: {} of {} pins differ from the image; {} line(s) not compared",
            moving.len(),
            changes.len(),
            parsed.not_pinned.len()
        );
    }
    Ok(code)
}

fn secs_between(a: jiff::Timestamp, b: jiff::Timestamp) -> u64 {
    u64::try_from(b.as_second() - a.as_second()).unwrap_or(0)
}

/// Seconds since the image was imported (0 if its record's instant is unreadable).
fn age(r: &agentjail_image::ImageRecord, now: jiff::Timestamp) -> u64 {
    r.created
        .parse::<jiff::Timestamp>()
        .map(|t| secs_between(t, now))
        .unwrap_or(0)
}

fn human_age(s: u64) -> String {
    match s {
        0..60 => format!("{s}s"),
        60..3600 => format!("{}m", s / 60),
        3600..86_400 => format!("{}h", s / 3600),
        _ => format!("{}d", s / 86_400),
    }
}

fn human_bytes(b: u64) -> String {
    match b {
        0..1024 => format!("{b} B"),
        1024..1_048_576 => format!("{:.1} KiB", b as f64 / 1024.0),
        1_048_576..1_073_741_824 => format!("{:.1} MiB", b as f64 / 1_048_576.0),
        _ => format!("{:.1} GiB", b as f64 / 1_073_741_824.0),
    }
}

/// `agentjail image gc`: keeps what a task type of `configs` names, and what a run used (or an
/// import added) within `keep_days`; removes the rest (or, with `dry_run`, says it would).
fn gc(
    configs: &[PathBuf],
    store: Option<PathBuf>,
    keep_days: u64,
    dry_run: bool,
) -> Result<u8, String> {
    use std::collections::BTreeMap;
    let mut named: BTreeMap<String, Vec<String>> = BTreeMap::new();
    let mut default_store = None;
    for p in configs {
        let c = agentjail_server::Config::load(p).map_err(|e| e.to_string())?;
        default_store.get_or_insert_with(|| {
            let data = c
                .server
                .data_dir
                .clone()
                .unwrap_or_else(agentjail_server::default_data_dir);
            agentjail_server::images::store_dir(&c.server, &data)
        });
        for (name, t) in &c.tasks {
            if let Some(d) = &t.image {
                named
                    .entry(d.clone())
                    .or_default()
                    .push(format!("{}: task `{name}`", p.display()));
            }
        }
    }
    let s = Store::at(store.or(default_store).as_deref());
    let now = jiff::Timestamp::now();
    let window = keep_days.saturating_mul(86_400);
    let (mut removed, mut kept) = (0usize, 0usize);
    for r in s.list().map_err(|e| e.to_string())? {
        let r = match r {
            Ok(r) => r,
            Err(e) => {
                errln!("agentjail image gc: skipped {e} (remove it with `agentjail image rm`)");
                continue;
            }
        };
        if let Some(by) = named.get(&r.digest) {
            kept += 1;
            errln!("kept {} (named by {})", r.digest, by.join(", "));
            continue;
        }
        let used = s.last_used(&r.digest).map(|t| secs_between(t, now));
        let recent = used.unwrap_or_else(|| age(&r, now));
        if recent < window {
            kept += 1;
            errln!(
                "kept {} ({} {} ago, within {keep_days} days)",
                r.digest,
                if used.is_some() { "used" } else { "imported" },
                human_age(recent)
            );
            continue;
        }
        let what = format!(
            "{} ({}, {}, {})",
            r.digest,
            r.kind,
            human_bytes(r.bytes),
            used.map(|u| format!("last used {} ago", human_age(u)))
                .unwrap_or_else(|| "never used".into())
        );
        if dry_run {
            outln!("would remove {what}");
        } else {
            s.remove(&r.digest).map_err(|e| e.to_string())?;
            outln!("removed {what}");
        }
        removed += 1;
    }
    errln!(
        "agentjail image gc: {} {removed}, kept {kept} (store {})",
        if dry_run { "would remove" } else { "removed" },
        s.root().display()
    );
    Ok(0)
}
