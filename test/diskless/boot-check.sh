#!/bin/sh
# boot-check.sh: run by boot-check.service on a diskless node booted from
# Shoal (see docs/diskless.md and scripts/diskless.sh). It proves the root
# works through Debian's own init: it prints to the serial console that
# systemd reached it, runs python3 from the root (reading its 6 MB binary
# through the root mount, so the data servers serve it), prints the NFS
# mount statistics of the root, and powers the node off. The lines start
# with DISKLESS so that the driver can find them among systemd's messages.
exec >/dev/console 2>&1
up=$(cut -d' ' -f1 /proc/uptime)
echo "DISKLESS first-line host=$(hostname) uptime=$up init=$(readlink /proc/1/exe) kernel=$(uname -r)"
echo "DISKLESS mounts $(awk '$2 == "/" || $2 == "/media/root-ro" { printf "%s %s %s %s; ", $1, $2, $3, $4 }' /proc/mounts)"
if out=$(python3 - <<'PY'
import hashlib, os, sys
p = os.path.realpath(sys.executable)
h = hashlib.sha256()
with open(p, "rb") as f:
    for b in iter(lambda: f.read(1 << 20), b""):
        h.update(b)
print(f"python {sys.version.split()[0]} {p} {os.path.getsize(p)} bytes sha256 {h.hexdigest()}")
PY
); then
	echo "DISKLESS python ok $out"
else
	echo "DISKLESS python failed: $out"
fi
# The root's NFS mount: / itself with shoal.overlay=none, the overlay's
# lower layer (/media/root-ro) otherwise.
awk '$1 == "device" { on = ($8 == "nfs4" && ($5 == "/" || $5 == "/media/root-ro")) } on { print "DISKLESS mountstats " $0 }' /proc/self/mountstats
# The node's own directory on Shoal (shoal.state=), read-write.
if [ -d /var/lib/shoal-node ] && echo "$(hostname) booted at uptime $up" >>/var/lib/shoal-node/boots; then
	echo "DISKLESS state ok $(tail -n 1 /var/lib/shoal-node/boots)"
fi
# shoal.loop=SECS: keep running programs from the root for SECS seconds
# while the host takes servers away (run-loop.sh).
loop=$(sed -n 's/.*shoal\.loop=\([0-9][0-9]*\).*/\1/p' /proc/cmdline)
[ -n "$loop" ] && /usr/local/sbin/run-loop.sh "$loop"
# The shared root is read-only underneath the overlay.
if touch /media/root-ro/.probe 2>/dev/null; then
	echo "DISKLESS root-ro WRITABLE"
else
	echo "DISKLESS root-ro read-only"
fi
# What the kernel said about NFS and its data servers (a data server
# killed during the boot shows here).
dmesg 2>/dev/null | grep -iE 'nfs|rpc|pnfs' | tail -n 20 | sed 's/^/DISKLESS dmesg /'
echo "DISKLESS systemd $(systemctl is-system-running 2>&1) failed-units=$(systemctl --failed --plain --no-legend 2>/dev/null | awk '{print $1}' | tr '\n' ',')"
echo "DISKLESS done uptime=$(cut -d' ' -f1 /proc/uptime)"
# What systemctl poweroff does, without first asking logind (there is no
# D-Bus in a minbase root).
systemctl --no-block start poweroff.target --job-mode=replace-irreversibly
