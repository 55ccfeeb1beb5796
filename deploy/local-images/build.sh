#!/usr/bin/env bash
# Builds the images docker-compose.yaml names where Docker Hub cannot be reached, from
# Debian's packages alone, then the project's image:
#   recpipe-local/debian:bookworm   debootstrap's minimal Debian 12, imported
#   postgres:15, redis:7            stand-ins with the official images' names and contract
#   recpipe-local/python:3.11       Debian's Python 3.11, the project image's base
#   recpipe:latest                  ./Dockerfile on that base, with this machine's CA
#                                   certificates and a wheelhouse of requirements.lock
# Images already present are kept (--force rebuilds the stand-ins). Run as root, from the
# checkout: deploy/local-images/build.sh
set -euo pipefail
cd "$(dirname "$0")/../.."
say() { echo "local-images: $*" >&2; }
force=0
[ "${1:-}" = --force ] && force=1
MIRROR="${DEBIAN_MIRROR:-http://deb.debian.org/debian}"
# builds reach the package indexes on the host's network: the compose bridge has no NAT
# when dockerd runs with --iptables=false (docs/deployment.md)
build() { docker build --network host "$@"; }
have() { [ "$force" = 0 ] && docker image inspect "$1" >/dev/null 2>&1; }

if ! have recpipe-local/debian:bookworm; then
  say "debootstrap bookworm (about a minute)"
  root="$(mktemp -d)"
  trap 'rm -rf "$root"' EXIT
  debootstrap --variant=minbase bookworm "$root" "$MIRROR" >/dev/null
  cat > "$root/etc/apt/sources.list" <<LIST
deb $MIRROR bookworm main
deb $MIRROR bookworm-updates main
deb ${MIRROR%/debian}/debian-security bookworm-security main
LIST
  # images keep no apt caches or docs
  rm -rf "$root"/var/cache/apt/archives/*.deb "$root"/var/lib/apt/lists/*
  tar -C "$root" -c . | docker import - recpipe-local/debian:bookworm >/dev/null
  rm -rf "$root"
  trap - EXIT
fi
# postgres and redis are rebuilt when their folder changed (a label holds its hash); the
# Python base is kept (a new one rebuilds the project's whole stack: --force)
for name in postgres:15 redis:7 recpipe-local/python:3.11; do
  dir="deploy/local-images/$(echo "$name" | sed 's#recpipe-local/##; s#:.*##')"
  source="$(cat "$dir"/* | sha256sum | cut -c1-16)"
  built="$(docker image inspect -f '{{ index .Config.Labels "org.recpipe.source" }}' "$name" 2>/dev/null || true)"
  case "$name" in recpipe-local/*) have "$name" && built="$source" ;; esac
  if [ "$force" = 1 ] || [ "$built" != "$source" ]; then
    say "building $name"
    build -q --label org.recpipe.source="$source" -t "$name" "$dir" >/dev/null
  fi
done

# The project image's optional inputs (both git-ignored): public CA certificates that the
# package indexes' TLS needs here, and wheels, so that its build needs no index at all.
mkdir -p deploy/ca-certificates deploy/wheelhouse
for crt in /usr/local/share/ca-certificates/*.crt; do
  [ -e "$crt" ] && cp -u "$crt" deploy/ca-certificates/
done
# The wheels are downloaded once per version of the locks into a cache of this user's (this
# machine's Python 3.11: the project's .venv, else python3), then linked into the checkout.
cache="${RECPIPE_WHEELHOUSE:-${XDG_CACHE_HOME:-$HOME/.cache}/recpipe/wheelhouse}"
locks="$(cat requirements.lock requirements-spark-client.lock | sha256sum | cut -c1-16)"
stamp="$cache/.locks-$locks"
py=.venv/bin/python
[ -x "$py" ] || py=python3
if [ ! -e "$stamp" ] && "$py" -c 'import sys; sys.exit(sys.version_info[:2] != (3, 11))' 2>/dev/null; then
  say "filling $cache from requirements.lock (pip's cache answers repeats)"
  mkdir -p "$cache"
  for lock in requirements.lock requirements-spark-client.lock; do  # (their protobufs differ)
    "$py" -m pip download -q --no-deps -d "$cache" -r "$lock"
  done
  cp -u "$(find "${PIP_CACHE_DIR:-$HOME/.cache/pip}/wheels" -name 'horovod-0.28.1-*.whl' | head -1)" \
    "$cache"/ 2>/dev/null || say "no horovod wheel in pip's cache: the image builds it (3-4 minutes)"
  touch "$stamp"
fi
if [ -e "$stamp" ]; then
  for f in "$cache"/*.whl "$cache"/*.tar.gz; do
    [ -e "deploy/wheelhouse/${f##*/}" ] || ln "$f" deploy/wheelhouse/ 2>/dev/null || cp "$f" deploy/wheelhouse/
  done
fi
say "building recpipe:latest"
args=(--build-arg PYTHON_IMAGE=recpipe-local/python:3.11
      --build-arg GIT_COMMIT="$(git rev-parse --short HEAD 2>/dev/null || echo unknown)")
# the pinned stack's stage tagged per version of the locks: the next builds take it from the
# cache, and pruning leaves it alone
deps="recpipe-deps:$locks"
have "$deps" || build -q -t "$deps" --target deps "${args[@]}" . >/dev/null
build -t recpipe:latest "${args[@]}" .
# what earlier builds left that no tag names (the project's layers; a replaced stack's GBs)
docker images recpipe-deps --format '{{.Repository}}:{{.Tag}}' | { grep -vx "$deps" || true; } | xargs -r docker rmi >/dev/null
for stage in final src deps; do
  docker image prune -f --filter "label=org.recpipe.stage=$stage" >/dev/null
done
say "done: docker-compose up -d"
