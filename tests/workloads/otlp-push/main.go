// otlp-push sends OTLP profiles as the OpenTelemetry Collector's exporters do: it builds them with
// the Collector's own data model and encoder (go.opentelemetry.io/collector/pdata/pprofile,
// pprofileotlp), gzips the export request and posts it to -url (`/v1development/profiles`).
// Two resources of service `otlp-push`: host node-a with CPU samples (samples/count, period 10 ms
// of CPU time), some in phase `replay` (attribute phaseprof.phase), and a goroutine profile;
// host node-b with allocations (alloc_space and alloc_objects). Its truth line: the HTTP status,
// and per host the totals its samples hold, summed back from the pdata it encoded.
package main

import (
	"bytes"
	"compress/gzip"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"math/rand"
	"net/http"
	"os"
	"time"

	"go.opentelemetry.io/collector/pdata/pcommon"
	"go.opentelemetry.io/collector/pdata/pprofile"
	"go.opentelemetry.io/collector/pdata/pprofile/pprofileotlp"
)

type builder struct {
	pd      pprofile.Profiles
	strings map[string]int32
}

func newBuilder() *builder {
	b := &builder{pd: pprofile.NewProfiles(), strings: map[string]int32{}}
	d := b.pd.Dictionary()
	// Index 0 of every table is the empty entry.
	b.str("")
	d.MappingTable().AppendEmpty()
	d.LocationTable().AppendEmpty()
	d.FunctionTable().AppendEmpty()
	d.LinkTable().AppendEmpty()
	d.AttributeTable().AppendEmpty()
	d.StackTable().AppendEmpty()
	m := d.MappingTable().AppendEmpty()
	m.SetFilenameStrindex(b.str("/usr/local/bin/otlp-push"))
	return b
}

func (b *builder) str(s string) int32 {
	if i, ok := b.strings[s]; ok {
		return i
	}
	t := b.pd.Dictionary().StringTable()
	t.Append(s)
	b.strings[s] = int32(t.Len() - 1)
	return b.strings[s]
}

// stack: leaf first.
func (b *builder) stack(functions ...string) int32 {
	d := b.pd.Dictionary()
	st := d.StackTable().AppendEmpty()
	for _, f := range functions {
		fn := d.FunctionTable().AppendEmpty()
		fn.SetNameStrindex(b.str(f))
		loc := d.LocationTable().AppendEmpty()
		loc.SetMappingIndex(1)
		loc.Lines().AppendEmpty().SetFunctionIndex(int32(d.FunctionTable().Len() - 1))
		st.LocationIndices().Append(int32(d.LocationTable().Len() - 1))
	}
	return int32(d.StackTable().Len() - 1)
}

func (b *builder) phase(name string) int32 {
	d := b.pd.Dictionary()
	a := d.AttributeTable().AppendEmpty()
	a.SetKeyStrindex(b.str("phaseprof.phase"))
	a.Value().SetStr(name)
	return int32(d.AttributeTable().Len() - 1)
}

func (b *builder) resource(host string) pprofile.ScopeProfiles {
	rp := b.pd.ResourceProfiles().AppendEmpty()
	rp.Resource().Attributes().PutStr("service.name", "otlp-push")
	rp.Resource().Attributes().PutStr("service.version", "2.0")
	rp.Resource().Attributes().PutStr("host.name", host)
	sp := rp.ScopeProfiles().AppendEmpty()
	sp.Scope().SetName("otlp-push")
	return sp
}

func (b *builder) profile(sp pprofile.ScopeProfiles, typ, unit string, period int64) pprofile.Profile {
	p := sp.Profiles().AppendEmpty()
	p.SampleType().SetTypeStrindex(b.str(typ))
	p.SampleType().SetUnitStrindex(b.str(unit))
	if period > 0 {
		p.PeriodType().SetTypeStrindex(b.str("cpu"))
		p.PeriodType().SetUnitStrindex(b.str("nanoseconds"))
		p.SetPeriod(period)
	}
	now := time.Now()
	p.SetTime(pcommon.NewTimestampFromTime(now.Add(-10 * time.Second)))
	p.SetDurationNano(uint64(10 * time.Second))
	return p
}

func sample(p pprofile.Profile, stack int32, v int64, attrs ...int32) {
	s := p.Samples().AppendEmpty()
	s.SetStackIndex(stack)
	s.Values().Append(v)
	for _, a := range attrs {
		s.AttributeIndices().Append(a)
	}
}

func main() {
	url := flag.String("url", "", "the collector")
	token := flag.String("token", "", "bearer token")
	flag.Parse()
	r := rand.New(rand.NewSource(time.Now().UnixNano()))
	b := newBuilder()

	a := b.resource("node-a")
	cpu := b.profile(a, "samples", "count", 10_000_000)
	work, idle := b.stack("main.work", "main.main"), b.stack("main.idle", "main.main")
	replay := b.phase("replay")
	sample(cpu, work, 500+r.Int63n(500), replay)
	sample(cpu, idle, 100+r.Int63n(300))
	sample(cpu, work, 50+r.Int63n(50))
	goroutines := b.profile(a, "goroutine", "count", 0)
	sample(goroutines, idle, 7)

	n := b.resource("node-b")
	space := b.profile(n, "alloc_space", "bytes", 0)
	objects := b.profile(n, "alloc_objects", "count", 0)
	grow := b.stack("main.grow", "main.work", "main.main")
	sample(space, grow, 4096*(100+r.Int63n(100)))
	sample(objects, grow, 100+r.Int63n(100))

	// The truth: what the samples hold, per host, summed back from the pdata built.
	truth := map[string]map[string]int64{}
	rps := b.pd.ResourceProfiles()
	for i := 0; i < rps.Len(); i++ {
		host, _ := rps.At(i).Resource().Attributes().Get("host.name")
		sums := map[string]int64{}
		truth[host.Str()] = sums
		sps := rps.At(i).ScopeProfiles()
		for j := 0; j < sps.Len(); j++ {
			ps := sps.At(j).Profiles()
			for k := 0; k < ps.Len(); k++ {
				p := ps.At(k)
				strs := b.pd.Dictionary().StringTable()
				key := strs.At(int(p.SampleType().TypeStrindex())) + "/" + strs.At(int(p.SampleType().UnitStrindex()))
				for m := 0; m < p.Samples().Len(); m++ {
					s := p.Samples().At(m)
					for v := 0; v < s.Values().Len(); v++ {
						sums[key] += s.Values().At(v)
						if s.AttributeIndices().Len() > 0 {
							sums[key+" in replay"] += s.Values().At(v)
						}
					}
				}
			}
		}
	}

	body, err := pprofileotlp.NewExportRequestFromProfiles(b.pd).MarshalProto()
	if err != nil {
		fmt.Fprintln(os.Stderr, "marshal:", err)
		os.Exit(1)
	}
	var gz bytes.Buffer
	w := gzip.NewWriter(&gz)
	w.Write(body)
	w.Close()
	req, _ := http.NewRequest(http.MethodPost, *url+"/v1development/profiles", &gz)
	req.Header.Set("Content-Type", "application/x-protobuf")
	req.Header.Set("Content-Encoding", "gzip")
	req.Header.Set("Authorization", "Bearer "+*token)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		fmt.Fprintln(os.Stderr, "post:", err)
		os.Exit(1)
	}
	answer, _ := io.ReadAll(resp.Body)
	partial := pprofileotlp.NewExportResponse()
	_ = partial.UnmarshalProto(answer)
	out, _ := json.Marshal(map[string]any{
		"status":          resp.StatusCode,
		"answer":          string(answer),
		"rejected":        partial.PartialSuccess().RejectedProfiles(),
		"partial_message": partial.PartialSuccess().ErrorMessage(),
		"totals":          truth,
	})
	fmt.Println(string(out))
}
