/* stripped-sim [ROUNDS]: burns CPU in two named functions (ROUNDS times, 1 by default), to be
 * built with -g and then stripped by the tests, its symbols left only in a separate debug file
 * (a .gnu_debuglink beside it, or by build ID under a debug directory or a debuginfod server). */
#include <stdio.h>
#include <stdlib.h>

static volatile unsigned long sink;

__attribute__((noinline)) void stripped_spin_leaf(unsigned long n)
{
	for (unsigned long i = 0; i < n; i++)
		sink += i * 7;
}

__attribute__((noinline)) void stripped_spin_outer(void)
{
	for (int k = 0; k < 40; k++)
		stripped_spin_leaf(10000000);
}

int main(int argc, char **argv)
{
	int rounds = argc > 1 ? atoi(argv[1]) : 1;

	for (int r = 0; r < rounds; r++)
		stripped_spin_outer();
	printf("{\"sink\":%lu}\n", sink);
	return 0;
}
