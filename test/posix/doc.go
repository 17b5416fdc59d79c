// Package posix is a POSIX conformance suite for `shoal mount`: it serves
// Shoal in-process (a single server, and a two-data-server pNFS cluster),
// mounts it with FUSE through package fusemount, and checks the mount with
// the system calls and tools applications use (open, rename, link, chmod,
// fcntl locks, cp, tar, dd, rsync, git, and fio and postmark with their
// data checked: fio verifies every block by crc32c, postmark must delete
// every file it created).
//
// The suite needs /dev/fuse and either root or fusermount3; without them it
// skips. Running it as root adds the cases that need root: chown, and
// permission checks as an unprivileged uid, which work because the mount
// uses each caller's uid and gid as its NFS credential. Every check goes
// through the mount, so a failure points at the mount, the client library
// or the server, not at a test double.
package posix
