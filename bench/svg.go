package main

import (
	"fmt"
	"math"
	"strings"
)

// barChart is a grouped bar chart written as a standalone SVG: groups along
// the x axis, one bar per series in each group, optional min–max whiskers,
// linear or log y axis, value labels on the bars.
//
// Written by hand rather than with a plotting library: results.md shows
// these files inline, and GitHub renders a static SVG but runs no
// JavaScript (go-echarts writes HTML+JS); gonum/plot would bring ten
// modules (gonum, x/image, fonts, LaTeX, PDF, rasterizer) into the main
// module's graph and still need its own ticker, whiskers and labels to
// draw what this does in one file of plain, diffable SVG.
type barChart struct {
	Title, Subtitle string
	YLabel          string
	Groups          []string
	GroupNotes      []string // a second line under each group label; optional
	Series          []barSeries
	Log             bool
	Format          func(float64) string // value labels; nil: fmtNum
}

type barSeries struct {
	Name   string
	Color  string
	Colors []string  // per group, overriding Color (one-series charts colored by mode)
	Values []float64 // per group; NaN: no bar
	Lo, Hi []float64 // whisker ends per group; nil or NaN: none
}

const (
	chartW, chartH = 760, 400
	marginL        = 74
	marginR        = 18
	marginT        = 78
	marginB        = 58
)

var svgEscaper = strings.NewReplacer("&", "&amp;", "<", "&lt;", ">", "&gt;", `"`, "&quot;")

func esc(s string) string { return svgEscaper.Replace(s) }

// SVG renders the chart.
func (c barChart) SVG() string {
	format := c.Format
	if format == nil {
		format = fmtNum
	}
	var b strings.Builder
	fmt.Fprintf(&b, `<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" viewBox="0 0 %d %d" font-family="Helvetica, Arial, sans-serif">`+"\n", chartW, chartH, chartW, chartH)
	fmt.Fprintf(&b, `<rect width="%d" height="%d" fill="#ffffff"/>`+"\n", chartW, chartH)
	fmt.Fprintf(&b, `<text x="%d" y="24" font-size="16" font-weight="bold" fill="#222">%s</text>`+"\n", marginL, esc(c.Title))
	if c.Subtitle != "" {
		fmt.Fprintf(&b, `<text x="%d" y="42" font-size="11" fill="#666">%s</text>`+"\n", marginL, esc(c.Subtitle))
	}

	// Legend, one row under the title (only when series have names that
	// the group labels do not already give).
	x := float64(marginL)
	if len(c.Series) > 1 || c.Series[0].Colors == nil {
		for _, s := range c.Series {
			fmt.Fprintf(&b, `<rect x="%.1f" y="52" width="11" height="11" rx="2" fill="%s"/>`, x, s.Color)
			fmt.Fprintf(&b, `<text x="%.1f" y="62" font-size="11" fill="#333">%s</text>`+"\n", x+15, esc(s.Name))
			x += 15 + float64(len(s.Name))*6.2 + 16
		}
	}

	// The y scale.
	lo, hi := math.Inf(1), math.Inf(-1)
	for _, s := range c.Series {
		for i, v := range s.Values {
			for _, w := range []float64{v, at(s.Hi, i)} {
				if !math.IsNaN(w) && !(c.Log && w <= 0) {
					lo, hi = math.Min(lo, w), math.Max(hi, w)
				}
			}
		}
	}
	plotW := float64(chartW - marginL - marginR)
	plotH := float64(chartH - marginT - marginB)
	y0 := float64(chartH - marginB)
	var ticks []float64
	var scale func(float64) float64
	if math.IsInf(hi, -1) { // nothing to draw
		fmt.Fprintf(&b, `<text x="%d" y="%d" font-size="13" fill="#888">no data</text>`+"\n", chartW/2-30, chartH/2)
		b.WriteString("</svg>\n")
		return b.String()
	}
	if c.Log {
		dlo, dhi := math.Floor(math.Log10(lo)), math.Ceil(math.Log10(hi))
		if dhi <= dlo {
			dhi = dlo + 1
		}
		for d := dlo; d <= dhi; d++ {
			ticks = append(ticks, math.Pow(10, d))
		}
		scale = func(v float64) float64 { return y0 - (math.Log10(v)-dlo)/(dhi-dlo)*plotH }
	} else {
		step := niceStep(hi / 5)
		top := math.Ceil(hi*1.08/step) * step
		for t := 0.0; t <= top+step/2; t += step {
			ticks = append(ticks, t)
		}
		scale = func(v float64) float64 { return y0 - v/top*plotH }
	}
	for _, t := range ticks {
		y := scale(t)
		fmt.Fprintf(&b, `<line x1="%d" x2="%d" y1="%.1f" y2="%.1f" stroke="#e5e5e5"/>`, marginL, chartW-marginR, y, y)
		fmt.Fprintf(&b, `<text x="%d" y="%.1f" font-size="10" fill="#666" text-anchor="end">%s</text>`+"\n", marginL-6, y+3.5, esc(fmtNum(t)))
	}
	fmt.Fprintf(&b, `<line x1="%d" x2="%d" y1="%.1f" y2="%.1f" stroke="#999"/>`+"\n", marginL, chartW-marginR, y0, y0)
	fmt.Fprintf(&b, `<text transform="translate(16,%.1f) rotate(-90)" font-size="11" fill="#444" text-anchor="middle">%s</text>`+"\n", float64(marginT)+plotH/2, esc(c.YLabel))

	// Bars.
	gw := plotW / float64(len(c.Groups))
	bw := math.Min(gw*0.78/float64(len(c.Series)), 90)
	inner := bw * float64(len(c.Series))
	for g, name := range c.Groups {
		gx := float64(marginL) + gw*float64(g) + (gw-inner)/2
		for si, s := range c.Series {
			v := at(s.Values, g)
			bx := gx + bw*float64(si)
			if !math.IsNaN(v) && !(c.Log && v <= 0) {
				color := s.Color
				if g < len(s.Colors) {
					color = s.Colors[g]
				}
				top := scale(v)
				fmt.Fprintf(&b, `<rect x="%.1f" y="%.1f" width="%.1f" height="%.1f" fill="%s"><title>%s: %s</title></rect>`+"\n",
					bx+1, top, bw-2, y0-top, color, esc(s.Name+" · "+name), esc(format(v)))
				wl, wh := at(s.Lo, g), at(s.Hi, g)
				if !math.IsNaN(wl) && !math.IsNaN(wh) && wh > wl && !(c.Log && wl <= 0) {
					cx := bx + bw/2
					fmt.Fprintf(&b, `<path d="M%.1f %.1fV%.1fM%.1f %.1fH%.1fM%.1f %.1fH%.1f" stroke="#333" stroke-width="1" fill="none"/>`+"\n",
						cx, scale(wl), scale(wh), cx-3, scale(wl), cx+3, cx-3, scale(wh), cx+3)
				}
				ly := top - 4
				if !math.IsNaN(wh) && wh > v {
					ly = scale(wh) - 4
				}
				fs := 10.0
				if bw < 30 {
					fs = 8.5
				}
				fmt.Fprintf(&b, `<text x="%.1f" y="%.1f" font-size="%.1f" fill="#222" text-anchor="middle">%s</text>`+"\n", bx+bw/2, ly, fs, esc(format(v)))
			} else {
				fmt.Fprintf(&b, `<text x="%.1f" y="%.1f" font-size="9" fill="#aaa" text-anchor="middle">–</text>`+"\n", bx+bw/2, y0-4)
			}
		}
		cx := float64(marginL) + gw*(float64(g)+0.5)
		fmt.Fprintf(&b, `<text x="%.1f" y="%.1f" font-size="11" fill="#222" text-anchor="middle">%s</text>`+"\n", cx, y0+17, esc(name))
		if g < len(c.GroupNotes) && c.GroupNotes[g] != "" {
			fmt.Fprintf(&b, `<text x="%.1f" y="%.1f" font-size="10" fill="#666" text-anchor="middle">%s</text>`+"\n", cx, y0+32, esc(c.GroupNotes[g]))
		}
	}
	b.WriteString("</svg>\n")
	return b.String()
}

func at(v []float64, i int) float64 {
	if i < len(v) {
		return v[i]
	}
	return math.NaN()
}

// niceStep rounds a raw tick step up to 1, 2 or 5 times a power of ten.
func niceStep(raw float64) float64 {
	if raw <= 0 {
		return 1
	}
	p := math.Pow(10, math.Floor(math.Log10(raw)))
	for _, m := range []float64{1, 2, 5, 10} {
		if raw <= m*p {
			return m * p
		}
	}
	return 10 * p
}

// fmtNum prints a value compactly: 55.2k, 1.8M, 23.4, 0.31, 0.0042.
func fmtNum(v float64) string {
	a := math.Abs(v)
	switch {
	case math.IsNaN(v):
		return "–"
	case a >= 1e6:
		return trimZero(fmt.Sprintf("%.2fM", v/1e6))
	case a >= 1e4:
		return trimZero(fmt.Sprintf("%.1fk", v/1e3))
	case a >= 1e3:
		return trimZero(fmt.Sprintf("%.2fk", v/1e3))
	case a >= 100:
		return fmt.Sprintf("%.0f", v)
	case a >= 10:
		return trimZero(fmt.Sprintf("%.1f", v))
	case a >= 1:
		return trimZero(fmt.Sprintf("%.2f", v))
	case a == 0:
		return "0"
	case a >= 0.01:
		return trimZero(fmt.Sprintf("%.3f", v))
	}
	return fmt.Sprintf("%.2g", v)
}

// trimZero drops trailing zeros after a decimal point ("2.50k" → "2.5k").
func trimZero(s string) string {
	suffix := ""
	if n := len(s); n > 0 && (s[n-1] == 'k' || s[n-1] == 'M') {
		s, suffix = s[:n-1], s[n-1:]
	}
	if strings.Contains(s, ".") {
		s = strings.TrimRight(strings.TrimRight(s, "0"), ".")
	}
	return s + suffix
}

// modeColors keeps each mode's color the same in every chart.
var modeColors = map[string]string{
	"direct":                   "#8c8c8c",
	"svcproxy-userspace":       "#1f77b4",
	"svcproxy-userspace-ipset": "#aec7e8",
	"svcproxy-vip":             "#17becf",
	"svcproxy-local":           "#9edae5",
	"svcproxy-sockmap":         "#bcbd22",
	"kube-dnat":                "#2ca02c",
	"svcproxy-iptables":        "#9467bd",
	"svcproxy-nftables":        "#e377c2",
	"svcproxy-ipvs":            "#8c564b",
	"haproxy":                  "#ff7f0e",
	"nginx-stream":             "#d62728",
}

func modeColor(m string) string {
	if c, ok := modeColors[m]; ok {
		return c
	}
	return "#17becf"
}
