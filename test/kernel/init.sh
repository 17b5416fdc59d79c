#!/bin/sh
# /init of the kernel-client harness VM (built into the initramfs by
# setup.sh). It brings up busybox, the NFS modules and the network, exports
# the t_* settings from the kernel command line and hands over to
# /workload.sh. It always ends with poweroff, so qemu exits (-no-reboot).
#
# Settings (kernel command line; names must not contain a dot, or the kernel
# takes them for module parameters):
#   t_host=10.0.2.2   server address as seen from the guest
#   t_port=2049       server port
#   t_path=/export    exported path to mount
#   t_vers=4.1        NFS minor version (4.1 or 4.2)
#   t_phase=main      workload phase: main | verify | grow | mirror | deleg |
#                     recall-a | recall-b (workload.sh), failover (failover.sh)
#   t_sums=...        phase "verify": name:sha256,... written by phase "main"
#   t_pnfs=1          add the pNFS steps; SYNC lines ask the driver for metrics
#   t_ip=10.0.2.15    guest address (/24), t_gw=10.0.2.2 default gateway
#   t_id=a            VMs that run at the same time against one server: a
#                     host name and NFSv4 client-ID uniquifier of their own
/bin/busybox mkdir -p /proc /sys /dev /tmp /run
/bin/busybox --install -s
mount -t proc proc /proc
mount -t sysfs sysfs /sys
mount -t devtmpfs devtmpfs /dev 2>/dev/null
mount -t tmpfs -o size=512m tmpfs /tmp
export PATH=/bin:/sbin:/usr/bin:/usr/sbin HOME=/root TZ=UTC

for w in $(cat /proc/cmdline); do
	case "$w" in
	t_*=*) export "$w" ;;
	esac
done

kver=$(cat /kver)
while read -r m; do
	insmod "/lib/modules/$kver/$m" || echo "init: insmod $m failed"
done </modules.order

# The client ID the kernel presents (EXCHANGE_ID's co_ownerid) is built
# from the host name and nfs4_unique_id; VMs that mount one server at the
# same time must differ in it, or the server takes them for one client
# that rebooted.
if [ -n "${t_id:-}" ]; then
	hostname "shoal-vm-$t_id"
	echo "shoal-vm-$t_id" >/sys/module/nfs/parameters/nfs4_unique_id || echo "init: cannot set nfs4_unique_id"
fi

: "${t_ip:=10.0.2.15}" "${t_gw:=10.0.2.2}"
ip link set lo up
ip addr add "$t_ip/24" dev eth0
ip link set eth0 up
ip route add default via "$t_gw"

echo "init: kernel $(uname -r), guest $t_ip, server ${t_host:-10.0.2.2}:${t_port:-2049} vers=${t_vers:-4.1} phase=${t_phase:-main}"
if [ "${t_phase:-main}" = failover ]; then
	sh /failover.sh
else
	sh /workload.sh
fi
echo "init: workload exited with status $?"
sync
poweroff -f
