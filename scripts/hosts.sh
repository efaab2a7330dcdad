#!/usr/bin/env bash
# hosts.sh DIR RTT_MS CMD [ARGS...] — run CMD as on separate hosts: PostgreSQL, RabbitMQ and CMD each
# in a network namespace of its own on this machine, every packet between them delayed so that a
# round trip takes RTT_MS milliseconds (e.g. 0.5) more than on loopback.
#
# The kernel here has no netem qdisc (CONFIG_NET_SCH_NETEM is not set; there are no modules to
# load), so the namespaces are not joined by veth pairs with a netem delay: each has a TUN device
# in one /24 and bench/cmd/netwire, a user-space switch, forwards every IPv4 packet between them
# after RTT_MS/2 (see its doc). It reports, when CMD ends, the one-way time it actually added, its
# CPU and any packets it dropped; DIR/netwire.txt keeps that report.
#
# The servers start through `scripts/services.sh netns-start` in DIR/services, listening on their
# namespace addresses; CMD runs in the third namespace with the variables of their env.sh
# (SAGA_PG_URL, SAGA_AMQP_URL, SAGA_RABBIT_API), with SAGA_HOSTS_RTT_MS set and SAGA_NETWORK_PID
# naming netwire (sagabench reports its CPU per saga apart from both sides'). CMD must not need
# the network beyond them (build binaries before). Everything — servers, netwire, namespaces — is
# torn down when CMD ends, fails or the run is interrupted. Needs root.
set -euo pipefail

die() { echo "hosts: $*" >&2; exit 1; }
log() { echo "hosts: $*" >&2; }

[ $# -ge 3 ] || die "usage: hosts.sh DIR RTT_MS CMD [ARGS...]"
dir=$1 rtt=$2
shift 2
[ "$(id -u)" -eq 0 ] || die "network namespaces need root"
[[ $rtt =~ ^[0-9]+(\.[0-9]+)?$ ]] || die "RTT_MS '$rtt': want a number of milliseconds such as 0.5"
[ -c /dev/net/tun ] || die "/dev/net/tun is missing: TUN devices are not available"
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/.." && pwd)
mkdir -p "$dir"
dir=$(cd "$dir" && pwd)

# A run's namespaces and subnet are its own, so runs can overlap.
tag=$(printf '%04x' $((RANDOM % 65536)))
net=10.$((200 + RANDOM % 50)).$((RANDOM % 256))
pgns=saga-$tag-pg mqns=saga-$tag-mq appns=saga-$tag-app
pgaddr=$net.2 mqaddr=$net.3 appaddr=$net.4
oneway_us=$(awk -v r="$rtt" 'BEGIN { printf "%d", r * 1000 / 2 }')
wire_pid=

cleanup() {
	local rc=$?
	trap - EXIT INT TERM
	"$here/services.sh" netns-stop "$dir/services" >/dev/null 2>&1 || true
	if [ -n "$wire_pid" ]; then
		kill -TERM "$wire_pid" 2>/dev/null || true
		wait "$wire_pid" 2>/dev/null || true
		[ ! -f "$dir/netwire.txt" ] || cat "$dir/netwire.txt" >&2
	fi
	local ns
	for ns in "$appns" "$mqns" "$pgns"; do
		ip netns del "$ns" 2>/dev/null || true
	done
	[ "$rc" -eq 0 ] || log "failed (exit $rc); logs in $dir"
	exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

log "building bench/cmd/netwire"
(cd "$root/bench" && go build -o "$dir/netwire" ./cmd/netwire) || die "could not build netwire"

for spec in "$pgns:$pgaddr" "$mqns:$mqaddr" "$appns:$appaddr"; do
	ns=${spec%%:*} addr=${spec#*:}
	ip netns add "$ns" || die "ip netns add $ns failed"
	ip -n "$ns" link set lo up
	ip -n "$ns" tuntap add dev sw0 mode tun || die "no TUN device in $ns"
	ip -n "$ns" link set sw0 mtu 1500
	ip -n "$ns" addr add "$addr/24" dev sw0
	ip -n "$ns" link set sw0 up
done
rm -f "$dir/netwire.ready" "$dir/netwire.txt"
"$dir/netwire" -delay "${oneway_us}us" -dev sw0 -ready "$dir/netwire.ready" -stats "$dir/netwire.txt" \
	-link "$pgns=$pgaddr" -link "$mqns=$mqaddr" -link "$appns=$appaddr" 2>"$dir/netwire.log" &
wire_pid=$!
for _ in $(seq 1 100); do
	[ -f "$dir/netwire.ready" ] && break
	kill -0 "$wire_pid" 2>/dev/null || { cat "$dir/netwire.log" >&2; die "netwire stopped"; }
	sleep 0.05
done
[ -f "$dir/netwire.ready" ] || die "netwire did not attach within 5 s"
log "namespaces $pgns ($pgaddr), $mqns ($mqaddr), $appns ($appaddr); ${oneway_us} µs one way (RTT $rtt ms + forwarding)"

"$here/services.sh" netns-start "$dir/services" "$pgns" "$pgaddr" "$mqns" "$mqaddr"
# shellcheck disable=SC1091
source "$dir/services/env.sh"
export SAGA_HOSTS_RTT_MS=$rtt
export SAGA_NETWORK_PID=$wire_pid
ip netns exec "$appns" "$@"
