/*
 * fattr: the part of attr's setfattr(1) and getfattr(1) the in-VM NFS
 * workload uses, as one static binary (Debian's busybox has neither, and
 * attr's tools need shared libraries). It acts as setfattr or getfattr
 * according to the name it is run by:
 *
 *   setfattr -n NAME [-v VALUE] FILE...   set NAME (VALUE taken literally;
 *                                         no -v sets an empty value)
 *   setfattr -x NAME FILE...              remove NAME
 *   getfattr -n NAME [--only-values] FILE...
 *                                         print NAME's value
 *   getfattr -d FILE...                   print every user.* attribute
 *
 * Output is getfattr's: "# file: FILE", then NAME="VALUE" lines (values
 * with unprintable bytes as 0x and hex), then an empty line; with
 * --only-values just the raw value. Errors are "PROG: FILE: strerror"
 * on stderr ("No such attribute" for ENODATA, as attr prints it).
 *
 * Exit status: 0 done, 1 an error on some file, 2 usage.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/xattr.h>

#define MAXVAL (64 * 1024)
#define MAXLIST (64 * 1024)

static const char *prog;

static int usage(void)
{
	fprintf(stderr, "usage: setfattr {-n NAME [-v VALUE] | -x NAME} FILE...\n"
			"       getfattr {-n NAME [--only-values] | -d} FILE...\n");
	return 2;
}

static int fail(const char *file)
{
	const char *msg = errno == ENODATA ? "No such attribute" : strerror(errno);
	fprintf(stderr, "%s: %s: %s\n", prog, file, msg);
	return 1;
}

static void print_value(const char *name, const char *val, ssize_t n)
{
	ssize_t i;
	int text = 1;

	for (i = 0; i < n; i++)
		if (val[i] < 0x20 || val[i] > 0x7e || val[i] == '"' || val[i] == '\\')
			text = 0;
	if (text) {
		printf("%s=\"%.*s\"\n", name, (int)n, val);
		return;
	}
	printf("%s=0x", name);
	for (i = 0; i < n; i++)
		printf("%02x", (unsigned char)val[i]);
	printf("\n");
}

static int set_main(int argc, char **argv)
{
	const char *name = NULL, *value = "";
	int remove = 0, i, rc = 0;

	for (i = 1; i < argc && argv[i][0] == '-'; i++) {
		if (i + 1 >= argc)
			return usage();
		if (!strcmp(argv[i], "-n"))
			name = argv[++i];
		else if (!strcmp(argv[i], "-v"))
			value = argv[++i];
		else if (!strcmp(argv[i], "-x")) {
			name = argv[++i];
			remove = 1;
		} else
			return usage();
	}
	if (!name || i == argc)
		return usage();
	for (; i < argc; i++) {
		int r = remove ? removexattr(argv[i], name)
			       : setxattr(argv[i], name, value, strlen(value), 0);
		if (r < 0)
			rc = fail(argv[i]);
	}
	return rc;
}

static int get_main(int argc, char **argv)
{
	const char *name = NULL;
	int dump = 0, only = 0, i, rc = 0;
	static char val[MAXVAL], list[MAXLIST];

	for (i = 1; i < argc && argv[i][0] == '-'; i++) {
		if (!strcmp(argv[i], "-n") && i + 1 < argc)
			name = argv[++i];
		else if (!strcmp(argv[i], "-d"))
			dump = 1;
		else if (!strcmp(argv[i], "--only-values"))
			only = 1;
		else
			return usage();
	}
	if (!name == !dump || i == argc)
		return usage();
	for (; i < argc; i++) {
		const char *file = argv[i];
		ssize_t n;

		if (name) {
			n = getxattr(file, name, val, sizeof val);
			if (n < 0) {
				rc = fail(file);
				continue;
			}
			if (only) {
				fwrite(val, 1, n, stdout);
				continue;
			}
			printf("# file: %s\n", file);
			print_value(name, val, n);
			printf("\n");
			continue;
		}
		n = listxattr(file, list, sizeof list);
		if (n < 0) {
			rc = fail(file);
			continue;
		}
		printf("# file: %s\n", file);
		for (char *p = list; p < list + n; p += strlen(p) + 1) {
			ssize_t v;

			if (strncmp(p, "user.", 5))
				continue;
			v = getxattr(file, p, val, sizeof val);
			if (v < 0) {
				rc = fail(file);
				continue;
			}
			print_value(p, val, v);
		}
		printf("\n");
	}
	return rc;
}

int main(int argc, char **argv)
{
	prog = strrchr(argv[0], '/') ? strrchr(argv[0], '/') + 1 : argv[0];
	if (!strcmp(prog, "setfattr"))
		return set_main(argc, argv);
	if (!strcmp(prog, "getfattr"))
		return get_main(argc, argv);
	return usage();
}
