// go-spin burns CPU in a named function so tests can check that Go frames resolve to Go names.
// It burns the given milliseconds of its own CPU time, not of wall time, so a busy machine
// delays it rather than leaving it fewer samples.
package main

import (
	"fmt"
	"os"
	"strconv"
	"syscall"
	"time"
)

// cpuTime is the process's CPU time so far (user and system).
func cpuTime() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		panic(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

//go:noinline
func spinHot(d time.Duration) uint64 {
	x := uint64(1)
	for start := cpuTime(); cpuTime()-start < d; {
		for i := 0; i < 10000; i++ {
			x ^= x << 13
			x ^= x >> 7
			x ^= x << 17
		}
	}
	return x
}

func main() {
	ms := 1000
	if len(os.Args) > 1 {
		ms, _ = strconv.Atoi(os.Args[1])
	}
	x := spinHot(time.Duration(ms) * time.Millisecond)
	fmt.Printf("{\"pid\":%d,\"burn_fn\":\"main.spinHot\",\"x\":%d}\n", os.Getpid(), x)
}
