#!/usr/bin/env bash
# ci/release/oci-layout.sh BINARY VERSION COMMIT EPOCH OUT.tar [BASE.tar]
# Writes an OCI image layout (image-spec v1.1) of agentjail itself, as a tar, without a
# container daemon: the image deploy/kubernetes runs (docs/deploy.md, "The image").
#
#   layer 1 (with BASE.tar): a root file system, here Debian 12 minbase + python3 made by
#           ci/release/debian-root.sh: /bin/sh for the pods' cgroup entrypoint, and python3,
#           what the example task types run (in the native tier the container's /usr is the
#           sandbox's host image). Written without device nodes and FIFOs (the container
#           runtime makes /dev), without setuid/setgid bits and without extended attributes
#           (file capabilities): nothing in the image can raise a process's privileges. Nor
#           manuals, translations, documentation (licences stay) or apt's caches.
#   layer 2: /usr/local/bin/agentjail, the static musl binary.
#
# Its config (entrypoint the binary, linux/amd64), manifest, and index.json naming it
# `VERSION`. The bytes depend only on the inputs (the base's entries in its own order, every
# mtime EPOCH, the binary's entries owned 0:0, gzip without a timestamp), so the image digest is
# reproducible for the same base tarball. Prints the image (manifest) digest on stdout.
set -euo pipefail
[ $# -eq 5 ] || [ $# -eq 6 ] || { echo "usage: $0 BINARY VERSION COMMIT EPOCH OUT.tar [BASE.tar]" >&2; exit 2; }
exec python3 - "$@" <<'EOF'
import gzip, hashlib, io, json, os, sys, tarfile, tempfile
binary, version, commit, epoch, out = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]), sys.argv[5]
base = sys.argv[6] if len(sys.argv) > 6 else None

def canon(v):
    return json.dumps(v, sort_keys=True, separators=(",", ":")).encode()

def tar_bytes(entries):
    """entries: (path, data or None for a directory, mode)."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as t:
        for path, data, mode in entries:
            ti = tarfile.TarInfo(path)
            ti.mtime, ti.uid, ti.gid, ti.uname, ti.gname, ti.mode = epoch, 0, 0, "", "", mode
            if data is None:
                ti.type = tarfile.DIRTYPE
                t.addfile(ti)
            else:
                ti.size = len(data)
                t.addfile(ti, io.BytesIO(data))
    return buf.getvalue()

# Left out of the base, as Debian's -slim images do (the licences, */copyright, stay): manuals,
# translations, documentation, apt's caches and lists. The directories stay, so dpkg and apt
# still work in an image built FROM this one.
SLIM = ("usr/share/man/", "usr/share/info/", "usr/share/locale/", "usr/share/doc/",
        "var/cache/apt/", "var/lib/apt/lists/")

def base_tar(path):
    """The base root file system as a layer: its entries in their own order (a hard link
    follows its target), names without "./", every mtime EPOCH, no device nodes or FIFOs, no
    setuid/setgid bits, no extended attributes or other PAX records."""
    buf = io.BytesIO()
    kept = dropped = slimmed = 0
    with tarfile.open(path) as src, tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as t:
        for m in src:
            name = m.name[2:] if m.name.startswith("./") else m.name
            name = name.rstrip("/")
            if name in ("", "."):
                continue
            if m.ischr() or m.isblk() or m.isfifo():
                dropped += 1
                continue
            if not m.isdir() and name.startswith(SLIM) and not name.endswith("/copyright"):
                slimmed += 1
                continue
            ti = tarfile.TarInfo(name)
            ti.type, ti.size, ti.uid, ti.gid, ti.uname, ti.gname = m.type, m.size, m.uid, m.gid, "", ""
            ti.mode = m.mode & ~0o6000
            ti.mtime = epoch
            if m.issym() or m.islnk():
                ti.linkname = m.linkname[2:] if m.islnk() and m.linkname.startswith("./") else m.linkname
            t.addfile(ti, src.extractfile(m) if m.isreg() else None)
            kept += 1
    print(f"oci-layout: base layer from {path}: {kept} entries, {dropped} device nodes/FIFOs "
          f"dropped, {slimmed} documentation and package-cache files left out",
          file=sys.stderr)
    return buf.getvalue()

def gzipped(data):
    gz = io.BytesIO()
    with gzip.GzipFile(fileobj=gz, mode="wb", compresslevel=9, mtime=0) as g:
        g.write(data)
    return gz.getvalue()

with open(binary, "rb") as f:
    exe = f.read()
layer_tars = [base_tar(base)] if base else []
layer_tars.append(tar_bytes([("usr", None, 0o755), ("usr/local", None, 0o755),
                             ("usr/local/bin", None, 0o755), ("usr/local/bin/agentjail", exe, 0o755)]))
layers = [gzipped(lt) for lt in layer_tars]
created = __import__("datetime").datetime.fromtimestamp(epoch, __import__("datetime").timezone.utc) \
    .strftime("%Y-%m-%dT%H:%M:%SZ")
labels = {
    "org.opencontainers.image.title": "agentjail",
    "org.opencontainers.image.version": version,
    "org.opencontainers.image.revision": commit,
    "org.opencontainers.image.licenses": "Apache-2.0",
}
config = canon({
    "architecture": "amd64", "os": "linux", "created": created,
    "config": {"Entrypoint": ["/usr/local/bin/agentjail"], "Cmd": ["--help"], "Labels": labels,
               "Env": ["PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"]},
    "rootfs": {"type": "layers",
               "diff_ids": ["sha256:" + hashlib.sha256(lt).hexdigest() for lt in layer_tars]},
    "history": ([{"created": created, "created_by": "ci/release/debian-root.sh (mmdebstrap)"}] if base else [])
               + [{"created": created, "created_by": "ci/release/oci-layout.sh"}],
})
def desc(media, data, **extra):
    d = {"mediaType": media, "digest": "sha256:" + hashlib.sha256(data).hexdigest(), "size": len(data)}
    d.update(extra)
    return d
manifest = canon({
    "schemaVersion": 2,
    "mediaType": "application/vnd.oci.image.manifest.v1+json",
    "config": desc("application/vnd.oci.image.config.v1+json", config),
    "layers": [desc("application/vnd.oci.image.layer.v1.tar+gzip", l) for l in layers],
    "annotations": labels,
})
index = canon({
    "schemaVersion": 2,
    "mediaType": "application/vnd.oci.image.index.v1+json",
    "manifests": [desc("application/vnd.oci.image.manifest.v1+json", manifest,
                       platform={"architecture": "amd64", "os": "linux"},
                       annotations={"org.opencontainers.image.ref.name": version})],
})
blobs = sorted({hashlib.sha256(b).hexdigest(): b for b in (*layers, config, manifest)}.items())
entries = [("blobs", None, 0o755), ("blobs/sha256", None, 0o755)]
entries += [("blobs/sha256/" + h, b, 0o644) for h, b in blobs]
entries += [("index.json", index, 0o644),
            ("oci-layout", canon({"imageLayoutVersion": "1.0.0"}), 0o644)]
with open(out, "wb") as f:
    f.write(tar_bytes(entries))
print("sha256:" + hashlib.sha256(manifest).hexdigest())
EOF
