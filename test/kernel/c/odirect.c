/*
 * odirect: O_DIRECT file I/O in 1 MiB requests with an aligned buffer,
 * for the in-VM NFS workload.
 *
 *   odirect read FILE SIZE
 *       Reads FILE opened with O_DIRECT in 1 MiB read(2) calls and copies
 *       the data to stdout until a read returns 0 (end of file). SIZE is
 *       the file's expected size: once more than SIZE + 1 MiB bytes have
 *       come back, the server is answering reads past the end of the file
 *       with data, and the helper stops with status 3 instead of reading
 *       forever. Prints on stderr how many bytes came back in how many
 *       reads and how long the last non-empty read was.
 *   odirect write FILE
 *       Creates or truncates FILE, opens it with O_DIRECT and copies stdin
 *       to it in 1 MiB write(2) calls (the last one may be shorter; NFS
 *       accepts any length and offset with O_DIRECT), then fsyncs and
 *       closes it. Prints the byte count on stderr.
 *
 * Exit status: 0 done, 1 an I/O error, 2 usage, 3 more data than SIZE.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define CHUNK (1 << 20)

static int writeall(int fd, const char *p, size_t n)
{
	while (n > 0) {
		ssize_t w = write(fd, p, n);
		if (w < 0) {
			if (errno == EINTR)
				continue;
			return -1;
		}
		p += w;
		n -= (size_t)w;
	}
	return 0;
}

static int do_read(const char *path, long long size, char *buf)
{
	int fd = open(path, O_RDONLY | O_DIRECT);
	if (fd < 0) {
		fprintf(stderr, "odirect: open %s O_DIRECT: %s\n", path, strerror(errno));
		return 1;
	}
	long long total = 0;
	long reads = 0;
	ssize_t last = 0;
	for (;;) {
		ssize_t r = read(fd, buf, CHUNK);
		if (r < 0) {
			if (errno == EINTR)
				continue;
			fprintf(stderr, "odirect: read %s at offset %lld (read %ld): %s\n", path, total, reads + 1,
				strerror(errno));
			return 1;
		}
		reads++;
		if (r == 0)
			break;
		last = r;
		total += r;
		if (writeall(1, buf, (size_t)r) != 0) {
			fprintf(stderr, "odirect: write stdout: %s\n", strerror(errno));
			return 1;
		}
		if (total > size + CHUNK) {
			fprintf(stderr,
				"odirect: %lld bytes read from %s, which has %lld: reads past the end of the file return data (last read %zd bytes)\n",
				total, path, size, r);
			return 3;
		}
	}
	close(fd);
	fprintf(stderr, "odirect: read %lld bytes in %ld reads (the last non-empty one %zd bytes)\n", total, reads, last);
	return 0;
}

static int do_write(const char *path, char *buf)
{
	int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_DIRECT, 0644);
	if (fd < 0) {
		fprintf(stderr, "odirect: open %s O_DIRECT for writing: %s\n", path, strerror(errno));
		return 1;
	}
	long long total = 0;
	for (;;) {
		/* Fill a whole chunk from stdin (a pipe may return less). */
		size_t n = 0;
		while (n < CHUNK) {
			ssize_t r = read(0, buf + n, CHUNK - n);
			if (r < 0) {
				if (errno == EINTR)
					continue;
				fprintf(stderr, "odirect: read stdin: %s\n", strerror(errno));
				return 1;
			}
			if (r == 0)
				break;
			n += (size_t)r;
		}
		if (n == 0)
			break;
		if (writeall(fd, buf, n) != 0) {
			fprintf(stderr, "odirect: write %s at offset %lld: %s\n", path, total, strerror(errno));
			return 1;
		}
		total += (long long)n;
		if (n < CHUNK)
			break;
	}
	if (fsync(fd) != 0 || close(fd) != 0) {
		fprintf(stderr, "odirect: fsync/close %s: %s\n", path, strerror(errno));
		return 1;
	}
	fprintf(stderr, "odirect: wrote %lld bytes\n", total);
	return 0;
}

int main(int argc, char **argv)
{
	char *buf;
	if (posix_memalign((void **)&buf, 4096, CHUNK) != 0) {
		fprintf(stderr, "odirect: out of memory\n");
		return 1;
	}
	if (argc == 4 && strcmp(argv[1], "read") == 0)
		return do_read(argv[2], atoll(argv[3]), buf);
	if (argc == 3 && strcmp(argv[1], "write") == 0)
		return do_write(argv[2], buf);
	fprintf(stderr, "usage: odirect read FILE SIZE | odirect write FILE <DATA\n");
	return 2;
}
