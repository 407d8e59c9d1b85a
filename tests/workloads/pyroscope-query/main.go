// pyroscope-query asks a server what Grafana's Pyroscope data source asks, with Pyroscope's own
// Go API client (github.com/grafana/pyroscope/api, its connect clients, protobuf on the wire):
// the profile types, the label names and the values of -label, the series of -selector, and
// the merged flame graph of -type under -selector. It prints one JSON line: what came back, the
// flame graph's total, and the sum of its nodes' self values decoded from its levels (they
// must come to the total).
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"net/http"
	"os"
	"time"

	"connectrpc.com/connect"
	querierv1 "github.com/grafana/pyroscope/api/gen/proto/go/querier/v1"
	"github.com/grafana/pyroscope/api/gen/proto/go/querier/v1/querierv1connect"
	typesv1 "github.com/grafana/pyroscope/api/gen/proto/go/types/v1"
)

func main() {
	url := flag.String("url", "", "the server")
	selector := flag.String("selector", "{}", "label selector")
	profileType := flag.String("type", "", "profile type ID")
	label := flag.String("label", "service_name", "a label whose values to list")
	flag.Parse()
	ctx := context.Background()
	c := querierv1connect.NewQuerierServiceClient(http.DefaultClient, *url)
	end := time.Now().Add(time.Minute).UnixMilli()
	start := end - int64(2*time.Hour/time.Millisecond)
	out := map[string]any{}
	fail := func(what string, err error) {
		fmt.Fprintf(os.Stderr, "%s: %v\n", what, err)
		os.Exit(1)
	}

	types, err := c.ProfileTypes(ctx, connect.NewRequest(&querierv1.ProfileTypesRequest{Start: start, End: end}))
	if err != nil {
		fail("ProfileTypes", err)
	}
	var ids []string
	for _, t := range types.Msg.ProfileTypes {
		ids = append(ids, t.ID)
	}
	out["profile_types"] = ids

	names, err := c.LabelNames(ctx, connect.NewRequest(&typesv1.LabelNamesRequest{Matchers: []string{*selector}, Start: start, End: end}))
	if err != nil {
		fail("LabelNames", err)
	}
	out["label_names"] = names.Msg.Names
	values, err := c.LabelValues(ctx, connect.NewRequest(&typesv1.LabelValuesRequest{Name: *label, Matchers: []string{*selector}, Start: start, End: end}))
	if err != nil {
		fail("LabelValues", err)
	}
	out["label_values"] = values.Msg.Names

	series, err := c.Series(ctx, connect.NewRequest(&querierv1.SeriesRequest{Matchers: []string{*selector}, Start: start, End: end}))
	if err != nil {
		fail("Series", err)
	}
	var sets []map[string]string
	for _, ls := range series.Msg.LabelsSet {
		m := map[string]string{}
		for _, l := range ls.Labels {
			m[l.Name] = l.Value
		}
		sets = append(sets, m)
	}
	out["series"] = sets

	maxNodes := int64(16384)
	merged, err := c.SelectMergeStacktraces(ctx, connect.NewRequest(&querierv1.SelectMergeStacktracesRequest{
		ProfileTypeID: *profileType, LabelSelector: *selector, Start: start, End: end, MaxNodes: &maxNodes,
	}))
	if err != nil {
		fail("SelectMergeStacktraces", err)
	}
	fg := merged.Msg.Flamegraph
	var self int64
	leaves := map[string]int64{}
	for _, level := range fg.Levels {
		for i := 0; i+3 < len(level.Values); i += 4 {
			self += level.Values[i+2]
			if level.Values[i+2] > 0 {
				leaves[fg.Names[level.Values[i+3]]] += level.Values[i+2]
			}
		}
	}
	out["total"] = fg.Total
	out["self_sum"] = self
	out["self_by_name"] = leaves
	out["levels"] = len(fg.Levels)
	line, _ := json.Marshal(out)
	fmt.Println(string(line))
}
