#!/usr/bin/env bash
# Build `local/bookworm`: a minimal Debian bookworm root file system (debootstrap --variant=minbase),
# imported as a Docker image. It is the base of docker/cpu where no registry can be reached.
#
#   docker/base/build-bookworm.sh [TAG] [--force]
#
# The Debian mirror is read from this machine's apt sources (override: SUITE_DEBIAN_MIRROR=URL);
# an existing image is kept unless --force. Needs root (debootstrap) and a Docker engine.
set -euo pipefail

tag=local/bookworm
force=0
for arg in "$@"; do
  case "$arg" in
    --force) force=1 ;;
    -h|--help) sed -n '2,9p' "$0"; exit 0 ;;
    *) tag=$arg ;;
  esac
done
dist=${SUITE_DEBIAN_SUITE:-bookworm}
# Debian's own client when both are installed; DOCKER overrides.
if [ -z "${DOCKER:-}" ]; then
  if [ -x /usr/bin/docker ]; then DOCKER=/usr/bin/docker; else DOCKER=docker; fi
fi

# one build of a tag at a time: a second call (CI builds the base in the background while the venv is made;
# two `suite build`s at once) waits for the first, then finds its image
exec 9>"${TMPDIR:-/tmp}/suite-bookworm-${tag//[^A-Za-z0-9_.-]/_}.lock"
flock 9
if [ "$force" = 0 ] && "$DOCKER" image inspect "$tag" >/dev/null 2>&1; then
  echo "$tag exists ($("$DOCKER" image inspect -f '{{.Id}}' "$tag")); --force rebuilds it"
  exit 0
fi

mirror_from_apt() {
  # deb822 sources first (URIs: ... with Suites: containing the dist), then one-line sources.list entries.
  local f
  for f in /etc/apt/sources.list.d/*.sources; do
    [ -r "$f" ] || continue
    awk -v dist="$dist" '
      /^[[:space:]]*$/ { if (uri != "" && suites ~ ("(^| )" dist "( |$)")) { print uri; exit } uri=""; suites=""; next }
      /^URIs:/ { uri=$2 }
      /^Suites:/ { $1=""; suites=$0; sub(/^ /, "", suites) }
      END { if (uri != "" && suites ~ ("(^| )" dist "( |$)")) print uri }' "$f" | head -n1
  done
  for f in /etc/apt/sources.list /etc/apt/sources.list.d/*.list; do
    [ -r "$f" ] || continue
    awk -v dist="$dist" '$1 == "deb" && $0 !~ /security/ { for (i = 2; i <= NF; i++) if ($i == dist) { print $(i-1); exit } }' "$f"
  done
}

mirror=${SUITE_DEBIAN_MIRROR:-}
if [ -z "$mirror" ]; then
  mirror=$(mirror_from_apt | grep -v -e security -e '^\[' | head -n1 || true)
fi
mirror=${mirror:-http://deb.debian.org/debian}
command -v debootstrap >/dev/null || { echo "debootstrap is not installed (apt-get install debootstrap)" >&2; exit 1; }

work=$(mktemp -d "${TMPDIR:-/tmp}/suite-bookworm.XXXXXX")
trap 'rm -rf "$work"' EXIT
echo "debootstrap --variant=minbase $dist from $mirror"
start=$(date +%s)
debootstrap --variant=minbase "$dist" "$work/rootfs" "$mirror" >"$work/debootstrap.log" 2>&1 || {
  tail -n 30 "$work/debootstrap.log" >&2
  exit 1
}
rm -rf "$work/rootfs/var/lib/apt/lists/"* "$work/rootfs/var/cache/apt/archives/"*.deb
tar -C "$work/rootfs" --numeric-owner -c . | "$DOCKER" import \
  --change 'CMD ["bash"]' \
  --change 'ENV LANG=C.UTF-8' \
  --message "debootstrap --variant=minbase $dist $mirror" - "$tag"
echo "$tag built in $(( $(date +%s) - start )) s: $("$DOCKER" image inspect -f '{{.Id}} {{.Size}}' "$tag")"
