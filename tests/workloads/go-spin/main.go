// go-spin burns CPU in a named function so tests can check that Go frames resolve to Go names.
package main

import (
	"fmt"
	"os"
	"strconv"
	"time"
)

//go:noinline
func spinHot(d time.Duration) uint64 {
	x := uint64(1)
	for start := time.Now(); time.Since(start) < d; {
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
