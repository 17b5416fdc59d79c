# shellcheck shell=bash
# scripts/lib/shoal-cluster.sh: the cluster-and-mount steps the FUSE
# benchmark scripts share (fuse-meta.sh, fuse-links.sh, fuse-vs-lib.sh).
# Source it after setting repo, work and DS; it starts processes in the
# background and records their PIDs (up_pid, mount_pid), so that the
# caller's cleanup stops exactly those, by PID.
#
#   shoal_build              SHOAL, built from $repo into $work if unset
#   shoal_up                 `shoal up --ds $DS` on 127.0.0.1 with UP_ARGS,
#                            and UP_ENV (NAME=VALUE words) in its environment
#                            only; sets up_pid, addr (the MDS) and metrics (URL)
#   shoal_mount ACCESS MNT   `shoal mount --access ACCESS` of the cluster
#                            at MNT with MOUNT_ARGS, and MOUNT_ENV (NAME=VALUE
#                            words) in its environment only; sets mount_pid
#   shoal_stop MNT           unmounts MNT, stops the mount and the cluster
#   stop_pid PID             SIGTERM, up to 10 s, then SIGKILL

up_pid=
mount_pid=

stop_pid() {
	local pid=$1
	[[ -n $pid ]] || return 0
	kill "$pid" 2>/dev/null || return 0
	for _ in $(seq 1 100); do kill -0 "$pid" 2>/dev/null || return 0; sleep 0.1; done
	kill -9 "$pid" 2>/dev/null || true
}

shoal_build() {
	if [[ -z ${SHOAL:-} ]]; then
		SHOAL=$work/shoal
		(cd "$repo" && go build -o "$SHOAL" ./cmd/shoal)
	fi
}

shoal_up() {
	# shellcheck disable=SC2086 # UP_ARGS is a list of flags
	# shellcheck disable=SC2086 # UP_ENV is a list of NAME=VALUE words
	env ${UP_ENV:-} "$SHOAL" up --dir "$work/cluster" --ds "$DS" --listen 127.0.0.1:0 --http 127.0.0.1:0 \
		--ready-file "$work/ready" --log-level warn ${UP_ARGS:-} >"$work/up.log" 2>&1 &
	up_pid=$!
	for _ in $(seq 1 300); do
		[[ -s $work/ready ]] && break
		kill -0 "$up_pid" 2>/dev/null || { cat "$work/up.log" >&2; echo "shoal up died" >&2; exit 1; }
		sleep 0.1
	done
	[[ -s $work/ready ]] || { echo "shoal up not ready after 30s" >&2; exit 1; }
	addr=$(sed -n 's/.*"mds":"\([^"]*\)".*/\1/p' "$work/ready")
	[[ $addr == 127.0.0.1:* ]] || { echo "unexpected MDS address '$addr'" >&2; exit 1; }
	metrics=$(sed -n 's|^  status: \(http://[^ ]*/\)$|\1metrics|p' "$work/up.log")
	[[ -n $metrics ]] || { cat "$work/up.log" >&2; echo "no status URL in shoal up's output" >&2; exit 1; }
}

shoal_mount() {
	local access=$1 mnt=$2
	mkdir -p "$mnt"
	# The mount in the foreground of a background job, so its PID is ours.
	# shellcheck disable=SC2086 # MOUNT_ARGS is a list of flags
	# shellcheck disable=SC2086 # MOUNT_ENV is a list of NAME=VALUE words
	env ${MOUNT_ENV:-} "$SHOAL" mount --access "$access" ${MOUNT_ARGS:-} "nfs://$addr/" "$mnt" >"$work/mount.log" 2>&1 &
	mount_pid=$!
	for _ in $(seq 1 300); do
		mountpoint -q "$mnt" && break
		kill -0 "$mount_pid" 2>/dev/null || { cat "$work/mount.log" >&2; echo "shoal mount died" >&2; exit 1; }
		sleep 0.1
	done
	mountpoint -q "$mnt" || { echo "mount not up after 30s" >&2; exit 1; }
}

shoal_stop() {
	local mnt=$1
	if mountpoint -q "$mnt" 2>/dev/null; then
		"$SHOAL" umount "$mnt" 2>/dev/null || fusermount3 -u -z "$mnt" 2>/dev/null || umount -l "$mnt" 2>/dev/null
	fi
	stop_pid "$mount_pid"
	stop_pid "$up_pid"
}
