#!/usr/bin/env bash
# scale-bench.sh: issue 13's scale test, `shoal bench --workloads scale`,
# on a loopback cluster this run starts and stops (see docs/benchmarks.md,
# "Metadata at scale"): FILES empty files, DIR_FILES of them in one
# directory, created by SESSIONS client sessions; prints the create and
# stat rates of the first and the last 10%, the `ls -l` time of the large
# directory, meta.db's size and the MDS's memory, and writes the JSON
# report to OUT.
#
#   scripts/scale-bench.sh                          # 1,000,000 files, 100,000 in one directory
#   FILES=200000 DIR_FILES=50000 scripts/scale-bench.sh
#   QUICK=1 scripts/scale-bench.sh                  # smoke: 2,000 files (a few seconds)
#   PROF=/tmp/prof scripts/scale-bench.sh           # also a CPU profile of the servers (shoal up)
#
# Environment: SHOAL (binary; default: built from this checkout), FILES,
# DIR_FILES, SESSIONS (default 4), OUT (default scale.json), PROF,
# QUICK=1, TIMEOUT (default 3h; the bench stops its cluster by PID
# however it ends).
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
OUT=${OUT:-$PWD/scale.json}
args=(bench --workloads scale --json "$OUT" --timeout "${TIMEOUT:-3h}")
[[ ${QUICK:-0} == 1 ]] && args+=(--quick)
[[ -n ${FILES:-} ]] && args+=(--files "$FILES")
[[ -n ${DIR_FILES:-} ]] && args+=(--dir-files "$DIR_FILES")
[[ -n ${SESSIONS:-} ]] && args+=(--clients "$SESSIONS")
[[ -n ${PROF:-} ]] && args+=(--cpuprofile "$PROF")
tmp=
if [[ -z ${SHOAL:-} ]]; then
	tmp=$(mktemp -d "${TMPDIR:-/tmp}/shoal-scale-bench.XXXXXX")
	trap 'rm -rf "$tmp"' EXIT
	SHOAL=$tmp/shoal
	(cd "$repo" && go build -o "$SHOAL" ./cmd/shoal)
fi
echo "load average: $(cut -d' ' -f1-3 /proc/loadavg)" >&2
"$SHOAL" "${args[@]}"
