//! The signing key of receipts: an Ed25519 key in a PKCS#8 PEM file, created on first use with
//! mode 0600 in a 0700 folder, refused when readable by others or not owned by the current
//! user; its default place; signers' public keys in SPKI PEM form. The key id is the hex
//! sha256 of the raw 32-byte public key.

use std::io::{Read, Write};
use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use ed25519_dalek::pkcs8::{DecodePrivateKey, DecodePublicKey, EncodePrivateKey, EncodePublicKey};
use ed25519_dalek::{SigningKey, VerifyingKey};
use sha2::{Digest, Sha256};

use super::ReceiptError;

/// Largest key file or PEM text accepted.
const MAX_KEY_FILE_BYTES: u64 = 16 * 1024;

/// The signing key of receipts.
pub struct ReceiptKey {
    pub(super) key: SigningKey,
}

impl std::fmt::Debug for ReceiptKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ReceiptKey")
            .field("keyid", &self.keyid())
            .finish_non_exhaustive()
    }
}

/// `$XDG_DATA_HOME/agentjail/receipt-key.pem`, else `$HOME/.local/share/agentjail/receipt-key.pem`
/// (relative or empty variables are ignored, as the XDG spec says).
pub fn default_key_path() -> PathBuf {
    key_path_from(std::env::var_os("XDG_DATA_HOME"), std::env::var_os("HOME"))
}

pub(super) fn key_path_from(
    xdg: Option<std::ffi::OsString>,
    home: Option<std::ffi::OsString>,
) -> PathBuf {
    let abs = |v: Option<std::ffi::OsString>| v.map(PathBuf::from).filter(|p| p.is_absolute());
    let base = abs(xdg)
        .or_else(|| abs(home).map(|h| h.join(".local/share")))
        .unwrap_or_else(|| PathBuf::from("/nonexistent/.local/share"));
    base.join("agentjail").join("receipt-key.pem")
}

impl ReceiptKey {
    /// A new random key (not stored).
    pub fn generate() -> Result<ReceiptKey, ReceiptError> {
        let mut seed = [0u8; 32];
        getrandom::fill(&mut seed).map_err(|e| ReceiptError::Random(e.to_string()))?;
        let key = SigningKey::from_bytes(&seed);
        seed.fill(0);
        Ok(ReceiptKey { key })
    }

    /// Loads the key at `path`, creating it (mode 0600, parent folders 0700) when absent.
    pub fn load_or_create(path: &Path) -> Result<ReceiptKey, ReceiptError> {
        let io = |source| ReceiptError::KeyIo {
            path: path.to_owned(),
            source,
        };
        match std::fs::symlink_metadata(path) {
            Ok(_) => return ReceiptKey::load(path),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(io(e)),
        }
        if let Some(parent) = path.parent().filter(|p| !p.as_os_str().is_empty()) {
            std::fs::DirBuilder::new()
                .recursive(true)
                .mode(0o700)
                .create(parent)
                .map_err(io)?;
        }
        let key = ReceiptKey::generate()?;
        let pem = key
            .key
            .to_pkcs8_pem(ed25519_dalek::pkcs8::spki::der::pem::LineEnding::LF)
            .map_err(|e| ReceiptError::Encoding(e.to_string()))?;
        let mut f = match std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .custom_flags(rustix::fs::OFlags::NOFOLLOW.bits() as i32)
            .open(path)
        {
            Ok(f) => f,
            // Created by someone else meanwhile: load (and check) that one.
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
                return ReceiptKey::load(path);
            }
            Err(e) => return Err(io(e)),
        };
        f.write_all(pem.as_bytes()).map_err(io)?;
        f.sync_all().map_err(io)?;
        Ok(key)
    }

    /// Loads an existing key file, refusing one that is not a regular file owned by the current
    /// user with no group/other permission bits.
    pub fn load(path: &Path) -> Result<ReceiptKey, ReceiptError> {
        let io = |source| ReceiptError::KeyIo {
            path: path.to_owned(),
            source,
        };
        let f = std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(
                (rustix::fs::OFlags::NOFOLLOW | rustix::fs::OFlags::NONBLOCK).bits() as i32,
            )
            .open(path)
            .map_err(|e| {
                if e.raw_os_error() == Some(rustix::io::Errno::LOOP.raw_os_error()) {
                    ReceiptError::KeyNotRegularFile {
                        path: path.to_owned(),
                    }
                } else {
                    io(e)
                }
            })?;
        let meta = f.metadata().map_err(io)?;
        if !meta.is_file() {
            return Err(ReceiptError::KeyNotRegularFile {
                path: path.to_owned(),
            });
        }
        let uid = rustix::process::geteuid().as_raw();
        if meta.uid() != uid {
            return Err(ReceiptError::KeyOwner {
                path: path.to_owned(),
                owner: meta.uid(),
                uid,
            });
        }
        if meta.mode() & 0o077 != 0 {
            return Err(ReceiptError::KeyPermissions {
                path: path.to_owned(),
                mode: meta.mode() & 0o7777,
            });
        }
        let mut pem = String::new();
        f.take(MAX_KEY_FILE_BYTES)
            .read_to_string(&mut pem)
            .map_err(|_| ReceiptError::KeyFormat {
                path: path.to_owned(),
            })?;
        let key = SigningKey::from_pkcs8_pem(&pem).map_err(|_| ReceiptError::KeyFormat {
            path: path.to_owned(),
        })?;
        Ok(ReceiptKey { key })
    }

    /// The public key as SPKI PEM (`-----BEGIN PUBLIC KEY-----`).
    pub fn public_key_pem(&self) -> String {
        self.key
            .verifying_key()
            .to_public_key_pem(ed25519_dalek::pkcs8::spki::der::pem::LineEnding::LF)
            .unwrap_or_default()
    }

    /// Hex sha256 of the raw 32-byte public key.
    pub fn keyid(&self) -> String {
        keyid_of(&self.key.verifying_key())
    }

    /// The public half.
    pub fn verifying_key(&self) -> VerifyingKey {
        self.key.verifying_key()
    }
}

pub(super) fn keyid_of(k: &VerifyingKey) -> String {
    agentjail_manifest::hex(&Sha256::digest(k.as_bytes()))
}

/// Parses an SPKI PEM Ed25519 public key.
pub fn parse_public_key_pem(pem: &str) -> Result<VerifyingKey, ReceiptError> {
    if pem.len() > MAX_KEY_FILE_BYTES as usize {
        return Err(ReceiptError::PublicKeyFormat);
    }
    VerifyingKey::from_public_key_pem(pem.trim()).map_err(|_| ReceiptError::PublicKeyFormat)
}
