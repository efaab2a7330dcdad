#!/usr/bin/env bash
# trixie-root.sh — print the path of a Debian 13 ("trixie") root holding RabbitMQ 4.x and
# PostgreSQL 17, making it first when it is missing.
#
#   scripts/trixie-root.sh          make the root once (about 2 minutes), then print its path
#
# Debian 13's Erlang needs glibc 2.38 and Debian 12 ships 2.36, so the newer servers run inside
# this root (chroot), on the host's loopback; scripts/services.sh starts them there when
# SAGA_SERVICES_VERSIONS=new. The root lives in SAGA_TRIXIE_ROOT (default
# ~/.cache/protosaga/trixie-root), outside any clone, and is made once per machine: a finished
# root holds the marker file .protosaga-ready; a build interrupted half-way is removed and redone.
# Needs root (debootstrap, chroot).
set -euo pipefail

die() { echo "trixie-root: $*" >&2; exit 1; }
log() { echo "trixie-root: $*" >&2; }

ROOT=${SAGA_TRIXIE_ROOT:-$HOME/.cache/protosaga/trixie-root}
MIRROR=${SAGA_DEBIAN_MIRROR:-http://deb.debian.org/debian}
# The packages the root holds (the host's psql and curl talk to the servers over loopback).
PACKAGES="rabbitmq-server postgresql-17 ca-certificates"

[ "$(id -u)" -eq 0 ] || die "needs root (debootstrap and chroot)"

if [ -f "$ROOT/.protosaga-ready" ]; then
	echo "$ROOT"
	exit 0
fi

mkdir -p "$(dirname "$ROOT")"
exec 9>"$ROOT.lock"
flock 9 # one build at a time; a second caller waits for it and reuses its root
if [ -f "$ROOT/.protosaga-ready" ]; then
	echo "$ROOT"
	exit 0
fi

command -v debootstrap >/dev/null || {
	log "installing debootstrap"
	apt-get update -qq >/dev/null || die "apt-get update failed"
	DEBIAN_FRONTEND=noninteractive apt-get install -y -qq debootstrap >/dev/null || die "apt-get install debootstrap failed"
}

tmp=$ROOT.build
if mountpoint -q "$tmp/proc" 2>/dev/null; then umount "$tmp/proc"; fi
rm -rf "$tmp"
log "debootstrap trixie into $tmp (about a minute)"
debootstrap --variant=minbase trixie "$tmp" "$MIRROR" >"$ROOT.debootstrap.log" 2>&1 ||
	{ tail -20 "$ROOT.debootstrap.log" >&2; die "debootstrap failed (log: $ROOT.debootstrap.log)"; }

# Packages must not start servers while they install: the root has no init, and the servers
# run only as private nodes started by services.sh.
printf '#!/bin/sh\nexit 101\n' >"$tmp/usr/sbin/policy-rc.d"
chmod 755 "$tmp/usr/sbin/policy-rc.d"
mount -t proc proc "$tmp/proc"
trap 'umount "$tmp/proc" 2>/dev/null || true' EXIT
log "installing $PACKAGES inside the root"
chroot "$tmp" env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $PACKAGES \
	>"$ROOT.apt.log" 2>&1 || { tail -20 "$ROOT.apt.log" >&2; die "apt-get install in the root failed (log: $ROOT.apt.log)"; }
chroot "$tmp" apt-get clean
umount "$tmp/proc"
trap - EXIT

[ -x "$tmp/usr/lib/rabbitmq/bin/rabbitmq-server" ] || die "rabbitmq-server missing in the root"
[ -x "$tmp/usr/lib/postgresql/17/bin/postgres" ] || die "PostgreSQL 17 missing in the root"
chroot "$tmp" dpkg-query -W rabbitmq-server postgresql-17 erlang-base >"$tmp/.protosaga-versions"
touch "$tmp/.protosaga-ready"
rm -rf "$ROOT"
mv "$tmp" "$ROOT"
log "ready: $ROOT ($(tr '\n\t' ', ' <"$ROOT/.protosaga-versions"))"
echo "$ROOT"
