/*
 * libc-sim: threads that sleep, write and allocate only through Debian's libc (built without
 * frame pointers), compiled with clang -O2 (which omits them too): the waits, syscalls and
 * allocations a profiler sees all start inside libc, and only unwinding from call-frame
 * information gets from there back through the program's functions to the thread's entry.
 *
 * Each of THREADS threads runs worker() -> round() ROUNDS times; a round: flush_records() writes
 * WRITES records to /dev/null with write(2) (libc's wrapper), pause_briefly() sleeps 1 ms with
 * nanosleep(2) (libc's usleep), and build_batch() mallocs and frees a 256 KiB buffer. The main
 * thread waits in pthread_join.
 *
 * Usage: libc-sim [THREADS] [ROUNDS] [WRITES]. Truth (one JSON line on stdout): pid, threads,
 * rounds, writes (write(2) calls by the workers), sleeps (nanosleep calls), allocs, alloc_bytes.
 */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <fcntl.h>
#include <unistd.h>

static int rounds = 200, writes_per_round = 20, fd = -1;
static volatile unsigned long sink;
/* Where each thread publishes its batch before freeing it: the allocation escapes, so the
 * compiler cannot elide the malloc/free pair (per thread: a shared one would be freed twice). */
static __thread unsigned char *volatile last_batch;

__attribute__((noinline)) static void flush_records(void)
{
	char rec[64];
	memset(rec, 'r', sizeof(rec));
	for (int i = 0; i < writes_per_round; i++)
		if (write(fd, rec, sizeof(rec)) != sizeof(rec))
			abort();
}

__attribute__((noinline)) static void pause_briefly(void)
{
	usleep(1000);
}

__attribute__((noinline)) static void build_batch(void)
{
	unsigned char *buf = malloc(256 << 10);
	if (!buf)
		abort();
	memset(buf, (int)sink, 256 << 10);
	last_batch = buf;
	sink += last_batch[4096];
	free(last_batch);
}

__attribute__((noinline)) static void round_once(void)
{
	flush_records();
	pause_briefly();
	build_batch();
}

static void *worker(void *arg)
{
	(void)arg;
	for (int r = 0; r < rounds; r++)
		round_once();
	return NULL;
}

int main(int argc, char **argv)
{
	int threads = argc > 1 ? atoi(argv[1]) : 2;
	rounds = argc > 2 ? atoi(argv[2]) : rounds;
	writes_per_round = argc > 3 ? atoi(argv[3]) : writes_per_round;
	if (threads < 1 || threads > 64)
		threads = 2;
	fd = open("/dev/null", O_WRONLY);
	if (fd < 0)
		return 1;
	pthread_t tids[64];
	for (int i = 0; i < threads; i++)
		if (pthread_create(&tids[i], NULL, worker, NULL))
			return 1;
	for (int i = 0; i < threads; i++)
		pthread_join(tids[i], NULL);
	long n = (long)threads * rounds;
	printf("{\"pid\":%d,\"threads\":%d,\"rounds\":%d,\"writes\":%ld,\"sleeps\":%ld,"
	       "\"allocs\":%ld,\"alloc_bytes\":%ld}\n",
	       getpid(), threads, rounds, n * writes_per_round, n, n, n * (256L << 10));
	return 0;
}
