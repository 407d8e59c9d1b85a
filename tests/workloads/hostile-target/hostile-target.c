/* hostile-target: the program of an unprivileged user attacking the root profiler (the hostile
 * local user tests). Spins for SECONDS in anonymous executable memory (JIT-like code that only a
 * perf map names, which the attacking user writes, or plants), and with FILE maps that file
 * executable first (a 2 GiB sparse file, a library about to be replaced by a FIFO). Prints its
 * pid and the JIT code's address as one JSON line, then spins.
 *
 * hostile-target SECONDS [FILE] */
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

int main(int argc, char **argv)
{
	int seconds = argc > 1 ? atoi(argv[1]) : 5;
	if (argc > 2) {
		int fd = open(argv[2], O_RDONLY);
		struct stat st;
		if (fd < 0 || fstat(fd, &st) != 0) {
			perror(argv[2]);
			return 1;
		}
		if (mmap(NULL, st.st_size, PROT_READ | PROT_EXEC, MAP_PRIVATE, fd, 0) ==
		    MAP_FAILED) {
			perror("mmap");
			return 1;
		}
		close(fd);
	}
	/* mov rax, rdi; 1: dec rax; jnz 1b; ret */
	static const unsigned char code[] = {0x48, 0x89, 0xf8, 0x48, 0xff, 0xc8, 0x75, 0xfb, 0xc3};
	unsigned char *mem = mmap(NULL, 4096, PROT_READ | PROT_WRITE | PROT_EXEC,
				  MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (mem == MAP_FAILED) {
		perror("mmap");
		return 1;
	}
	memcpy(mem, code, sizeof(code));
	printf("{\"pid\":%d,\"jit\":\"%lx\"}\n", getpid(), (unsigned long)(uintptr_t)mem);
	fflush(stdout);
	uint64_t (*spin)(uint64_t) = (uint64_t(*)(uint64_t))mem;
	time_t end = time(NULL) + seconds;
	while (time(NULL) < end)
		spin(20000000);
	return 0;
}
