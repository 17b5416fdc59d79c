#!/usr/bin/env bash
# The metadata engines side by side: create, stat and remove of empty files
# per second on bbolt (write-ahead log, group commit: what the server
# opens), etcd with one embedded member, three embedded members (the same
# etcd, in the benchmark's process), and a 3-member cluster of the
# system's etcd (Debian's etcd-server) as three processes on 127.0.0.1,
# each serially and from 16 goroutines at once, etcd with group commit and
# without ("-solo"). It runs meta's BenchmarkEngines (see there), prints a
# table and writes JSON to OUT (default etcd-bench.json).
#
#   FILES=2000 COUNT=3 PORT=23790 OUT=etcd-bench.json scripts/etcd-bench.sh
#
# FILES is the number of operations per measurement, COUNT the number of
# measurements (the median is reported), PORT the first of the six ports
# the members use (client and peer port of each). Data directories are in
# TMPDIR, the embedded member's too, so both pay the same disk's fsyncs.
# BASE=COMMIT also measures the engines of that commit (rows ENGINE@COMMIT;
# the benchmark is copied into its tree), alternating with this tree's run
# by run, so that a change of the machine's load hits both alike:
#
#   BASE=3a50d0d COUNT=5 scripts/etcd-bench.sh
set -euo pipefail
cd "$(dirname "$0")/.."
command -v etcd >/dev/null || { echo "etcd-bench: needs etcd (apt-get install etcd-server)" >&2; exit 1; }
FILES=${FILES:-2000}
COUNT=${COUNT:-3}
PORT=${PORT:-23790}
OUT=$(realpath -m "${OUT:-etcd-bench.json}")

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
	# The base has no NoGroupCommit: its etcd rows are what it does.
	sed 's/NoGroupCommit: solo,//' meta/engine_bench_test.go >"$work/base/meta/engine_bench_test.go"
	(cd "$work/base" && go test -c -o "$work/meta-base.test" ./meta)
fi

initial=() endpoints=()
for i in 0 1 2; do
	initial+=("m$i=http://127.0.0.1:$((PORT + 2 * i + 1))")
	endpoints+=("127.0.0.1:$((PORT + 2 * i))")
done
initial=$(IFS=,; echo "${initial[*]}")
endpoints=$(IFS=,; echo "${endpoints[*]}")
for i in 0 1 2; do
	c=$((PORT + 2 * i)) p=$((PORT + 2 * i + 1))
	etcd --name "m$i" --data-dir "$work/m$i" \
		--listen-client-urls "http://127.0.0.1:$c" --advertise-client-urls "http://127.0.0.1:$c" \
		--listen-peer-urls "http://127.0.0.1:$p" --initial-advertise-peer-urls "http://127.0.0.1:$p" \
		--initial-cluster "$initial" --initial-cluster-state new --initial-cluster-token etcd-bench \
		--log-level warn >"$work/m$i.log" 2>&1 &
	pids+=($!)
done
healthy=
for _ in $(seq 150); do
	if ETCDCTL_API=3 etcdctl --endpoints "$endpoints" --command-timeout 2s endpoint health >/dev/null 2>&1; then
		healthy=1
		break
	fi
	sleep 0.2
done
[ -n "$healthy" ] || { echo "etcd-bench: the cluster at $endpoints did not become healthy" >&2; tail -n 5 "$work"/m*.log >&2; exit 1; }

# run BINARY BENCH-REGEXP SUFFIX: one measurement of each benchmark,
# engines renamed ENGINE$SUFFIX, appended to bench.txt.
run() {
	(cd "$work" && TMPDIR="$work" SHOAL_BENCH_ETCD="$endpoints" "./$1" -test.run '^$' -test.bench "$2" \
		-test.benchtime "${FILES}x" -test.count 1 -test.timeout 60m) >"$work/run.txt" 2>&1 || true
	grep -q '^PASS' "$work/run.txt" || { cat "$work/run.txt" >&2; echo "etcd-bench: $1 failed" >&2; exit 1; }
	sed -E "s#^(BenchmarkEngines/[^/]+)/#\1$3/#" "$work/run.txt" | grep -E '^Benchmark' | tee -a "$work/bench.txt" >&2
}
load_before=$(cut -d' ' -f1-3 /proc/loadavg)
: >"$work/bench.txt"
for _ in $(seq "$COUNT"); do
	if [ -n "${BASE:-}" ]; then
		run meta-base.test '^BenchmarkEngines$/^(bolt|etcd-embedded|etcd-external)$/' "@$BASE"
	fi
	run meta.test '^BenchmarkEngines$' ""
done
load_after=$(cut -d' ' -f1-3 /proc/loadavg)

# Lines "BenchmarkEngines/ENGINE/conc-N/OP-P  ITER  NS ns/op" become one
# JSON record per engine, concurrency and operation: the median rate over
# COUNT runs and every sample.
jq -R -s --arg files "$FILES" --arg cpu "$(sed -n 's/^model name\s*: //p' /proc/cpuinfo | head -n 1)" \
	--arg nproc "$(nproc)" --arg etcd "$(etcd --version | sed -n 's/^etcd Version: //p')" \
	--arg load_before "$load_before" --arg load_after "$load_after" --arg disk "$(df --output=source "$work" | tail -n 1)" '
	[split("\n")[] | capture("^BenchmarkEngines/(?<engine>[^/]+)/conc-(?<conc>[0-9]+)/(?<op>[a-z]+)(-[0-9]+)?\\s+[0-9]+\\s+(?<ns>[0-9.]+) ns/op")]
	| group_by([.engine, .conc, .op])
	| map({engine: .[0].engine, conc: (.[0].conc | tonumber), op: .[0].op,
		samples: map(1e9 / (.ns | tonumber) | round)}
		| .per_sec = (.samples | sort | .[(length - 1) / 2 | floor]))
	| {machine: {cpu: $cpu, cpus: ($nproc | tonumber), loadavg_before: $load_before, loadavg_after: $load_after, disk: $disk},
	   etcd_version: $etcd, ops_per_measurement: ($files | tonumber), results: .}' "$work/bench.txt" >"$OUT"

# The table: one row per engine and concurrency, operations per second.
jq -r '
	def rate($e; $c; $o): (.results[] | select(.engine == $e and .conc == $c and .op == $o) | .per_sec) // 0;
	. as $r
	| "engine                 conc  create/s   stat/s  remove/s",
	  ([.results[] | [.engine, .conc]] | unique | sort_by(.[1]) | .[]
	   | . as [$e, $c]
	   | "\($e | . + " " * (22 - length)) \($c | tostring | " " * (4 - length) + .)  \([$r | rate($e; $c; "create"), rate($e; $c; "stat"), rate($e; $c; "remove")] | map(tostring | " " * (8 - length) + .) | join(" "))"),
	  ([.results[].conc] | unique | .[] as $c
	   | [$r | rate("etcd-external"; $c; "create"), rate("etcd-embedded"; $c; "create"),
	      rate("etcd-external"; $c; "stat"), rate("etcd-embedded"; $c; "stat"),
	      rate("etcd-external"; $c; "remove"), rate("etcd-embedded"; $c; "remove")]
	   | select(.[1] > 0 and .[0] > 0)
	   | "3 members / embedded, conc \($c): create \(.[0] / .[1] * 100 | round)%, stat \(.[2] / .[3] * 100 | round)%, remove \(.[4] / .[5] * 100 | round)%"),
	  ([.results[].conc] | unique | .[] as $c
	   | [$r | rate("etcd-embedded3"; $c; "create"), rate("etcd-embedded"; $c; "create"),
	      rate("etcd-embedded3"; $c; "stat"), rate("etcd-embedded"; $c; "stat"),
	      rate("etcd-embedded3"; $c; "remove"), rate("etcd-embedded"; $c; "remove")]
	   | select(.[1] > 0 and .[0] > 0)
	   | "3 embedded members / 1, same etcd, conc \($c): create \(.[0] / .[1] * 100 | round)%, stat \(.[2] / .[3] * 100 | round)%, remove \(.[4] / .[5] * 100 | round)%"),
	  "machine: \(.machine.cpus) x \(.machine.cpu), load \(.machine.loadavg_before) before, \(.machine.loadavg_after) after; etcd \(.etcd_version); \(.ops_per_measurement) ops per measurement, median of \(.results[0].samples | length)"
' "$OUT"
echo "JSON: $OUT"
