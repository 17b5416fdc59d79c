#!/usr/bin/env bash
# bench-papers.sh — regenerate the pNFS benchmark results of
# docs/benchmarks.md on an emulated cluster (shoal testbed), with the
# baselines in the same run, and draw the plots.
#
#   sudo scripts/bench-papers.sh [OUTDIR]      (default docs/bench)
#
# Sweeps, all with --clients client processes each in its own namespace:
#   1. data servers 1..6, 8 clients, pNFS on and off   -> ds.json
#   2. clients 1,2,4,8 on 6 DS: Shoal pNFS on/off and NFS-Ganesha in the
#      MDS namespace                                   -> clients-*.json
#   3. transfer size 32KiB..4MiB, 8 clients, 6 DS      -> block-*.json
#   4. small files (mdtest- and postmark-like): Shoal pNFS, pNFS off,
#      NFS-Ganesha                                     -> meta-*.json
#   5. the data-server sweep again at RATE2 (faster links than the
#      machine's CPU can fill: where the CPU, not the network, limits) -> ds-RATE2.json
#   6. the cost of copies: MIRRORS (1 and 2) copies of every stripe unit
#      (shoal mds --mirrors) on MIRROR_DS data servers, the same clients,
#      pNFS on, a fresh testbed per number of copies    -> mirrors.json
# then `shoal bench plot` writes the PNG/SVG plots and results.md.
#
# Environment: RATE (per-link rate, default 500mbit: the rate at which this
# 2-core machine moves the whole NFS stack of 6 DS x 8 clients without
# running out of CPU; see docs/benchmarks.md), CLIENTS (default 8),
# MAXDS (default 6), STONEWALL (per phase, default 6s), BLOCK (bytes per
# client, default 512MiB: more than a stonewall's worth, so every cell runs
# for the stonewall time), REPS (repetitions of sweep 1, default 3; the
# tables give median [min-max]), SHOAL_BIN (a prebuilt shoal, built without -tags noplot, so not the
# Debian package's; default: go build),
# STEPS (which of the sweeps 1-6 to run, default all; given, earlier
# results in OUTDIR are kept), NAME (testbed name, default shoalbench), RATE2 (a second data-server
# sweep at this rate, default 1gbit; empty: none; RATE2_DS its data-server
# counts, default 1,2,4,MAXDS), STORAGE (data servers' storage,
# default tmpfs: see `shoal testbed up --help`), MIRRORS (copies swept in
# step 6, default 1,2), MIRROR_DS (its data servers, default 4),
# MIRROR_BLOCK (bytes per client in step 6, default 256MiB, not
# stonewalled: every cell moves the same bytes, so the read phases after
# one and two copies are equally long), MIRROR_REPS (default REPS).
# Needs root, ip, tc and, for the baseline, ganesha.nfsd. Takes about 20
# minutes on a 2-core machine.
set -euo pipefail

cd "$(dirname "$0")/.."
out=${1:-docs/bench}
rate=${RATE:-500mbit}
clients=${CLIENTS:-8}
maxds=${MAXDS:-6}
stonewall=${STONEWALL:-6s}
block=${BLOCK:-512MiB}
reps=${REPS:-3}
storage=${STORAGE:-tmpfs}
name=${NAME:-shoalbench}
rate2=${RATE2-1gbit}
rate2ds=${RATE2_DS:-1,2,4,$maxds}
mirrors=${MIRRORS:-1,2}
mirrords=${MIRROR_DS:-4}
mirrorblock=${MIRROR_BLOCK:-256MiB}
mirrorreps=${MIRROR_REPS:-$reps}
steps=" ${STEPS:-1 2 3 4 5 6} "
want() { [[ $steps == *" $1 "* ]]; }
mkdir -p "$out"
if [ -z "${STEPS:-}" ]; then
	rm -f "$out"/*.json
fi

bin=${SHOAL_BIN:-}
if [ -z "$bin" ]; then
	bin=$(mktemp -d)/shoal
	go build -o "$bin" ./cmd/shoal
fi

down() { "$bin" testbed down --name "$name" >/dev/null 2>&1 || true; }
trap down EXIT INT TERM
down

log="$out/tables.txt"
[ -n "${STEPS:-}" ] || : >"$log"
start=$(date +%s)
step() { echo "== $(($(date +%s) - start))s: $*" | tee -a "$log" >&2; }

common=(--workloads ior --reps 1 --stonewall "$stonewall" --testbed-name "$name")

if want 1; then
	step "1. data servers 1..$maxds, $clients clients, pNFS on/off, rate $rate"
	"$bin" bench "${common[@]}" --reps "$reps" --testbed-up --rate "$rate" --storage "$storage" --ds "$(seq -s, 1 "$maxds")" \
		--clients "$clients" --block "$block" --transfer 1MiB --label ds --json "$out/ds.json" | tee -a "$log"
fi

if want 2 || want 3 || want 4; then
	step "bring up $maxds DS, $clients clients for the remaining sweeps"
	"$bin" testbed up --name "$name" --ds "$maxds" --clients "$clients" --rate "$rate" --storage "$storage" >/dev/null
fi

want 2 && step "2. clients sweep on $maxds DS (Shoal pNFS on/off, NFS-Ganesha)"
for c in 1 2 4 8; do
	want 2 || break
	[ "$c" -le "$clients" ] || continue
	"$bin" bench "${common[@]}" --testbed --ds "$maxds" --clients "$c" --block "$block" --transfer 1MiB \
		--label clients --json "$out/clients-shoal-$c.json" | tee -a "$log"
	"$bin" bench "${common[@]}" --testbed --ds "$maxds" --clients "$c" --block "$block" --transfer 1MiB \
		--target ganesha --ganesha-script scripts/ganesha.sh --label clients --json "$out/clients-ganesha-$c.json" | tee -a "$log" ||
		echo "ganesha baseline failed (is ganesha.nfsd installed?)" >&2
done

want 3 && step "3. transfer-size sweep, $clients clients, $maxds DS"
for t in 32KiB 64KiB 128KiB 256KiB 512KiB 1MiB 2MiB 4MiB; do
	want 3 || break
	"$bin" bench "${common[@]}" --stonewall 5s --testbed --ds "$maxds" --clients "$clients" --block 64MiB \
		--transfer "$t" --label block --json "$out/block-$t.json" | tee -a "$log"
done

meta=(--workloads meta --testbed --testbed-name "$name" --ds "$maxds" --clients "$clients"
	--files 200 --file-size 4096 --pool-files 100 --transactions 300)
if want 4; then
	step "4. small files: mdtest- and postmark-like"
	# The raw pNFS shape: every file over the data servers. The client's
	# default small-I/O threshold (64 KiB) would send these 4 KiB files
	# through the MDS instead (docs/client-policy.md measures both).
	"$bin" bench "${meta[@]}" --pnfs on --small-io-threshold=-1 --json "$out/meta-shoal-pnfs.json" | tee -a "$log"
	"$bin" bench "${meta[@]}" --pnfs off --json "$out/meta-shoal-off.json" | tee -a "$log"
	"$bin" bench "${meta[@]}" --target ganesha --ganesha-script scripts/ganesha.sh --json "$out/meta-ganesha.json" | tee -a "$log" ||
		echo "ganesha baseline failed" >&2
fi

step "tear down"
down

if [ -n "$rate2" ] && want 5; then
	step "5. data servers $rate2ds again at $rate2 per link: where does the CPU become the limit?"
	"$bin" bench "${common[@]}" --testbed-up --rate "$rate2" --storage "$storage" --ds "$rate2ds" \
		--clients "$clients" --block "$block" --transfer 1MiB --label "ds-$rate2" --json "$out/ds-$rate2.json" | tee -a "$log"
fi

if want 6; then
	# Write ceiling with m copies: min(clients, DS/m) links (every byte
	# enters the data servers m times: client -> first copy, first copy ->
	# each other copy); reads are served by one copy: min(clients, DS).
	# bench.ceilingMBps derives both; docs/benchmarks.md has the argument.
	step "6. cost of copies: $mirrors copies on $mirrords DS, $clients clients, pNFS on, rate $rate"
	"$bin" bench --workloads ior --reps "$mirrorreps" --testbed-up --testbed-name "$name" --rate "$rate" --storage "$storage" \
		--ds "$mirrords" --mirrors "$mirrors" --pnfs on --clients "$clients" --block "$mirrorblock" --transfer 1MiB \
		--label mirrors --json "$out/mirrors.json" | tee -a "$log"
fi
step "plots"
"$bin" bench plot --dir "$out"
step "done"
