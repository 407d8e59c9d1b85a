// relay-sim: a message relay with known costs per phase, for phaseprof's tests.
//
// Per iteration: ingest (build a message) → verify (bytes.Clone it, then deep recursion that
// grows the goroutine stack, so a uretprobe would crash it) → commit (one write(2) and one
// fsync(2) to a file) → fanout (one bufio.Writer.Flush, i.e. one write(2), per subscriber
// socket on 127.0.0.1). The work runs on one goroutine, free to migrate between OS threads
// (-lock-thread locks it to one). The truth is printed as one JSON line at the end (one more
// write(2)).
package main

import (
	"bufio"
	"bytes"
	"flag"
	"fmt"
	"io"
	"net"
	"os"
	"runtime"
	"sync"
	"time"
)

type truth struct {
	Calls        map[string]int `json:"calls"`
	CloneBytes   int64          `json:"clone_bytes"`
	CommitWrites int            `json:"commit_writes"`
	Fsyncs       int            `json:"fsyncs"`
	FanoutFlush  int            `json:"fanout_flushes"`
}

var t = truth{Calls: map[string]int{}}
var sink byte

//go:noinline
func ingest(i int, size int) []byte {
	t.Calls["ingest"]++
	msg := make([]byte, size)
	for j := range msg {
		msg[j] = byte(i + j)
	}
	return msg
}

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
func verify(msg []byte, depth int) []byte {
	t.Calls["verify"]++
	c := bytes.Clone(msg)
	t.CloneBytes += int64(len(c))
	sink += recurse(depth, [64]byte{})
	return c
}

//go:noinline
func commit(f *os.File, msg []byte) {
	t.Calls["commit"]++
	if _, err := f.Write(msg); err != nil {
		panic(err)
	}
	t.CommitWrites++
	if err := f.Sync(); err != nil {
		panic(err)
	}
	t.Fsyncs++
}

//go:noinline
func fanout(subs []*bufio.Writer, msg []byte) {
	t.Calls["fanout"]++
	for _, w := range subs {
		if _, err := w.Write(msg); err != nil {
			panic(err)
		}
		if err := w.Flush(); err != nil {
			panic(err)
		}
		t.FanoutFlush++
	}
}

func main() {
	iterations := flag.Int("iterations", 1000, "messages to relay")
	size := flag.Int("msg-bytes", 512, "bytes per message")
	nsubs := flag.Int("subscribers", 3, "subscriber sockets on 127.0.0.1")
	depth := flag.Int("depth", 2000, "recursion depth in verify")
	waitStdin := flag.Bool("wait-stdin", false, "start after a line on stdin")
	out := flag.String("commit-to", "", "file to commit to (default: a temp file)")
	lockThread := flag.Bool("lock-thread", false, "lock the relay loop to one OS thread")
	benchSwitches := flag.Int("bench-switches", 0, "only pass a token between two goroutines this many times and print ns per pass (scheduler-probe benchmark)")
	benchCalls := flag.Int("bench-calls", 0, "only call ingest this many times and print ns per call (probe-cost benchmark)")
	flag.Parse()

	if *benchCalls > 0 {
		runtime.LockOSThread()
		start := time.Now()
		for i := 0; i < *benchCalls; i++ {
			ingest(i, 1)
		}
		fmt.Printf("%f\n", float64(time.Since(start).Nanoseconds())/float64(*benchCalls))
		return
	}

	if *benchSwitches > 0 {
		// Unbuffered channels: every pass parks one goroutine and readies the other.
		ping, pong := make(chan int), make(chan int)
		go func() {
			for v := range ping {
				pong <- v
			}
		}()
		start := time.Now()
		for i := 0; i < *benchSwitches; i++ {
			ping <- i
			<-pong
		}
		close(ping)
		fmt.Printf("%f\n", float64(time.Since(start).Nanoseconds())/float64(*benchSwitches))
		return
	}

	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		panic(err)
	}
	var readers sync.WaitGroup
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			readers.Add(1)
			go func() { defer readers.Done(); io.Copy(io.Discard, c) }()
		}
	}()
	var subs []*bufio.Writer
	var conns []net.Conn
	for i := 0; i < *nsubs; i++ {
		c, err := net.Dial("tcp", ln.Addr().String())
		if err != nil {
			panic(err)
		}
		conns = append(conns, c)
		subs = append(subs, bufio.NewWriterSize(c, 1<<16))
	}
	path := *out
	if path == "" {
		f, err := os.CreateTemp("", "relay-sim-*.log")
		if err != nil {
			panic(err)
		}
		path = f.Name()
		f.Close()
		defer os.Remove(path)
	}
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_TRUNC, 0o600)
	if err != nil {
		panic(err)
	}
	if *waitStdin {
		bufio.NewReader(os.Stdin).ReadString('\n')
	}

	done := make(chan struct{})
	go func() {
		if *lockThread {
			runtime.LockOSThread()
			defer runtime.UnlockOSThread()
		}
		for i := 0; i < *iterations; i++ {
			msg := ingest(i, *size)
			c := verify(msg, *depth)
			commit(f, c)
			fanout(subs, c)
		}
		close(done)
	}()
	<-done
	f.Close()
	for _, c := range conns {
		c.Close()
	}
	ln.Close()
	readers.Wait()

	flushes := t.CommitWrites + t.Fsyncs + t.FanoutFlush
	line := fmt.Sprintf(`{"pid":%d,"iterations":%d,"calls":{"ingest":%d,"verify":%d,"commit":%d,"fanout":%d},`+
		`"clone_bytes":%d,"commit_writes":%d,"fsyncs":%d,"fanout_flushes":%d,"flushes":%d,"sink":%d}`+"\n",
		os.Getpid(), *iterations, t.Calls["ingest"], t.Calls["verify"], t.Calls["commit"], t.Calls["fanout"],
		t.CloneBytes, t.CommitWrites, t.Fsyncs, t.FanoutFlush, flushes, sink)
	os.Stdout.WriteString(line)
}
