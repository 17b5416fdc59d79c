#!/usr/bin/env bash
# mds-cpu.sh: the MDS's CPU per metadata change (issue 27). For each shoal
# binary given (default: one built from this checkout) and each mode
# (synced, the default, and --sync=false), it starts `shoal serve` on
# 127.0.0.1, runs `shoal bench --addr --server-pid --workloads small`
# against it (Shoal's Go client, one operation at a time: create =
# OPEN(CREATE)+CLOSE of an empty file, stat, remove) and prints, per
# workload, the rate and the server's CPU time per operation (user+system
# from /proc, in µs), which a busy machine disturbs less than the rate.
# Binaries are alternated ROUNDS times so that a change of load hits each.
#
#   scripts/mds-cpu.sh                          # this checkout
#   scripts/mds-cpu.sh /tmp/shoal-before /tmp/shoal-after
#   FILES=2000 REPS=3 ROUNDS=2 MODES="sync async" scripts/mds-cpu.sh A B
#
# The client is the first binary's `shoal bench` (the same for every
# server). Everything listens on 127.0.0.1; servers are stopped by PID.
set -euo pipefail
cd "$(dirname "$0")/.."
FILES=${FILES:-2000} REPS=${REPS:-3} ROUNDS=${ROUNDS:-2} MODES=${MODES:-sync async}
work=$(mktemp -d)
pid=""
cleanup() { [ -n "$pid" ] && kill "$pid" 2>/dev/null && wait "$pid" 2>/dev/null; rm -rf "$work"; }
trap cleanup EXIT
bins=("$@")
if [ ${#bins[@]} -eq 0 ]; then
	go build -o "$work/shoal" ./cmd/shoal
	bins=("$work/shoal")
fi
client=${bins[0]}
port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
printf '%-28s %-6s %-8s %10s %12s\n' binary mode workload "ops/s" "CPU µs/op"
for r in $(seq "$ROUNDS"); do
	for i in "${!bins[@]}"; do
		b=${bins[$i]}
		for m in $MODES; do
			args=()
			[ "$m" = async ] && args=(--sync=false)
			# A fresh directory each time: a reopened one would start in
			# its grace period and refuse OPEN(CREATE) and REMOVE.
			d=$work/srv-$r-$i-$m
			p=$(port)
			"$b" serve --listen "127.0.0.1:$p" --dir "$d" --no-root-squash --log-level warn "${args[@]}" >"$work/serve.log" 2>&1 &
			pid=$!
			for _ in $(seq 100); do
				(echo >/dev/tcp/127.0.0.1/"$p") 2>/dev/null && break
				sleep 0.1
			done
			"$client" bench --addr "127.0.0.1:$p" --server-pid "$pid" --workloads small \
				--files "$FILES" --reps "$REPS" --json "$work/r.json" >/dev/null 2>"$work/bench.err" ||
				{ cat "$work/bench.err" >&2; exit 1; }
			kill "$pid"; wait "$pid" 2>/dev/null || true; pid=""
			python3 - "$work/r.json" "$b" "$m" <<'PY'
import json, sys, statistics
rep = json.load(open(sys.argv[1]))
for t in rep["targets"]:
    for r in t["results"]:
        cpu = [c / (s * r["samples"][i]) * 1e6 for i, (c, s) in enumerate(zip(r.get("server_cpu_seconds", []), r["seconds"]))]
        print("%-28s %-6s %-8s %10.0f %12.1f" % (sys.argv[2][-28:], sys.argv[3], r["workload"].split()[0],
              r["median"], statistics.median(cpu) if cpu else float("nan")))
PY
		done
	done
done
echo "load average: $(cut -d' ' -f1-3 /proc/loadavg)"
