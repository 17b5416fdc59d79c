#!/usr/bin/env bash
# flexfiles-cp-kill.sh — `shoal cp` through a flexfiles export (RFC 8435,
# client-written mirrors) while one data server is killed with SIGKILL:
# the copy must succeed and the file read back byte for byte.
#
#   scripts/flexfiles-cp-kill.sh [SIZE]        (default 512M)
#
# Runs one `shoal mds` (export `/` with layout: flexfiles, --mirrors 2) and
# two `shoal ds` processes on 127.0.0.1, copies a random file in with
# `shoal cp`, kills the second data server with kill -9 once it holds
# 50 MB of the file, then copies the file back out and compares it. The
# MDS log shows the client's error reports ("pNFS client reports a data
# server error") and the copy marked stale. Only the processes it started
# are stopped, by PID. Environment: SHOAL_BIN (default: go build), PORT
# (MDS port, default 20490; the data servers use PORT+10 and PORT+11),
# KEEP=1 keeps the work directory and its logs, LOG_LEVEL the MDS's
# log level (debug shows every failed operation).
set -euo pipefail
size=${1:-512M}
port=${PORT:-20490}
root=$(cd "$(dirname "$0")/.." && pwd)
work=$(mktemp -d /tmp/shoal-flexcp.XXXXXX)
bin=${SHOAL_BIN:-$work/shoal}
[ -n "${SHOAL_BIN:-}" ] || (cd "$root" && go build -o "$bin" ./cmd/shoal)
pids=()
cleanup() {
	for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
	wait 2>/dev/null || true
	if [ -n "${KEEP:-}" ]; then echo "logs kept in $work"; else rm -rf "$work"; fi
}
trap cleanup EXIT
cd "$work"
cat >mds.yaml <<EOF
log_level: ${LOG_LEVEL:-info}
exports:
  - path: /
    layout: flexfiles
EOF
head -c "$size" /dev/urandom >src.bin
"$bin" mds --listen 127.0.0.1:$port --dir mds --config mds.yaml --mirrors 2 --no-root-squash --lease 10s >mds.log 2>&1 &
pids+=($!)
for _ in $(seq 100); do [ -f mds/join-secret ] && break; sleep 0.1; done
for i in 0 1; do
	"$bin" ds --mds 127.0.0.1:$port --join-secret-file mds/join-secret --listen 127.0.0.1:$((port + 10 + i)) --dir ds$i >ds$i.log 2>&1 &
	pids+=($!)
done
victim=${pids[2]}
for _ in $(seq 100); do grep -c "data server joined" mds.log 2>/dev/null | grep -q 2 && break; sleep 0.1; done
"$bin" cp src.bin nfs://127.0.0.1:$port/out.bin >cp.log 2>&1 &
cp=$!
held=0
for _ in $(seq 600); do
	held=$(du -sb ds1 | cut -f1)
	[ "$held" -gt 50000000 ] && break
	kill -0 $cp 2>/dev/null || break
	sleep 0.05
done
echo "kill -9 of data server 1 (pid $victim), holding $held bytes"
kill -9 "$victim"
status=0
wait $cp || status=$?
cat cp.log
[ $status -eq 0 ] || { echo "FAIL: shoal cp exited $status"; exit 1; }
"$bin" cp nfs://127.0.0.1:$port/out.bin "$work/back.bin" >/dev/null
cmp src.bin back.bin || { echo "FAIL: the file read back differs"; exit 1; }
echo "error reports at the MDS: $(grep -c 'reports a data server error' mds.log || true)"
grep -m3 'reports a data server error\|stale until healed' mds.log || true
echo "PASS: copy survived the kill; $(stat -c %s src.bin) bytes read back equal"
