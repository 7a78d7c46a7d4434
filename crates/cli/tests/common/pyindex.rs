//! What `agentjail image build` tests need: a base image with the host's Python and pip, a
//! local package index (PEP 503 simple pages served by Python's `http.server`, started by the
//! test inside its network namespace), and small wheels and source distributions made here.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

use sha2::Digest;

/// A root file system with the host's python3, its whole standard library (without
/// `__pycache__`), pip and setuptools from Debian's dist-packages, the libraries every
/// extension module links, the C++ runtime manylinux wheels expect, and `/bin/sh`: a base
/// `image build` can run pip on.
pub fn pip_base(d: &Path) -> PathBuf {
    let root = super::pyimage::python_rootfs(
        d,
        "import ssl, ctypes, lzma, bz2, zlib, decimal, pip._internal.cli.main",
    );
    let copy_tree = |src: &str| {
        let dest = root.join(src.trim_start_matches('/'));
        std::fs::create_dir_all(dest.parent().unwrap()).unwrap();
        let st = Command::new("cp")
            .args(["-a", "--no-preserve=ownership", src])
            .arg(&dest)
            .status()
            .unwrap();
        assert!(st.success(), "cp -a {src}");
    };
    let _ = std::fs::remove_dir_all(root.join("usr/lib/python3.11"));
    copy_tree("/usr/lib/python3.11");
    for p in ["pip", "setuptools", "pkg_resources", "_distutils_hack"] {
        let src = format!("/usr/lib/python3/dist-packages/{p}");
        if Path::new(&src).exists() {
            let _ = std::fs::remove_dir_all(root.join(src.trim_start_matches('/')));
            copy_tree(&src);
        }
    }
    let st = Command::new("find")
        .arg(&root)
        .args([
            "-name",
            "__pycache__",
            "-prune",
            "-exec",
            "rm",
            "-rf",
            "{}",
            "+",
        ])
        .status()
        .unwrap();
    assert!(st.success());
    // What manylinux wheels take from the system (PEP 599's list, the part pandas and numpy
    // link): the C library's pieces, the C++ runtime and libgcc, as any Debian base has them.
    for lib in [
        "/lib/x86_64-linux-gnu/libm.so.6",
        "/lib/x86_64-linux-gnu/libpthread.so.0",
        "/lib/x86_64-linux-gnu/libdl.so.2",
        "/lib/x86_64-linux-gnu/librt.so.1",
        "/usr/lib/x86_64-linux-gnu/libstdc++.so.6",
        "/usr/lib/x86_64-linux-gnu/libgcc_s.so.1",
    ] {
        super::pyimage::copy_in(&root, Path::new(lib));
    }
    for e in std::fs::read_dir("/usr/lib/python3.11/lib-dynload").unwrap() {
        let p = e.unwrap().path();
        let o = Command::new("ldd").arg(&p).output().unwrap();
        for l in String::from_utf8_lossy(&o.stdout).lines() {
            if let Some(lib) = l.split_whitespace().find(|w| w.starts_with('/')) {
                super::pyimage::copy_in(&root, Path::new(lib));
            }
        }
    }
    root
}

pub fn sha256_file(p: &Path) -> String {
    hex(&sha2::Sha256::digest(std::fs::read(p).unwrap()))
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

/// PEP 503's normalized name.
pub fn pep503(name: &str) -> String {
    let mut out = String::new();
    for c in name.to_lowercase().chars() {
        if matches!(c, '-' | '_' | '.') {
            if !out.ends_with('-') {
                out.push('-');
            }
        } else {
            out.push(c);
        }
    }
    out
}

/// Makes a pure-Python wheel `NAME-VERSION-py3-none-any.whl` in `dir` whose package `NAME`
/// has `__init__.py` = `init`.
pub fn wheel(dir: &Path, name: &str, version: &str, init: &str) -> PathBuf {
    let script = r#"
import base64, hashlib, sys, zipfile
d, name, version, init = sys.argv[1:5]
di = f"{name}-{version}.dist-info"
files = {
    f"{name}/__init__.py": init.encode(),
    f"{di}/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n".encode(),
    f"{di}/WHEEL": b"Wheel-Version: 1.0\nGenerator: agentjail-test\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
}
record = ""
for n, b in files.items():
    h = base64.urlsafe_b64encode(hashlib.sha256(b).digest()).rstrip(b"=").decode()
    record += f"{n},sha256={h},{len(b)}\n"
record += f"{di}/RECORD,,\n"
files[f"{di}/RECORD"] = record.encode()
path = f"{d}/{name}-{version}-py3-none-any.whl"
with zipfile.ZipFile(path, "w") as z:
    for n, b in files.items():
        info = zipfile.ZipInfo(n, date_time=(2020, 1, 1, 0, 0, 0))
        info.external_attr = 0o644 << 16
        z.writestr(info, b)
print(path)
"#;
    make(script, dir, [name, version, init])
}

/// Makes a source distribution `NAME-VERSION.tar.gz` in `dir` with the given `setup.py`.
pub fn sdist(dir: &Path, name: &str, version: &str, setup_py: &str) -> PathBuf {
    let script = r#"
import io, sys, tarfile
d, name, version, setup = sys.argv[1:5]
base = f"{name}-{version}"
path = f"{d}/{base}.tar.gz"
pkg_info = f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n"
with tarfile.open(path, "w:gz") as t:
    for n, body in [("setup.py", setup), ("PKG-INFO", pkg_info)]:
        b = body.encode()
        info = tarfile.TarInfo(f"{base}/{n}")
        info.size = len(b)
        t.addfile(info, io.BytesIO(b))
print(path)
"#;
    make(script, dir, [name, version, setup_py])
}

/// Runs the Python `script` with `dir` and `args`; the path it prints (the file it made).
fn make(script: &str, dir: &Path, args: [&str; 3]) -> PathBuf {
    let o = Command::new("python3")
        .args(["-c", script])
        .arg(dir)
        .args(args)
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    PathBuf::from(String::from_utf8_lossy(&o.stdout).trim())
}

/// A lock-file line for a distribution file: `name==version --hash=sha256:…`.
pub fn pin(name: &str, version: &str, file: &Path) -> String {
    format!("{name}=={version} --hash=sha256:{}\n", sha256_file(file))
}

/// A local package index: `DIR/simple/<project>/index.html` pages linking the files in
/// `DIR/files/`, served over HTTP on 127.0.0.1 by Python's `http.server` (in the caller's
/// network namespace). Killed on drop.
pub struct Index {
    pub port: u16,
    child: Child,
    log: PathBuf,
}

impl Index {
    /// Publishes `files` (wheels and sdists; the project is the file name's part before the
    /// first `-`) under `dir` and serves it.
    pub fn serve(dir: &Path, files: &[PathBuf]) -> Index {
        let files_dir = dir.join("files");
        std::fs::create_dir_all(&files_dir).unwrap();
        let mut projects: std::collections::BTreeMap<String, Vec<String>> = Default::default();
        for f in files {
            let name = f.file_name().unwrap().to_str().unwrap().to_owned();
            std::fs::copy(f, files_dir.join(&name)).unwrap();
            let project = pep503(name.split('-').next().unwrap());
            projects.entry(project).or_default().push(format!(
                "<a href=\"../../files/{name}#sha256={}\">{name}</a><br>",
                sha256_file(f)
            ));
        }
        for (p, links) in &projects {
            let d = dir.join("simple").join(p);
            std::fs::create_dir_all(&d).unwrap();
            std::fs::write(
                d.join("index.html"),
                format!(
                    "<!DOCTYPE html><html><body>{}</body></html>",
                    links.join("")
                ),
            )
            .unwrap();
        }
        let log = dir.join("requests.log");
        let script = "import functools, http.server, sys\n\
             h = functools.partial(http.server.SimpleHTTPRequestHandler, directory=sys.argv[1])\n\
             s = http.server.ThreadingHTTPServer(('127.0.0.1', 0), h)\n\
             print(s.server_address[1], flush=True)\n\
             s.serve_forever()\n";
        let mut child = Command::new("python3")
            .args(["-c", script])
            .arg(dir)
            .stdout(Stdio::piped())
            .stderr(std::fs::File::create(&log).unwrap())
            .spawn()
            .unwrap();
        let mut line = String::new();
        BufReader::new(child.stdout.take().unwrap())
            .read_line(&mut line)
            .unwrap();
        let port = line.trim().parse().expect("the index's port");
        Index { port, child, log }
    }

    /// Requests the index answered so far (one log line each).
    pub fn requests(&self) -> usize {
        std::fs::read_to_string(&self.log)
            .unwrap_or_default()
            .lines()
            .filter(|l| l.contains("\"GET "))
            .count()
    }
}

impl Drop for Index {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
