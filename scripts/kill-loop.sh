#!/usr/bin/env bash
# kill-loop.sh [TRIALS]: issue 11's "no committed byte lost" benchmark.
# A writer appends 64 KiB records through the Go client and fsyncs each one
# while a random data server of a `shoal mds --mirrors 2` cluster (three
# `shoal ds` processes on loopback) is killed with SIGKILL at a random
# moment and restarted; every record acknowledged by fsync must read back.
# Prints the per-trial log, a summary table, and writes JSON to
# ${SHOAL_KILL_JSON:-kill-loop.json}. Bounded: TRIALS trials (default 100),
# each writes for at most 3 s.
set -euo pipefail
cd "$(dirname "$0")/.."
trials=${1:-100}
json=${SHOAL_KILL_JSON:-$PWD/kill-loop.json}
SHOAL_KILL_TRIALS=$trials SHOAL_KILL_JSON=$json \
	go test ./test/membership -run '^TestKillLoop$' -count=1 -v -timeout $((trials * 60 + 300))s
echo "JSON: $json"
