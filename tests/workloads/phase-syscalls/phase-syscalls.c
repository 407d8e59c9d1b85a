/*
 * phase-syscalls: native phases with known syscalls, for counting them exactly under phase
 * probes (whose return trampoline enters the kernel through a syscall of its own since Linux
 * 6.11: it must never be counted as the program's).
 *
 * Per call: ask_parent(n) makes n getppid(2) calls; digest() only computes (no syscall); both
 * are called from work(), a phase enclosing them. Usage: phase-syscalls [CALLS] [GETPPIDS].
 * Truth (one JSON line, written with one write(2)): pid, calls, getppid, digest_calls.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

static volatile unsigned long sink;

__attribute__((noinline)) void ask_parent(int n)
{
	for (int i = 0; i < n; i++)
		sink += syscall(SYS_getppid);
}

/* Pure computation: an FNV-style digest over a buffer, no syscall. */
__attribute__((noinline)) unsigned long digest(const unsigned char *buf, size_t len)
{
	unsigned long h = 0xcbf29ce484222325UL;
	for (int round = 0; round < 64; round++)
		for (size_t i = 0; i < len; i++)
			h = (h ^ buf[i]) * 0x100000001b3UL;
	return h;
}

__attribute__((noinline)) void work(int getppids, const unsigned char *buf, size_t len)
{
	ask_parent(getppids);
	sink += digest(buf, len);
}

int main(int argc, char **argv)
{
	int calls = argc > 1 ? atoi(argv[1]) : 6;
	int getppids = argc > 2 ? atoi(argv[2]) : 700;
	unsigned char buf[4096];
	for (size_t i = 0; i < sizeof(buf); i++)
		buf[i] = (unsigned char)(i * 31);
	for (int c = 0; c < calls; c++)
		work(getppids, buf, sizeof(buf));
	char line[256];
	int n = snprintf(line, sizeof(line),
			 "{\"pid\":%d,\"calls\":%d,\"getppid\":%d,\"digest_calls\":%d,\"sink\":%lu}\n",
			 (int)getpid(), calls, calls * getppids, calls, sink);
	return write(1, line, n) == n ? 0 : 1;
}
