package main

import (
	"math"
	"slices"
)

// Samples are the measurements of a run, the host's (Results) or the VM's
// (VMResults): the one place the report's statistics come from, a median
// and the range over rounds.
//
// Why not golang.org/x/perf/benchmath (benchstat's summaries): a full run
// has 5 rounds, a quick one 1, and below 6 samples benchmath gives no
// confidence interval at 95% (the report would show ±∞ everywhere); at a
// quick run's 1 it can compare nothing. The median with its min–max range,
// the targets' per-round ratios, and rounds that disagree by over 15%
// listed in "Noise" tell the reader more at the round counts the machine
// affords.
type Samples []Sample

// values returns every sample of (mode, test, metric), in round order.
func (ss Samples) values(mode, test, metric string) []float64 {
	var out []float64
	for _, s := range ss {
		if s.Mode == mode && s.Test == test && s.Metric == metric {
			out = append(out, s.Value)
		}
	}
	return out
}

// stat summarizes (mode, test, metric) over rounds.
func (ss Samples) stat(mode, test, metric string) stat {
	return summarize(ss.values(mode, test, metric))
}

// med is the median of a metric, NaN when not measured.
func (ss Samples) med(mode, test, metric string) float64 {
	st := ss.stat(mode, test, metric)
	if !st.ok() {
		return math.NaN()
	}
	return st.Median
}

// ratio of mode to base on a column: for lower-is-better columns (latency,
// CPU) the ratio is still mode/base, so below 1 is better there. NaN when
// either was not measured or base is 0.
func (ss Samples) ratio(mode, base string, c column) float64 {
	a, z := ss.med(mode, c.test, c.metric), ss.med(base, c.test, c.metric)
	if math.IsNaN(a) || math.IsNaN(z) || z == 0 {
		return math.NaN()
	}
	return a / z
}

// roundRatios are mode/base on a column round by round, over the rounds
// both measured (base non-zero): the same pairing as the run's
// interleaving, so their spread shows how far one round can be trusted.
func (ss Samples) roundRatios(mode, base string, c column) []float64 {
	byRound := map[int]float64{}
	for _, s := range ss {
		if s.Mode == base && s.Test == c.test && s.Metric == c.metric && s.Value != 0 {
			byRound[s.Round] = s.Value
		}
	}
	var out []float64
	for _, s := range ss {
		if z, ok := byRound[s.Round]; ok && s.Mode == mode && s.Test == c.test && s.Metric == c.metric {
			out = append(out, s.Value/z)
		}
	}
	return out
}

// ran are those of modes with at least one sample, in the order given.
func (ss Samples) ran(modes []string) []string {
	var out []string
	for _, m := range modes {
		if slices.ContainsFunc(ss, func(s Sample) bool { return s.Mode == m }) {
			out = append(out, m)
		}
	}
	return out
}
