#!/usr/bin/env bash
# serve-phase-perf.sh: a perf(1) profile of a `shoal serve` process during
# one phase of `shoal bench --workloads small` only (issue 27's remove
# phase by default), with call graphs: what the server spends its CPU on
# per REMOVE (or create, or stat), kernel included, without the other
# phases that `shoal bench --cpuprofile` mixes in. Needs perf and root (or
# kernel.perf_event_paranoid <= 1).
#
#   scripts/serve-phase-perf.sh                         # default mode, 40,000 files, 4 streams
#   SERVE_ARGS=--sync=false scripts/serve-phase-perf.sh # async
#   PHASE=create OUT=/tmp/create.perf scripts/serve-phase-perf.sh
#   perf report -i serve.perf --stdio --children --sort sym -g none | head -80
#
#   FILES (40000), STREAMS (4), PHASE (remove: stat, create or remove),
#   SECONDS_REC (2.5: how long perf records once the phase began), OUT
#   (serve.perf in the current directory), BIN (a built shoal; default:
#   go build ./cmd/shoal).
set -euo pipefail
out=${OUT:-$PWD/serve.perf}
files=${FILES:-40000}
phase=${PHASE:-remove}
cd "$(dirname "$0")/.."
work=$(mktemp -d)
spid=
cleanup() {
	if [ -n "$spid" ]; then kill -INT "$spid" 2>/dev/null || true; wait "$spid" 2>/dev/null || true; fi
	rm -rf "$work"
}
trap cleanup EXIT
bin=${BIN:-}
if [ -z "$bin" ]; then
	bin=$work/shoal
	go build -o "$bin" ./cmd/shoal
fi
# shellcheck disable=SC2086
"$bin" serve --dir "$work/data" --listen 127.0.0.1:0 --no-root-squash ${SERVE_ARGS:-} >"$work/serve.log" 2>&1 &
spid=$!
addr=
for _ in $(seq 100); do
	addr=$(grep -o 'listen=[0-9.:]*' "$work/serve.log" | head -1 | cut -d= -f2 || true)
	[ -n "$addr" ] && break
	sleep 0.1
done
[ -n "$addr" ] || { echo "shoal serve did not start: $(cat "$work/serve.log")" >&2; exit 1; }
"$bin" bench --addr "$addr" --server-pid "$spid" --workloads small --files "$files" --reps 1 \
	--streams "${STREAMS:-4}" >"$work/bench.log" 2>&1 &
bpid=$!
# The phases run create, stat, remove: wait for the line of the one before.
case $phase in
create) before= ;;
stat) before="create $files files rep" ;;
remove) before="stat $files files rep" ;;
*) echo "PHASE must be create, stat or remove" >&2; exit 2 ;;
esac
if [ -n "$before" ]; then
	for _ in $(seq 6000); do
		grep -q "$before" "$work/bench.log" && break
		kill -0 "$bpid" 2>/dev/null || break
		sleep 0.05
	done
fi
perf record -q -e cpu-clock -F 999 -g -p "$spid" -o "$out" -- sleep "${SECONDS_REC:-2.5}"
wait "$bpid"
grep -E "files rep" "$work/bench.log"
echo "profile: $out (perf report -i $out --stdio --children --sort sym -g none)"
