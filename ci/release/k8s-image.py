#!/usr/bin/env python3
"""deploy/kubernetes and the image it runs (docs/deploy.md, "The image").

  k8s-image.py pin SRC_DIR DIGEST EPOCH OUT.tar
      SRC_DIR (deploy/kubernetes) as a tar whose entries sit under `agentjail-kubernetes/`, with
      the kustomization's image digest set to DIGEST: what ci/release/build.sh ships as
      agentjail-kubernetes.tar. Sorted entries, owner 0:0, every mtime EPOCH: reproducible.

  k8s-image.py check DIR [LAYOUT.tar]
      The image reference of the manifests in DIR (called by ci/validate-k8s.sh on the
      repository's folder, and by ci/release/check.sh on the release's, with its OCI layout):
      - kustomization.yaml's `images:` has exactly one entry, naming the image by digest
        (`sha256:` and 64 hex digits; in the repository the placeholder PLACEHOLDER, which the
        release build replaces), with no tag;
      - every container of every workload names exactly that image (so kustomize pins each);
      - with LAYOUT.tar: the digest is the layout's image manifest digest, every blob matches
        its digest, and the image's files hold what the pods run: the programs their commands
        start, `/usr/local/bin/agentjail`, and the first word of each task type's command in the
        ConfigMap (in the native tier the container's /usr is the sandbox's host image).
Exit 1 with one line per problem.
"""

import gzip
import hashlib
import io
import json
import os
import posixpath
import re
import sys
import tarfile
import tomllib

import yaml

PLACEHOLDER = "sha256:RELEASE-DIGEST"
DIGEST = re.compile(r"^sha256:[0-9a-f]{64}$")
WORKLOADS = {"StatefulSet", "Deployment", "DaemonSet", "Job", "CronJob", "Pod"}


def kustomization_images(d):
    with open(os.path.join(d, "kustomization.yaml")) as f:
        return yaml.safe_load(f).get("images") or []


def pin(src, digest, epoch, out):
    if not DIGEST.match(digest):
        sys.exit(f"k8s-image: {digest!r} is not a sha256 digest")
    path = os.path.join(src, "kustomization.yaml")
    text = open(path).read()
    if text.count(f"digest: {PLACEHOLDER}") != 1:
        sys.exit(f"k8s-image: {path} has no single `digest: {PLACEHOLDER}` line to pin")
    files = []
    for root, dirs, names in os.walk(src):
        dirs.sort()
        for n in sorted(names):
            if n.endswith((".pyc",)) or "__pycache__" in root:
                continue
            files.append(os.path.relpath(os.path.join(root, n), src))
    with tarfile.open(out, "w", format=tarfile.PAX_FORMAT) as t:
        seen_dirs = set()
        for rel in files:
            parts = rel.split(os.sep)
            for i in range(len(parts)):
                d = "/".join(["agentjail-kubernetes"] + parts[:i])
                if d not in seen_dirs:
                    seen_dirs.add(d)
                    ti = tarfile.TarInfo(d)
                    ti.type, ti.mode, ti.mtime = tarfile.DIRTYPE, 0o755, epoch
                    t.addfile(ti)
            full = os.path.join(src, rel)
            data = open(full, "rb").read()
            if rel == "kustomization.yaml":
                data = text.replace(f"digest: {PLACEHOLDER}", f"digest: {digest}").encode()
            ti = tarfile.TarInfo("agentjail-kubernetes/" + "/".join(parts))
            ti.size, ti.mtime = len(data), epoch
            ti.mode = 0o755 if os.access(full, os.X_OK) else 0o644
            t.addfile(ti, io.BytesIO(data))


class Layout:
    """An OCI image layout tar: its image manifest digest and the files of its layers."""

    def __init__(self, path):
        self.tar = tarfile.open(path)
        self.errors = []
        index = json.loads(self.blob_raw("index.json"))
        mans = index.get("manifests", [])
        if len(mans) != 1:
            self.errors.append(f"{path}: index.json lists {len(mans)} manifests, expected 1")
        self.digest = mans[0]["digest"] if mans else None
        manifest = json.loads(self.blob(self.digest))
        self.config = json.loads(self.blob(manifest["config"]["digest"]))
        self.entries = {}  # path -> (type, linkname)
        for layer in manifest["layers"]:
            data = self.blob(layer["digest"])
            if layer["mediaType"].endswith("+gzip"):
                data = gzip.decompress(data)
            with tarfile.open(fileobj=io.BytesIO(data)) as lt:
                for m in lt:
                    name = posixpath.normpath("/" + m.name)
                    base = posixpath.basename(name)
                    if base.startswith(".wh."):
                        self.entries.pop(posixpath.join(posixpath.dirname(name), base[4:]), None)
                        continue
                    self.entries[name] = (m, m.linkname)

    def blob_raw(self, name):
        return self.tar.extractfile(name).read()

    def blob(self, digest):
        data = self.blob_raw("blobs/sha256/" + digest.split(":", 1)[1])
        if "sha256:" + hashlib.sha256(data).hexdigest() != digest:
            self.errors.append(f"blob {digest} does not match its digest")
        return data

    def resolve(self, path, depth=0):
        """The entry `path` names, following symbolic links (in the image's own root)."""
        if depth > 40:
            return None
        parts = [p for p in path.split("/") if p]
        cur = "/"
        for i, p in enumerate(parts):
            cur = posixpath.join(cur, p)
            e = self.entries.get(cur)
            if e is None:
                return None
            m, link = e
            if m.issym():
                target = link if link.startswith("/") else posixpath.join(posixpath.dirname(cur), link)
                rest = "/".join(parts[i + 1:])
                return self.resolve(posixpath.normpath(posixpath.join(target, rest)), depth + 1)
        return self.entries.get(cur, (None,))[0]

    def executable(self, path):
        m = self.resolve(path)
        return m is not None and (m.isreg() or m.islnk()) and m.mode & 0o111 != 0


def workload_containers(d):
    for f in sorted(os.listdir(d)):
        if not f.endswith(".yaml") or f == "kustomization.yaml":
            continue
        for doc in yaml.safe_load_all(open(os.path.join(d, f))):
            if not doc or doc.get("kind") not in WORKLOADS:
                continue
            spec = doc["spec"]
            if doc["kind"] == "CronJob":
                spec = spec["jobTemplate"]["spec"]
            pod = spec if doc["kind"] == "Pod" else spec["template"]["spec"]
            for c in pod.get("initContainers", []) + pod.get("containers", []):
                yield f"{f}: {doc['kind']} {doc['metadata']['name']}, container {c['name']}", c


def check(d, layout_path):
    errors = []
    images = kustomization_images(d)
    if len(images) != 1:
        errors.append(f"kustomization.yaml: `images:` has {len(images)} entries, expected 1")
        return errors
    img = images[0]
    name, digest = img.get("name"), img.get("digest")
    if "newTag" in img:
        errors.append("kustomization.yaml: the image has a newTag: name it by digest only")
    if not digest or not (DIGEST.match(digest) or (layout_path is None and digest == PLACEHOLDER)):
        errors.append(f"kustomization.yaml: the image's digest {digest!r} is not sha256:<64 hex digits>"
                      + ("" if layout_path else f" (or the placeholder {PLACEHOLDER})"))
    containers = list(workload_containers(d))
    if not containers:
        errors.append(f"{d}: no workload with containers")
    for where, c in containers:
        if c.get("image") != name:
            errors.append(f"{where}: image {c.get('image')!r} is not {name!r}, the kustomization's "
                          "image (kustomize would not pin it by digest)")
    if layout_path is None:
        return errors
    lay = Layout(layout_path)
    errors += [f"{layout_path}: {e}" for e in lay.errors]
    if lay.digest != digest:
        errors.append(f"kustomization.yaml: digest {digest} is not the image's, {lay.digest}")
    needed = {"/usr/local/bin/agentjail": "the agentjail binary"}
    for where, c in containers:
        cmd = (c.get("command") or lay.config["config"].get("Entrypoint") or [])[:1]
        for p in cmd:
            needed.setdefault(p, f"{where}'s command")
        for a in c.get("args", []):
            for p in re.findall(r"exec (/[^\s]+)", a):
                needed.setdefault(p, f"{where}'s entrypoint script")
    for f in sorted(os.listdir(d)):
        if not f.endswith(".yaml") or f == "kustomization.yaml":
            continue
        for doc in yaml.safe_load_all(open(os.path.join(d, f))):
            if not doc or doc.get("kind") != "ConfigMap":
                continue
            for key, val in doc.get("data", {}).items():
                if not key.endswith(".toml"):
                    continue
                for tname, t in tomllib.loads(val).get("tasks", {}).items():
                    first = (t.get("command") or [None])[0]
                    if first and first.startswith("/") and not first.startswith(("/input", "/work", "/output")):
                        needed.setdefault(first, f"{f}: task type {tname}'s command")
    for p, why in sorted(needed.items()):
        if not lay.executable(p):
            errors.append(f"the image has no executable {p} ({why})")
    if not errors:
        print(f"k8s-image: {d} names {name}@{digest}, the image of {layout_path}; it holds "
              + ", ".join(sorted(needed)))
    return errors


def main():
    if len(sys.argv) == 6 and sys.argv[1] == "pin":
        pin(sys.argv[2], sys.argv[3], int(sys.argv[4]), sys.argv[5])
        return 0
    if sys.argv[1:2] == ["check"] and len(sys.argv) in (3, 4):
        errors = check(sys.argv[2], sys.argv[3] if len(sys.argv) == 4 else None)
        for e in errors:
            print(f"k8s-image: FAIL: {e}", file=sys.stderr)
        if not errors and len(sys.argv) == 3:
            print(f"k8s-image: {sys.argv[2]}: every workload names the kustomization's image, by digest")
        return 1 if errors else 0
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
