#!/bin/sh
# /init of the machine-crash harness's VM (setup.sh builds it into the
# initramfs; the test appends /bin/shoal). It mounts the virtio disk
# (ext4, made by the test) at /disk, checks the metadata a previous boot
# left there (shoal admin fsck) and runs `shoal serve` on it until the
# harness kills the VM. Console protocol, one line each:
#   FSCK-JSON {...}   fsck's report (boots after the first)
#   FSCK-RC n         its exit status (0 consistent, 4 problems, 1 no open)
#   SERVE-START       shoal serve is starting
#   SWEEP-DONE ...    its sweep of data objects no file owns completed
#   SWEEP-INCOMPLETE ...  or did not
# Settings (kernel command line): t_sync=true|false, t_interval=100ms,
# t_lease=15s, t_skipfsync=1 (only with a shoal_crashtest binary).
/bin/busybox mkdir -p /proc /sys /dev /tmp
/bin/busybox --install -s
mount -t proc proc /proc
mount -t sysfs sysfs /sys
mount -t devtmpfs devtmpfs /dev 2>/dev/null
export PATH=/bin:/sbin HOME=/root TZ=UTC
for w in $(cat /proc/cmdline); do
	case "$w" in
	t_*=*) export "$w" ;;
	esac
done
kver=$(cat /kver)
while read -r m; do
	insmod "/lib/modules/$kver/$m" 2>/dev/null || echo "init: insmod $m failed"
done </modules.order
ip link set lo up
ip addr add 10.0.2.15/24 dev eth0
ip link set eth0 up
ip route add default via 10.0.2.2
# Defaults of ext4: data=ordered, barriers on (fdatasync reaches the disk
# as a flush), 5 s journal commits.
if ! mount -t ext4 /dev/vda /disk; then
	echo "init: mount /dev/vda failed"
	poweroff -f
fi
echo "init: kernel $(uname -r), $(grep ' /disk ' /proc/mounts)"
if [ -f /disk/shoal/meta.db ]; then
	/bin/shoal admin fsck --dir /disk/shoal --json >/tmp/fsck.json 2>/tmp/fsck.err
	rc=$?
	echo "FSCK-JSON $(tr -d '\n' </tmp/fsck.json)"
	sed 's/^/fsck: /' /tmp/fsck.err
	echo "FSCK-RC $rc"
fi
[ "${t_skipfsync:-0}" = 1 ] && export SHOAL_TEST_SKIP_WAL_FSYNC=1
echo "SERVE-START"
# The server logs at info level through a filter that passes its
# warnings and errors and turns the end of its sweep of data objects no
# file owns (after an unclean start, once the grace period is over) into
# one line: SWEEP-DONE (complete) or SWEEP-INCOMPLETE.
{
	/bin/shoal --log-level info serve --listen 0.0.0.0:2049 --dir /disk/shoal --no-root-squash \
		--delegations=false --lease "${t_lease:-15s}" --sync="${t_sync:-true}" --commit-interval "${t_interval:-100ms}" 2>&1
	echo "SERVE-EXIT $?"
} | while IFS= read -r l; do
	case "$l" in
	*"swept data objects no file owns"*) echo "SWEEP-DONE $l" ;;
	*"sweep of unowned data objects incomplete"*) echo "SWEEP-INCOMPLETE $l" ;;
	SERVE-EXIT* | *level=WARN* | *level=ERROR*) echo "$l" ;;
	esac
done
poweroff -f
