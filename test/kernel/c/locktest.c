/*
 * locktest: POSIX byte-range lock checks for the in-VM NFS workload.
 *
 *   locktest hold FILE READY RELEASE
 *       Takes a write lock on bytes [0,100) of FILE with F_SETLK, creates
 *       the file READY, then waits (at most 600 s) until RELEASE exists or
 *       SIGUSR1/SIGTERM arrives, unlocks and exits 0.
 *   locktest conflict FILE HOLDERPID
 *       F_SETLK of a write lock on [0,100) must fail with EAGAIN or EACCES;
 *       F_GETLK must then report a write lock on [0,100) held by HOLDERPID
 *       (HOLDERPID 0 skips the pid check: a lock held through another NFS
 *       client is reported by the server's LOCKT reply, which carries no
 *       pid); and a write lock on the disjoint range [100,200) must succeed.
 *   locktest free FILE
 *       F_SETLK of a write lock on [0,100) must succeed.
 *
 * Each mode prints one line describing its outcome and exits 0 on success,
 * 1 on a failed check, 2 on usage errors.
 */
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static volatile sig_atomic_t released;

static void on_signal(int sig)
{
	(void)sig;
	released = 1;
}

static int open_file(const char *path)
{
	int fd = open(path, O_RDWR | O_CREAT, 0644);
	if (fd < 0) {
		fprintf(stderr, "locktest: open %s: %s\n", path, strerror(errno));
		exit(1);
	}
	return fd;
}

static int setlk(int fd, short type, off_t start, off_t len)
{
	struct flock fl;
	memset(&fl, 0, sizeof fl);
	fl.l_type = type;
	fl.l_whence = SEEK_SET;
	fl.l_start = start;
	fl.l_len = len;
	return fcntl(fd, F_SETLK, &fl);
}

static int hold(const char *path, const char *ready, const char *release)
{
	int fd = open_file(path);
	if (setlk(fd, F_WRLCK, 0, 100) != 0) {
		printf("hold: F_SETLK failed: %s\n", strerror(errno));
		return 1;
	}
	signal(SIGUSR1, on_signal);
	signal(SIGTERM, on_signal);
	int r = open(ready, O_WRONLY | O_CREAT, 0644);
	if (r < 0) {
		printf("hold: create %s: %s\n", ready, strerror(errno));
		return 1;
	}
	dprintf(r, "%d\n", (int)getpid());
	close(r);
	struct timespec ts = {0, 50 * 1000 * 1000};
	for (int i = 0; i < 12000 && !released; i++) {
		if (access(release, F_OK) == 0)
			break;
		nanosleep(&ts, NULL);
	}
	if (setlk(fd, F_UNLCK, 0, 100) != 0) {
		printf("hold: unlock failed: %s\n", strerror(errno));
		return 1;
	}
	close(fd);
	printf("hold: released\n");
	return 0;
}

static int conflict(const char *path, long holder)
{
	int fd = open_file(path);
	if (setlk(fd, F_WRLCK, 0, 100) == 0) {
		printf("conflict: F_SETLK succeeded while pid %ld holds the lock\n", holder);
		return 1;
	}
	if (errno != EAGAIN && errno != EACCES) {
		printf("conflict: F_SETLK failed with %s, want EAGAIN or EACCES\n", strerror(errno));
		return 1;
	}
	int setlk_errno = errno;
	struct flock fl;
	memset(&fl, 0, sizeof fl);
	fl.l_type = F_WRLCK;
	fl.l_whence = SEEK_SET;
	fl.l_start = 0;
	fl.l_len = 100;
	if (fcntl(fd, F_GETLK, &fl) != 0) {
		printf("conflict: F_GETLK: %s\n", strerror(errno));
		return 1;
	}
	if (fl.l_type != F_WRLCK) {
		printf("conflict: F_GETLK l_type=%d, want F_WRLCK\n", fl.l_type);
		return 1;
	}
	if (fl.l_start != 0 || fl.l_len != 100) {
		printf("conflict: F_GETLK range [%ld,+%ld), want [0,+100)\n",
		       (long)fl.l_start, (long)fl.l_len);
		return 1;
	}
	if (holder > 0 && fl.l_pid != holder) {
		printf("conflict: F_GETLK l_pid=%ld, want %ld\n", (long)fl.l_pid, holder);
		return 1;
	}
	if (setlk(fd, F_WRLCK, 100, 100) != 0) {
		printf("conflict: lock on disjoint range [100,200) failed: %s\n", strerror(errno));
		return 1;
	}
	setlk(fd, F_UNLCK, 100, 100);
	close(fd);
	printf("conflict: F_SETLK -> %s, F_GETLK -> pid %ld [%ld,+%ld), disjoint range ok\n",
	       strerror(setlk_errno), (long)fl.l_pid, (long)fl.l_start, (long)fl.l_len);
	return 0;
}

static int lock_free(const char *path)
{
	int fd = open_file(path);
	if (setlk(fd, F_WRLCK, 0, 100) != 0) {
		printf("free: F_SETLK failed after release: %s\n", strerror(errno));
		return 1;
	}
	setlk(fd, F_UNLCK, 0, 100);
	close(fd);
	printf("free: F_SETLK ok\n");
	return 0;
}

int main(int argc, char **argv)
{
	setvbuf(stdout, NULL, _IONBF, 0);
	if (argc == 5 && strcmp(argv[1], "hold") == 0)
		return hold(argv[2], argv[3], argv[4]);
	if (argc == 4 && strcmp(argv[1], "conflict") == 0)
		return conflict(argv[2], strtol(argv[3], NULL, 10));
	if (argc == 3 && strcmp(argv[1], "free") == 0)
		return lock_free(argv[2]);
	fprintf(stderr, "usage: locktest hold FILE READY RELEASE | conflict FILE HOLDERPID | free FILE\n");
	return 2;
}
