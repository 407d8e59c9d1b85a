/* stripped-sim: burns CPU in two named functions, to be built with -g and then stripped by the
 * tests, its symbols left only in a separate debug file (a .gnu_debuglink beside it, or by build
 * ID under a debug directory or a debuginfod server). */
#include <stdio.h>

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

int main(void)
{
	stripped_spin_outer();
	printf("{\"sink\":%lu}\n", sink);
	return 0;
}
