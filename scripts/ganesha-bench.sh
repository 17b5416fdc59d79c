#!/bin/sh
# ganesha-bench.sh: issue 27's Shoal-against-NFS-Ganesha comparison in one
# run. Builds ./cmd/shoal, then `shoal bench --workloads small` starts
# `shoal serve` (synced, the default), `shoal serve --sync=false` and a
# private NFS-Ganesha (scripts/ganesha.sh; root and ganesha.nfsd needed),
# one after the other on loopback, drives each with Shoal's Go client (one
# operation at a time: create = OPEN(CREATE)+CLOSE of an empty file, stat,
# remove), and prints the table and each Shoal target's ratio to Ganesha
# with issue 27's goals (default ≥ 1.5× on create and remove, async ≥ 2×).
#
# Rates alone do not say whether a reply waited for stable storage:
# scripts/ganesha-sync.sh counts the calls each of these servers makes to
# put a change there before it answers.
#
#   FILES (2000) files per rep, REPS (3) repetitions, OUT the JSON report
#   (ganesha-bench.json in the current directory); extra arguments go to
#   shoal bench, e.g. `scripts/ganesha-bench.sh --streams 4` runs 4
#   concurrent streams of operations, each in a directory of its own.
set -eu
out=${OUT:-$PWD/ganesha-bench.json}
cd "$(dirname "$0")/.."
bin=$(mktemp -d)
trap 'rm -rf "$bin"' EXIT
go build -o "$bin/shoal" ./cmd/shoal
"$bin/shoal" bench --workloads small --targets shoal,shoal-async,ganesha \
	--files "${FILES:-2000}" --reps "${REPS:-3}" --json "$out" "$@"
