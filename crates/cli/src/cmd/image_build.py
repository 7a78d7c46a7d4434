"""agentjail image build, inside the sandbox on the base image (docs/images.md, "Building an
image"): pip installs the lock file into a root of its own, then that root is packed as one
tar layer in /output. Options after the script's name go to pip (the index, wheels only).
The layer's tar headers carry no owner and no time: only names, modes and contents count."""

import os
import subprocess
import sys
import tarfile

ROOT = "/tmp/root"
LAYER = "/output/layer.tar"


def main():
    cmd = [
        sys.executable, "-I", "-m", "pip", "install",
        "--root", ROOT,
        "--ignore-installed",
        "--require-hashes",
        "--no-cache-dir",
        "--no-compile",
        "--disable-pip-version-check",
        "--no-input",
        "--progress-bar", "off",
        "--no-warn-script-location",
        "-r", "/input/requirements.txt",
    ] + sys.argv[1:]
    print("agentjail-build: " + " ".join(cmd), flush=True)
    done = subprocess.run(cmd)
    if done.returncode != 0:
        sys.exit(done.returncode)
    if not os.path.isdir(ROOT):
        print("agentjail-build: pip installed nothing", file=sys.stderr)
        sys.exit(3)
    with tarfile.open(LAYER, "w", format=tarfile.PAX_FORMAT) as t:
        for here, dirs, files in os.walk(ROOT):
            dirs.sort()
            for name in dirs + sorted(files):
                full = os.path.join(here, name)
                info = t.gettarinfo(full, arcname=os.path.relpath(full, ROOT))
                if info is None:
                    continue
                info.uid = info.gid = 0
                info.uname = info.gname = ""
                info.mtime = 0
                if info.isreg():
                    with open(full, "rb") as f:
                        t.addfile(info, f)
                else:
                    t.addfile(info)
    print("agentjail-build: layer written", flush=True)


main()
