#!/usr/bin/env bash
# Builds the Debian package of Shoal from this checkout with dpkg-deb (no
# packaging tools beyond dpkg itself):
#
#   /usr/bin/shoal                      stamped with version and commit
#   /lib/systemd/system/shoal-mds.service, shoal-vip.service,
#                       shoal-ds.service, shoal-ds@.service
#   /etc/shoal/mds.yaml, vip.yaml, ds.yaml
#                                       example configurations (conffiles)
#   /usr/share/doc/shoal/deploy.md, service-address.md
#                                       docs/deploy.md and the page it links
#                                       for the service address
#
# and prints the path of dist/out/shoal_VERSION_ARCH.deb.
#
#   SHOAL_VERSION=1.2.3   package version (default 0.0~gitYYYYMMDDHHMMSS.COMMIT,
#                         from the last commit, its time in UTC)
set -euo pipefail
cd "$(dirname "$0")/.."

if git rev-parse --git-dir >/dev/null 2>&1; then
	commit=$(git rev-parse HEAD)
	# The version sorts by commit date, so that dpkg sees a later build as
	# an upgrade; ~ sorts before any release 0.0.
	version=${SHOAL_VERSION:-0.0~git$(TZ=UTC git log -1 --format=%cd --date=format-local:%Y%m%d%H%M%S).$(git rev-parse --short=12 HEAD)}
	if [ -n "$(git status --porcelain --untracked-files=no)" ]; then
		commit+="-dirty"
	fi
else
	# A source tree without git (a tarball): the version must be given.
	commit=unknown
	version=${SHOAL_VERSION:?"not a git checkout: set SHOAL_VERSION"}
fi
arch=$(go env GOARCH) # amd64, arm64: the same names as Debian's

out=dist/out
root=$(mktemp -d "${TMPDIR:-/tmp}/shoal-deb.XXXXXX")
trap 'rm -rf "$root"' EXIT
chmod 0755 "$root" # mktemp made it 0700; it becomes /
mkdir -p "$out"

# A static binary (no cgo) depends on no library version. -X stamps what
# `shoal version` prints, whatever GOFLAGS says about -buildvcs. -tags
# noplot leaves out the charts of `shoal bench plot` and the plotting
# library (gonum.org/v1/plot, its fonts and encoders): the package runs
# servers; `shoal bench` still measures and writes JSON, which a build from
# a checkout draws.
CGO_ENABLED=0 GOOS=linux GOARCH=$arch go build -trimpath -tags noplot \
	-ldflags "-s -w -X main.version=$version -X main.commit=$commit" \
	-o "$root/usr/bin/shoal" ./cmd/shoal

install -D -m 0644 -t "$root/lib/systemd/system" dist/systemd/*.service
install -D -m 0644 -t "$root/etc/shoal" dist/etc/mds.yaml dist/etc/vip.yaml dist/etc/ds.yaml
install -D -m 0644 -t "$root/usr/share/doc/shoal" docs/deploy.md docs/service-address.md README.md
install -D -m 0755 -t "$root/DEBIAN" dist/debian/postinst dist/debian/prerm dist/debian/postrm
# dpkg keeps an operator's edits of these across upgrades.
printf '/etc/shoal/%s\n' mds.yaml vip.yaml ds.yaml >"$root/DEBIAN/conffiles"

cat >"$root/DEBIAN/control" <<EOF
Package: shoal
Version: $version
Architecture: $arch
Maintainer: Shoal developers <noreply@shoalfs.invalid>
Installed-Size: $(du -sk --exclude=DEBIAN "$root" | cut -f1)
Depends: fuse3, passwd
Suggests: etcd-server, etcd-client, nfs-common
Section: net
Priority: optional
Homepage: https://github.com/shoalfs/shoal
Description: parallel NFS (pNFS) storage: metadata server, data servers, client
 Shoal is an NFSv4.1/4.2 server with pNFS (files layout): a metadata
 server, with its metadata in etcd or a local database, and data servers
 that hold the file data striped, and optionally mirrored, across them.
 On etcd, several metadata servers elect one leader and take over from it,
 and a supervisor moves the service address clients mount to the leader.
 The single shoal binary also mounts Shoal (or any NFSv4.1 server) with
 FUSE and copies files to and from it.
 .
 The package installs systemd units for the metadata server, the service
 address supervisor and the data servers, and example configurations in
 /etc/shoal; it enables nothing.
EOF

deb="$out/shoal_${version}_${arch}.deb"
dpkg-deb --root-owner-group -Zxz --build "$root" "$deb" >/dev/null
echo "$deb"
