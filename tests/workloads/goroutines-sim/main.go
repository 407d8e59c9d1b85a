// goroutines-sim: Go phases on goroutines that migrate between OS threads, with known costs.
//
// Per round, -goroutines fresh goroutines (fresh 8 KiB stacks, so every round's deep recursion
// grows and moves them) each make -calls calls of handle, which calls
//   - persist: two write(2)s to /dev/null around a recursion that grows the goroutine stack
//     (so a uretprobe could never be used), and
//   - await: a blocking receive on a channel that a helper goroutine sends on after -wait;
//     the time spent in the receive is measured here.
// Nothing is locked to a thread and GOMAXPROCS is at least 2, so goroutines block, are
// preempted and resume on other threads inside phases. The truth is printed as one JSON line at
// the end (one more write(2)).
package main

import (
	"flag"
	"fmt"
	"os"
	"runtime"
	"sync"
	"sync/atomic"
	"time"
)

var (
	handleCalls, persistCalls, awaitCalls, writes atomic.Int64
	waitedNs                                       atomic.Int64
	sink                                           atomic.Int64
)

//go:noinline
func recurse(depth int, acc [64]byte) byte {
	// 64 bytes of frame per level: deep enough to make the runtime grow (move) the stack.
	if depth == 0 {
		return acc[depth%64]
	}
	acc[depth%64] ^= byte(depth)
	return recurse(depth-1, acc) + 1
}

//go:noinline
func persist(f *os.File, buf []byte, depth int) {
	persistCalls.Add(1)
	if _, err := f.Write(buf); err != nil {
		panic(err)
	}
	sink.Add(int64(recurse(depth, [64]byte{})))
	if _, err := f.Write(buf); err != nil {
		panic(err)
	}
	writes.Add(2)
}

//go:noinline
func await(wait time.Duration) {
	awaitCalls.Add(1)
	ch := make(chan int)
	go func() {
		time.Sleep(wait)
		ch <- 1
	}()
	start := time.Now()
	v := <-ch
	waitedNs.Add(time.Since(start).Nanoseconds())
	sink.Add(int64(v))
}

//go:noinline
func handle(f *os.File, buf []byte, depth int, wait time.Duration) {
	handleCalls.Add(1)
	persist(f, buf, depth)
	await(wait)
}

func main() {
	goroutines := flag.Int("goroutines", 8, "goroutines per round")
	rounds := flag.Int("rounds", 10, "rounds of fresh goroutines")
	calls := flag.Int("calls", 50, "handle calls per goroutine per round")
	depth := flag.Int("depth", 2000, "recursion depth in persist")
	wait := flag.Duration("wait", time.Millisecond, "how long each await blocks")
	flag.Parse()
	if runtime.GOMAXPROCS(0) < 2 {
		runtime.GOMAXPROCS(2)
	}
	f, err := os.OpenFile("/dev/null", os.O_WRONLY, 0)
	if err != nil {
		panic(err)
	}
	buf := make([]byte, 64)
	for r := 0; r < *rounds; r++ {
		var wg sync.WaitGroup
		for g := 0; g < *goroutines; g++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for i := 0; i < *calls; i++ {
					handle(f, buf, *depth, *wait)
				}
			}()
		}
		wg.Wait()
	}
	line := fmt.Sprintf(`{"pid":%d,"gomaxprocs":%d,"calls":{"handle":%d,"persist":%d,"await":%d},`+
		`"writes":%d,"waited_ns":%d,"sink":%d}`+"\n",
		os.Getpid(), runtime.GOMAXPROCS(0), handleCalls.Load(), persistCalls.Load(), awaitCalls.Load(),
		writes.Load(), waitedNs.Load(), sink.Load())
	os.Stdout.WriteString(line)
}
