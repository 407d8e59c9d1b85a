// pyroscope-push: a Go program profiled by Pyroscope's own Go SDK (grafana/pyroscope-go), which
// pushes its CPU and heap profiles to -url every second, as it would to a Pyroscope server. Its
// HTTP client keeps a copy of every profile it sent and what the server answered; at the end it
// prints, as its truth, the sums of each sample type over the uploads the server accepted,
// parsed by Go's own pprof library (github.com/google/pprof/profile), and the sample types the
// server said it left out.
package main

import (
	"bytes"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"mime"
	"mime/multipart"
	"net/http"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/google/pprof/profile"
	"github.com/grafana/pyroscope-go"
)

// teeClient sends each upload and, where the server accepted it, adds its sample values.
type teeClient struct {
	mu       sync.Mutex
	inner    *http.Client
	sums     map[string]int64 // "type/unit" -> sum over accepted uploads
	accepted int
	ignored  map[string]bool // sample types the server said it did not store
	refused  []string
}

func (c *teeClient) Do(req *http.Request) (*http.Response, error) {
	body, err := io.ReadAll(req.Body)
	if err != nil {
		return nil, err
	}
	req.Body = io.NopCloser(bytes.NewReader(body))
	resp, err := c.inner.Do(req)
	if err != nil {
		return resp, err
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if resp.StatusCode != http.StatusOK {
		msg, _ := io.ReadAll(resp.Body)
		resp.Body = io.NopCloser(bytes.NewReader(msg))
		c.refused = append(c.refused, fmt.Sprintf("%d %s", resp.StatusCode, msg))
		return resp, nil
	}
	c.accepted++
	// The collector names the sample types it did not store.
	answer, _ := io.ReadAll(resp.Body)
	resp.Body = io.NopCloser(bytes.NewReader(answer))
	var said struct {
		Ignored []string `json:"ignored_sample_types"`
	}
	if json.Unmarshal(answer, &said) == nil {
		for _, t := range said.Ignored {
			c.ignored[t] = true
		}
	}
	_, params, err := mime.ParseMediaType(req.Header.Get("Content-Type"))
	if err != nil {
		return resp, nil
	}
	r := multipart.NewReader(bytes.NewReader(body), params["boundary"])
	for {
		part, err := r.NextPart()
		if err != nil {
			break
		}
		if part.FormName() != "profile" {
			continue
		}
		p, err := profile.Parse(part)
		if err != nil {
			c.refused = append(c.refused, "unparsable: "+err.Error())
			continue
		}
		for _, s := range p.Sample {
			for i, st := range p.SampleType {
				c.sums[st.Type+"/"+st.Unit] += s.Value[i]
			}
		}
	}
	return resp, nil
}

var sink [][]byte

//go:noinline
func burn(until time.Time) uint64 {
	x := uint64(1)
	for time.Now().Before(until) {
		for i := 0; i < 10000; i++ {
			x = x*6364136223846793005 + 1442695040888963407
		}
	}
	return x
}

//go:noinline
func churn(n int) {
	for i := 0; i < n; i++ {
		sink = append(sink, make([]byte, 4096))
		if len(sink) > 256 {
			sink = sink[:0]
		}
	}
}

func main() {
	url := flag.String("url", "", "where to push (the collector)")
	token := flag.String("token", "", "bearer token")
	service := flag.String("service", "pyroscope-push", "application name")
	seconds := flag.Int("seconds", 3, "how long to work")
	flag.Parse()
	client := &teeClient{inner: &http.Client{Timeout: 10 * time.Second}, sums: map[string]int64{}, ignored: map[string]bool{}}
	p, err := pyroscope.Start(pyroscope.Config{
		ApplicationName: *service,
		ServerAddress:   *url,
		Tags:            map[string]string{"version": "1.2.3", "region": "test"},
		HTTPHeaders:     map[string]string{"Authorization": "Bearer " + *token},
		HTTPClient:      client,
		UploadRate:      time.Second,
		ProfileTypes: []pyroscope.ProfileType{
			pyroscope.ProfileCPU, pyroscope.ProfileAllocObjects, pyroscope.ProfileAllocSpace,
			pyroscope.ProfileInuseObjects, pyroscope.ProfileInuseSpace,
		},
	})
	if err != nil {
		fmt.Fprintln(os.Stderr, "pyroscope.Start:", err)
		os.Exit(1)
	}
	end := time.Now().Add(time.Duration(*seconds) * time.Second)
	for time.Now().Before(end) {
		burn(time.Now().Add(50 * time.Millisecond))
		churn(1000)
	}
	if err := p.Stop(); err != nil {
		fmt.Fprintln(os.Stderr, "pyroscope Stop:", err)
	}
	client.mu.Lock()
	defer client.mu.Unlock()
	out, _ := json.Marshal(map[string]any{
		"accepted": client.accepted,
		"refused":  client.refused,
		"sums":     client.sums,
		"ignored":  client.ignored,
	})
	fmt.Println(strings.TrimSpace(string(out)))
}
