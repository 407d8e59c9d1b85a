// otlp-check reads an OTLP profiles protobuf (ProfilesData) with the OpenTelemetry Collector's
// own decoder (go.opentelemetry.io/collector/pdata/pprofile), which rejects malformed messages and
// dangling dictionary references, and prints what it holds as one JSON line: the profiles, their
// sample type, samples, the total of their values, the value by leaf function, and the threads
// named by the samples' attributes.
package main

import (
	"encoding/json"
	"fmt"
	"os"

	"go.opentelemetry.io/collector/pdata/pprofile"
)

type summary struct {
	Profiles   int              `json:"profiles"`
	SampleType string           `json:"sample_type"`
	Unit       string           `json:"unit"`
	Samples    int              `json:"samples"`
	Total      int64            `json:"total"`
	ByLeaf     map[string]int64 `json:"by_leaf"`
	Threads    map[string]int64 `json:"threads"`
	Mappings   []string         `json:"mappings"`
}

func main() {
	buf, err := os.ReadFile(os.Args[1])
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	var u pprofile.ProtoUnmarshaler
	pd, err := u.UnmarshalProfiles(buf)
	if err != nil {
		fmt.Fprintln(os.Stderr, "invalid OTLP profiles:", err)
		os.Exit(1)
	}
	dict := pd.Dictionary()
	strs := dict.StringTable()
	s := summary{ByLeaf: map[string]int64{}, Threads: map[string]int64{}}
	for i := 0; i < dict.MappingTable().Len(); i++ {
		s.Mappings = append(s.Mappings, strs.At(int(dict.MappingTable().At(i).FilenameStrindex())))
	}
	rps := pd.ResourceProfiles()
	for i := 0; i < rps.Len(); i++ {
		sps := rps.At(i).ScopeProfiles()
		for j := 0; j < sps.Len(); j++ {
			profiles := sps.At(j).Profiles()
			for k := 0; k < profiles.Len(); k++ {
				p := profiles.At(k)
				s.Profiles++
				s.SampleType = strs.At(int(p.SampleType().TypeStrindex()))
				s.Unit = strs.At(int(p.SampleType().UnitStrindex()))
				for n := 0; n < p.Samples().Len(); n++ {
					sample := p.Samples().At(n)
					s.Samples++
					var v int64
					for m := 0; m < sample.Values().Len(); m++ {
						v += sample.Values().At(m)
					}
					s.Total += v
					stack := dict.StackTable().At(int(sample.StackIndex()))
					if stack.LocationIndices().Len() > 0 {
						loc := dict.LocationTable().At(int(stack.LocationIndices().At(0)))
						fn := dict.FunctionTable().At(int(loc.Lines().At(0).FunctionIndex()))
						s.ByLeaf[strs.At(int(fn.NameStrindex()))] += v
					}
					attrs := sample.AttributeIndices()
					for m := 0; m < attrs.Len(); m++ {
						a := dict.AttributeTable().At(int(attrs.At(m)))
						if strs.At(int(a.KeyStrindex())) == "thread.name" {
							s.Threads[a.Value().AsString()] += v
						}
					}
				}
			}
		}
	}
	out, _ := json.Marshal(s)
	fmt.Println(string(out))
}
