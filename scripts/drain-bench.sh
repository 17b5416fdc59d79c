#!/usr/bin/env bash
# drain-bench.sh — measure `shoal admin drain` of one data server on an
# emulated cluster (shoal testbed), against the per-link rate.
#
#   sudo scripts/drain-bench.sh
#   sudo TOTAL_MB=96 FILE_MB=8 scripts/drain-bench.sh     (a smoke run, ~15 s)
#
# Brings up `shoal testbed up --ds 3 --clients 1` (default rate unless RATE
# is set; data on tmpfs), writes TOTAL_MB (default 3072) in files of FILE_MB
# (default 128) from client c0 with `shoal put`, so that each data server
# holds about TOTAL_MB/3, drains data server VICTIM (default ds1) with
# `shoal admin drain` run in the MDS's namespace, then reads every file back
# from c0 and compares its sha256 with the one taken before the put. Prints
# a table and one JSON line (also appended to $OUT when set).
#
# What is measured: seconds is the drain job's own time on the MDS (from
# `admin status --json`: started..ended); mb_per_s is the bytes the victim
# held (`admin status --json`, "bytes", before the drain) over that time;
# copied_mb_per_s is the bytes the MDS copied and verified (the job's
# "bytes"), which is more than the victim held when the files narrow. The
# MDS's link counters (eth0 in its namespace) give what crossed its link in
# each direction (averaged over the job's time: the drain is the only
# traffic through it), /proc/stat and /proc/loadavg the machine's CPU use
# and load during the drain, and /proc/PID/stat the CPU (in cores: CPU-
# seconds per second of the job) of the MDS and the victim data server.
#
# Every data server holds a stripe of every file, so with 3 data servers the
# drained one has no free peer to hand its units to and each file narrows to
# the 2 others: its whole stripe map changes and about 2/3 of every file is
# copied, not just the victim's third. SPARE=1 brings up a fourth data
# server that is stopped while the files are written and restarted before
# the drain, so the drain hands the victim's units to it and only they move.
#
# Environment: RATE (per-link rate; default the testbed's), TOTAL_MB, FILE_MB,
# VICTIM (node name of the data server to drain, default ds1), SPARE (0/1),
# NAME (testbed name, default shoaldrain), SHOAL_BIN (a prebuilt shoal;
# default: go build into the work directory), WORKDIR (default a new
# mktemp -d; the random source file and the testbed live there and are
# removed at the end unless KEEP=1), OUT (file to append the JSON line to),
# DRAIN_TIMEOUT (seconds, default 1800). Needs root, ip, tc, jq, perl.
set -euo pipefail
cd "$(dirname "$0")/.."

total_mb=${TOTAL_MB:-3072}
file_mb=${FILE_MB:-128}
victim=${VICTIM:-ds1}
spare=${SPARE:-0}
name=${NAME:-shoaldrain}
drain_timeout=${DRAIN_TIMEOUT:-1800}
[ "$total_mb" -ge 1 ] && [ "$file_mb" -ge 1 ] || { echo "TOTAL_MB and FILE_MB must be positive" >&2; exit 2; }
nfiles=$(((total_mb + file_mb - 1) / file_mb))
[ "$(id -u)" = 0 ] || { echo "needs root (shoal testbed)" >&2; exit 2; }
for c in jq perl ip tc sha256sum; do command -v "$c" >/dev/null || { echo "needs $c" >&2; exit 2; }; done

work=${WORKDIR:-$(mktemp -d /tmp/shoal-drain-bench.XXXXXX)}
mkdir -p "$work"
tb=$work/tb
bin=${SHOAL_BIN:-}
restarted=""
sampler=""

cleanup() {
	local rc=$?
	[ -z "$sampler" ] || kill "$sampler" 2>/dev/null || true
	if [ -n "$bin" ] && [ -x "$bin" ]; then
		timeout 60 "$bin" testbed down --name "$name" --dir "$tb" >/dev/null 2>&1 || true
	fi
	# A data server this script restarted itself (SPARE=1): `testbed down`
	# finds it in the testbed's namespace, but make sure.
	if [ -n "$restarted" ] && kill -0 "$restarted" 2>/dev/null; then
		kill "$restarted" 2>/dev/null || true
	fi
	if [ "${KEEP:-0}" != 1 ] && [ -z "${WORKDIR:-}" ]; then
		rm -rf "$work"
	fi
	exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

t0=$(date +%s)
step() { echo "== $(($(date +%s) - t0))s: $*" >&2; }

if [ -z "$bin" ]; then
	step "build shoal"
	bin=$work/shoal
	go build -o "$bin" ./cmd/shoal
fi

load_before=$(cut -d' ' -f1-3 /proc/loadavg)
step "load before: $load_before"

# Leftovers of an interrupted run with the same name.
timeout 60 "$bin" testbed down --name "$name" >/dev/null 2>&1 || true

nds=3
[ "$spare" = 1 ] && nds=4
up=(testbed up --name "$name" --dir "$tb" --ds "$nds" --clients 1)
[ -n "${RATE:-}" ] && up+=(--rate "$RATE")
step "shoal ${up[*]}"
timeout 300 "$bin" "${up[@]}" >"$work/up.log" 2>&1 || { cat "$work/up.log" >&2; exit 1; }

state=$tb/testbed.json
mds=$(jq -r .mds_addr "$state")
rate=$(jq -r .rate "$state")
rate_bps=$(jq -r .rate_bits_per_sec "$state")
secret=$tb/mds/join-secret
tx() { timeout "$1" "$bin" testbed exec --name "$name" --dir "$tb" "${@:2}"; }
admin() { tx 120 mds -- "$bin" admin "$@" --mds "$mds" --join-secret-file "$secret"; }
status() { admin status --json; }
node_ip() { jq -r --arg n "$1" '.nodes[] | select(.name == $n) | .ip' "$state"; }
ds_id() { # node name -> data server id, by its address
	local ip
	ip=$(node_ip "$1")
	status | jq -r --arg a "$ip:2049" '.data_servers[] | select(.Addrs | index($a)) | .ID'
}
wait_up() { # node name, true|false
	local id=$1 want=$2 i
	for i in $(seq 60); do
		[ "$(status | jq -r --arg id "$id" '.data_servers[] | select(.ID == $id) | .Up')" = "$want" ] && return 0
		sleep 1
	done
	echo "data server $id never became Up=$want" >&2
	return 1
}

victim_ip=$(node_ip "$victim")
[ -n "$victim_ip" ] && [ "$victim_ip" != null ] || { echo "no node $victim" >&2; exit 2; }
victim_id=$(ds_id "$victim")

if [ "$spare" = 1 ]; then
	sp=ds3
	sp_id=$(ds_id $sp)
	sp_pid=$(jq -r --arg n $sp '.nodes[] | select(.name == $n) | .pid' "$state")
	mapfile -t sp_cmd < <(jq -r --arg n $sp '.nodes[] | select(.name == $n) | .cmdline[]' "$state")
	sp_ns=$(jq -r --arg n $sp '.nodes[] | select(.name == $n) | .namespace' "$state")
	step "stop the spare $sp ($sp_id) while the files are written"
	kill -TERM "$sp_pid"
	for _ in $(seq 30); do kill -0 "$sp_pid" 2>/dev/null || break; sleep 1; done
	wait_up "$sp_id" false
fi

step "write $nfiles files of $file_mb MiB from c0"
src=$work/src
head -c "$((file_mb << 20))" /dev/urandom >"$src"
: >"$work/sums"
for i in $(seq -w 1 "$nfiles"); do
	# One random file reused under many names, but every MiB of each copy
	# is stamped with the file's name and the MiB's index, so a unit that
	# lands in the wrong file or at the wrong offset changes the sha256.
	perl -e 'my ($f, $tag) = @ARGV; open(my $h, "+<", $f) or die $!; my $n = -s $h;
		for (my $o = 0; $o < $n; $o += 1 << 20) { seek($h, $o, 0); print $h substr(sprintf("%s unit %08d ", $tag, $o >> 20), 0, $n - $o) }
		close($h) or die $!' "$src" "drain-bench f$i"
	echo "$(sha256sum <"$src" | cut -d' ' -f1) f$i" >>"$work/sums"
	tx 600 c0 -- "$bin" put "$src" "nfs://$mds/f$i"
done
rm -f "$src"

if [ "$spare" = 1 ]; then
	step "restart the spare $sp"
	setsid ip netns exec "$sp_ns" "${sp_cmd[@]}" >>"$tb/logs/$sp.log" 2>&1 </dev/null &
	restarted=$!
	wait_up "$sp_id" true
fi

status >"$work/status-before.json"
ds_bytes=$(jq -r --arg id "$victim_id" '.data_servers[] | select(.ID == $id) | .bytes' "$work/status-before.json")
ds_files=$(jq -r --arg id "$victim_id" '.data_servers[] | select(.ID == $id) | .files' "$work/status-before.json")
total_bytes=$(jq '[.data_servers[].bytes] | add' "$work/status-before.json")
step "victim $victim ($victim_id) holds $ds_bytes bytes of $ds_files files (cluster: $total_bytes bytes)"

cpu() { awk '/^cpu /{printf "%d %d\n", $2+$3+$4+$5+$6+$7+$8+$9, $5+$6}' /proc/stat; }
# CPU-seconds (utime+stime) of the testbed's server processes, by node
# name; the restarted spare is not in testbed.json, so it is left out.
pcpu() {
	local pid
	pid=$(jq -r --arg n "$1" '.nodes[] | select(.name == $n) | .pid' "$state")
	awk -v hz="$(getconf CLK_TCK)" '{sub(/^.*\) /, ""); printf "%.2f\n", ($12 + $13) / hz}' "/proc/$pid/stat"
}
netc() { ip netns exec "$name-mds" cat /sys/class/net/eth0/statistics/rx_bytes /sys/class/net/eth0/statistics/tx_bytes | paste -sd' '; }
(while sleep 5; do echo "$(date +%s) $(cut -d' ' -f1-3 /proc/loadavg)"; done) >"$work/load.log" 2>/dev/null &
sampler=$!
load_start=$(cut -d' ' -f1-3 /proc/loadavg)
read -r c0t c0i < <(cpu)
read -r rx0 tx0 < <(netc)
m0=$(pcpu mds) v0=$(pcpu "$victim")
step "shoal admin drain $victim_id"
s0=$(date +%s.%N)
tx "$drain_timeout" mds -- "$bin" admin drain --mds "$mds" --join-secret-file "$secret" "$victim_id" | tee "$work/drain.log" >&2
s1=$(date +%s.%N)
read -r rx1 tx1 < <(netc)
m1=$(pcpu mds) v1=$(pcpu "$victim")
read -r c1t c1i < <(cpu)
kill "$sampler" 2>/dev/null || true
sampler=""
load_end=$(cut -d' ' -f1-3 /proc/loadavg)
load_max=$( (echo "0 $load_start"; cat "$work/load.log"; echo "0 $load_end") | awk '{if ($2 > m) m = $2} END {print m + 0}')
load_during="${load_start%% *} at start, max $load_max, ${load_end%% *} at end (1-min)"
step "load during the drain: $load_during"

status >"$work/status-after.json"
job=$(jq -c .job "$work/status-after.json")
after_state=$(jq -r --arg id "$victim_id" '.data_servers[] | select(.ID == $id) | "\(.State) \(.files) \(.bytes)"' "$work/status-after.json")
[ "$(jq -r '.running' <<<"$job")" = false ] && [ -z "$(jq -r '.error // empty' <<<"$job")" ] ||
	{ echo "drain did not finish cleanly: $job" >&2; exit 1; }
[ "$after_state" = "drained 0 0" ] || { echo "victim after the drain: $after_state (want drained 0 0)" >&2; exit 1; }

step "read back $nfiles files from c0"
bad=0
while read -r sum f; do
	got=$(tx 600 c0 -- "$bin" cat "nfs://$mds/$f" | sha256sum | cut -d' ' -f1)
	if [ "$got" != "$sum" ]; then
		echo "MISMATCH $f: $got, want $sum" >&2
		bad=$((bad + 1))
	fi
done <"$work/sums"
[ "$bad" = 0 ] || { echo "$bad of $nfiles files differ after the drain" >&2; exit 1; }
step "all $nfiles files identical"

copied=$(jq -r .bytes <<<"$job")
# started/ended carry nanoseconds, which jq's date parser rejects: split them.
jsec() { jq -r --arg k "$1" '.[$k] | capture("^(?<s>[^.Z]+)(\\.(?<f>[0-9]+))?Z$") | ((.s + "Z" | fromdateiso8601) + ("0." + (.f // "0") | tonumber))' <<<"$job"; }
secs=$(awk -v a="$(jsec started)" -v b="$(jsec ended)" 'BEGIN {printf "%.2f", b - a}')
wall=$(awk -v a="$s0" -v b="$s1" 'BEGIN {printf "%.2f", b - a}')
mds_cpu=$(awk -v a="$m0" -v b="$m1" -v s="$secs" 'BEGIN {printf "%.2f", (b - a) / s}')
victim_cpu=$(awk -v a="$v0" -v b="$v1" -v s="$secs" 'BEGIN {printf "%.2f", (b - a) / s}')
cpu_busy=$(awk -v t="$((c1t - c0t))" -v i="$((c1i - c0i))" 'BEGIN {printf "%.0f", (t > 0 ? 100 * (t - i) / t : 0)}')
read -r mbps copied_mbps link_mbps rx_mbps tx_mbps < <(awk -v d="$ds_bytes" -v c="$copied" -v s="$secs" -v r="$rate_bps" \
	-v rx="$((rx1 - rx0))" -v tx="$((tx1 - tx0))" \
	'BEGIN {printf "%.1f %.1f %.1f %.1f %.1f\n", d/s/1e6, c/s/1e6, r/8/1e6, rx/s/1e6, tx/s/1e6}')

{
	echo
	printf '%-34s %s\n' "rate (per link, each direction)" "$rate = $link_mbps MB/s"
	printf '%-34s %s\n' "data servers" "$nds$([ "$spare" = 1 ] && echo " (one spare, empty)")"
	printf '%-34s %s\n' "files" "$nfiles x $file_mb MiB, $total_bytes bytes"
	printf '%-34s %s\n' "victim holds" "$ds_bytes bytes in $ds_files files"
	printf '%-34s %s\n' "drain time (MDS job / wall)" "$secs s / $wall s"
	printf '%-34s %s\n' "victim bytes / time" "$mbps MB/s ($(awk -v a="$mbps" -v b="$link_mbps" 'BEGIN {printf "%.0f", 100 * a / b}')% of link)"
	printf '%-34s %s\n' "copied+verified / time" "$copied bytes, $copied_mbps MB/s"
	printf '%-34s %s\n' "MDS link in / out over job time" "$rx_mbps / $tx_mbps MB/s ($((rx1 - rx0)) / $((tx1 - tx0)) bytes)"
	printf '%-34s %s\n' "CPU busy (machine)" "$cpu_busy %"
	printf '%-34s %s\n' "CPU of MDS / victim (cores)" "$mds_cpu / $victim_cpu"
	printf '%-34s %s\n' "load before / during" "$load_before / $load_during"
	echo
} >&2

line=$(jq -cn --arg rate "$rate" --argjson ds_bytes "$ds_bytes" --argjson seconds "$secs" --argjson mb_per_s "$mbps" \
	--argjson link_mb_per_s "$link_mbps" --argjson copied_bytes "$copied" --argjson copied_mb_per_s "$copied_mbps" \
	--argjson wall_seconds "$wall" --argjson mds_rx_mb_per_s "$rx_mbps" --argjson mds_tx_mb_per_s "$tx_mbps" \
	--argjson cpu_busy_pct "$cpu_busy" --argjson mds_cpu "$mds_cpu" --argjson victim_cpu "$victim_cpu" --arg load_before "$load_before" --arg load_during "$load_during" \
	--argjson data_servers "$nds" --argjson spare "$spare" --argjson files "$nfiles" --argjson file_mb "$file_mb" \
	'{rate: $rate, ds_bytes: $ds_bytes, seconds: $seconds, mb_per_s: $mb_per_s, link_mb_per_s: $link_mb_per_s,
	  copied_bytes: $copied_bytes, copied_mb_per_s: $copied_mb_per_s, wall_seconds: $wall_seconds,
	  mds_rx_mb_per_s: $mds_rx_mb_per_s, mds_tx_mb_per_s: $mds_tx_mb_per_s, cpu_busy_pct: $cpu_busy_pct, mds_cpu: $mds_cpu, victim_cpu: $victim_cpu,
	  load_before: $load_before, load_during: $load_during, data_servers: $data_servers, spare: ($spare == 1),
	  files: $files, file_mb: $file_mb}')
echo "$line"
[ -z "${OUT:-}" ] || echo "$line" >>"$OUT"
step "done"
