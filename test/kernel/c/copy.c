/*
 * copy: server-side copy for workload.sh (busybox cp reads and writes).
 *
 *   copy range SRC DST    copy_file_range(2) of all of SRC into a new DST
 *                         (NFSv4.2 COPY); prints the bytes copied
 *   copy clone SRC DST    ioctl FICLONE of SRC into a new DST (NFSv4.2
 *                         CLONE); prints the size cloned
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/stat.h>
#include <unistd.h>

#ifndef FICLONE
#define FICLONE _IOW(0x94, 9, int)
#endif

int main(int argc, char **argv)
{
	if (argc != 4 || (strcmp(argv[1], "range") && strcmp(argv[1], "clone"))) {
		fprintf(stderr, "usage: copy range|clone SRC DST\n");
		return 2;
	}
	int in = open(argv[2], O_RDONLY);
	if (in < 0) {
		perror(argv[2]);
		return 1;
	}
	struct stat st;
	if (fstat(in, &st) < 0) {
		perror("fstat");
		return 1;
	}
	int out = open(argv[3], O_WRONLY | O_CREAT | O_TRUNC, 0644);
	if (out < 0) {
		perror(argv[3]);
		return 1;
	}
	if (!strcmp(argv[1], "clone")) {
		if (ioctl(out, FICLONE, in) < 0) {
			perror("ioctl FICLONE");
			return 1;
		}
		printf("%lld\n", (long long)st.st_size);
	} else {
		long long total = 0;
		for (;;) {
			ssize_t n = copy_file_range(in, NULL, out, NULL, 1 << 30, 0);
			if (n < 0) {
				perror("copy_file_range");
				return 1;
			}
			if (n == 0)
				break;
			total += n;
		}
		printf("%lld\n", total);
	}
	if (fsync(out) < 0 || close(out) < 0) {
		perror("fsync/close");
		return 1;
	}
	return 0;
}
