/*
 * chains: a target whose call paths never stop changing. 24 functions call each other in random
 * chains 4 to 8 deep (a chain's path is drawn afresh each time, so nearly every one is a call
 * path never seen before), and each chain's leaf makes one getppid(2) syscall and sleeps 1 ms
 * with nanosleep(2) from a leaf of its own. Built with frame pointers and without sibling-call
 * optimization, so every function keeps its frame and the kernel's walk sees the whole chain.
 *
 * Usage: chains SECONDS RATE [wait]: RATE chains per second for SECONDS; with `wait`, starts
 * only after a line on stdin (so that an agent attaches first). Truth (one JSON line on stdout):
 * pid, chains, getppid (syscalls made by the leaves), nanosleep.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#define N 24

typedef void (*link_fn)(unsigned depth, unsigned *rng);
static link_fn links[N];
static unsigned long getppids, nanosleeps;

static unsigned next_random(unsigned *s)
{
	*s ^= *s << 13;
	*s ^= *s >> 17;
	*s ^= *s << 5;
	return *s;
}

__attribute__((noinline)) static void leaf(void)
{
	syscall(SYS_getppid);
	getppids++;
	struct timespec ms = {0, 1000000};
	nanosleep(&ms, NULL);
	nanosleeps++;
	__asm__ volatile("" ::: "memory");
}

/* The empty asm after the call keeps it a call (not a jump that would drop the frame). */
#define LINK(i)                                                                                    \
	__attribute__((noinline)) static void link##i(unsigned depth, unsigned *rng)               \
	{                                                                                          \
		if (depth == 0)                                                                    \
			leaf();                                                                    \
		else                                                                               \
			links[next_random(rng) % N](depth - 1, rng);                               \
		__asm__ volatile("" ::: "memory");                                                 \
	}
LINK(0) LINK(1) LINK(2) LINK(3) LINK(4) LINK(5) LINK(6) LINK(7) LINK(8) LINK(9) LINK(10) LINK(11)
LINK(12) LINK(13) LINK(14) LINK(15) LINK(16) LINK(17) LINK(18) LINK(19) LINK(20) LINK(21)
LINK(22) LINK(23)

static double now(void)
{
	struct timespec t;
	clock_gettime(CLOCK_MONOTONIC, &t);
	return t.tv_sec + t.tv_nsec / 1e9;
}

int main(int argc, char **argv)
{
	link_fn all[N] = {link0,  link1,  link2,  link3,  link4,  link5,  link6,  link7,
			  link8,  link9,  link10, link11, link12, link13, link14, link15,
			  link16, link17, link18, link19, link20, link21, link22, link23};
	memcpy(links, all, sizeof(all));
	double seconds = argc > 1 ? atof(argv[1]) : 10;
	double rate = argc > 2 ? atof(argv[2]) : 200;
	if (argc > 3 && strcmp(argv[3], "wait") == 0) {
		char line[16];
		if (!fgets(line, sizeof(line), stdin))
			return 1;
	}
	unsigned rng = (unsigned)getpid() * 2654435761u | 1;
	unsigned long chains = 0;
	double start = now();
	while (now() - start < seconds) {
		/* Paced: chain k starts at k / rate seconds (the leaf's sleep is part of the pace). */
		if (chains >= (now() - start) * rate) {
			struct timespec gap = {0, 200000};
			nanosleep(&gap, NULL);
			nanosleeps++;
			continue;
		}
		links[next_random(&rng) % N](4 + next_random(&rng) % 5, &rng);
		chains++;
	}
	printf("{\"pid\":%d,\"chains\":%lu,\"getppid\":%lu,\"nanosleep\":%lu}\n", getpid(), chains,
	       getppids, nanosleeps);
	return 0;
}
