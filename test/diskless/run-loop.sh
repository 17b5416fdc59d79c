#!/bin/sh
# run-loop.sh SECS [ROUNDS]: the "running node" of docs/diskless.md, run
# by boot-check.sh when the kernel command line has shoal.loop=SECS. For
# SECS seconds, and at least ROUNDS rounds (default 8, so that a fault the
# host injects after round 3 has rounds after it however slow the machine
# is), and at most 5000 rounds, it reads and executes programs from
# the shared root, the way a compute node's jobs do, while the host kills
# a data server or the leading MDS underneath (scripts/diskless.sh boot
# --loop SECS --kill ds|mds). Each round first drops the page cache, so
# that the binaries, libraries and directories really come from the
# servers again, then runs:
#
#   - python3 importing 16 modules of its standard library (python3-minimal's);
#   - md5sum over a fixed set of binaries and libraries (the sums must
#     stay those of the first round);
#   - ls -lR /usr/lib | wc -l (a directory walk: READDIR and GETATTR).
#
# One console line per round ("DISKLESS loop iter N ..."), one per failure
# ("DISKLESS loop ERROR ...": a non-zero exit, anything on stderr, or a sum
# that changed), all with the node's uptime, and at the end one line
# "DISKLESS loop-summary iterations=N errors=E max_gap_s=G ..." where G is
# the longest time between the ends of two rounds (or from the start to
# the first end): how long the node stood still at worst.
secs=${1:-60} rounds=${2:-8}
bins="/usr/bin/python3.11 /usr/lib/x86_64-linux-gnu/libc.so.6 /usr/bin/bash /usr/lib/systemd/systemd /usr/bin/ls /usr/bin/md5sum /usr/bin/sort /usr/bin/find"
# The binaries that exist in this root (a trimmed root may lack one).
set --
for b in $bins; do
	[ -f "$b" ] && set -- "$@" "$b"
done

now() { read -r u _ </proc/uptime; echo "${u%.*}${u#*.}"; } # centiseconds
cs() { echo "$(($1 / 100)).$(printf %02d $(($1 % 100)))"; }

errors=0
# err ITER WHAT: one error line; the details are in /tmp/loop.err.
err() {
	errors=$((errors + 1))
	echo "DISKLESS loop ERROR iter $1 t=$(cs "$(now)") $2: $(head -c 300 /tmp/loop.err | tr '\n' ' ')"
}

# step ITER NAME CMD...: run CMD with a hard limit, its output to
# /tmp/loop.out; a non-zero exit or any stderr is an error.
step() {
	i=$1 name=$2
	shift 2
	timeout -s KILL 300 "$@" >/tmp/loop.out 2>/tmp/loop.err
	rc=$?
	if [ $rc -ne 0 ]; then
		err "$i" "$name exit $rc"
		return 1
	fi
	if [ -s /tmp/loop.err ]; then
		err "$i" "$name stderr"
		return 1
	fi
	return 0
}

start=$(now)
last=$start
maxgap=0 maxiter=0 iter=0
sums=
echo "DISKLESS loop start secs=$secs rounds=$rounds t=$(cs "$start") files=$*"
while { [ $(($(now) - start)) -lt $((secs * 100)) ] || [ $iter -lt "$rounds" ]; } && [ $iter -lt 5000 ]; do
	iter=$((iter + 1))
	t0=$(now)
	echo 3 >/proc/sys/vm/drop_caches
	step $iter python3 python3 -c 'import hashlib, email.parser, csv, datetime, argparse, pathlib, subprocess, tempfile, textwrap, random, ipaddress, configparser, base64, struct, inspect, logging
print(hashlib.sha256(repr(sorted(dir(pathlib))).encode()).hexdigest()[:12])'
	if step $iter md5sum md5sum "$@"; then
		s=$(md5sum </tmp/loop.out | cut -c1-12)
		if [ -z "$sums" ]; then
			sums=$s
			sed 's/^/DISKLESS loop md5 /' /tmp/loop.out
		elif [ "$s" != "$sums" ]; then
			cp /tmp/loop.out /tmp/loop.err
			err $iter "md5sum changed"
		fi
	fi
	if step $iter ls-lR sh -c 'ls -lR /usr/lib | wc -l'; then
		n=$(cat /tmp/loop.out)
	else
		n=?
	fi
	t1=$(now)
	gap=$((t1 - last))
	[ $gap -gt $maxgap ] && maxgap=$gap
	[ $((t1 - t0)) -gt $maxiter ] && maxiter=$((t1 - t0))
	last=$t1
	echo "DISKLESS loop iter $iter t=$(cs "$t1") took=$(cs $((t1 - t0))) lsR=$n errors=$errors"
done
echo "DISKLESS loop-summary iterations=$iter errors=$errors max_gap_s=$(cs $maxgap) max_iter_s=$(cs $maxiter) secs=$(cs $(($(now) - start)))"
