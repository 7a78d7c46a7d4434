//! The development token of `agentjail serve` without `--config`: kept in
//! `DATA/private/dev-token` so that a saved client configuration (an MCP client's, a script's)
//! keeps working across restarts; deleting the file is how an operator rotates it.
//!
//! The file is created atomically (written under a temporary name with mode 0600, then
//! hard-linked into place, so a reader never sees half a token and two starts never replace
//! each other's) and read back only when it is a regular file (not a symlink), owned by the
//! user running the service, with no permission for group or others, and holding one token.
//! Anything else is refused, fail closed: a token that others could have read, or that another
//! user wrote, must not be accepted as this operator's, and silently replacing it would break
//! the saved configuration without saying why. The message names the file and the fix (delete
//! it); the service then shows no token and does not start.

use std::io::{Read, Write};
use std::os::unix::fs::{MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

use crate::app::ServerError;
use crate::util::random_hex;

/// The token file's name, in the data directory's `private` folder.
pub const FILE: &str = "dev-token";

/// The token in `DATA/private/dev-token`, created when missing; and the file's path.
pub(crate) fn load_or_create(data_dir: &Path) -> Result<(String, PathBuf), ServerError> {
    let private = data_dir.join("private");
    let io = |what: &str, p: &Path, e: std::io::Error| {
        ServerError::Io(format!("{what} {}: {e}", p.display()))
    };
    std::fs::create_dir_all(&private).map_err(|e| io("cannot create", &private, e))?;
    std::fs::set_permissions(&private, std::fs::Permissions::from_mode(0o700))
        .map_err(|e| io("cannot set permissions of", &private, e))?;
    let path = private.join(FILE);
    // Twice at most: when another start created the file between our read and our link.
    for _ in 0..2 {
        if let Some(t) = read(&path)? {
            return Ok((t, path));
        }
        if create(&private, &path)? {
            break;
        }
    }
    match read(&path)? {
        Some(t) => Ok((t, path)),
        None => Err(ServerError::Io(format!(
            "cannot create the dev token file {}",
            path.display()
        ))),
    }
}

fn refuse(path: &Path, why: &str) -> ServerError {
    ServerError::Io(format!(
        "refusing to start: the dev token file {} {why}; delete it (`rm {}`) and start again for a new token",
        path.display(),
        path.display()
    ))
}

/// The token in `path`; None when there is no file.
fn read(path: &Path) -> Result<Option<String>, ServerError> {
    let f = match std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(rustix::fs::OFlags::NOFOLLOW.bits() as i32)
        .open(path)
    {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) if e.raw_os_error() == Some(rustix::io::Errno::LOOP.raw_os_error()) => {
            return Err(refuse(path, "is a symbolic link"));
        }
        Err(e) => {
            return Err(ServerError::Io(format!(
                "cannot read the dev token file {}: {e}",
                path.display()
            )));
        }
    };
    let m = f
        .metadata()
        .map_err(|e| ServerError::Io(format!("cannot stat {}: {e}", path.display())))?;
    if !m.is_file() {
        return Err(refuse(path, "is not a regular file"));
    }
    let me = rustix::process::geteuid().as_raw();
    if m.uid() != me {
        return Err(refuse(
            path,
            &format!("belongs to uid {}, not to uid {me} running serve", m.uid()),
        ));
    }
    if m.mode() & 0o077 != 0 {
        return Err(refuse(
            path,
            &format!(
                "may be read or written by its group or others (mode {:04o}), so the token in it may be known to them",
                m.mode() & 0o7777
            ),
        ));
    }
    let mut text = String::new();
    f.take(256)
        .read_to_string(&mut text)
        .map_err(|_| refuse(path, "does not hold a dev token"))?;
    let t = text.trim();
    let ok = t.len() == 68
        && t.starts_with("ajt_")
        && t[4..]
            .bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b));
    if !ok {
        return Err(refuse(
            path,
            "does not hold a dev token (`ajt_` and 64 lower-case hex digits)",
        ));
    }
    Ok(Some(t.to_string()))
}

/// Creates `path` with a new token; false when another process created it first.
fn create(private: &Path, path: &Path) -> Result<bool, ServerError> {
    let io = |what: &str, p: &Path, e: std::io::Error| {
        ServerError::Io(format!("{what} {}: {e}", p.display()))
    };
    let token = format!(
        "ajt_{}",
        random_hex(32).map_err(|e| ServerError::Io(e.to_string()))?
    );
    let tmp = private.join(format!(
        ".{FILE}.{}.{}",
        std::process::id(),
        random_hex(4).map_err(|e| ServerError::Io(e.to_string()))?
    ));
    let written = (|| {
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .custom_flags(rustix::fs::OFlags::NOFOLLOW.bits() as i32)
            .open(&tmp)?;
        // The umask cannot widen 0600, but a narrower one would leave 0400 etc.: set it.
        f.set_permissions(std::fs::Permissions::from_mode(0o600))?;
        f.write_all(format!("{token}\n").as_bytes())?;
        f.sync_all()?;
        Ok::<(), std::io::Error>(())
    })();
    if let Err(e) = written {
        let _ = std::fs::remove_file(&tmp);
        return Err(io("cannot write", &tmp, e));
    }
    // link(2) never replaces an existing file: the first start to get here wins.
    let linked = std::fs::hard_link(&tmp, path);
    let _ = std::fs::remove_file(&tmp);
    match linked {
        Ok(()) => {
            if let Ok(d) = std::fs::File::open(private) {
                let _ = d.sync_all();
            }
            Ok(true)
        }
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => Ok(false),
        Err(e) => Err(io("cannot create", path, e)),
    }
}
