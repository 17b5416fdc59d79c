#!/usr/bin/env bash
# fuse-meta-ab.sh: scripts/fuse-meta.sh for two configurations, A and B,
# in alternating sittings (A, B, A, B, ...), and the ratio of their rates
# pair by pair.
#
#   scripts/fuse-meta-ab.sh                          # Shoal --sync=false against MooseFS's default
#   PAIRS=5 RUNS=3 scripts/fuse-meta-ab.sh
#   A="SHOAL=/tmp/shoal-base UP_ARGS=--sync=false" B="SHOAL=/tmp/shoal-new UP_ARGS=--sync=false" scripts/fuse-meta-ab.sh
#   OUT=/tmp/ab scripts/fuse-meta-ab.sh              # keep each sitting's JSON there
#
# Why alternate: on the 2-CPU VM these benchmarks run on, every process's
# CPU per operation moves by 15-20% for minutes at a time, with the same
# operations done (docs/benchmarks.md, "Async deletes through the mount:
# two speeds"): a sitting of Shoal and a sitting of MooseFS a few minutes
# apart can land in different windows, and their ratio then says more
# about the machine than about either. Sittings next to each other mostly
# share a window, so the ratio of each pair is the figure to read; each
# sitting's cold-stat rate shows the window it ran in (the stat phase
# barely involves the servers). Each sitting's CPU per file (server, mount
# and workers together, from fuse-meta.sh's DIAG counters) is printed
# too: when other work loads the machine, the rates follow it, the CPU
# per file much less.
#
# A and B are NAME=VALUE words passed to fuse-meta.sh's environment (a
# value cannot hold spaces). PAIRS (default 3), RUNS (runs per sitting,
# default 3) and everything else fuse-meta.sh reads (DS, PROCS, FILES,
# ...) apply to both. fuse-meta.sh runs with DIAG=1. SHOAL defaults to a
# binary built once from this checkout.
set -euo pipefail

A=${A:-UP_ARGS=--sync=false}
B=${B:-TARGET=moosefs}
PAIRS=${PAIRS:-3}
RUNS=${RUNS:-3}
repo=$(cd "$(dirname "$0")/.." && pwd)
work=$(mktemp -d "${TMPDIR:-/tmp}/shoal-fuse-meta-ab.XXXXXX")
trap 'rm -rf "$work"' EXIT
out=${OUT:-$work}
mkdir -p "$out"

if [[ -z ${SHOAL:-} ]]; then
	(cd "$repo" && go build -o "$work/shoal" ./cmd/shoal)
	export SHOAL=$work/shoal
fi

for i in $(seq 1 "$PAIRS"); do
	for side in A B; do
		words=$A
		[[ $side == B ]] && words=$B
		echo "pair $i, $side ($words): load average $(cut -d' ' -f1-3 /proc/loadavg)" >&2
		# shellcheck disable=SC2086 # words is a list of NAME=VALUE
		env RUNS="$RUNS" DIAG=1 OUT="$out/$side-$i.json" $words "$repo/scripts/fuse-meta.sh" \
			>"$out/$side-$i.txt" 2>&1 || { cat "$out/$side-$i.txt" >&2; exit 1; }
	done
done

python3 - "$out" "$PAIRS" "$A" "$B" <<'EOF'
import json, statistics, sys
out, pairs, a, b = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4]
print(f"A: {a}\nB: {b}")


def cpu_us(res, phase):
    """Median over the sitting's runs of the CPU-µs per file of the
    server, the mount and the workers together (DIAG): on a loaded
    machine, the figure that still compares."""
    runs = [d for d in res.get("diag", []) if d["phase"] == phase]
    if not runs:
        return float("nan")
    return statistics.median(sum(d[k]["run_ms"] for k in ("server", "mount", "workers")) for d in runs)

print(f"{'pair':4} {'phase':7} {'A/s':>9} {'B/s':>9} {'A/B':>6}   {'A stat/s':>9} {'B stat/s':>9}   {'A CPU-µs':>9} {'B CPU-µs':>9}")
ratios = {p: [] for p in ("create", "stat", "delete")}
for i in range(1, pairs + 1):
    ra, rb = (json.load(open(f"{out}/{s}-{i}.json")) for s in ("A", "B"))
    for p in ratios:
        x, y = ra[p]["per_second"], rb[p]["per_second"]
        ratios[p].append(x / y)
        print(f"{i:4} {p:7} {x:9} {y:9} {x / y:6.2f}   {ra['stat']['per_second']:9} {rb['stat']['per_second']:9}"
              f"   {cpu_us(ra, p):9.1f} {cpu_us(rb, p):9.1f}")
for p, r in ratios.items():
    print(f"{p}: A/B per pair {' '.join(f'{x:.2f}' for x in r)}; median {statistics.median(r):.2f}")
print("CPU-µs: per file, server + mount + workers, median of the sitting's runs")
EOF
