/*
 * slowsync.so: an LD_PRELOAD library that makes every fsync and fdatasync
 * of the process it is loaded into take SLOWSYNC_US microseconds longer,
 * after the real call returns. bench/slowdisk/run.sh loads it into the
 * benchmark's PostgreSQL and RabbitMQ to measure both sides on a disk
 * whose flushes are slower than this machine's (a network block device
 * flushes in about a millisecond; this machine's local disk in about 0.13).
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdlib.h>
#include <time.h>

static void slow_down(void)
{
	static long ns = -1;
	if (ns < 0) {
		const char *s = getenv("SLOWSYNC_US");
		ns = s ? atol(s) * 1000L : 0;
	}
	if (ns > 0) {
		struct timespec ts = { ns / 1000000000L, ns % 1000000000L };
		while (nanosleep(&ts, &ts) != 0)
			; /* interrupted by a signal: sleep the rest */
	}
}

int fdatasync(int fd)
{
	static int (*real)(int);
	if (!real)
		real = (int (*)(int))dlsym(RTLD_NEXT, "fdatasync");
	int r = real(fd);
	slow_down();
	return r;
}

int fsync(int fd)
{
	static int (*real)(int);
	if (!real)
		real = (int (*)(int))dlsym(RTLD_NEXT, "fsync");
	int r = real(fd);
	slow_down();
	return r;
}
