#!/usr/bin/env bash
# Prints the path of a clean Debian 12 root file system as a tarball, made by mmdebstrap from
# Debian's archive (variant minbase, plus python3, which `agentjail demo` and the self-test's
# probes run in their sandboxes; nothing else, and no Rust). It is cached in
# /var/cache/agentjail-release/ (override: AGENTJAIL_DEBROOT_CACHE), keyed by this script's own
# hash, so CI makes it once per machine; the package test unpacks a fresh copy every time.
# With `--with-pip`: the same plus python3-pip, the base of `agentjail image build`'s tests
# (crates/cli/tests/image_build.rs, docs/images.md "A base to start from").
set -euo pipefail
include=python3
name=debian12-minbase-python3
if [ "${1:-}" = --with-pip ]; then
  include=python3,python3-pip
  name=debian12-minbase-python3-pip
fi
here="$(cd "$(dirname "$0")" && pwd)"
cache="${AGENTJAIL_DEBROOT_CACHE:-/var/cache/agentjail-release}"
key="$(sha256sum "$here/debian-root.sh" | cut -c1-12)"
tarball="$cache/$name-$key.tar"
if [ ! -s "$tarball" ]; then
  command -v mmdebstrap >/dev/null || {
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq mmdebstrap
  } >&2
  mkdir -p "$cache"
  tmp="$tarball.partial.$$"
  trap 'rm -f "$tmp"' EXIT
  mmdebstrap --quiet --variant=minbase --include="$include" --format=tar \
    bookworm "$tmp" http://deb.debian.org/debian >&2
  mv "$tmp" "$tarball"
fi
echo "$tarball"
