// nats-driver: drives a real NATS server (nats-server, fetched from the Go module proxy) with
// NATS's own Go client: -publishers connections, each on its own goroutine, publish -msgs
// messages each to subject "phaseprof.bench", which -subscribers connections subscribe to; then
// every connection flushes (a PING/PONG round trip), so the server has processed every message
// before the driver prints what it sent and what its subscribers received, as one JSON line.
package main

import (
	"flag"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
)

func main() {
	url := flag.String("url", nats.DefaultURL, "server URL")
	publishers := flag.Int("publishers", 8, "publishing connections (one goroutine each)")
	subscribers := flag.Int("subscribers", 2, "subscribing connections")
	msgs := flag.Int("msgs", 2000, "messages per publisher")
	size := flag.Int("bytes", 128, "payload bytes")
	flag.Parse()

	var received atomic.Int64
	var subs []*nats.Conn
	for i := 0; i < *subscribers; i++ {
		nc, err := nats.Connect(*url)
		if err != nil {
			panic(err)
		}
		if _, err := nc.Subscribe("phaseprof.bench", func(*nats.Msg) { received.Add(1) }); err != nil {
			panic(err)
		}
		if err := nc.Flush(); err != nil {
			panic(err)
		}
		subs = append(subs, nc)
	}
	payload := make([]byte, *size)
	var wg sync.WaitGroup
	for p := 0; p < *publishers; p++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			nc, err := nats.Connect(*url)
			if err != nil {
				panic(err)
			}
			defer nc.Close()
			for i := 0; i < *msgs; i++ {
				if err := nc.Publish("phaseprof.bench", payload); err != nil {
					panic(err)
				}
			}
			if err := nc.Flush(); err != nil {
				panic(err)
			}
		}()
	}
	wg.Wait()
	want := int64(*publishers * *msgs * *subscribers)
	deadline := time.Now().Add(30 * time.Second)
	for received.Load() < want && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	for _, nc := range subs {
		nc.Close()
	}
	fmt.Printf("{\"published\":%d,\"received\":%d}\n", *publishers**msgs, received.Load())
}
