/* jit-sim: a minimal JIT. Copies a counted loop into anonymous executable memory, names it in
 * /tmp/perf-PID.map as JIT runtimes do (perf's jit interface), and runs it for about half a
 * second, so CPU samples land in code no file on disk describes. */
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

int main(void)
{
	/* mov rax, rdi; 1: dec rax; jnz 1b; ret */
	static const unsigned char code[] = {0x48, 0x89, 0xf8, 0x48, 0xff, 0xc8, 0x75, 0xfb, 0xc3};
	unsigned char *mem = mmap(NULL, 4096, PROT_READ | PROT_WRITE | PROT_EXEC,
				  MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (mem == MAP_FAILED) {
		perror("mmap");
		return 1;
	}
	memcpy(mem, code, sizeof(code));
	char path[64];
	snprintf(path, sizeof(path), "/tmp/perf-%d.map", getpid());
	FILE *map = fopen(path, "w");
	if (!map) {
		perror(path);
		return 1;
	}
	fprintf(map, "%lx %zx jit_spin_loop\n", (unsigned long)(uintptr_t)mem, sizeof(code));
	fclose(map);
	uint64_t (*spin)(uint64_t) = (uint64_t(*)(uint64_t))mem;
	for (int i = 0; i < 10; i++)
		spin(100000000);
	printf("{\"map\":\"%s\"}\n", path);
	return 0;
}
