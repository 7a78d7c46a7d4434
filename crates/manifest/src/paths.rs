//! Paths checked before a run: sandbox paths (mount points, the output) normalized, with
//! anything that could mean another place refused; input mounts kept below /input or /work and
//! apart from each other; host sources (inputs, the output schema) resolved under a
//! [`SourcePolicy`].

use std::path::{Component, Path, PathBuf};

use crate::bounds;

/// Where the sources of inputs (and the output schema) may come from.
#[derive(Debug, Clone)]
pub struct SourcePolicy {
    /// Relative sources are resolved against this folder (the manifest's folder).
    pub base_dir: PathBuf,
    /// After resolving symlinks, a source must lie below one of these (canonical) folders.
    /// `None` means any host path (the CLI's `--ro` flags: the caller names paths itself).
    pub roots: Option<Vec<PathBuf>>,
}

/// Why a sandbox path (a mount point, the output) is refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SandboxPathError {
    #[error("{0:?} is not an absolute path")]
    NotAbsolute(String),
    #[error("path is too long")]
    TooLong,
    #[error("{0:?} contains a control character")]
    ControlCharacter(String),
    #[error("{path:?} contains a `{component}` component")]
    DotComponent { path: String, component: String },
    #[error("the sandbox root cannot be a mount point")]
    Root,
}

/// Why a host source (an input, the output schema) is refused.
#[derive(Debug, thiserror::Error)]
pub(crate) enum SourceError {
    #[error("empty or contains a NUL byte")]
    EmptyOrNul,
    #[error("{given}: {error}")]
    Canonicalize {
        given: String,
        #[source]
        error: std::io::Error,
    },
    #[error("{given} resolves to {}, outside the allowed source folder(s) {allowed}; hint: pass --source-root DIR to allow another folder", .resolved.display())]
    Outside {
        given: String,
        resolved: PathBuf,
        allowed: String,
    },
    #[error("{given}: unexpected `..` after resolution")]
    DotDot { given: String },
}

/// Normalizes an absolute sandbox path: refuses `..`, `.`, empty components after the root,
/// control characters and overlong paths, and returns it without a trailing slash.
pub fn normalize_sandbox_path(p: &str) -> Result<String, SandboxPathError> {
    if !p.starts_with('/') {
        return Err(SandboxPathError::NotAbsolute(p.to_string()));
    }
    if p.len() > bounds::MAX_PATH {
        return Err(SandboxPathError::TooLong);
    }
    if p.chars().any(|c| c.is_control()) {
        return Err(SandboxPathError::ControlCharacter(p.to_string()));
    }
    let mut out = String::new();
    for comp in p.split('/').filter(|c| !c.is_empty()) {
        if comp == ".." || comp == "." {
            return Err(SandboxPathError::DotComponent {
                path: p.to_string(),
                component: comp.to_string(),
            });
        }
        out.push('/');
        out.push_str(comp);
    }
    if out.is_empty() {
        return Err(SandboxPathError::Root);
    }
    Ok(out)
}

/// True when `p` lies strictly below `dir` (both normalized).
pub(crate) fn under(p: &str, dir: &str) -> bool {
    p.len() > dir.len() && p.starts_with(dir) && p.as_bytes()[dir.len()] == b'/'
}

pub(crate) fn resolve_source(source: &str, policy: &SourcePolicy) -> Result<PathBuf, SourceError> {
    if source.is_empty() || source.contains('\0') {
        return Err(SourceError::EmptyOrNul);
    }
    let raw = Path::new(source);
    let joined = if raw.is_absolute() {
        raw.to_path_buf()
    } else {
        policy.base_dir.join(raw)
    };
    let canon = joined
        .canonicalize()
        .map_err(|error| SourceError::Canonicalize {
            given: source.to_string(),
            error,
        })?;
    if let Some(roots) = &policy.roots
        && !roots.iter().any(|r| canon.starts_with(r))
    {
        let allowed: Vec<String> = roots.iter().map(|r| r.display().to_string()).collect();
        return Err(SourceError::Outside {
            given: source.to_string(),
            resolved: canon,
            allowed: allowed.join(", "),
        });
    }
    // Reject paths whose components could confuse mount handling later.
    if canon
        .components()
        .any(|c| matches!(c, Component::ParentDir))
    {
        return Err(SourceError::DotDot {
            given: source.to_string(),
        });
    }
    Ok(canon)
}

/// An input's mount (a host or an inline input), normalized: below /input or /work, and
/// overlapping none of `taken`.
pub(crate) fn input_mount(mount: &str, taken: &[String]) -> Result<String, String> {
    let mount = normalize_sandbox_path(mount).map_err(|r| r.to_string())?;
    if !(under(&mount, "/input") || under(&mount, "/work")) {
        return Err(if mount == "/input" || mount == "/work" {
            "must name a path below /input or /work, not the folder itself".to_string()
        } else if under(&mount, "/output") || mount == "/output" {
            "inputs cannot be mounted under /output, which holds only what the command writes"
                .to_string()
        } else {
            format!("{mount} is outside /input and /work")
        });
    }
    for other in taken {
        if mount == *other || under(&mount, other) || under(other, &mount) {
            return Err(format!("{mount} overlaps the input mounted at {other}"));
        }
    }
    Ok(mount)
}
