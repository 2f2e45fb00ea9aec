package chaos

import (
	"encoding/json"
	"fmt"
	"html/template"
	"io"
	"math"
	"strings"
	"time"
)

// WriteHTML writes the report as one self-contained HTML page (inline CSS
// and SVG, no script, no external asset).
func (r *Report) WriteHTML(w io.Writer) error {
	if err := reportTemplate.Execute(w, r); err != nil {
		return fmt.Errorf("chaos: render report.html: %w", err)
	}
	return nil
}

var reportTemplate = template.Must(template.New("report").Funcs(template.FuncMap{
	"throughput": throughputSVG,
	"latency":    latencySVG,
	"secs":       func(f float64) string { return fmt.Sprintf("%.1fs", f) },
	"ms": func(d time.Duration) string {
		return fmt.Sprintf("%.1f", float64(d)/float64(time.Millisecond))
	},
	"trunc": func(s string, n int) string {
		if len(s) <= n {
			return s
		}
		return s[:n] + "…"
	},
	"join":      strings.Join,
	"verdict":   func(ok bool) string { return map[bool]string{true: "PASS", false: "FAIL"}[ok] },
	"vclass":    func(ok bool) string { return map[bool]string{true: "pass", false: "fail"}[ok] },
	"faultbad":  faultBad,
	"rowjson":   rowJSON,
	"outcomes":  sortedOutcomes,
	"inc":       func(i int) int { return i + 1 },
	"drillView": func(name string, d *Drill) drillView { return drillView{Name: name, Drill: d} },
	"rto": func(v float64) string {
		if v < 0 {
			return "never"
		}
		return fmt.Sprintf("%.2fs", v)
	},
}).Parse(reportHTML + drillHTML))

// drillHTML renders one drill's figures (template "drill", given a
// drillView).
const drillHTML = `{{define "drill"}}<h3>Failover drill: <a href="#{{.Name}}">{{.Name}}</a> <span class="badge {{vclass .Drill.Passed}}">{{verdict .Drill.Passed}}</span></h3>
<p><code>{{.Drill.Fault}}</code> took <b>{{.Drill.Region}}</b> down at {{secs .Drill.FaultAt}}; failover: <b>{{.Drill.Failover}}</b>.{{if .Drill.EtcdElection}} etcd elected a leader before the move: the RTO bound allows for the election and the leases it extended.{{end}} {{.Drill.Redirected}} call(s) sent to the region after the fault were refused there and went on to a live region, as a client with several endpoints does.{{if .Drill.StoreLost}} <b>The region's store did not answer: what only it held is lost</b> (the RPO of region-local mode, counted below).{{end}}</p>
<table>
<tr><th>figure</th><th>value</th><th>bound</th><th>met</th></tr>
{{range .Drill.Figures}}<tr><td>{{.Name}}</td><td>{{if eq .Unit "s"}}{{rto .Value}}{{else}}{{.Value}}{{end}}</td><td>{{if eq .Unit "s"}}&le; {{printf "%.1f" .Bound}}s{{else}}{{.Bound}}{{end}}</td><td class="{{vclass .Met}}">{{if .Met}}yes{{else}}NO{{end}}</td></tr>
{{end}}</table>
<table>
<tr><th>affected tenant</th><th>RTO</th><th>served again by</th></tr>
{{range .Drill.Tenants}}<tr><td>{{.Tenant}}</td><td>{{rto .Seconds}}</td><td>{{.Node}}</td></tr>
{{end}}</table>{{end}}`

func faultBad(f FaultEvent) bool {
	return f.Skipped != "" || f.PreHealthError != "" || f.InjectError != "" || f.HealError != "" || f.PostHealthError != ""
}

func sortedOutcomes(m map[string]int) []struct {
	Name  string
	Count int
} {
	var out []struct {
		Name  string
		Count int
	}
	for _, k := range sortedKeys(m) {
		out = append(out, struct {
			Name  string
			Count int
		}{k, m[k]})
	}
	return out
}

func rowJSON(v any) string {
	b, err := json.Marshal(v)
	if err != nil {
		return fmt.Sprintf("%+v", v)
	}
	return string(b)
}

// Plot geometry.
const (
	plotW, plotH       = 960, 200
	plotLeft, plotRght = 48, 12
	plotTop, plotBot   = 14, 26
)

// niceMax rounds v up to 1, 2 or 5 times a power of ten.
func niceMax(v float64) float64 {
	if v <= 0 {
		return 1
	}
	p := math.Pow(10, math.Floor(math.Log10(v)))
	for _, m := range []float64{1, 2, 5, 10} {
		if v <= m*p {
			return m * p
		}
	}
	return 10 * p
}

type plot struct {
	b          strings.Builder
	tMax, yMax float64
}

func newPlot(title string, tMax, yMax float64, unit string) *plot {
	p := &plot{tMax: max(tMax, 1), yMax: niceMax(yMax)}
	fmt.Fprintf(&p.b, `<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 %d %d" width="100%%" role="img" aria-label="%s">`, plotW, plotH, template.HTMLEscapeString(title))
	fmt.Fprintf(&p.b, `<rect x="0" y="0" width="%d" height="%d" fill="#fff"/>`, plotW, plotH)
	// Grid and axes.
	for i := 0; i <= 4; i++ {
		v := p.yMax * float64(i) / 4
		y := p.y(v)
		fmt.Fprintf(&p.b, `<line x1="%d" y1="%.1f" x2="%d" y2="%.1f" stroke="#e5e7eb"/>`, plotLeft, y, plotW-plotRght, y)
		fmt.Fprintf(&p.b, `<text x="%d" y="%.1f" font-size="10" text-anchor="end" fill="#6b7280">%s</text>`, plotLeft-4, y+3, trimFloat(v))
	}
	step := niceMax(p.tMax / 10)
	for t := 0.0; t <= p.tMax+1e-9; t += step {
		x := p.x(t)
		fmt.Fprintf(&p.b, `<line x1="%.1f" y1="%d" x2="%.1f" y2="%d" stroke="#9ca3af"/>`, x, plotH-plotBot, x, plotH-plotBot+4)
		fmt.Fprintf(&p.b, `<text x="%.1f" y="%d" font-size="10" text-anchor="middle" fill="#6b7280">%ss</text>`, x, plotH-plotBot+15, trimFloat(t))
	}
	fmt.Fprintf(&p.b, `<text x="%d" y="10" font-size="10" fill="#374151">%s</text>`, plotLeft, template.HTMLEscapeString(title+" ("+unit+")"))
	return p
}

func trimFloat(v float64) string {
	s := fmt.Sprintf("%.1f", v)
	return strings.TrimSuffix(s, ".0")
}

func (p *plot) x(t float64) float64 {
	return plotLeft + t/p.tMax*float64(plotW-plotLeft-plotRght)
}

func (p *plot) y(v float64) float64 {
	return float64(plotH-plotBot) - math.Min(v, p.yMax)/p.yMax*float64(plotH-plotTop-plotBot)
}

// faults shades each fault's interval, labelled.
func (p *plot) faults(fs []FaultEvent) {
	for i, f := range fs {
		if f.Skipped != "" {
			continue
		}
		x0, x1 := p.x(f.At), p.x(math.Max(f.HealedAt, f.At+0.2))
		fmt.Fprintf(&p.b, `<rect x="%.1f" y="%d" width="%.1f" height="%d" fill="#fecaca" fill-opacity="0.55"><title>%s</title></rect>`,
			x0, plotTop, x1-x0, plotH-plotTop-plotBot, template.HTMLEscapeString(f.Name))
		if f.RecoveredAt > f.HealedAt {
			x2 := p.x(f.RecoveredAt)
			fmt.Fprintf(&p.b, `<rect x="%.1f" y="%d" width="%.1f" height="%d" fill="#fde68a" fill-opacity="0.45"/>`, x1, plotTop, x2-x1, plotH-plotTop-plotBot)
		}
		fmt.Fprintf(&p.b, `<text x="%.1f" y="%d" font-size="9" fill="#991b1b">%d</text>`, x0+2, plotTop+10, i+1)
	}
}

func (p *plot) String() template.HTML {
	fmt.Fprintf(&p.b, `<line x1="%d" y1="%d" x2="%d" y2="%d" stroke="#374151"/>`, plotLeft, plotH-plotBot, plotW-plotRght, plotH-plotBot)
	p.b.WriteString(`</svg>`)
	return template.HTML(p.b.String()) //nolint:gosec // built from numbers and escaped strings
}

// throughputSVG plots calls per second, stacked by class, over the faults.
func throughputSVG(s ScenarioReport) template.HTML {
	var yMax float64
	for _, b := range s.Series {
		yMax = math.Max(yMax, float64(b.Definite+b.Ambiguous+b.Other))
	}
	p := newPlot("calls per second: definite (green), ambiguous (orange), other (grey)", float64(len(s.Series)), yMax, "calls/s")
	p.faults(s.Faults)
	bw := (p.x(1) - p.x(0)) * 0.85
	for _, b := range s.Series {
		x := p.x(float64(b.T))
		y0 := float64(0)
		for _, part := range []struct {
			n     int
			color string
		}{{b.Definite, "#16a34a"}, {b.Ambiguous, "#f59e0b"}, {b.Other, "#9ca3af"}} {
			if part.n == 0 {
				continue
			}
			top, bot := p.y(y0+float64(part.n)), p.y(y0)
			fmt.Fprintf(&p.b, `<rect x="%.1f" y="%.1f" width="%.1f" height="%.1f" fill="%s"><title>t=%ds: %d</title></rect>`, x, top, bw, bot-top, part.color, b.T, part.n)
			y0 += float64(part.n)
		}
	}
	return p.String()
}

// latencySVG plots the p50 and p99 latency per second.
func latencySVG(s ScenarioReport) template.HTML {
	var yMax float64
	for _, b := range s.Series {
		yMax = math.Max(yMax, b.P99ms)
	}
	p := newPlot("latency per second: p50 (blue), p99 (purple)", float64(len(s.Series)), yMax, "ms")
	p.faults(s.Faults)
	for _, line := range []struct {
		get   func(Bucket) float64
		color string
	}{{func(b Bucket) float64 { return b.P50ms }, "#2563eb"}, {func(b Bucket) float64 { return b.P99ms }, "#7c3aed"}} {
		var pts []string
		for _, b := range s.Series {
			if b.Definite+b.Ambiguous+b.Other == 0 {
				continue
			}
			pts = append(pts, fmt.Sprintf("%.1f,%.1f", p.x(float64(b.T)+0.5), p.y(line.get(b))))
		}
		if len(pts) > 0 {
			fmt.Fprintf(&p.b, `<polyline points="%s" fill="none" stroke="%s" stroke-width="1.5"/>`, strings.Join(pts, " "), line.color)
		}
	}
	return p.String()
}

const reportHTML = `<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<title>idem chaos report: {{.Scenario}} (seed {{.Seed}}) {{verdict .Passed}}</title>
<style>
body{font:14px/1.45 system-ui,-apple-system,"Segoe UI",sans-serif;margin:24px auto;max-width:1100px;color:#111827;padding:0 16px}
h1{font-size:22px;margin:0 0 4px}h2{font-size:18px;margin:32px 0 6px;border-bottom:1px solid #e5e7eb;padding-bottom:4px}
h3{font-size:15px;margin:18px 0 6px}
.pass{color:#15803d;font-weight:600}.fail{color:#b91c1c;font-weight:600}.muted{color:#6b7280}
.badge{display:inline-block;padding:1px 8px;border-radius:10px;font-size:12px;font-weight:600}
.badge.pass{background:#dcfce7}.badge.fail{background:#fee2e2}.badge.skip{background:#f3f4f6;color:#6b7280}.badge.warn{background:#fef3c7;color:#92400e}
table{border-collapse:collapse;width:100%;margin:6px 0 10px;font-size:13px}
th,td{border-bottom:1px solid #e5e7eb;padding:4px 6px;text-align:left;vertical-align:top}
th{background:#f9fafb;font-weight:600}
code,pre{font:12px/1.4 ui-monospace,SFMono-Regular,Menlo,monospace}
pre{background:#f9fafb;padding:6px;white-space:pre-wrap;word-break:break-all;margin:2px 0}
details{margin:4px 0}summary{cursor:pointer}
.kv td:first-child{width:180px;color:#6b7280}
svg{border:1px solid #e5e7eb;border-radius:4px;margin:4px 0}
</style>
</head>
<body>
<h1>idem chaos report <span class="badge {{vclass .Passed}}">{{verdict .Passed}}</span></h1>
<table class="kv">
<tr><td>scenario</td><td><code>{{.Scenario}}</code></td></tr>
<tr><td>seed</td><td><code>{{.Seed}}</code></td></tr>
{{if .Env}}<tr><td>environment</td><td><code>{{.Env}}</code></td></tr>{{end}}
{{if .Break}}<tr><td>broken engine</td><td><code>--break {{.Break}}</code> (this run must fail)</td></tr>{{end}}
<tr><td>duration per scenario</td><td>{{.Duration}}, {{.Clients}} clients, minimum rate {{.MinRate}} calls/s before the first fault</td></tr>
<tr><td>started</td><td>{{.Started.Format "2006-01-02 15:04:05 MST"}}</td></tr>
{{if .Command}}<tr><td>reproduce</td><td><code>{{.Command}}</code></td></tr>{{end}}
</table>
<table>
<tr><th>scenario</th><th>verdict</th><th>calls</th><th>keys</th><th>faults</th><th>failed checks</th></tr>
{{range .Scenarios}}<tr><td><a href="#{{.Name}}">{{.Name}}</a></td><td class="{{vclass .Passed}}">{{verdict .Passed}}{{if not .Valid}} (invalid){{end}}</td><td>{{.Ops}}{{if .SidecarCalls}} + {{.SidecarCalls}} sidecar{{end}}</td><td>{{.Keys}}</td><td>{{len .Faults}}</td><td>{{join .Failed ", "}}{{if .Error}}error{{end}}</td></tr>
{{end}}</table>
{{range .Scenarios}}{{$s := .}}{{range .Drills}}{{template "drill" (drillView $s.Name .)}}{{end}}{{end}}
{{range .Scenarios}}{{$s := .}}
<h2 id="{{.Name}}">{{.Name}} <span class="badge {{vclass .Passed}}">{{verdict .Passed}}</span></h2>
<p>{{.Description}}</p>
{{if .Error}}<p class="fail">The scenario could not run: </p><pre>{{.Error}}</pre>{{end}}
{{if and (not .Valid) (not .Error)}}<p class="fail">INVALID: {{.Invalid}}</p>{{end}}
<table class="kv">
<tr><td>cluster</td><td>{{len .Regions}} regions ({{join .Regions ", "}}), {{.NodesPerRegion}} nodes each, {{.StoreMode}} store{{if .PgBouncer}} reached through PgBouncer (transaction pooling){{end}}, 3 etcd members, provider simulator, {{if .StoreLinksOnly}}the replicated store's links proxied{{else if .Direct}}no link proxied{{else}}every link proxied{{end}}</td></tr>
<tr><td>idemd flags</td><td><code>{{join .NodeArgs " "}}</code></td></tr>
<tr><td>traffic</td><td>{{.Ops}} calls on {{.Keys}} keys by {{.Clients}} clients{{if .SidecarCalls}}, and {{.SidecarCalls}} calls by as many sidecar clients,{{end}} over {{secs .TrafficSeconds}}; warm-up rate {{printf "%.1f" .WarmupRate}} calls/s (minimum {{.MinRate}})</td></tr>
<tr><td>answers</td><td>{{range outcomes .Outcomes}}<code>{{.Name}}</code>&nbsp;×{{.Count}} &nbsp; {{end}}</td></tr>
{{if .History}}<tr><td>artifacts</td><td><a href="{{.History}}">history.json</a> (every call) · <a href="{{.Logs}}">logs/</a>{{if .Elapsed}} · whole scenario {{.Elapsed}}{{end}}</td></tr>{{end}}
</table>
<h3>Fault timeline</h3>
{{if .Faults}}<table>
<tr><th>#</th><th>fault</th><th>injected</th><th>healed</th><th>healthy again</th><th>health and notes</th></tr>
{{range $i, $f := .Faults}}<tr><td>{{inc $i}}</td><td><code>{{$f.Name}}</code><br><span class="muted">held {{$f.Hold}}</span></td>
<td>{{if $f.Skipped}}—{{else}}{{secs $f.At}}{{end}}</td><td>{{if $f.Skipped}}—{{else}}{{secs $f.HealedAt}}{{end}}</td><td>{{if $f.Skipped}}—{{else}}{{secs $f.RecoveredAt}}{{end}}</td>
<td>{{if faultbad $f}}<span class="fail">{{if $f.Skipped}}skipped: {{$f.Skipped}}. {{end}}{{if $f.PreHealthError}}before: {{$f.PreHealthError}}. {{end}}{{if $f.InjectError}}inject: {{$f.InjectError}}. {{end}}{{if $f.HealError}}heal: {{$f.HealError}}. {{end}}{{if $f.PostHealthError}}after: {{$f.PostHealthError}}{{end}}</span>{{else}}<span class="pass">healthy before and after</span>{{end}}
{{range $f.Notes}}<br><span class="muted">{{.}}</span>{{end}}</td></tr>
{{end}}</table>{{else}}<p class="muted">No faults.</p>{{end}}
{{if .Series}}<h3>Throughput and latency</h3>
<p class="muted">Red bands: a fault is active (numbered as in the timeline); yellow: healed, waiting for the cluster's health.</p>
{{throughput .}}
{{latency .}}{{end}}
<h3>Checks</h3>
<table>
<tr><th>check</th><th>verdict</th><th>details</th></tr>
{{range .Checks}}<tr><td><code>{{.Name}}</code><br><span class="muted">{{.Description}}</span></td>
<td>{{if .Skipped}}<span class="badge skip">SKIP</span>{{else if and .Passed .Warnings}}<span class="badge warn">WARN</span>{{else}}<span class="badge {{vclass .Passed}}">{{verdict .Passed}}</span>{{end}}</td>
<td>{{.Details}}{{if .Visualization}}<br><a href="{{$s.Name}}/{{.Visualization}}">porcupine visualisation of the history</a>{{end}}
{{range .CounterExamples}}<details><summary>{{if .Warning}}<span class="badge warn">warning</span> {{end}}<code>{{.Key}}</code>: {{.Summary}}</summary>
{{if .Ops}}<table><tr><th>call</th><th>start → end (ms)</th><th>to</th><th>key, attempt</th><th>sent</th><th>answer</th></tr>
{{range .Ops}}<tr><td>{{.ID}}{{if .Sweep}} (sweep){{end}}{{if .Reused}} (reused){{end}}<br><span class="muted">client {{.Client}}/{{.Lane}}, {{.Role}}</span></td><td>{{ms .Start}} → {{ms .End}}</td><td>{{.Node}}</td><td><code>{{.Key}}</code> #{{.Attempt}}</td><td><pre>{{.Body}}</pre></td>
<td><b>{{if .Status}}{{.Status}}{{else}}no answer{{end}}</b>{{if .Replayed}} replayed{{end}} {{.ErrorCode}} <code>{{.RespHash}}</code><pre>{{trunc .RespBody 400}}{{.Err}}</pre></td></tr>
{{end}}</table>{{end}}
{{range .Rows}}<pre>{{rowjson .}}</pre>{{end}}
</details>{{end}}</td></tr>
{{end}}</table>
{{end}}
<p class="muted">Written by <code>idemctl chaos run</code>. The whole history of each scenario is in its history.json; the checks are described in docs/chaos.md.</p>
</body>
</html>
`

// drillView is a drill and its scenario's name, for the "drill" template.
type drillView struct {
	Name  string
	Drill *Drill
}
