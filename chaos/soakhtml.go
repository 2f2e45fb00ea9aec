package chaos

import (
	"fmt"
	"html/template"
	"io"
	"math"
	"sort"
	"strings"
)

// The soak's plots: one SVG line chart per quantity, over minutes of the
// run, faults shaded. soak.svg stacks the main ones into one image (for
// documentation); soak.html has them all.

const (
	soakPlotW, soakPlotH = 960, 180
	soakLeft, soakRight  = 56, 150 // the right margin holds the legend
	soakTop, soakBot     = 18, 24
)

var soakColors = []string{"#2563eb", "#dc2626", "#16a34a", "#7c3aed", "#ea580c", "#0891b2", "#db2777", "#65a30d", "#4b5563"}

// soakLine is one named series of a chart.
type soakLine struct {
	name string
	pts  []Point
}

// soakChart renders one chart at vertical offset y0 (inside a larger SVG).
func soakChart(b *strings.Builder, y0 int, title, unit string, tMax float64, lines []soakLine, faults []FaultEvent) {
	yMax := 0.0
	for _, l := range lines {
		for _, p := range l.pts {
			if !math.IsNaN(p.V) {
				yMax = math.Max(yMax, p.V)
			}
		}
	}
	yMax = niceMax(yMax * 1.05)
	tMax = math.Max(tMax, 1)
	w := float64(soakPlotW - soakLeft - soakRight)
	h := float64(soakPlotH - soakTop - soakBot)
	x := func(t float64) float64 { return soakLeft + t/tMax*w }
	y := func(v float64) float64 { return float64(y0) + soakTop + h - math.Min(v, yMax)/yMax*h }
	fmt.Fprintf(b, `<g font-family="sans-serif">`)
	fmt.Fprintf(b, `<text x="%d" y="%d" font-size="12" fill="#111827">%s (%s)</text>`, soakLeft, y0+13, template.HTMLEscapeString(title), template.HTMLEscapeString(unit))
	for _, f := range faults {
		if f.Skipped != "" {
			continue
		}
		x0, x1 := x(f.At), x(math.Max(f.RecoveredAt, f.At+1))
		fmt.Fprintf(b, `<rect x="%.1f" y="%.1f" width="%.1f" height="%.1f" fill="#fecaca" fill-opacity="0.6"><title>%s</title></rect>`,
			x0, float64(y0)+soakTop, math.Max(x1-x0, 1), h, template.HTMLEscapeString(f.Name))
	}
	for i := 0; i <= 4; i++ {
		v := yMax * float64(i) / 4
		fmt.Fprintf(b, `<line x1="%d" y1="%.1f" x2="%d" y2="%.1f" stroke="#e5e7eb"/>`, soakLeft, y(v), soakPlotW-soakRight, y(v))
		fmt.Fprintf(b, `<text x="%d" y="%.1f" font-size="10" text-anchor="end" fill="#6b7280">%s</text>`, soakLeft-4, y(v)+3, trimFloat(v))
	}
	minutes := tMax / 60
	step := niceMax(minutes / 10)
	for m := 0.0; m <= minutes+1e-9; m += step {
		fmt.Fprintf(b, `<text x="%.1f" y="%d" font-size="10" text-anchor="middle" fill="#6b7280">%s min</text>`, x(m*60), y0+soakPlotH-8, trimFloat(m))
	}
	fmt.Fprintf(b, `<line x1="%d" y1="%.1f" x2="%d" y2="%.1f" stroke="#374151"/>`, soakLeft, y(0), soakPlotW-soakRight, y(0))
	for i, l := range lines {
		color := soakColors[i%len(soakColors)]
		var pts []string
		for _, p := range l.pts {
			if math.IsNaN(p.V) {
				continue
			}
			pts = append(pts, fmt.Sprintf("%.1f,%.1f", x(p.T), y(p.V)))
		}
		if len(pts) > 0 {
			fmt.Fprintf(b, `<polyline points="%s" fill="none" stroke="%s" stroke-width="1.5"/>`, strings.Join(pts, " "), color)
		}
		ly := y0 + soakTop + 10 + 13*i
		fmt.Fprintf(b, `<rect x="%d" y="%d" width="10" height="3" fill="%s"/><text x="%d" y="%d" font-size="10" fill="#374151">%s</text>`,
			soakPlotW-soakRight+8, ly-4, color, soakPlotW-soakRight+22, ly, template.HTMLEscapeString(l.name))
	}
	b.WriteString(`</g>`)
}

// soakPanel is one chart of the report.
type soakPanel struct {
	title, unit string
	lines       []soakLine
}

func (r *SoakReport) nodeLines(get func(NodeSample) float64, scale float64) []soakLine {
	var out []soakLine
	for _, name := range r.nodeNames() {
		var pts []Point
		for _, s := range r.Samples {
			v := math.NaN()
			for _, n := range s.Nodes {
				if n.Name == name && n.StartTime != 0 {
					v = get(n) / scale
				}
			}
			pts = append(pts, Point{T: s.T, V: v})
		}
		out = append(out, soakLine{name: name, pts: pts})
	}
	return out
}

// tableLines returns the largest tables (table and indexes, summed over the
// regions) over time, MB.
func (r *SoakReport) tableLines(n int) []soakLine {
	if len(r.Samples) == 0 {
		return nil
	}
	size := func(s SoakSample) map[string]float64 {
		out := map[string]float64{}
		for _, st := range s.Stores {
			for _, t := range st.Tables {
				out[t.Name] += float64(t.TableBytes+t.IndexBytes) / (1 << 20)
			}
		}
		return out
	}
	last := size(r.Samples[len(r.Samples)-1])
	names := make([]string, 0, len(last))
	for k := range last {
		names = append(names, k)
	}
	sort.Slice(names, func(i, j int) bool { return last[names[i]] > last[names[j]] })
	if len(names) > n {
		names = names[:n]
	}
	out := make([]soakLine, len(names))
	for i, name := range names {
		out[i].name = name
		for _, s := range r.Samples {
			out[i].pts = append(out[i].pts, Point{T: s.T, V: size(s)[name]})
		}
	}
	return out
}

func (r *SoakReport) panels(all bool) []soakPanel {
	sum := func(get func(StoreSample) float64) func(SoakSample) float64 {
		return func(s SoakSample) float64 {
			var v float64
			for _, st := range s.Stores {
				v += get(st)
			}
			return v
		}
	}
	ps := []soakPanel{
		{"throughput", "calls/s", []soakLine{{"calls/s", r.series(func(s SoakSample) float64 { return s.Rate })}}},
		{"latency", "ms", []soakLine{
			{"p50", r.series(func(s SoakSample) float64 { return s.P50ms })},
			{"p99", r.series(func(s SoakSample) float64 { return s.P99ms })},
		}},
		{"node resident memory", "MB", r.nodeLines(func(n NodeSample) float64 { return n.RSSBytes }, 1<<20)},
		{"node goroutines", "count", r.nodeLines(func(n NodeSample) float64 { return n.Goroutines }, 1)},
		{"node open descriptors", "count", r.nodeLines(func(n NodeSample) float64 { return n.OpenFDs }, 1)},
		{"store: largest tables with their indexes, all regions", "MB", r.tableLines(6)},
		{"PostgreSQL data and the provider simulator", "MB", []soakLine{
			{"postgres data", r.series(func(s SoakSample) float64 {
				if s.Postgres == nil {
					return math.NaN()
				}
				return float64(s.Postgres.DataBytes) / (1 << 20)
			})},
			{"provider file", r.series(func(s SoakSample) float64 {
				if s.Provider == nil {
					return math.NaN()
				}
				return float64(s.Provider.DataBytes) / (1 << 20)
			})},
			{"provider rss", r.series(func(s SoakSample) float64 {
				if s.Provider == nil {
					return math.NaN()
				}
				return float64(s.Provider.RSSBytes) / (1 << 20)
			})},
		}},
	}
	ps = append(ps,
		soakPanel{"CPU per 1,000 answered calls", "CPU s", r.cpuLines()},
		soakPanel{"outbox backlog, all regions", "rows", []soakLine{
			{"outbox unpublished", r.series(sum(func(st StoreSample) float64 { return float64(st.OutboxBacklog) }))},
			{"queue pending", r.series(sum(func(st StoreSample) float64 { return float64(st.QueuePending) }))},
			{"emails unsent", r.series(sum(func(st StoreSample) float64 { return float64(st.EmailsUnsent) }))},
		}},
	)
	if !all {
		return ps
	}
	return append(ps,
		soakPanel{"store pool connections", "count", r.nodeLines(func(n NodeSample) float64 { return n.PoolTotal }, 1)},
		soakPanel{"node heap in use", "MB", r.nodeLines(func(n NodeSample) float64 { return n.HeapBytes }, 1<<20)},
		soakPanel{"idempotency records, all regions", "rows", []soakLine{
			{"records", r.series(sum(func(st StoreSample) float64 { return float64(st.Records) }))},
		}},
		soakPanel{"errors per interval", "calls", []soakLine{
			{"errors", r.series(func(s SoakSample) float64 { return float64(s.Errors) })},
			{"wrong", r.series(func(s SoakSample) float64 { return float64(s.Wrong) })},
		}},
	)
}

// cpuLines returns the CPU time per 1,000 answered calls of the nodes
// (together), PostgreSQL and the provider, per interval: the component
// whose cost per call grows is the one that slows the run down.
func (r *SoakReport) cpuLines() []soakLine {
	total := func(s SoakSample) (nodes, pg, prov float64, ok bool) {
		for _, n := range s.Nodes {
			if n.StartTime == 0 {
				return 0, 0, 0, false // a node's counter is missing or restarted
			}
			nodes += n.CPUSeconds
		}
		if s.Postgres != nil {
			pg = s.Postgres.CPUSeconds
		}
		if s.Provider != nil {
			prov = s.Provider.CPUSeconds
		}
		return nodes, pg, prov, true
	}
	lines := []soakLine{{name: "nodes"}, {name: "postgres"}, {name: "provider"}}
	for i := 1; i < len(r.Samples); i++ {
		a, b := r.Samples[i-1], r.Samples[i]
		answered := float64(b.Calls - b.Errors)
		n0, p0, v0, ok0 := total(a)
		n1, p1, v1, ok1 := total(b)
		nodes := math.NaN()
		if ok0 && ok1 && len(a.Nodes) == len(b.Nodes) && n1 >= n0 && answered > 0 {
			nodes = (n1 - n0) / answered * 1000
		}
		per := func(x0, x1 float64) float64 {
			if answered <= 0 || x1 < x0 || x0 == 0 {
				return math.NaN()
			}
			return (x1 - x0) / answered * 1000
		}
		lines[0].pts = append(lines[0].pts, Point{T: b.T, V: nodes})
		lines[1].pts = append(lines[1].pts, Point{T: b.T, V: per(p0, p1)})
		lines[2].pts = append(lines[2].pts, Point{T: b.T, V: per(v0, v1)})
	}
	return lines
}

func (r *SoakReport) tMax() float64 {
	t := r.TrafficSeconds
	if n := len(r.Samples); n > 0 {
		t = math.Max(t, r.Samples[n-1].T)
	}
	return t
}

// SVG returns the main charts stacked in one standalone SVG image.
func (r *SoakReport) SVG() string {
	ps := r.panels(false)
	var b strings.Builder
	h := soakPlotH*len(ps) + 24
	fmt.Fprintf(&b, `<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 %d %d" width="%d" height="%d">`, soakPlotW, h, soakPlotW, h)
	fmt.Fprintf(&b, `<rect width="%d" height="%d" fill="#fff"/>`, soakPlotW, h)
	verdict := "PASS"
	if !r.Passed {
		verdict = "FAIL"
	}
	fmt.Fprintf(&b, `<text x="%d" y="16" font-family="sans-serif" font-size="13" font-weight="bold">idemctl soak %s: %s, %d calls, faults shaded</text>`,
		soakLeft, verdict, template.HTMLEscapeString(r.Duration), r.Calls)
	for i, p := range ps {
		soakChart(&b, 24+i*soakPlotH, p.title, p.unit, r.tMax(), p.lines, r.Faults)
	}
	b.WriteString(`</svg>`)
	return b.String()
}

// WriteHTML writes a self-contained page: verdicts, counts, every chart,
// the faults.
func (r *SoakReport) WriteHTML(w io.Writer) error {
	var charts []template.HTML
	for _, p := range r.panels(true) {
		var b strings.Builder
		fmt.Fprintf(&b, `<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 %d %d" width="100%%">`, soakPlotW, soakPlotH)
		soakChart(&b, 0, p.title, p.unit, r.tMax(), p.lines, r.Faults)
		b.WriteString(`</svg>`)
		charts = append(charts, template.HTML(b.String())) //nolint:gosec // numbers and escaped strings
	}
	var counts []struct {
		Kind string
		SoakCounts
	}
	for _, k := range SoakKinds() {
		counts = append(counts, struct {
			Kind string
			SoakCounts
		}{k, r.Counts[k]})
	}
	t := template.Must(template.New("soak").Parse(soakHTML))
	var b strings.Builder
	if err := t.Execute(&b, map[string]any{"R": r, "Charts": charts, "Counts": counts}); err != nil {
		return fmt.Errorf("chaos: render soak.html: %w", err)
	}
	if _, err := io.WriteString(w, b.String()); err != nil {
		return fmt.Errorf("chaos: write soak.html: %w", err)
	}
	return nil
}

const soakHTML = `<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<title>idem soak: {{if .R.Passed}}PASS{{else}}FAIL{{end}}</title>
<style>
body{font:14px/1.45 system-ui,sans-serif;margin:24px auto;max-width:1100px;color:#111827;padding:0 16px}
h1{font-size:22px}h2{font-size:18px;margin-top:28px;border-bottom:1px solid #e5e7eb}
table{border-collapse:collapse}td,th{padding:3px 10px;border-bottom:1px solid #f3f4f6;text-align:left;vertical-align:top}
.pass{color:#15803d;font-weight:600}.fail{color:#b91c1c;font-weight:600}.muted{color:#6b7280}
</style>
</head>
<body>
<h1>idem soak: <span class="{{if .R.Passed}}pass">PASS{{else}}fail">FAIL{{end}}</span></h1>
<p class="muted">{{.R.Command}}<br>started {{.R.Started}}, {{.R.Duration}} of traffic ({{printf "%.0f" .R.TrafficSeconds}} s), samples every {{.R.Interval}},
faults every {{.R.FaultEvery}}, {{.R.Clients}} clients, seed {{.R.Seed}}, regions {{.R.Regions}} ({{.R.NodesPerRegion}} node each), {{.R.Cores}} cores; elapsed {{.R.Elapsed}}</p>
{{if .R.Error}}<p class="fail">error: {{.R.Error}}</p>{{end}}
<h2>Checks</h2>
<table>{{range .R.Checks}}<tr><td class="{{if .Passed}}pass">pass{{else}}fail">FAIL{{end}}</td><td>{{.Name}}</td><td>{{.Detail}}</td></tr>{{end}}</table>
<h2>Calls</h2>
<table><tr><th>kind</th><th>calls</th><th>as contracted</th><th>errors (faults)</th><th>wrong</th></tr>
{{range .Counts}}<tr><td>{{.Kind}}</td><td>{{.Calls}}</td><td>{{.OK}}</td><td>{{.Errors}}</td><td>{{.Wrong}}</td></tr>{{end}}</table>
<h2>Over time</h2>
{{range .Charts}}{{.}}{{end}}
<h2>Faults</h2>
<table><tr><th>#</th><th>fault</th><th>at</th><th>healed</th><th>healthy again</th><th>notes</th></tr>
{{range $i, $f := .R.Faults}}<tr><td>{{$i}}</td><td>{{$f.Name}}</td><td>{{printf "%.0f" $f.At}} s</td><td>{{printf "%.0f" $f.HealedAt}} s</td><td>{{printf "%.0f" $f.RecoveredAt}} s</td>
<td>{{$f.Skipped}} {{$f.InjectError}} {{$f.HealError}} {{$f.PostHealthError}} {{range $f.Notes}}{{.}} {{end}}</td></tr>{{end}}</table>
<p class="muted">Every sample, with each table's and index's size, dead rows and autovacuum count per region: soak.json.</p>
</body>
</html>
`
