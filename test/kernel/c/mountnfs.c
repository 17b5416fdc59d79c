/*
 * mountnfs: mount an NFS file system with mount(2) directly.
 *
 * busybox's mount routes nfs4 through its legacy NFSv2/v3 binary-options
 * code, which cannot mount NFSv4.1+. The kernel's nfs4 type accepts a text
 * options string, so this helper passes one through unchanged.
 *
 * usage: mountnfs SOURCE TARGET OPTIONS      e.g.
 *        mountnfs 10.0.2.2:/export /mnt vers=4.1,port=2049,addr=10.0.2.2
 *        mountnfs -u TARGET                  (umount2 TARGET, 0)
 */
#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <sys/mount.h>

int main(int argc, char **argv)
{
	if (argc == 3 && strcmp(argv[1], "-u") == 0) {
		if (umount2(argv[2], 0) != 0) {
			fprintf(stderr, "mountnfs: umount %s: %s\n", argv[2], strerror(errno));
			return 1;
		}
		return 0;
	}
	if (argc != 4) {
		fprintf(stderr, "usage: mountnfs SOURCE TARGET OPTIONS | mountnfs -u TARGET\n");
		return 2;
	}
	if (mount(argv[1], argv[2], "nfs4", 0, argv[3]) != 0) {
		fprintf(stderr, "mountnfs: mount %s on %s (%s): %s\n",
			argv[1], argv[2], argv[3], strerror(errno));
		return 1;
	}
	return 0;
}
