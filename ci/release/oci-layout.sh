#!/usr/bin/env bash
# ci/release/oci-layout.sh BINARY VERSION COMMIT EPOCH OUT.tar
# Writes an OCI image layout (image-spec v1.1) of agentjail itself, as a tar, without a
# container daemon: one gzip layer holding only /usr/local/bin/agentjail (the static musl
# binary needs no libc, no shell, no /etc), its config (entrypoint the binary, linux/amd64) and
# manifest, and index.json naming it `VERSION`. The bytes depend only on the inputs (sorted
# entries, owner 0:0, every mtime EPOCH, gzip without a timestamp), so the image digest is
# reproducible. Prints the image (manifest) digest on stdout.
set -euo pipefail
[ $# -eq 5 ] || { echo "usage: $0 BINARY VERSION COMMIT EPOCH OUT.tar" >&2; exit 2; }
exec python3 - "$@" <<'EOF'
import gzip, hashlib, io, json, os, sys, tarfile, tempfile
binary, version, commit, epoch, out = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]), sys.argv[5]

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

with open(binary, "rb") as f:
    exe = f.read()
layer_tar = tar_bytes([("usr", None, 0o755), ("usr/local", None, 0o755),
                       ("usr/local/bin", None, 0o755), ("usr/local/bin/agentjail", exe, 0o755)])
gz = io.BytesIO()
with gzip.GzipFile(fileobj=gz, mode="wb", compresslevel=9, mtime=0) as g:
    g.write(layer_tar)
layer = gz.getvalue()
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
    "config": {"Entrypoint": ["/usr/local/bin/agentjail"], "Cmd": ["--help"], "Labels": labels},
    "rootfs": {"type": "layers", "diff_ids": ["sha256:" + hashlib.sha256(layer_tar).hexdigest()]},
    "history": [{"created": created, "created_by": "ci/release/oci-layout.sh"}],
})
def desc(media, data, **extra):
    d = {"mediaType": media, "digest": "sha256:" + hashlib.sha256(data).hexdigest(), "size": len(data)}
    d.update(extra)
    return d
manifest = canon({
    "schemaVersion": 2,
    "mediaType": "application/vnd.oci.image.manifest.v1+json",
    "config": desc("application/vnd.oci.image.config.v1+json", config),
    "layers": [desc("application/vnd.oci.image.layer.v1.tar+gzip", layer)],
    "annotations": labels,
})
index = canon({
    "schemaVersion": 2,
    "mediaType": "application/vnd.oci.image.index.v1+json",
    "manifests": [desc("application/vnd.oci.image.manifest.v1+json", manifest,
                       platform={"architecture": "amd64", "os": "linux"},
                       annotations={"org.opencontainers.image.ref.name": version})],
})
blobs = sorted({hashlib.sha256(b).hexdigest(): b for b in (layer, config, manifest)}.items())
entries = [("blobs", None, 0o755), ("blobs/sha256", None, 0o755)]
entries += [("blobs/sha256/" + h, b, 0o644) for h, b in blobs]
entries += [("index.json", index, 0o644),
            ("oci-layout", canon({"imageLayoutVersion": "1.0.0"}), 0o644)]
with open(out, "wb") as f:
    f.write(tar_bytes(entries))
print("sha256:" + hashlib.sha256(manifest).hexdigest())
EOF
