/*
 * sparse: fallocate(2) and lseek(2) SEEK_DATA/SEEK_HOLE for workload.sh
 * (busybox has neither a punch-hole fallocate nor a hole-seeking tool).
 *
 *   sparse alloc FILE OFF LEN    fallocate mode 0 (NFSv4.2 ALLOCATE)
 *   sparse punch FILE OFF LEN    PUNCH_HOLE|KEEP_SIZE (NFSv4.2 DEALLOCATE)
 *   sparse data FILE OFF         prints lseek(SEEK_DATA), or "nxio"
 *   sparse hole FILE OFF         prints lseek(SEEK_HOLE), or "nxio"
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#ifndef FALLOC_FL_KEEP_SIZE
#define FALLOC_FL_KEEP_SIZE 0x01
#endif
#ifndef FALLOC_FL_PUNCH_HOLE
#define FALLOC_FL_PUNCH_HOLE 0x02
#endif

static void usage(void)
{
	fprintf(stderr, "usage: sparse alloc|punch FILE OFF LEN | sparse data|hole FILE OFF\n");
	exit(2);
}

int main(int argc, char **argv)
{
	if (argc < 4)
		usage();
	const char *cmd = argv[1];
	off_t off = strtoll(argv[3], NULL, 0);
	int fd = open(argv[2], O_RDWR);
	if (fd < 0) {
		perror(argv[2]);
		return 1;
	}
	if (!strcmp(cmd, "alloc") || !strcmp(cmd, "punch")) {
		if (argc != 5)
			usage();
		off_t len = strtoll(argv[4], NULL, 0);
		int mode = !strcmp(cmd, "punch") ? FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE : 0;
		if (fallocate(fd, mode, off, len) < 0) {
			perror("fallocate");
			return 1;
		}
		return 0;
	}
	if (!strcmp(cmd, "data") || !strcmp(cmd, "hole")) {
		off_t r = lseek(fd, off, !strcmp(cmd, "data") ? SEEK_DATA : SEEK_HOLE);
		if (r < 0 && errno == ENXIO) {
			printf("nxio\n");
			return 0;
		}
		if (r < 0) {
			perror("lseek");
			return 1;
		}
		printf("%lld\n", (long long)r);
		return 0;
	}
	usage();
	return 2;
}
