// pyroscope-query asks a server what Grafana's Pyroscope data source asks, with Pyroscope's own
// Go API client (github.com/grafana/pyroscope/api, its connect clients, protobuf on the wire):
// the profile types, the label names and the values of -label, the series of -selector, the
// merged flame graph of -type under -selector, and the same merged as pprof. It prints one JSON
// line: what came back, the flame graph's total, and the sum of its nodes' self values decoded
// from its levels (they must come to the total), the pprof's sum of its first value. With
// -step, also the time series of -type under -selector (grouped by -group-by), each point as
// [ms, value]; with -right, the diff of -selector (left) against -right, each side's ticks and
// the sums of its selves.
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"net/http"
	"os"
	"strings"
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
	startFlag := flag.Int64("start", 0, "range start, ms (default: 2 hours ago)")
	endFlag := flag.Int64("end", 0, "range end, ms (default: in a minute)")
	step := flag.Float64("step", 0, "time series step, seconds (0: no time series)")
	groupBy := flag.String("group-by", "", "time series grouped by these labels (comma-separated)")
	right := flag.String("right", "", "a second selector to diff -selector against")
	flag.Parse()
	ctx := context.Background()
	c := querierv1connect.NewQuerierServiceClient(http.DefaultClient, *url)
	end := time.Now().Add(time.Minute).UnixMilli()
	start := end - int64(2*time.Hour/time.Millisecond)
	if *startFlag != 0 {
		start = *startFlag
	}
	if *endFlag != 0 {
		end = *endFlag
	}
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

	profile, err := c.SelectMergeProfile(ctx, connect.NewRequest(&querierv1.SelectMergeProfileRequest{
		ProfileTypeID: *profileType, LabelSelector: *selector, Start: start, End: end,
	}))
	if err != nil {
		fail("SelectMergeProfile", err)
	}
	var pprofTotal int64
	for _, s := range profile.Msg.Sample {
		pprofTotal += s.Value[0]
	}
	out["pprof_total"] = pprofTotal
	out["pprof_samples"] = len(profile.Msg.Sample)

	if *step > 0 {
		var groups []string
		if *groupBy != "" {
			groups = strings.Split(*groupBy, ",")
		}
		ts, err := c.SelectSeries(ctx, connect.NewRequest(&querierv1.SelectSeriesRequest{
			ProfileTypeID: *profileType, LabelSelector: *selector, Start: start, End: end,
			Step: *step, GroupBy: groups,
		}))
		if err != nil {
			fail("SelectSeries", err)
		}
		var all []map[string]any
		for _, s := range ts.Msg.Series {
			labels := map[string]string{}
			for _, l := range s.Labels {
				labels[l.Name] = l.Value
			}
			var points [][2]float64
			for _, p := range s.Points {
				points = append(points, [2]float64{float64(p.Timestamp), p.Value})
			}
			all = append(all, map[string]any{"labels": labels, "points": points})
		}
		out["time_series"] = all
	}

	if *right != "" {
		side := func(sel string) *querierv1.SelectMergeStacktracesRequest {
			return &querierv1.SelectMergeStacktracesRequest{ProfileTypeID: *profileType, LabelSelector: sel, Start: start, End: end}
		}
		d, err := c.Diff(ctx, connect.NewRequest(&querierv1.DiffRequest{Left: side(*selector), Right: side(*right)}))
		if err != nil {
			fail("Diff", err)
		}
		f := d.Msg.Flamegraph
		var left, rightSelf int64
		for _, level := range f.Levels {
			for i := 0; i+6 < len(level.Values); i += 7 {
				left += level.Values[i+2]
				rightSelf += level.Values[i+5]
			}
		}
		out["diff"] = map[string]int64{
			"left_ticks": f.LeftTicks, "right_ticks": f.RightTicks, "total": f.Total,
			"left_self_sum": left, "right_self_sum": rightSelf,
		}
	}
	line, _ := json.Marshal(out)
	fmt.Println(string(line))
}
