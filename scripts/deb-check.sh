#!/usr/bin/env bash
# Installs Shoal's Debian package and runs it as installed, on loopback:
#
#   1. builds the package (scripts/deb.sh) unless given one, installs it
#      with dpkg -i, checks its files and units (systemd-analyze verify),
#      and that shoal vip reads the example vip.yaml (which names no
#      address, so it goes no further);
#   2. starts etcd from Debian's etcd-server package on 127.0.0.1:2379 with
#      its data in a temporary directory (the example mds.yaml's meta:);
#   3. starts the MDS and a data server the way the installed units do: each
#      unit's ExecStart= as its User= with its AmbientCapabilities=, so with
#      the example configurations /etc/shoal/mds.yaml and ds.yaml unchanged
#      (the join secret copied to the data server's path as deploy.md says);
#   4. checks that the data server registers (shoal admin status), writes a
#      file and reads it back, and that both servers stop cleanly on SIGTERM;
#   5. purges the package, and removes what it created.
#
# It needs root (dpkg, the shoal user) and the ports of the examples free:
# 2049, 2050, 2379, 2380 and 9101 on 127.0.0.1. Every process it starts is
# stopped by its PID.
#
#   scripts/deb-check.sh [PACKAGE.deb]
set -euo pipefail
cd "$(dirname "$0")/.."

say() { printf 'deb-check: %s\n' "$*"; }
fail() {
	say "FAIL: $*"
	exit 1
}

[ "$(id -u)" = 0 ] || fail "needs root (dpkg -i, and the servers run as the package's user shoal)"
command -v etcd >/dev/null || fail "no etcd: apt-get install etcd-server"
if dpkg -s shoal >/dev/null 2>&1; then
	fail "the shoal package is installed already; this check installs and purges its own"
fi
for d in /var/lib/shoal/mds /var/lib/shoal/ds /etc/shoal/join-secret; do
	[ ! -e "$d" ] || fail "$d exists: this check would use and then delete it"
done
for port in 2049 2050 2379 2380 9101; do
	if [ -n "$(ss -Hltn "sport = :$port")" ]; then
		fail "port $port is in use (ss -ltn); the example configurations need it"
	fi
done

work=$(mktemp -d "${TMPDIR:-/tmp}/shoal-deb-check.XXXXXX")
user_existed=0
getent passwd shoal >/dev/null && user_existed=1
pids=()
installed=0
ok=0
cleanup() {
	for pid in "${pids[@]}"; do
		kill -KILL "$pid" 2>/dev/null || true
		wait "$pid" 2>/dev/null || true
	done
	if [ "$ok" = 0 ]; then
		for f in "$work"/*.log; do
			[ -e "$f" ] && printf '==== %s ====\n%s\n' "$(basename "$f")" "$(tail -n 40 "$f")"
		done
	fi
	if [ "$installed" = 1 ]; then
		dpkg -P shoal >/dev/null 2>&1 || true
	fi
	rm -rf /var/lib/shoal/mds /var/lib/shoal/ds /etc/shoal/join-secret
	rmdir /var/lib/shoal /etc/shoal 2>/dev/null || true
	if [ "$user_existed" = 0 ] && getent passwd shoal >/dev/null; then
		userdel shoal 2>/dev/null || true
	fi
	rm -rf "$work"
}
trap cleanup EXIT

deb=${1:-}
if [ -z "$deb" ]; then
	start=$SECONDS
	deb=$(./scripts/deb.sh)
	say "built $deb ($((SECONDS - start))s)"
fi
dpkg -i "$deb" >"$work/dpkg.log" 2>&1 || fail "dpkg -i $deb: $(cat "$work/dpkg.log")"
installed=1
version=$(dpkg-query -W -f '${Version}' shoal)
say "installed shoal $version"
for f in /usr/bin/shoal /lib/systemd/system/shoal-mds.service /lib/systemd/system/shoal-vip.service \
	/lib/systemd/system/shoal-ds.service /lib/systemd/system/shoal-ds@.service /etc/shoal/mds.yaml \
	/etc/shoal/vip.yaml /etc/shoal/ds.yaml /usr/share/doc/shoal/deploy.md /usr/share/doc/shoal/service-address.md; do
	[ -e "$f" ] || fail "the package did not install $f"
done
getent passwd shoal >/dev/null || fail "postinst did not create the user shoal"
[ "$(stat -c %U /var/lib/shoal)" = shoal ] || fail "/var/lib/shoal is not owned by shoal"
stamp=$(/usr/bin/shoal version)
[[ "$stamp" == *"shoal $version"* ]] || fail "shoal version does not say $version: $stamp"
if command -v systemd-analyze >/dev/null; then
	cp /lib/systemd/system/shoal-ds@.service "$work/shoal-ds@check.service"
	if ! systemd-analyze verify --man=no /lib/systemd/system/shoal-mds.service /lib/systemd/system/shoal-vip.service \
		/lib/systemd/system/shoal-ds.service "$work/shoal-ds@check.service" >"$work/verify.log" 2>&1; then
		fail "systemd-analyze verify: $(cat "$work/verify.log")"
	fi
	say "systemd-analyze verify: the units are clean"
fi

# The example vip.yaml names no service address (every cluster's differs),
# so shoal vip must refuse to start for that reason alone: any other error
# is a key of the example that shoal vip does not know.
vip_err=$(/usr/bin/shoal vip --config /etc/shoal/vip.yaml 2>&1) && fail "shoal vip started with the example vip.yaml, which names no address"
[[ "$vip_err" == *"--address and --interface are required"* ]] || fail "shoal vip --config /etc/shoal/vip.yaml: $vip_err"
say "the example vip.yaml reads cleanly (shoal vip asks for the address and interface it leaves out)"

# forget PID: a process waited for leaves the list cleanup kills (its PID
# may be reused).
forget() {
	local p keep=()
	for p in "${pids[@]}"; do
		[ "$p" = "$1" ] || keep+=("$p")
	done
	pids=("${keep[@]}")
}

# wait_log FILE REGEXP PID: wait until FILE matches, or PID exits, or 60 s.
wait_log() {
	local i
	for i in $(seq 600); do
		grep -qE "$2" "$1" 2>/dev/null && return 0
		kill -0 "$3" 2>/dev/null || fail "$(basename "$1" .log) exited before logging /$2/"
		sleep 0.1
	done
	fail "$(basename "$1" .log) did not log /$2/ within 60s"
}

# run_unit UNIT LOG: starts the unit's ExecStart= as its User=, with its
# AmbientCapabilities= (none of its other settings matter on loopback).
run_unit() {
	local unit=/lib/systemd/system/$1 exec user caps=()
	exec=$(sed -n 's/^ExecStart=//p' "$unit")
	user=$(sed -n 's/^User=//p' "$unit")
	if grep -q '^AmbientCapabilities=CAP_NET_BIND_SERVICE$' "$unit"; then
		caps=(--inh-caps=+net_bind_service --ambient-caps=+net_bind_service)
	fi
	# $exec is split into words as systemd would (it has no quotes).
	# shellcheck disable=SC2086
	setpriv --reuid="$user" --regid="$user" --init-groups "${caps[@]}" -- $exec >"$work/$2" 2>&1 &
	pids+=($!)
	say "started $1 as $user (pid $!): $exec"
}

etcd --name deb-check --data-dir "$work/etcd" \
	--listen-client-urls http://127.0.0.1:2379 --advertise-client-urls http://127.0.0.1:2379 \
	--listen-peer-urls http://127.0.0.1:2380 --initial-advertise-peer-urls http://127.0.0.1:2380 \
	--initial-cluster deb-check=http://127.0.0.1:2380 >"$work/etcd.log" 2>&1 &
etcd_pid=$!
pids+=("$etcd_pid")
wait_log "$work/etcd.log" 'ready to serve client requests' "$etcd_pid"
say "etcd $(etcd --version | sed -n 's/^etcd Version: //p') on 127.0.0.1:2379 (pid $etcd_pid)"

run_unit shoal-mds.service mds.log
mds_pid=${pids[-1]}
wait_log "$work/mds.log" 'shoal mds ready' "$mds_pid"
# deploy.md's step for every data server: a copy of the secret, 0600, owned
# by the user the data server runs as.
install -m 0600 -o shoal -g shoal /var/lib/shoal/mds/join-secret /etc/shoal/join-secret
run_unit shoal-ds.service ds.log
ds_pid=${pids[-1]}
wait_log "$work/ds.log" 'shoal ds ready' "$ds_pid"

admin=(--mds 127.0.0.1:2049 --join-secret-file /etc/shoal/join-secret)
for i in $(seq 100); do
	/usr/bin/shoal admin status --json "${admin[@]}" >"$work/status.json" 2>"$work/status.log" || true
	active=$(jq '[.data_servers[]? | select((.Up // .up) and (.State // .state) == "active")] | length' "$work/status.json" 2>/dev/null || echo 0)
	[ "$active" = 1 ] && break
	sleep 0.2
done
[ "$active" = 1 ] || fail "the data server is not active in shoal admin status: $(cat "$work/status.json" "$work/status.log")"
say "shoal admin status: 1 data server, active ($(jq -r '.data_servers[0] | .ID // .id' "$work/status.json"))"

curl -fsS -o /dev/null http://127.0.0.1:9101/metrics || fail "the MDS serves no metrics on its http: address"
say "the MDS serves metrics on its http: address, http://127.0.0.1:9101/metrics"

head -c 3000000 /dev/urandom >"$work/in"
/usr/bin/shoal put "$work/in" nfs://127.0.0.1:2049/deb-check >"$work/put.log" 2>&1 || fail "shoal put: $(cat "$work/put.log")"
/usr/bin/shoal get nfs://127.0.0.1:2049/deb-check "$work/out" >"$work/get.log" 2>&1 || fail "shoal get: $(cat "$work/get.log")"
cmp -s "$work/in" "$work/out" || fail "the file read back differs from the one written"
[ -n "$(find /var/lib/shoal/ds/data -type f -size +0 -print -quit)" ] || fail "the data server's directory holds no data"
say "put and get of a 3 MB file through the MDS and the data server: identical"

# SIGTERM, as systemctl stop sends it: each server must exit 0.
for name in ds mds etcd; do
	pid_var=${name}_pid
	pid=${!pid_var}
	kill -TERM "$pid"
	rc=0
	wait "$pid" || rc=$?
	forget "$pid"
	# etcd 3.4 ends by re-raising the signal: 128+15.
	[ "$rc" = 0 ] || { [ "$name" = etcd ] && [ "$rc" = 143 ]; } || fail "$name exited with status $rc on SIGTERM"
done
say "SIGTERM: data server, MDS and etcd stopped cleanly"

dpkg -P shoal >"$work/dpkg.log" 2>&1 || fail "dpkg -P shoal: $(cat "$work/dpkg.log")"
installed=0
for f in /usr/bin/shoal /lib/systemd/system/shoal-mds.service /lib/systemd/system/shoal-vip.service \
	/etc/shoal/mds.yaml /etc/shoal/vip.yaml /etc/shoal/join-secret; do
	[ ! -e "$f" ] || fail "dpkg -P shoal left $f"
done
[ -d /var/lib/shoal/ds ] || fail "dpkg -P shoal deleted the data in /var/lib/shoal"
say "dpkg -P shoal: removed the binary, units and configuration, kept /var/lib/shoal"
ok=1
say "PASS"
