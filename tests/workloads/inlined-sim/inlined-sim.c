/*
 * inlined-sim: a phase function the compiler inlines into its only caller, as Go and C
 * compilers do with a function called from one place, while an out-of-line copy of it (its
 * address is taken) never runs: a probe on its symbol alone would count no call.
 *
 * main calls commit_block() (never inlined) BLOCKS times; commit_block runs apply_block()
 * (inlined there), which mixes a few numbers and writes one 64-byte record to /dev/null.
 *
 * Usage: inlined-sim [BLOCKS]. Truth (one JSON line on stdout): pid, blocks (calls of
 * commit_block, each running apply_block once), writes (by apply_block).
 */
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static volatile long total;
static int fd = -1;

static inline void apply_block(long n)
{
	char rec[64];
	for (long i = 0; i < n; i++)
		total += i ^ n;
	memset(rec, 'b', sizeof(rec));
	if (write(fd, rec, sizeof(rec)) != sizeof(rec))
		abort();
}

/* Its address taken: an out-of-line copy is kept, which nothing calls. */
void (*volatile keep_apply_block)(long) = apply_block;

__attribute__((noinline)) void commit_block(long n)
{
	apply_block(n);
	total += 1;
}

int main(int argc, char **argv)
{
	long blocks = argc > 1 ? atol(argv[1]) : 1000;
	fd = open("/dev/null", O_WRONLY);
	if (fd < 0)
		return 1;
	for (long b = 0; b < blocks; b++)
		commit_block(b % 7 + 1);
	printf("{\"pid\":%d,\"blocks\":%ld,\"writes\":%ld}\n", getpid(), blocks, blocks);
	return 0;
}
