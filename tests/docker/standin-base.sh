#!/usr/bin/env bash
# A local stand-in for the Dockerfile's base image, pytorch/pytorch:2.13.0-cuda12.6-cudnn9-runtime, for CI
# machines that reach no image registry (only PyPI and the Debian mirrors). It holds what the Dockerfile relies
# on from the official image: bash, the shadow tools (useradd, userdel, groupadd, groupdel), getent, python and
# a current pip at /opt/conda/bin, first on the PATH as in the official image, numpy, and torch 2.13.0 (here the CPU
# wheel, which pip takes on these machines; the official image ships the CUDA 12.6 build). It runs as root.
# Built from a Debian root file system (debootstrap) imported into Docker, then tagged with the official name,
# so that the Dockerfile builds unchanged. If the tag exists (the real image, or a stand-in built before), it is
# left alone. Needs root, debootstrap and a running Docker engine. On a machine that builds the image for real
# GPUs, the stand-in would shadow the official image: remove it first (docker image rm TAG; its label says
# "CI stand-in"), and `hftoolkit doctor` in a container reports a CPU-only torch build.
#   tests/docker/standin-base.sh            PYTHON=.venv/bin/python  picks the pip that fetches the torch wheel
set -euo pipefail

TAG="pytorch/pytorch:2.13.0-cuda12.6-cudnn9-runtime"
SUITE="${DEBIAN_SUITE:-bookworm}"  # Python 3.11, as the package's CI uses
MIRROR="${DEBIAN_MIRROR:-http://deb.debian.org/debian}"
PYTHON="${PYTHON:-python3}"

if docker image inspect "$TAG" >/dev/null 2>&1; then
  echo "$TAG exists: not rebuilt"
  exit 0
fi

work="$(mktemp -d)"
container=""
cleanup() {
  if [ -n "$container" ]; then docker rm -f "$container" >/dev/null 2>&1 || true; fi
  docker image rm "hftoolkit-standin-rootfs:$SUITE" >/dev/null 2>&1 || true
  # debootstrap mounts /proc (and may bind /dev) inside the root file system; a failed run can leave them.
  grep -o " $work/[^ ]*" /proc/mounts | sort -r | xargs -r -n1 umount -l 2>/dev/null || true
  rm -rf --one-file-system "$work"
}
trap cleanup EXIT

# The torch wheel the host's pip takes for `pip install torch==2.13.0` (the CPU build on these machines, from
# their local wheel folder); the container's pip would take PyPI's CUDA build and its gigabytes of libraries.
"$PYTHON" -m pip download --quiet --no-deps --dest "$work/wheels" "torch==2.13.0"

debootstrap --variant=minbase --include=python3,python3-venv,ca-certificates "$SUITE" "$work/rootfs" "$MIRROR" \
  >"$work/debootstrap.log" 2>&1 || { tail -20 "$work/debootstrap.log"; exit 1; }
# The host's CA bundle: this network reaches PyPI through a TLS proxy whose certificate the host trusts.
cp /etc/ssl/certs/ca-certificates.crt "$work/rootfs/etc/ssl/certs/ca-certificates.crt"
rm -rf "$work/rootfs/var/cache/apt/archives/"*.deb "$work/rootfs/var/lib/apt/lists/"*
tar -C "$work/rootfs" -c . | docker import - "hftoolkit-standin-rootfs:$SUITE" >/dev/null

# The official image's Python lives at /opt/conda; a virtual environment there gives python, pip and the console
# scripts of what is installed into it the same paths.
container="$(docker create --network host -v "$work/wheels:/wheels:ro" "hftoolkit-standin-rootfs:$SUITE" \
  /bin/sh -c 'python3 -m venv /opt/conda \
    && /opt/conda/bin/pip install --quiet --no-cache-dir --upgrade pip \
    && /opt/conda/bin/pip install --quiet --no-cache-dir /wheels/torch-*.whl numpy')"
docker start --attach "$container"
docker commit \
  --change 'ENV PATH=/opt/conda/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
  --change 'ENV LANG=C.UTF-8' \
  --change 'LABEL org.opencontainers.image.description="hftoolkit CI stand-in for the official PyTorch image (tests/docker/standin-base.sh)"' \
  --change 'CMD ["/bin/bash"]' \
  "$container" "$TAG" >/dev/null
echo "$TAG built: $(docker image inspect --format '{{.Size}}' "$TAG" | awk '{printf "%.2f GB", $1/1e9}')"
