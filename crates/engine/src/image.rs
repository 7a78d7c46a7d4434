//! Identity of the default root file system: the host's system directories, bound read-only.
//!
//! The host image is not content-pinned (hashing all of /usr on every run would cost seconds),
//! so its identity is a digest over what describes it: the list of bound paths and symlinks,
//! the content of the small files that change whenever its software changes (the dynamic
//! loader cache, the OS release), and the size and modification time of the package database
//! (hashing dpkg's 600 KB status file cost ~0.5 ms, a tenth of a whole run; any package
//! install or removal rewrites it). The report and the receipt record it as `image`; a
//! manifest's `image_digest` must equal it. Two identical hosts therefore get different
//! identities: the host image identifies one machine's state, it does not pin content (that is
//! what digest-pinned images are for).

use sha2::{Digest, Sha256};

use crate::plan::Plan;

/// Small files whose content identifies the host's installed software.
const IDENTITY_FILES: &[&str] = &["/etc/ld.so.cache", "/usr/lib/os-release"];
/// Package databases, identified by size and modification time.
const PACKAGE_DBS: &[&str] = &[
    "/var/lib/dpkg/status",
    "/var/lib/rpm/rpmdb.sqlite",
    "/lib/apk/db/installed",
];

/// `sha256:<hex>` identity of the host image.
pub fn host_image_identity() -> String {
    let mut h = Sha256::new();
    h.update(b"agentjail.host-image/v1\n");
    for p in Plan::image_description() {
        h.update(p.as_bytes());
        h.update(b"\n");
    }
    for f in IDENTITY_FILES {
        match std::fs::read(f) {
            Ok(bytes) => {
                h.update(format!("{f} {}\n", agentjail_manifest::sha256_digest(&bytes)).as_bytes())
            }
            Err(_) => h.update(format!("{f} absent\n").as_bytes()),
        }
    }
    for f in PACKAGE_DBS {
        use std::os::unix::fs::MetadataExt;
        match std::fs::metadata(f) {
            Ok(m) => h.update(
                format!(
                    "{f} size={} mtime={}.{:09}\n",
                    m.len(),
                    m.mtime(),
                    m.mtime_nsec()
                )
                .as_bytes(),
            ),
            Err(_) => h.update(format!("{f} absent\n").as_bytes()),
        }
    }
    format!("sha256:{}", agentjail_manifest::hex(&h.finalize()))
}
