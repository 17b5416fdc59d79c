#!/usr/bin/env bash
# ior-diskless.sh — issue 26's IOR experiment, the one the diskless-root
# paper behind Shoal ran: every client writes, then reads, its own file of
# BLOCK bytes in calls of each transfer size, for 1..MAXCLIENTS clients,
# on Shoal with DS data servers against one NFS server (NFS-Ganesha in the
# MDS namespace), on the emulated cluster (shoal testbed: every client a
# network namespace of its own behind a RATE link). One testbed serves the
# whole run; for each transfer size the results go to OUTDIR/tSIZE/ and
# `shoal bench plot` draws aggregate MB/s against clients there, Shoal
# and Ganesha side by side, as the paper's figures do. Shoal's clients send
# every transfer to the data servers (--small-io-threshold=-1: the
# client library would otherwise send calls under 64 KiB through the MDS),
# since the experiment measures striping.
#
#   sudo scripts/ior-diskless.sh [OUTDIR]        (default docs/bench/ior-diskless)
#   QUICK=1 scripts/ior-diskless.sh /tmp/ior     # smoke: 2 sizes, 1-2 clients, 8 MiB
#
# Environment: DS (default 3), CLIENTS (client counts, default
# "1 2 4 8 16 25"), TRANSFERS (default "8KiB 16KiB 32KiB 64KiB 128KiB
# 256KiB"), BLOCK (bytes per client, default 128MiB), STONEWALL (per
# phase, default 8s: a cell that cannot move BLOCK in that time reports
# the bytes it moved, so small transfers with many clients end in bounded
# time), RATE (per link, default 500mbit), STORAGE (data servers' storage,
# default tmpfs), NAME (testbed name, default shoalior), SHOAL_BIN
# (prebuilt shoal; default: go build), TARGETS (default "shoal ganesha").
# Needs root, ip, tc and ganesha.nfsd. Bounded: every cell is two
# stonewalled phases; the full sweep is 72 cells, about 25 minutes here.
set -euo pipefail

cd "$(dirname "$0")/.."
out=${1:-docs/bench/ior-diskless}
ds=${DS:-3}
clients=${CLIENTS:-1 2 4 8 16 25}
transfers=${TRANSFERS:-8KiB 16KiB 32KiB 64KiB 128KiB 256KiB}
block=${BLOCK:-128MiB}
stonewall=${STONEWALL:-8s}
rate=${RATE:-500mbit}
storage=${STORAGE:-tmpfs}
name=${NAME:-shoalior}
targets=${TARGETS:-shoal ganesha}
if [ -n "${QUICK:-}" ]; then
	clients=${CLIENTS:-1 2}
	transfers=${TRANSFERS:-8KiB 256KiB}
	block=${BLOCK:-8MiB}
	stonewall=${STONEWALL:-3s}
fi
maxc=0
for c in $clients; do [ "$c" -gt "$maxc" ] && maxc=$c; done

bin=${SHOAL_BIN:-}
if [ -z "$bin" ]; then
	bin=$(mktemp -d)/shoal
	go build -o "$bin" ./cmd/shoal
fi
down() { "$bin" testbed down --name "$name" >/dev/null 2>&1 || true; }
trap down EXIT INT TERM
down

mkdir -p "$out"
log="$out/tables.txt"
: >"$log"
start=$(date +%s)
step() { echo "== $(($(date +%s) - start))s: $*" | tee -a "$log" >&2; }

step "testbed: $ds DS, $maxc client namespaces, $rate links, storage $storage; load $(cut -d' ' -f1-3 /proc/loadavg)"
"$bin" testbed up --name "$name" --ds "$ds" --clients "$maxc" --rate "$rate" --storage "$storage" >/dev/null

common=(--workloads ior --reps 1 --stonewall "$stonewall" --testbed --testbed-name "$name" --ds "$ds" --block "$block" --label clients)
for t in $transfers; do
	dir="$out/t$t"
	mkdir -p "$dir"
	rm -f "$dir"/*.json
	for c in $clients; do
		for target in $targets; do
			step "transfer $t, $c clients, $target"
			case $target in
			shoal) "$bin" bench "${common[@]}" --pnfs on --small-io-threshold=-1 --clients "$c" --transfer "$t" --json "$dir/clients-shoal-$c.json" | tee -a "$log" ;;
			ganesha) "$bin" bench "${common[@]}" --clients "$c" --transfer "$t" --target ganesha --ganesha-script scripts/ganesha.sh \
				--json "$dir/clients-ganesha-$c.json" | tee -a "$log" ;;
			esac
		done
	done
done
step "tear down"
down
for t in $transfers; do
	"$bin" bench plot --dir "$out/t$t" >/dev/null
done
step "done: plots and results.md in $out/t*/"
