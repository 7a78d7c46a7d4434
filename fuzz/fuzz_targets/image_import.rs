//! The image importer on an untrusted file (`agentjail image import FILE`): a tar (plain, or
//! gzip/zstd compressed) of a root file system or of an OCI image layout, with its index and
//! manifest JSON, digests and layers. The extractor must stay inside its root whatever the
//! archive says; every import here goes to a fresh store under a fresh folder.
#![no_main]

use agentjail_image::{Limits, Store};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(dir) = tempfile::Builder::new().prefix("agentjail-fuzz-").tempdir() else {
        return;
    };
    let src = dir.path().join("image.tar");
    if std::fs::write(&src, data).is_err() {
        return;
    }
    let limits = Limits {
        max_entries: 2_000,
        max_file_bytes: 1 << 20,
        max_total_bytes: 8 << 20,
        max_archive_bytes: 16 << 20,
        max_blob_bytes: 16 << 20,
        ..Limits::default()
    };
    let store = Store::at(Some(&dir.path().join("store")));
    let _ = store.import(&src, &limits);
    // Nothing outside the folder: the extractor's root is the only place it writes.
    let outside = dir.path().parent().map(|p| p.join("agentjail-fuzz-escape"));
    if let Some(o) = outside {
        assert!(
            !o.exists(),
            "an archive wrote outside its root: {}",
            o.display()
        );
    }
});
