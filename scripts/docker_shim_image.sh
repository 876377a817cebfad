#!/usr/bin/env bash
# Build the "host-shim" image ones-shim:local (or the tag given) with `docker import`, for machines
# without a registry. The image is an empty root file system: bin, lib, lib64 are symlinks into usr,
# and the rest are empty directories to mount onto (sbin too: the engine mounts its docker-init at
# /sbin/docker-init for `init: true`, which cannot land inside a read-only /usr). A container from it runs the host's programs:
# mount the host's /usr and /etc read-only, the Python installation the venv was made from, and the
# project (launcher.docker.volumes; the lines printed at the end). It needs a merged-/usr host
# (/bin -> usr/bin). Needs a Docker engine (DOCKER_HOST; see scripts/dockerd.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
TAG="${1:-ones-shim:local}"

die() { echo "docker_shim_image.sh: $*" >&2; exit 1; }
command -v docker >/dev/null 2>&1 || die "no docker CLI on PATH"
docker version --format '{{.Server.Version}}' >/dev/null 2>&1 || die "no Docker engine answers (DOCKER_HOST=${DOCKER_HOST:-unset})"
for d in bin lib; do
  [ -L "/$d" ] || die "/$d is not a symlink into /usr on this host: the shim needs a merged-/usr host"
done

work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
root="$work/rootfs"
mkdir -p "$root"/{usr,etc,sbin,dev,proc,sys,run,root,home,opt,srv,mnt,work,var/tmp,tmp}
chmod 1777 "$root/tmp" "$root/var/tmp"
chmod 0700 "$root/root"
for d in bin lib lib64; do
  ln -s "usr/$d" "$root/$d"
done
tar --numeric-owner --owner=0 --group=0 -C "$root" -cf "$work/rootfs.tar" .
docker import --message "ones host shim: mount /usr, /etc, the Python install and the project" \
  --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
  --change 'WORKDIR /' "$work/rootfs.tar" "$TAG" >/dev/null
echo "built $TAG ($(docker image inspect --format '{{.Size}}' "$TAG") bytes)" >&2

if [ -x .venv/bin/python ]; then
  python="$(pwd)/.venv/bin/python"
  prefix="$(.venv/bin/python -c 'import sys; print(sys.base_prefix)')"
  case "$prefix" in
    /usr|/usr/*) python_mount="" ;;  # the system Python comes with /usr
    *) python_mount=" $prefix:$prefix:ro," ;;
  esac
  cat >&2 <<EOF
launcher settings for this machine (resources/<env>.yaml):
  launcher:
    kind: docker
    docker:
      image: $TAG
      python: $python
      volumes: [/usr:/usr:ro, /etc:/etc:ro,${python_mount} $(pwd):$(pwd):ro]
EOF
fi
