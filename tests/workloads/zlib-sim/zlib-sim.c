/*
 * zlib-sim: compresses a compressible buffer with Debian's zlib (built without frame pointers)
 * for a number of rounds, always through compress_block(), called from run() from main(). A
 * profile of it should show the deflate code inside compress_block: only unwinding from the
 * call-frame information gets from zlib's frames back to the caller.
 *
 * Built with -DLOAD_ZLIB_LATE (and without -lz), it first spins ~300 ms in warm_up() and only then
 * dlopen()s libz: the library appears in the process after profiling began.
 *
 * Usage: zlib-sim [ROUNDS] [BYTES]. Truth (one JSON line): pid, rounds, input_bytes,
 * output_bytes, caller, elapsed_ns (of the compression rounds: fixed work, so a slowdown shows).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <zlib.h>
#ifdef LOAD_ZLIB_LATE
#include <dlfcn.h>
typedef int (*compress2_fn)(Bytef *, uLongf *, const Bytef *, uLong, int);
static compress2_fn compress2_late;
#define compress2 compress2_late

/* CPU work before libz is loaded, so a profiler sees the process without it first. */
__attribute__((noinline)) static unsigned long warm_up(void)
{
	struct timespec t0, t;
	clock_gettime(CLOCK_MONOTONIC, &t0);
	unsigned long x = 1;
	do {
		for (int i = 0; i < 100000; i++)
			x = x * 6364136223846793005UL + 1442695040888963407UL;
		clock_gettime(CLOCK_MONOTONIC, &t);
	} while ((t.tv_sec - t0.tv_sec) * 1000000000L + (t.tv_nsec - t0.tv_nsec) < 300000000L);
	return x;
}

static void load_zlib(void)
{
	printf("warm-up %lu\n", warm_up());
	void *z = dlopen("libz.so.1", RTLD_NOW);
	if (!z || !(compress2_late = (compress2_fn)dlsym(z, "compress2"))) {
		fprintf(stderr, "dlopen libz.so.1: %s\n", dlerror());
		exit(1);
	}
}
#endif

/* Text-like input: words from a small vocabulary in a pseudo-random order, so deflate works
 * on matches (its longest_match and deflate_slow are the hot code). */
static void fill(unsigned char *buf, size_t n)
{
	static const char *words[] = { "validator ", "block ", "replay ", "vote ", "commit ",
				       "ledger ", "shred ", "slot ", "leader ", "fork " };
	unsigned long x = 88172645463325252UL;
	size_t at = 0;
	while (at < n) {
		x ^= x << 13;
		x ^= x >> 7;
		x ^= x << 17;
		const char *w = words[x % 10];
		size_t len = strlen(w);
		if (len > n - at)
			len = n - at;
		memcpy(buf + at, w, len);
		at += len;
	}
}

__attribute__((noinline)) static size_t compress_block(const unsigned char *in, size_t n,
						       unsigned char *out, size_t cap)
{
	uLongf got = cap;
	if (compress2(out, &got, in, n, 9) != Z_OK) {
		fprintf(stderr, "compress2 failed\n");
		exit(1);
	}
	return got;
}

__attribute__((noinline)) static size_t run(long rounds, size_t n)
{
	unsigned char *in = malloc(n);
	size_t cap = n + n / 100 + 1024; /* above compressBound(n), which is not dlopen'ed */
	unsigned char *out = malloc(cap);
	if (!in || !out)
		exit(1);
	fill(in, n);
	size_t total = 0;
	for (long r = 0; r < rounds; r++)
		total += compress_block(in, n, out, cap);
	free(in);
	free(out);
	return total;
}

int main(int argc, char **argv)
{
	long rounds = argc > 1 ? atol(argv[1]) : 40;
	size_t n = argc > 2 ? (size_t)atol(argv[2]) : 1 << 20;
#ifdef LOAD_ZLIB_LATE
	load_zlib();
#endif
	struct timespec t0, t1;
	clock_gettime(CLOCK_MONOTONIC, &t0);
	size_t total = run(rounds, n);
	clock_gettime(CLOCK_MONOTONIC, &t1);
	long long elapsed = (t1.tv_sec - t0.tv_sec) * 1000000000LL + (t1.tv_nsec - t0.tv_nsec);
	printf("{\"pid\":%d,\"rounds\":%ld,\"input_bytes\":%zu,\"output_bytes\":%zu,"
	       "\"caller\":\"compress_block\",\"elapsed_ns\":%lld}\n",
	       (int)getpid(), rounds, n * rounds, total, elapsed);
	return 0;
}
