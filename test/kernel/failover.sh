#!/bin/sh
# failover.sh — phase "failover" of the kernel-client harness (server kind
# shoal-failover, failover_test.go). init.sh runs it instead of
# workload.sh. The guest mounts the service address (t_host) with the
# kernel's default options and, once per fault in t_faults, runs an
# application that must not notice the leading MDS going away:
#
#   - a 256 MiB file written by dd (oflag=direct conv=fsync), its sha256
#     taken on the way (tee into a fifo), then read back after a cache
#     drop and compared;
#   - a loop that creates (dd conv=fsync), renames and removes small files
#     and logs every change it was told succeeded, with its start and end
#     times;
#   - locktest holding a write lock on a file; the driver runs a second
#     NFS client (Shoal's, on the host side) that keeps trying to take it.
#
# Once 32 MiB of the big file have gone to the mount, the guest prints
# "SYNC fault-FAULT"; the driver takes the leader away (kill -9, SIGSTOP,
# step-down) and answers at once, so the application runs on through the
# takeover. Afterwards: every change the log holds is there (listing and
# contents from a fresh mount), the big file's sha256 matches from a fresh
# mount, the lock was held throughout, and the guest prints its timings
# relative to the fault (FOTIME lines) and the RPC counters of the round
# (FOSTATS lines, from /proc/self/mountstats).
#
# Settings (besides init.sh's): t_faults (default "kill,stop,stepdown"),
# t_rounds (default 1: each fault once, named as itself; N > 1: the list N
# times, rounds named FAULT.NN, as the driver's foRounds does),
# t_big_mb (default 256), t_step_timeout.

: "${t_host:=10.201.0.100}" "${t_vers:=4.2}" "${t_faults:=kill,stop,stepdown}" "${t_rounds:=1}"
: "${t_big_mb:=256}" "${t_step_timeout:=400}"
M=/mnt/nfs
PASSED=0
FAILED=0

now() { read -r u _ </proc/uptime; echo "${u%.*}${u#*.}"; } # centiseconds
secs() { echo "$(($1 / 100)).$(printf %02d $(($1 % 100)))"; }
pass() { PASSED=$((PASSED + 1)); echo "PASS $*"; }
fail() { FAILED=$((FAILED + 1)); echo "FAIL $*"; }

do_mount() {
	mkdir -p $M
	# The kernel's defaults for everything but what mount(2) without
	# mount.nfs needs: the version, the server address and our own.
	mountnfs "$t_host:/" $M "vers=$t_vers,addr=$t_host,clientaddr=${t_ip:-10.201.0.15}"
}

# host_act NAME TAG SECS: "SYNC TAG", the driver acts and answers
# "OK TAG ..." or "ERR TAG reason". Reported as step NAME.
host_act() {
	name=$1 tag=$2 wait=$3
	echo "SYNC $tag"
	if ! read -t "$wait" reply; then
		fail "$name no reply from the driver to SYNC $tag within ${wait}s"
		return 1
	fi
	case "$reply" in
	"OK $tag"*) pass "$name ${reply#"OK $tag"}" ;;
	*)
		fail "$name driver: $reply"
		return 1
		;;
	esac
}

# mstats FILE: the mount's per-operation counters and its transport line.
mstats() {
	awk -v m=$M '$1 == "device" { on = ($5 == m); next }
		on && $1 == "xprt:" { print "xprt", $0; next }
		on && $1 ~ /^[A-Z0-9_]+:$/ && NF >= 9 { sub(":", "", $1); print $1, $2, $3, $4, $9 }' /proc/self/mountstats >"$1"
}

# mstats_delta F A B: one FOSTATS line per operation called between the
# snapshots: calls, transmissions, major timeouts, execute ms (summed),
# and the transport's connect count and the line itself.
mstats_delta() {
	awk -v f="$1" 'NR == FNR { if ($1 == "xprt") xa = $0; else { o[$1] = $2; t[$1] = $3; to[$1] = $4; e[$1] = $5 }; next }
		$1 == "xprt" { xb = $0; next }
		$2 != o[$1] { printf "FOSTATS %s op %s calls=%d trans=%d timeouts=%d exec_ms=%d\n", f, $1, $2 - o[$1], $3 - t[$1], $4 - to[$1], $5 - e[$1] }
		END { sub("^xprt +", "", xa); sub("^xprt +", "", xb); print "FOSTATS " f " xprt-before " xa; print "FOSTATS " f " xprt-after " xb }' "$2" "$3"
}

# pacer: t_big_mb MiB of random data, 4 MiB at a time; /tmp/fo.quarter
# appears once 32 MiB have gone through, when the guest asks for the fault.
pacer() {
	i=0
	while [ $i -lt "$t_big_mb" ]; do
		dd if=/dev/urandom bs=1048576 count=4 2>/dev/null
		i=$((i + 4))
		[ $i -eq 32 ] && touch /tmp/fo.quarter
	done
}

# small_loop DIR: create (written with fsync), rename, and every third
# time remove the previous file, until /tmp/fo.stop appears. Every change
# it was told succeeded goes to /tmp/fo.log as "START END add|rm NAME";
# the first failure ends the loop with "ERR ..." in /tmp/fo.small.
small_loop() {
	d=$1
	i=0
	while [ ! -f /tmp/fo.stop ] && [ $i -lt 20000 ]; do
		i=$((i + 1))
		s=$(now)
		echo "file $i of $d" | dd of="$d/tmp$i" conv=fsync 2>/tmp/fo.small.dd ||
			{ echo "ERR create $d/tmp$i: $(cat /tmp/fo.small.dd)" >/tmp/fo.small; return 1; }
		mv "$d/tmp$i" "$d/f$i" 2>/tmp/fo.small.dd ||
			{ echo "ERR rename $d/tmp$i: $(cat /tmp/fo.small.dd)" >/tmp/fo.small; return 1; }
		echo "$s $(now) add f$i" >>/tmp/fo.log
		if [ $((i % 3)) -eq 0 ]; then
			s=$(now)
			rm "$d/f$((i - 1))" 2>/tmp/fo.small.dd ||
				{ echo "ERR remove $d/f$((i - 1)): $(cat /tmp/fo.small.dd)" >/tmp/fo.small; return 1; }
			echo "$s $(now) rm f$((i - 1))" >>/tmp/fo.log
		fi
		# Leave the (one, emulated) CPU to the big file's writer too.
		sleep 0.1
	done
	echo "OK $i" >/tmp/fo.small
}

# wait_file FILE TENTHS: wait for FILE to exist.
wait_file() {
	n=0
	while [ ! -f "$1" ] && [ $n -lt "$2" ]; do
		sleep 0.1
		n=$((n + 1))
	done
	[ -f "$1" ]
}

# stuck: what the client is blocked on, for a FAIL.
stuck() {
	echo w >/proc/sysrq-trigger 2>/dev/null
	dmesg | tail -n 60 | sed 's/^/  | /'
}

# round FAULT: one application run across one fault.
round() {
	f=$1
	D=$M/v$t_vers-$f
	rm -f /tmp/fo.*
	mkdir -p "$D/small" || { fail "$f/setup mkdir $D failed"; return 1; }
	# The lock holder, and the driver's second client trying to take it.
	locktest hold "$D/lockfile" /tmp/fo.lockready /tmp/fo.lockrelease >/tmp/fo.hold 2>&1 &
	holder=$!
	if ! wait_file /tmp/fo.lockready 300; then
		fail "$f/lock-hold no lock within 30 s: $(cat /tmp/fo.hold)"
		return 1
	fi
	holderpid=$(cat /tmp/fo.lockready)
	host_act "$f/thief-denied" "locked-$f" 120 || { touch /tmp/fo.lockrelease; return 1; }

	small_loop "$D/small" &
	small=$!
	mkfifo /tmp/fo.fifo
	sha256sum </tmp/fo.fifo | cut -d' ' -f1 >/tmp/fo.wsum &
	(
		# O_DIRECT: every MiB goes to the data servers as dd writes it, so
		# their byte counters show when data I/O stops and resumes (buffered,
		# the page cache holds a slow writer's data for up to 30 s).
		pacer | tee /tmp/fo.fifo | timeout -s KILL "$t_step_timeout" \
			dd of="$D/big" bs=1048576 iflag=fullblock oflag=direct conv=fsync 2>/tmp/fo.dd
		echo $? >/tmp/fo.ddrc
		now >/tmp/fo.ddend
	) &
	if ! wait_file /tmp/fo.quarter 600; then
		fail "$f/big-write 32 MiB not written within 60 s"
		touch /tmp/fo.stop /tmp/fo.lockrelease
		return 1
	fi
	sleep 1
	mstats /tmp/fo.ms0
	echo "SYNC fault-$f"
	read -t 60 reply
	t0=$(now)
	echo "FOTIME $f fault 0 ($reply)"
	case "$reply" in "OK fault-$f"*) ;; *) fail "$f/fault driver: $reply" ;; esac

	# The big file: dd ends (fsync included), then the read-back.
	if wait_file /tmp/fo.ddrc $((t_step_timeout * 10)); then
		rc=$(cat /tmp/fo.ddrc)
		te=$(cat /tmp/fo.ddend)
		wait_file /tmp/fo.wsum 100
		sleep 0.2
		if [ "$rc" = 0 ]; then
			pass "$f/big-write $t_big_mb MiB, dd conv=fsync exit 0, $(secs $((te - t0))) s after the fault: $(tail -n 1 /tmp/fo.dd)"
		else
			fail "$f/big-write dd exited $rc: $(tail -n 2 /tmp/fo.dd | tr '\n' ' ')"
		fi
		echo "FOTIME $f big-written $((te - t0))"
		sync
		echo 3 >/proc/sys/vm/drop_caches
		got=$(timeout -s KILL "$t_step_timeout" sha256sum "$D/big" | cut -d' ' -f1)
		tr=$(now)
		echo "FOTIME $f big-read $((tr - t0))"
		want=$(cat /tmp/fo.wsum)
		if [ -n "$want" ] && [ "$got" = "$want" ]; then
			pass "$f/big-readback sha256 ${want%"${want#????????????????}"} identical, read $(secs $((tr - t0))) s after the fault"
		else
			fail "$f/big-readback sha256 '$got', written '$want'"
		fi
	else
		stuck
		fail "$f/big-write dd did not end within ${t_step_timeout} s"
	fi

	# The small-file loop goes on for 3 s past the read-back, then stops.
	sleep 3
	touch /tmp/fo.stop
	n=0
	while kill -0 $small 2>/dev/null && [ $n -lt 1200 ]; do
		sleep 0.1
		n=$((n + 1))
	done
	if kill -0 $small 2>/dev/null; then
		stuck
		fail "$f/small-files loop stuck: $(tail -n 1 /tmp/fo.log)"
	else
		case "$(cat /tmp/fo.small 2>/dev/null)" in
		OK*) pass "$f/small-files $(grep -c add /tmp/fo.log) created+renamed, $(grep -c ' rm ' /tmp/fo.log) removed, no error" ;;
		*) fail "$f/small-files $(cat /tmp/fo.small 2>/dev/null)" ;;
		esac
	fi
	mstats /tmp/fo.ms1
	mstats_delta "$f" /tmp/fo.ms0 /tmp/fo.ms1

	# Every metadata op's start and end relative to the fault, for the
	# driver (only those that ended after it).
	awk -v t0="$t0" -v f="$f" '$2 >= t0 { printf "FOOP %s %d %d %s\n", f, $1 - t0, $2 - t0, $3 }' /tmp/fo.log

	# The lock: still held here (F_GETLK names the holder), never granted
	# to the driver's client.
	if out=$(locktest conflict "$D/lockfile" "$holderpid" 2>&1); then
		pass "$f/lock-probe-after $out"
	else
		fail "$f/lock-probe-after $out"
	fi
	host_act "$f/thief-never-granted" "unlock-$f" 120
	touch /tmp/fo.lockrelease
	n=0
	while kill -0 $holder 2>/dev/null && [ $n -lt 300 ]; do
		sleep 0.1
		n=$((n + 1))
	done
	if grep -q "hold: released" /tmp/fo.hold && wait $holder; then
		pass "$f/lock-held-through unlocked cleanly after the failover"
	else
		fail "$f/lock-held-through $(tr '\n' ' ' </tmp/fo.hold)"
	fi

	# A fresh mount: the listing is exactly what the log says, every file
	# holds what was written, and the big file's bytes are all there.
	if ! { mountnfs -u $M && do_mount; }; then
		fail "$f/verify remount failed"
		return 1
	fi
	awk '$3 == "add" { have[$4] = 1 } $3 == "rm" { delete have[$4] } END { for (n in have) print n }' /tmp/fo.log | sort >/tmp/fo.want
	ls "$D/small" | sort >/tmp/fo.have
	bad=""
	if ! cmp -s /tmp/fo.want /tmp/fo.have; then
		bad="listing differs from the log: $(diff /tmp/fo.want /tmp/fo.have | grep '^[-+][^-+]' | head -n 5 | tr '\n' ' ')"
	fi
	for n in $(cat /tmp/fo.want); do
		[ "$(cat "$D/small/$n" 2>&1)" = "file ${n#f} of $D/small" ] || { bad="$bad $n has '$(cat "$D/small/$n" 2>&1)'"; break; }
	done
	if [ -z "$bad" ]; then
		pass "$f/verify-small $(wc -l </tmp/fo.want) files as logged, contents identical (fresh mount)"
	else
		fail "$f/verify-small $bad"
	fi
	got=$(timeout -s KILL "$t_step_timeout" sha256sum "$D/big" | cut -d' ' -f1)
	if [ "$got" = "$(cat /tmp/fo.wsum)" ]; then
		pass "$f/verify-big sha256 identical (fresh mount)"
	else
		fail "$f/verify-big sha256 '$got', written '$(cat /tmp/fo.wsum)'"
	fi
	rm -rf "$D"
}

if ! do_mount; then
	fail "mount $t_host:/ failed"
	echo "RESULT $PASSED passed, $FAILED failed"
	exit 1
fi
pass "mount $(grep " $M " /proc/mounts)"
# round_names: the rounds in order (foRounds in failover_test.go).
round_names() {
	if [ "$t_rounds" -le 1 ]; then
		echo "$t_faults" | tr , ' '
		return
	fi
	i=1
	while [ $i -le "$t_rounds" ]; do
		for f in $(echo "$t_faults" | tr , ' '); do printf '%s.%02d ' "$f" $i; done
		i=$((i + 1))
	done
}
for f in $(round_names); do
	round "$f"
done
grep -q " $M " /proc/mounts && mountnfs -u $M
echo "RESULT $PASSED passed, $FAILED failed"
