#!/usr/bin/env bash
# The metadata engines side by side: create, stat and remove of empty files
# per second on bbolt (write-ahead log, group commit: what the server
# opens), etcd with one embedded member, three embedded members (the same
# etcd, in the benchmark's process), and a 3-member cluster of Debian's
# etcd as three processes on 127.0.0.1, each serially and from 16
# goroutines at once. etcd is opened as an elected MDS opens it (fenced on
# a leadership term, read cache on), and again without the read cache
# ("-nocache": every stat asks etcd). It runs meta's BenchmarkEngines (see
# there), prints a table and writes JSON to OUT (default etcd-bench.json).
# The txn/s column is meta's BenchmarkEtcdTxn on the same clusters: one
# Txn of a create's shape after another, straight to the leader with the
# plain etcd client, the floor under the engine's serial creates and
# removes (each is one such Txn).
#
#   FILES=2000 COUNT=3 PORT=23790 OUT=etcd-bench.json ETCD=system scripts/etcd-bench.sh
#
# FILES is the number of operations per measurement, COUNT the number of
# measurements (the median is reported), PORT the first of the ports the
# members use (client and peer port of each; six per cluster). Data
# directories are in TMPDIR, the embedded members' too, so all pay the
# same disk's fsyncs.
#
# ETCD picks the etcd of the 3-process cluster:
#   system  (the default) the machine's etcd (/usr/bin/etcd, Debian's
#           etcd-server package: 3.4 on Debian 12); rows etcd-external.
#   newest  the etcd-server of Debian's unstable suite, fetched with
#           apt-get download through a private apt configuration (its own
#           sources.list, lists and cache under ETCD_CACHE, default
#           /var/cache/shoal-etcd; the machine's apt sources are only
#           read, never changed) and unpacked with dpkg-deb -x into
#           ETCD_CACHE/VERSION; nothing is installed. Rows
#           etcd-external-newest.
#   both    a cluster of each, side by side (both row sets).
#   PATH    any etcd binary; rows etcd-external.
# SINGLE=1 also starts a one-member cluster of each of these binaries, as
# one process (rows etcd-external-1m, etcd-external-newest-1m): the same
# etcd without replication, which tells what the version and the process
# boundary cost (against etcd-embedded) from what the two more members
# cost (against the 3-member rows).
#
# Where the time of a serial change goes, and what TMPDIR does to it, is
# in docs/benchmarks.md ("etcd 3.4, serial changes"): TMPDIR=/dev/shm
# takes the disk out of every etcd row alike (a diagnostic, not a
# durable setup).
# BASE=COMMIT also measures the engines of that commit (rows ENGINE@COMMIT;
# the benchmark is copied into its tree), alternating with this tree's run
# by run, so that a change of the machine's load hits both alike:
#
#   BASE=3a50d0d COUNT=5 ETCD=both scripts/etcd-bench.sh
set -euo pipefail
cd "$(dirname "$0")/.."
FILES=${FILES:-2000}
COUNT=${COUNT:-3}
PORT=${PORT:-23790}
OUT=$(realpath -m "${OUT:-etcd-bench.json}")
ETCD=${ETCD:-system}
ETCD_CACHE=${ETCD_CACHE:-/var/cache/shoal-etcd}
command -v etcdctl >/dev/null || { echo "etcd-bench: needs etcdctl (apt-get install etcd-client)" >&2; exit 1; }

# system_etcd prints the machine's etcd.
system_etcd() {
	command -v etcd || { echo "etcd-bench: needs etcd (apt-get install etcd-server)" >&2; return 1; }
}

# newest_etcd prints the etcd binary of Debian unstable's etcd-server,
# fetching and unpacking it first if this version is not in the cache.
newest_etcd() {
	local a=$ETCD_CACHE/apt-sid ver dir
	mkdir -p "$a/lists/partial" "$a/cache/archives/partial"
	exec 8>"$ETCD_CACHE/.lock"
	flock 8
	echo "deb [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] http://deb.debian.org/debian sid main" >"$a/sources.list"
	cat >"$a/apt.conf" <<-EOF
		Dir::Etc::SourceList "$a/sources.list";
		Dir::Etc::SourceParts "/dev/null";
		Dir::State::Lists "$a/lists";
		Dir::Cache "$a/cache";
		Acquire::Languages "none";
		Acquire::IndexTargets::deb::DEP-11::DefaultEnabled "false";
		APT::Sandbox::User "root";
	EOF
	echo "etcd-bench: updating the private package lists of Debian unstable ($a)" >&2
	APT_CONFIG=$a/apt.conf apt-get update -q --error-on=any >&2 ||
		{ echo "etcd-bench: apt-get update of Debian unstable failed" >&2; return 1; }
	ver=$(APT_CONFIG=$a/apt.conf apt-cache show --no-all-versions etcd-server | sed -n 's/^Version: //p' | head -n 1)
	[ -n "$ver" ] || { echo "etcd-bench: no etcd-server in Debian unstable" >&2; return 1; }
	dir=$ETCD_CACHE/$ver
	if [ ! -x "$dir/usr/bin/etcd" ]; then
		echo "etcd-bench: fetching etcd-server $ver from Debian unstable into $dir" >&2
		rm -rf "$dir" "$a/deb"
		mkdir -p "$a/deb"
		(cd "$a/deb" && APT_CONFIG=$a/apt.conf apt-get download -q "etcd-server=$ver" >&2) ||
			{ echo "etcd-bench: apt-get download etcd-server=$ver failed" >&2; return 1; }
		mkdir -p "$dir.tmp"
		dpkg-deb -x "$a"/deb/etcd-server_*.deb "$dir.tmp"
		mv "$dir.tmp" "$dir"
		rm -rf "$a/deb"
	fi
	"$dir/usr/bin/etcd" --version >/dev/null ||
		{ echo "etcd-bench: $dir/usr/bin/etcd does not run here" >&2; return 1; }
	echo "$dir/usr/bin/etcd"
}

# clusters: "SUFFIX|BINARY|MEMBERS" per external cluster to start.
clusters=()
case "$ETCD" in
system) clusters+=("|$(system_etcd)|3") ;;
newest) clusters+=("-newest|$(newest_etcd)|3") ;;
both) clusters+=("|$(system_etcd)|3" "-newest|$(newest_etcd)|3") ;;
*)
	[ -x "$ETCD" ] || { echo "etcd-bench: ETCD=$ETCD: want system, newest, both or an etcd binary" >&2; exit 2; }
	clusters+=("|$ETCD|3")
	;;
esac
if [ "${SINGLE:-0}" = 1 ]; then
	for c in "${clusters[@]}"; do
		c=${c%|3}
		clusters+=("${c%%|*}-1m|${c#*|}|1")
	done
fi

work=$(mktemp -d "${TMPDIR:-/tmp}/etcd-bench.XXXXXX")
pids=()
cleanup() {
	for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
	for p in "${pids[@]}"; do wait "$p" 2>/dev/null || true; done
	rm -rf "$work"
}
trap cleanup EXIT

go test -c -o "$work/meta.test" ./meta
if [ -n "${BASE:-}" ]; then
	mkdir "$work/base"
	git archive "$BASE" | tar -x -C "$work/base"
	# The base may have no NoReadCache: its etcd rows are what it does.
	sed 's/NoReadCache: nocache,//' meta/engine_bench_test.go >"$work/base/meta/engine_bench_test.go"
	(cd "$work/base" && go test -c -o "$work/meta-base.test" ./meta)
fi

# start_cluster N BINARY MEMBERS: MEMBERS (at most three) members of
# BINARY on ports PORT+6N ... PORT+6N+5, data in $work/cN; prints the
# client endpoints.
start_cluster() {
	local n=$1 bin=$2 base=$((PORT + 6 * $1)) initial=() endpoints=() i c p
	for ((i = 0; i < $3; i++)); do
		initial+=("m$i=http://127.0.0.1:$((base + 2 * i + 1))")
		endpoints+=("127.0.0.1:$((base + 2 * i))")
	done
	initial=$(IFS=,; echo "${initial[*]}")
	endpoints=$(IFS=,; echo "${endpoints[*]}")
	for ((i = 0; i < $3; i++)); do
		c=$((base + 2 * i)) p=$((base + 2 * i + 1))
		"$bin" --name "m$i" --data-dir "$work/c$n/m$i" \
			--listen-client-urls "http://127.0.0.1:$c" --advertise-client-urls "http://127.0.0.1:$c" \
			--listen-peer-urls "http://127.0.0.1:$p" --initial-advertise-peer-urls "http://127.0.0.1:$p" \
			--initial-cluster "$initial" --initial-cluster-state new --initial-cluster-token "etcd-bench-$n" \
			--log-level warn >"$work/c$n-m$i.log" 2>&1 &
		pids+=($!)
	done
	echo "$endpoints"
}
# wait_healthy ENDPOINTS: until every member answers.
wait_healthy() {
	for _ in $(seq 150); do
		if ETCDCTL_API=3 etcdctl --endpoints "$1" --command-timeout 2s endpoint health >/dev/null 2>&1; then
			return 0
		fi
		sleep 0.2
	done
	echo "etcd-bench: the cluster at $1 did not become healthy" >&2
	tail -n 5 "$work"/c*-m*.log >&2
	return 1
}
# Started here, not in $(...), so that cleanup knows the members' PIDs.
suffixes=() eps=() versions=()
for n in "${!clusters[@]}"; do
	IFS='|' read -r suffix bin members <<<"${clusters[$n]}"
	mkdir -p "$work/c$n"
	start_cluster "$n" "$bin" "$members" >"$work/c$n/endpoints"
	suffixes+=("$suffix")
	eps+=("$(cat "$work/c$n/endpoints")")
	versions+=("etcd-external$suffix: $("$bin" --version | sed -n 's/^etcd Version: //p') ($bin)")
done
for e in "${eps[@]}"; do wait_healthy "$e"; done

# run BINARY BENCH-REGEXP SUFFIX ENDPOINTS EXTERNAL-SUFFIX: one
# measurement of each benchmark against the external cluster at
# ENDPOINTS, the external engines renamed etcd-external$EXTERNAL-SUFFIX and
# then every engine ENGINE$SUFFIX, appended to bench.txt.
run() {
	(cd "$work" && TMPDIR="$work" SHOAL_BENCH_ETCD="$4" "./$1" -test.run '^$' -test.bench "$2" \
		-test.benchtime "${FILES}x" -test.count 1 -test.timeout 60m) >"$work/run.txt" 2>&1 || true
	grep -q '^PASS' "$work/run.txt" || { cat "$work/run.txt" >&2; echo "etcd-bench: $1 failed" >&2; exit 1; }
	sed -E -e 's#^BenchmarkEtcdTxn/#BenchmarkEngines/#' \
		-e "s#^BenchmarkEngines/etcd-external([-/])#BenchmarkEngines/etcd-external$5\1#" \
		-e "s#^(BenchmarkEngines/[^/]+)/#\1$3/#" "$work/run.txt" | grep -E '^Benchmark' | tee -a "$work/bench.txt" >&2
}
load_before=$(cut -d' ' -f1-3 /proc/loadavg)
: >"$work/bench.txt"
for _ in $(seq "$COUNT"); do
	for n in "${!eps[@]}"; do
		# The engines that need no external cluster run once per round.
		if [ "$n" = 0 ]; then
			all='^BenchmarkEngines$' base='^BenchmarkEngines$/^(bolt|etcd-embedded|etcd-embedded3|etcd-external)$/'
			txn='^BenchmarkEtcdTxn$'
		else
			all='^BenchmarkEngines$/^etcd-external' base='^BenchmarkEngines$/^etcd-external$/'
			txn='^BenchmarkEtcdTxn$/^etcd-external$'
		fi
		if [ -n "${BASE:-}" ]; then
			run meta-base.test "$base" "@$BASE" "${eps[$n]}" "${suffixes[$n]}"
		fi
		run meta.test "$all" "" "${eps[$n]}" "${suffixes[$n]}"
		# The floor: one create-shaped Txn straight to the leader.
		run meta.test "$txn" "" "${eps[$n]}" "${suffixes[$n]}"
	done
done
load_after=$(cut -d' ' -f1-3 /proc/loadavg)

# Lines "BenchmarkEngines/ENGINE/conc-N/OP-P  ITER  NS ns/op" become one
# JSON record per engine, concurrency and operation: the median rate over
# COUNT runs and every sample.
jq -R -s --arg files "$FILES" --arg cpu "$(sed -n 's/^model name\s*: //p' /proc/cpuinfo | head -n 1)" \
	--arg nproc "$(nproc)" --arg etcd "$(printf '%s\n' "${versions[@]}")" \
	--arg load_before "$load_before" --arg load_after "$load_after" --arg disk "$(df --output=source "$work" | tail -n 1)" '
	[split("\n")[] | capture("^BenchmarkEngines/(?<engine>[^/]+)/conc-(?<conc>[0-9]+)/(?<op>[a-z]+)(-[0-9]+)?\\s+[0-9]+\\s+(?<ns>[0-9.]+) ns/op(\\s+(?<req>[0-9.]+) req/op)?")]
	| group_by([.engine, .conc, .op])
	| map({engine: .[0].engine, conc: (.[0].conc | tonumber), op: .[0].op,
		samples: map(1e9 / (.ns | tonumber) | round),
		req_samples: map(.req // empty | tonumber)}
		| .per_sec = (.samples | sort | .[(length - 1) / 2 | floor])
		| .requests_per_op = (.req_samples | if length > 0 then sort | .[(length - 1) / 2 | floor] else null end))
	| {machine: {cpu: $cpu, cpus: ($nproc | tonumber), loadavg_before: $load_before, loadavg_after: $load_after, disk: $disk},
	   etcd_versions: ($etcd | split("\n")), ops_per_measurement: ($files | tonumber), results: .}' "$work/bench.txt" >"$OUT"

# The table: one row per engine and concurrency, operations per second.
jq -r '
	def rate($e; $c; $o): (.results[] | select(.engine == $e and .conc == $c and .op == $o) | .per_sec) // 0;
	def reqs($e; $c; $o): (.results[] | select(.engine == $e and .conc == $c and .op == $o) | .requests_per_op) // null
		| if . == null then "-" else . * 100 | round / 100 | tostring end;
	. as $r
	| "engine                         conc  create/s   stat/s  remove/s     txn/s  requests per create, stat, remove",
	  ([.results[] | [.engine, .conc]] | unique | sort_by(.[1]) | .[]
	   | . as [$e, $c]
	   | "\($e | . + " " * (30 - length)) \($c | tostring | " " * (4 - length) + .)  \([$r | rate($e; $c; "create"), rate($e; $c; "stat"), rate($e; $c; "remove"), rate($e; $c; "txn")] | map(if . == 0 then "-" else tostring end | " " * (8 - length) + .) | join(" "))  \([$r | reqs($e; $c; "create"), reqs($e; $c; "stat"), reqs($e; $c; "remove")] | join(", "))"),
	  (["etcd-external", "etcd-external-newest", "etcd-embedded3", "etcd-external-1m", "etcd-external-newest-1m"][] as $e
	   | [.results[].conc] | unique | .[] as $c
	   | [$r | rate($e; $c; "create"), rate("etcd-embedded"; $c; "create"),
	      rate($e; $c; "stat"), rate("etcd-embedded"; $c; "stat"),
	      rate($e; $c; "remove"), rate("etcd-embedded"; $c; "remove")]
	   | select(.[1] > 0 and .[0] > 0)
	   | "\($e) / etcd-embedded, conc \($c): create \(.[0] / .[1] * 100 | round)%, stat \(.[2] / .[3] * 100 | round)%, remove \(.[4] / .[5] * 100 | round)%"),
	  (["etcd-external", "etcd-external-newest"][] as $e
	   | [.results[].conc] | unique | .[] as $c
	   | [$r | rate($e; $c; "create"), rate($e + "-1m"; $c; "create"), rate($e; $c; "remove"), rate($e + "-1m"; $c; "remove")]
	   | select(.[1] > 0 and .[0] > 0)
	   | "\($e) / \($e)-1m, conc \($c): create \(.[0] / .[1] * 100 | round)%, remove \(.[2] / .[3] * 100 | round)%"),
	  ([.results[] | select(.op == "txn") | .engine] | unique | .[] as $e
	   | [$r | rate($e; 1; "create"), rate($e; 1; "remove"), rate($e; 1; "txn")]
	   | select(.[0] > 0 and .[2] > 0)
	   | "\($e), serial: creates at \(.[0] / .[2] * 100 | round)%, removes at \(.[1] / .[2] * 100 | round)% of one bare Txn to the leader (txn/s)"),
	  "machine: \(.machine.cpus) x \(.machine.cpu), load \(.machine.loadavg_before) before, \(.machine.loadavg_after) after; etcd \(.etcd_versions | join("; ")); \(.ops_per_measurement) ops per measurement, median of \(.results[0].samples | length)"
' "$OUT"
echo "JSON: $OUT"
