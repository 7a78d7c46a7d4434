#![allow(clippy::unwrap_used, clippy::expect_used, clippy::large_enum_variant)]

use std::io::Read;
use std::path::Path;

use tar::{EntryType, Header};

use super::*;

/// A header with a raw name/link (the `tar` builder refuses `..` and absolute names, which is
/// exactly what these tests need to write).
fn hdr(name: &str, kind: EntryType, size: u64, mode: u32, link: Option<&str>) -> Header {
    let mut h = Header::new_gnu();
    h.set_entry_type(kind);
    h.set_size(size);
    h.set_mode(mode);
    h.set_mtime(1_700_000_000);
    let old = h.as_old_mut();
    old.name = [0; 100];
    old.name[..name.len()].copy_from_slice(name.as_bytes());
    if let Some(l) = link {
        old.linkname = [0; 100];
        old.linkname[..l.len()].copy_from_slice(l.as_bytes());
    }
    h.set_cksum();
    h
}

enum E<'a> {
    Dir(&'a str),
    File(&'a str, &'a [u8]),
    FileMode(&'a str, &'a [u8], u32),
    Sym(&'a str, &'a str),
    Hard(&'a str, &'a str),
    Raw(Header, Vec<u8>),
}

fn tarball(entries: Vec<E<'_>>) -> Vec<u8> {
    let mut b = tar::Builder::new(Vec::new());
    for e in entries {
        let (h, data): (Header, Vec<u8>) = match e {
            E::Dir(n) => (hdr(n, EntryType::Directory, 0, 0o755, None), vec![]),
            E::File(n, d) => (
                hdr(n, EntryType::Regular, d.len() as u64, 0o644, None),
                d.to_vec(),
            ),
            E::FileMode(n, d, m) => (
                hdr(n, EntryType::Regular, d.len() as u64, m, None),
                d.to_vec(),
            ),
            E::Sym(n, t) => (hdr(n, EntryType::Symlink, 0, 0o777, Some(t)), vec![]),
            E::Hard(n, t) => (hdr(n, EntryType::Link, 0, 0o644, Some(t)), vec![]),
            E::Raw(h, d) => (h, d),
        };
        b.append(&h, &data[..]).unwrap();
    }
    b.into_inner().unwrap()
}

struct Fx {
    dir: tempfile::TempDir,
    store: Store,
}

impl Fx {
    fn new() -> Fx {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::at(Some(&dir.path().join("store")));
        std::fs::create_dir(dir.path().join("outside")).unwrap();
        Fx { dir, store }
    }
    fn p(&self, n: &str) -> std::path::PathBuf {
        self.dir.path().join(n)
    }
    fn oci(&self, name: &str, layers: &[Vec<u8>]) -> (std::path::PathBuf, String) {
        let d = self.p(name);
        let gz: Vec<Vec<u8>> = layers.iter().map(|l| layout::gzip(l).unwrap()).collect();
        let digest = layout::write_oci_layout(&d, &gz).unwrap();
        (d, digest)
    }
    fn import(&self, p: &Path) -> Result<Imported, ImageError> {
        self.store.import(p, &Limits::default())
    }
    /// Nothing escaped: the sibling folder is empty, the store holds no image and no staging.
    fn assert_clean(&self) {
        assert_eq!(std::fs::read_dir(self.p("outside")).unwrap().count(), 0);
        let images = self.store.root().join("images");
        if images.exists() {
            assert_eq!(std::fs::read_dir(&images).unwrap().count(), 0);
        }
        let tmp = self.store.root().join("tmp");
        if tmp.exists() {
            assert_eq!(
                std::fs::read_dir(&tmp).unwrap().count(),
                0,
                "staging left behind"
            );
        }
    }
    fn refused(&self, tar: Vec<u8>, want: &str) {
        let p = self.p("in.tar");
        std::fs::write(&p, tar).unwrap();
        match self.import(&p) {
            Err(ImageError::Refused(r)) => assert!(r.contains(want), "reason {r:?} lacks {want:?}"),
            other => panic!("expected a refusal containing {want:?}, got {other:?}"),
        }
        // The same content as a layer of an OCI layout is refused the same way.
        let raw = std::fs::read(&p).unwrap();
        let _ = std::fs::remove_dir_all(self.p("layout"));
        let (l, _) = self.oci("layout", &[raw]);
        match self.import(&l) {
            Err(ImageError::Refused(r)) => {
                assert!(r.contains(want), "layout: reason {r:?} lacks {want:?}")
            }
            other => panic!("layout: expected a refusal containing {want:?}, got {other:?}"),
        }
        self.assert_clean();
    }
}

fn outside(fx: &Fx) -> String {
    fx.p("outside").display().to_string()
}

#[test]
fn oci_layers_whiteouts_and_opaque_dirs() {
    let fx = Fx::new();
    let l1 = tarball(vec![
        E::Dir("a/"),
        E::File("a/x", b"x"),
        E::File("a/y", b"y"),
        E::Dir("b/"),
        E::File("b/z", b"z"),
        E::Sym("bin", "usr/bin"),
        E::File("usr/bin/tool", b"#!/bin/sh\n"),
        E::Hard("usr/bin/tool2", "usr/bin/tool"),
    ]);
    let l2 = tarball(vec![
        E::File("a/.wh.x", b""),
        E::Dir("b/"),
        E::File("b/.wh..wh..opq", b""),
        E::File("b/new", b"n"),
    ]);
    let (dir, digest) = fx.oci("img", &[l1, l2]);
    let imp = fx.import(&dir).unwrap();
    assert_eq!(imp.record.digest, digest);
    assert_eq!(imp.record.kind, "oci");
    assert_eq!(imp.record.layers.len(), 2);
    let root = fx.store.resolve(&digest).unwrap();
    assert!(!root.join("a/x").exists());
    assert_eq!(std::fs::read(root.join("a/y")).unwrap(), b"y");
    assert!(!root.join("b/z").exists());
    assert_eq!(std::fs::read(root.join("b/new")).unwrap(), b"n");
    assert!(!root.join("a/.wh.x").exists() && !root.join("b/.wh..wh..opq").exists());
    assert_eq!(
        std::fs::read_link(root.join("bin")).unwrap(),
        Path::new("usr/bin")
    );
    assert_eq!(
        std::fs::read(root.join("usr/bin/tool2")).unwrap(),
        b"#!/bin/sh\n"
    );
    let v = fx.store.verify(&digest).unwrap();
    assert!(v.ok, "{v:?}");
    // Importing again: same digest, already present.
    let again = fx.import(&dir).unwrap();
    assert!(again.already_present);
    assert_eq!(fx.store.list().unwrap().len(), 1);
    // A tar of the layout imports to the same digest.
    let tarp = fx.p("img.tar");
    let mut b = tar::Builder::new(std::fs::File::create(&tarp).unwrap());
    b.append_dir_all(".", &dir).unwrap();
    b.finish().unwrap();
    drop(b);
    fx.store.remove(&digest).unwrap();
    assert_eq!(fx.import(&tarp).unwrap().record.digest, digest);
}

#[test]
fn tampering_is_caught_cheaply_and_by_verify() {
    let fx = Fx::new();
    let (dir, digest) = fx.oci(
        "img",
        &[tarball(vec![
            E::File("etc/os-release", b"ID=test\n"),
            E::File("bin/x", b"1"),
        ])],
    );
    fx.import(&dir).unwrap();
    let root = fx.store.resolve(&digest).unwrap();
    // Same size, content changed, mtime restored: ctime still moves.
    let f = root.join("bin/x");
    let mtime = std::fs::metadata(&f).unwrap().modified().unwrap();
    std::fs::write(&f, b"2").unwrap();
    std::fs::File::options()
        .write(true)
        .open(&f)
        .unwrap()
        .set_modified(mtime)
        .unwrap();
    match fx.store.resolve(&digest) {
        Err(ImageError::Changed { .. }) => {}
        other => panic!("{other:?}"),
    }
    let v = fx.store.verify(&digest).unwrap();
    assert!(!v.ok);
    assert_eq!(v.changes, vec!["changed: \"bin/x\"".to_string()]);
    std::fs::write(root.join("added"), b"").unwrap();
    let v = fx.store.verify(&digest).unwrap();
    assert!(v.changes.iter().any(|c| c == "added: \"added\""), "{v:?}");
    // Unknown digests and malformed ones.
    assert!(matches!(
        fx.store.resolve(&format!("sha256:{}", "0".repeat(64))),
        Err(ImageError::NotFound { .. })
    ));
    assert!(matches!(
        fx.store.resolve("sha256:abc"),
        Err(ImageError::BadDigest(_))
    ));
}

#[test]
fn plain_rootfs_dir_and_tarball() {
    let fx = Fx::new();
    let src = fx.p("rootfs");
    std::fs::create_dir_all(src.join("usr/bin")).unwrap();
    std::fs::write(src.join("usr/bin/hello"), b"hi").unwrap();
    std::os::unix::fs::symlink("usr/bin", src.join("bin")).unwrap();
    std::os::unix::fs::symlink("/etc/shadow", src.join("usr/shadow-link")).unwrap();
    let a = fx.import(&src).unwrap();
    assert_eq!(a.record.kind, "rootfs-dir");
    assert_eq!(a.record.digest, a.record.content_digest);
    let root = fx.store.resolve(&a.record.digest).unwrap();
    // The symlink is stored as a symlink, never followed at import.
    assert_eq!(
        std::fs::read_link(root.join("usr/shadow-link")).unwrap(),
        Path::new("/etc/shadow")
    );
    // The same tree as a gzip tarball has the same (content) digest.
    let t = tarball(vec![
        E::Sym("bin", "usr/bin"),
        E::Dir("usr/"),
        E::Sym("usr/shadow-link", "/etc/shadow"),
        E::Dir("usr/bin/"),
        E::File("usr/bin/hello", b"hi"),
    ]);
    let p = fx.p("rootfs.tar.gz");
    std::fs::write(&p, layout::gzip(&t).unwrap()).unwrap();
    let b = fx.import(&p).unwrap();
    assert_eq!(b.record.digest, a.record.digest, "same tree, same digest");
    assert!(b.already_present);
    let va = std::fs::read_to_string(
        fx.store
            .root()
            .join("images")
            .join(&a.record.digest[7..])
            .join("files.txt"),
    )
    .unwrap();
    assert!(va.contains("\"usr/bin/hello\""), "{va}");
    assert!(fx.store.verify(&b.record.digest).unwrap().ok);
}

#[test]
fn devices_fifos_setuid_and_xattrs_are_dropped() {
    let fx = Fx::new();
    let mut pax = tar::Builder::new(Vec::new());
    pax.append_pax_extensions([("SCHILY.xattr.security.capability", &b"\x01\x00\x00\x02"[..])])
        .unwrap();
    let mut t = pax.into_inner().unwrap();
    t.truncate(t.len() - 1024); // drop the end-of-archive blocks
    let rest = tarball(vec![
        E::File("bin/cap", b"x"),
        E::FileMode("bin/su", b"x", 0o4755),
        E::Raw(hdr("dev/sda", EntryType::Block, 0, 0o660, None), vec![]),
        E::Raw(hdr("dev/null", EntryType::Char, 0, 0o666, None), vec![]),
        E::Raw(hdr("fifo", EntryType::Fifo, 0, 0o644, None), vec![]),
    ]);
    t.extend_from_slice(&rest);
    let p = fx.p("in.tar");
    std::fs::write(&p, t).unwrap();
    let r = fx.import(&p).unwrap().record;
    let root = fx.store.resolve(&r.digest).unwrap();
    use std::os::unix::fs::PermissionsExt;
    assert_eq!(
        std::fs::metadata(root.join("bin/su"))
            .unwrap()
            .permissions()
            .mode()
            & 0o7777,
        0o755
    );
    assert!(
        !root.join("dev/sda").exists()
            && !root.join("dev/null").exists()
            && !root.join("fifo").exists()
    );
    let all = r.dropped.join("\n");
    assert!(
        all.contains("setuid") && all.contains("device node") && all.contains("extended attribute"),
        "{all}"
    );
}

#[test]
fn dotdot_entries_are_refused() {
    let fx = Fx::new();
    fx.refused(
        tarball(vec![E::File("../../outside/evil", b"x")]),
        "`..` component",
    );
    fx.refused(
        tarball(vec![E::File("a/../../outside/evil", b"x")]),
        "`..` component",
    );
}

#[test]
fn absolute_paths_are_refused() {
    let fx = Fx::new();
    let target = format!("{}/evil", outside(&fx));
    fx.refused(tarball(vec![E::File(&target, b"x")]), "absolute path");
}

#[test]
fn writing_through_a_symlink_is_refused() {
    let fx = Fx::new();
    let o = outside(&fx);
    fx.refused(
        tarball(vec![E::Sym("link", &o), E::File("link/evil", b"x")]),
        "symlink or not a directory",
    );
    fx.refused(
        tarball(vec![
            E::Sym("link", "../../outside"),
            E::File("link/evil", b"x"),
        ]),
        "symlink or not a directory",
    );
    // A symlink then a file of the same name: the file replaces the link, never writes through.
    let fx2 = Fx::new();
    let victim = fx2.p("outside/victim");
    std::fs::write(&victim, b"orig").unwrap();
    let t = tarball(vec![
        E::Sym("f", &victim.display().to_string()),
        E::File("f", b"evil"),
    ]);
    std::fs::write(fx2.p("in.tar"), t).unwrap();
    let r = fx2.import(&fx2.p("in.tar")).unwrap().record;
    assert_eq!(std::fs::read(&victim).unwrap(), b"orig");
    let root = fx2.store.resolve(&r.digest).unwrap();
    assert_eq!(std::fs::read(root.join("f")).unwrap(), b"evil");
}

#[test]
fn hard_links_outside_or_ahead_are_refused() {
    let fx = Fx::new();
    fx.refused(
        tarball(vec![E::Hard("shadow", "/etc/shadow")]),
        "absolute path",
    );
    fx.refused(
        tarball(vec![E::Hard("shadow", "../../../../etc/shadow")]),
        "`..` component",
    );
    fx.refused(
        tarball(vec![E::Hard("shadow", "etc/shadow")]),
        "not a regular file this import already extracted",
    );
    fx.refused(
        tarball(vec![E::Hard("early", "later"), E::File("later", b"x")]),
        "not a regular file this import already extracted",
    );
    fx.refused(
        tarball(vec![E::Sym("s", "/etc/shadow"), E::Hard("h", "s")]),
        "not a regular file",
    );
}

#[test]
fn a_10_gb_sparse_file_is_refused_on_its_header() {
    let fx = Fx::new();
    // A regular entry declaring 10 GB, with no data behind it: judged on the header.
    let mut t = tarball(vec![]);
    let h = hdr("big", EntryType::Regular, 10 << 30, 0o644, None);
    t.splice(0..0, h.as_bytes().iter().copied());
    let start = std::time::Instant::now();
    fx.refused(t, "larger than the bound");
    assert!(start.elapsed().as_secs() < 5);
    // A GNU sparse entry.
    let fx = Fx::new();
    let mut h = hdr("sparse", EntryType::GNUSparse, 0, 0o644, None);
    h.as_gnu_mut()
        .unwrap()
        .realsize
        .copy_from_slice(b"10000000000\0");
    h.set_cksum();
    fx.refused(tarball(vec![E::Raw(h, vec![])]), "sparse");
}

/// A tar stream of `n` empty files, generated lazily (never held in memory).
struct ManyFiles {
    n: u64,
    i: u64,
    buf: Vec<u8>,
    pos: usize,
}

impl Read for ManyFiles {
    fn read(&mut self, out: &mut [u8]) -> std::io::Result<usize> {
        if self.pos == self.buf.len() {
            if self.i < self.n {
                let h = hdr(&format!("f/{}", self.i), EntryType::Regular, 0, 0o644, None);
                self.buf = h.as_bytes().to_vec();
                self.i += 1;
            } else if self.i == self.n {
                self.buf = vec![0; 1024];
                self.i += 1;
            } else {
                return Ok(0);
            }
            self.pos = 0;
        }
        let k = out.len().min(self.buf.len() - self.pos);
        out[..k].copy_from_slice(&self.buf[self.pos..self.pos + k]);
        self.pos += k;
        Ok(k)
    }
}

#[test]
fn a_million_tiny_files_are_refused_at_the_entry_bound() {
    let d = tempfile::tempdir().unwrap();
    let limits = Limits {
        max_entries: 2_000,
        ..Limits::default()
    };
    let root = d.path().join("root");
    std::fs::create_dir(&root).unwrap();
    let mut ex = extract::Extractor::new(fsops::open_root(&root).unwrap(), &limits, true);
    let start = std::time::Instant::now();
    let r = ex.extract(ManyFiles {
        n: 1_000_000,
        i: 0,
        buf: Vec::new(),
        pos: 0,
    });
    match r {
        Err(ImageError::Refused(m)) => assert!(m.contains("more than 2000 entries"), "{m}"),
        other => panic!("{other:?}"),
    }
    assert!(start.elapsed().as_secs() < 10);
}

#[test]
fn decompression_bombs_are_bounded() {
    let d = tempfile::tempdir().unwrap();
    let limits = Limits {
        max_archive_bytes: 1 << 20,
        ..Limits::default()
    };
    let root = d.path().join("root");
    std::fs::create_dir(&root).unwrap();
    let zeros = vec![0u8; 8 << 20];
    let t = tarball(vec![E::File("z", &zeros)]);
    let gz = layout::gzip(&t).unwrap();
    let mut ex = extract::Extractor::new(fsops::open_root(&root).unwrap(), &limits, true);
    let r = ex.extract(extract::decompress(&gz[..]).unwrap());
    assert!(
        matches!(&r, Err(ImageError::Refused(m)) if m.contains("larger than")),
        "{r:?}"
    );
}

#[test]
fn wrong_digest_and_truncated_blobs_are_refused() {
    let fx = Fx::new();
    let layer = tarball(vec![E::File("x", b"hello")]);
    let (dir, _) = fx.oci("img", &[layer]);
    let idx: serde_json::Value =
        serde_json::from_slice(&std::fs::read(dir.join("index.json")).unwrap()).unwrap();
    let mdig = idx["manifests"][0]["digest"].as_str().unwrap().to_string();
    let m: serde_json::Value =
        serde_json::from_slice(&std::fs::read(dir.join("blobs/sha256").join(&mdig[7..])).unwrap())
            .unwrap();
    let ldig = m["layers"][0]["digest"].as_str().unwrap().to_string();
    let lpath = dir.join("blobs/sha256").join(&ldig[7..]);
    let good = std::fs::read(&lpath).unwrap();
    // Same size, one byte flipped.
    let mut bad = good.clone();
    let last = bad.len() - 1;
    bad[last] ^= 0xff;
    std::fs::write(&lpath, &bad).unwrap();
    match fx.import(&dir) {
        Err(ImageError::Refused(r)) => assert!(r.contains("wrong digest"), "{r}"),
        other => panic!("{other:?}"),
    }
    // Truncated.
    std::fs::write(&lpath, &good[..good.len() / 2]).unwrap();
    match fx.import(&dir) {
        Err(ImageError::Refused(r)) => assert!(r.contains("truncated"), "{r}"),
        other => panic!("{other:?}"),
    }
    // A blob that is a symlink to another file is not followed.
    std::fs::remove_file(&lpath).unwrap();
    std::fs::write(fx.p("outside/blob"), &good).unwrap();
    std::os::unix::fs::symlink(fx.p("outside/blob"), &lpath).unwrap();
    std::fs::remove_file(fx.p("outside/blob")).ok();
    assert!(matches!(fx.import(&dir), Err(ImageError::Refused(_))));
    fx.assert_clean();
}

#[test]
fn the_base_is_taken_from_the_manifest_annotations_only_when_it_is_a_digest() {
    use std::collections::BTreeMap;
    let d = format!("sha256:{}", "1f".repeat(32));
    let a = |pairs: &[(&str, &str)]| -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    };
    let bd = "org.opencontainers.image.base.digest";
    let bn = "org.opencontainers.image.base.name";
    assert_eq!(crate::oci::base_of(&a(&[(bd, &d)])), Some(d.clone()));
    assert_eq!(
        crate::oci::base_of(&a(&[(bd, &d), (bn, "docker.io/library/python:3.12-slim")])),
        Some(format!("docker.io/library/python:3.12-slim@{d}"))
    );
    // A name with a control character or space is left out; a non-digest is no base.
    assert_eq!(
        crate::oci::base_of(&a(&[(bd, &d), (bn, "x\x1b[2J y")])),
        Some(d.clone())
    );
    assert_eq!(crate::oci::base_of(&a(&[(bd, "latest")])), None);
    assert_eq!(crate::oci::base_of(&a(&[(bn, "python")])), None);
}

/// The SBOM lists what the image's dpkg status and Python distributions say is installed
/// (not what is only configured), and reads nothing through a symlink: a `python3.x` folder
/// that links out of the image, to a real folder of distributions, adds nothing. The same
/// image gives the same document; a changed image is refused, not described.
#[test]
fn the_sbom_lists_installed_packages_and_reads_nothing_through_a_symlink() {
    let fx = Fx::new();
    let src = fx.p("rootfs");
    let w = |rel: &str, text: &str| {
        let p = src.join(rel);
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(p, text).unwrap();
    };
    w(
        "etc/os-release",
        "PRETTY_NAME=\"Debian GNU/Linux 12\"\nID=debian\n",
    );
    w(
        "var/lib/dpkg/status",
        "Package: python3.11\nStatus: install ok installed\nArchitecture: amd64\nVersion: 3.11.2-6+deb12u1\n\n\
         Package: gone\nStatus: deinstall ok config-files\nArchitecture: amd64\nVersion: 1.0\n\n\
         Package: libc6\nStatus: install ok installed\nArchitecture: amd64\nVersion: 2.36-9+deb12u7\nDescription: GNU C\n two lines\n",
    );
    w(
        "usr/lib/python3/dist-packages/PyYAML-6.0.dist-info/METADATA",
        "Metadata-Version: 2.1\nName: PyYAML\nVersion: 6.0\n\nName: not-a-header\n",
    );
    w(
        "usr/local/lib/python3.11/site-packages/pandas-2.2.3.dist-info/METADATA",
        "Metadata-Version: 2.1\nName: pandas\nVersion: 2.2.3\n",
    );
    w(
        "usr/local/lib/python3.11/site-packages/broken.dist-info/METADATA",
        "Name: x\n",
    );
    // Outside the image, a folder of distributions the link below points to.
    let out = fx.p("elsewhere/site-packages/evil-9.9.dist-info");
    std::fs::create_dir_all(&out).unwrap();
    std::fs::write(out.join("METADATA"), "Name: evil\nVersion: 9.9\n").unwrap();
    std::os::unix::fs::symlink(fx.p("elsewhere"), src.join("usr/local/lib/python3.12")).unwrap();
    std::os::unix::fs::symlink(fx.p("elsewhere"), src.join("usr/lib/python3.13")).unwrap();

    let a = fx.import(&src).unwrap();
    let digest = a.record.digest.clone();
    let doc = fx.store.sbom(&digest).unwrap();
    assert_eq!(doc["bomFormat"], "CycloneDX");
    assert_eq!(doc["metadata"]["component"]["name"], digest.as_str());
    let purls: Vec<&str> = doc["components"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["purl"].as_str().unwrap())
        .collect();
    assert_eq!(
        purls,
        [
            "pkg:deb/debian/libc6@2.36-9%2Bdeb12u7?arch=amd64",
            "pkg:deb/debian/python3.11@3.11.2-6%2Bdeb12u1?arch=amd64",
            "pkg:pypi/pandas@2.2.3",
            "pkg:pypi/pyyaml@6.0",
        ]
    );
    assert_eq!(fx.store.sbom(&digest).unwrap(), doc, "deterministic");

    // A changed image is refused before it is described.
    let stored = fx.store.resolve(&digest).unwrap();
    std::fs::write(stored.join("var/lib/dpkg/status"), "Package: x\n").unwrap();
    assert!(
        matches!(fx.store.sbom(&digest), Err(ImageError::Changed { .. })),
        "a changed image must be refused"
    );
}

#[test]
fn a_build_layer_may_only_add_to_its_base() {
    let fx = Fx::new();
    let src = fx.p("base");
    std::fs::create_dir_all(src.join("usr/bin")).unwrap();
    std::fs::create_dir_all(src.join("usr/local")).unwrap();
    std::fs::write(src.join("usr/bin/python3"), b"the interpreter").unwrap();
    std::os::unix::fs::symlink("usr/bin", src.join("bin")).unwrap();
    let base = fx.import(&src).unwrap().record.digest;
    let images = || {
        std::fs::read_dir(fx.store.root().join("images"))
            .unwrap()
            .count()
    };
    let layer = |name: &str, entries: Vec<E<'_>>| {
        let p = fx.p(name);
        std::fs::write(&p, tarball(entries)).unwrap();
        p
    };

    // New files below existing directories (named again by the layer) are added.
    let ok = layer(
        "ok.tar",
        vec![
            E::Dir("usr/"),
            E::Dir("usr/local/"),
            E::Dir("usr/local/lib/"),
            E::File("usr/local/lib/pkg.py", b"VALUE = 1\n"),
        ],
    );
    let built = fx
        .store
        .build_on(&base, &ok, "test", &Limits::default())
        .unwrap();
    assert_eq!(built.record.kind, "build");
    assert_eq!(built.record.base.as_deref(), Some(base.as_str()));
    let root = fx.store.resolve(&built.record.digest).unwrap();
    assert_eq!(
        std::fs::read(root.join("usr/local/lib/pkg.py")).unwrap(),
        b"VALUE = 1\n"
    );
    assert_eq!(
        std::fs::read(root.join("usr/bin/python3")).unwrap(),
        b"the interpreter"
    );
    // The same layer again: the same image.
    let again = fx
        .store
        .build_on(&base, &ok, "test", &Limits::default())
        .unwrap();
    assert_eq!(again.record.digest, built.record.digest);
    assert!(again.already_present);
    assert_eq!(images(), 2);

    // Replacing a file of the base, a symlink over it, a directory over a symlink, and a
    // write through the base's symlink are each refused, with nothing stored.
    for (name, entries, want) in [
        (
            "replace.tar",
            vec![E::File("usr/bin/python3", b"evil")],
            "exists already",
        ),
        (
            "symlink.tar",
            vec![E::Sym("usr/bin/python3", "/tmp/evil")],
            "exists already",
        ),
        ("dir-over-link.tar", vec![E::Dir("bin/")], "exists already"),
        (
            "through-link.tar",
            vec![E::File("bin/new", b"x")],
            "symlink or not a directory",
        ),
        (
            "hardlink-to-base.tar",
            vec![E::Hard("usr/local/py", "usr/bin/python3")],
            "hard link",
        ),
    ] {
        let p = layer(name, entries);
        match fx.store.build_on(&base, &p, "test", &Limits::default()) {
            Err(ImageError::Refused(r)) => assert!(r.contains(want), "{name}: {r}"),
            other => panic!("{name}: expected a refusal, got {other:?}"),
        }
        assert_eq!(images(), 2, "{name}: nothing stored");
        assert_eq!(
            std::fs::read_dir(fx.store.root().join("tmp"))
                .unwrap()
                .count(),
            0,
            "{name}: staging left behind"
        );
    }

    // A base changed since it was stored refuses the build.
    let base_root = fx.store.resolve(&base).unwrap();
    std::fs::write(base_root.join("usr/bin/python3"), b"the interpreteR").unwrap();
    match fx.store.build_on(&base, &ok, "test", &Limits::default()) {
        Err(ImageError::Refused(r)) => assert!(r.contains("changed since it was stored"), "{r}"),
        other => panic!("expected a refusal, got {other:?}"),
    }
}
