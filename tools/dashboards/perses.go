package main

import (
	"encoding/json"
	"fmt"
)

// The Perses dashboard format (Perses API v1, kind Dashboard; the spec is
// also the spec of the Perses operator's PersesDashboard resource). These
// are the few spec structs the generator needs, written here because the
// Perses Go module (github.com/perses/perses) is not served by the Go
// module proxy this project builds from; the tests check the output
// field by field.

type persesDashboard struct {
	Kind     string         `json:"kind"` // Dashboard
	Metadata persesMetadata `json:"metadata"`
	Spec     persesSpec     `json:"spec"`
}

type persesMetadata struct {
	Name    string `json:"name"`
	Project string `json:"project"`
}

type persesSpec struct {
	Display         persesDisplay          `json:"display"`
	Duration        string                 `json:"duration"`
	RefreshInterval string                 `json:"refreshInterval"`
	Variables       []persesVariable       `json:"variables"`
	Panels          map[string]persesPanel `json:"panels"`
	Layouts         []persesLayout         `json:"layouts"`
}

type persesDisplay struct {
	Name        string `json:"name"`
	Description string `json:"description,omitempty"`
	Hidden      bool   `json:"hidden,omitempty"`
}

// persesPlugin is a plugin reference: what draws a panel, runs a query or
// lists a variable's values, with the plugin's own spec.
type persesPlugin struct {
	Kind string `json:"kind"`
	Spec any    `json:"spec"`
}

type persesVariable struct {
	Kind string `json:"kind"` // TextVariable, ListVariable
	Spec any    `json:"spec"`
}

type persesTextVariable struct {
	Name     string        `json:"name"`
	Display  persesDisplay `json:"display"`
	Value    string        `json:"value"`
	Constant bool          `json:"constant"`
}

type persesListVariable struct {
	Name           string        `json:"name"`
	Display        persesDisplay `json:"display"`
	DefaultValue   string        `json:"defaultValue"`
	AllowAllValue  bool          `json:"allowAllValue"`
	AllowMultiple  bool          `json:"allowMultiple"`
	CustomAllValue string        `json:"customAllValue"`
	Sort           string        `json:"sort"`
	Plugin         persesPlugin  `json:"plugin"`
}

type persesPanel struct {
	Kind string          `json:"kind"` // Panel
	Spec persesPanelSpec `json:"spec"`
}

type persesPanelSpec struct {
	Display persesDisplay `json:"display"`
	Plugin  persesPlugin  `json:"plugin"`
	Queries []persesQuery `json:"queries"`
}

type persesQuery struct {
	Kind string `json:"kind"` // TimeSeriesQuery
	Spec struct {
		Plugin persesPlugin `json:"plugin"`
	} `json:"spec"`
}

type persesPromQuery struct {
	Query            string `json:"query"`
	SeriesNameFormat string `json:"seriesNameFormat,omitempty"`
}

type persesLayout struct {
	Kind string `json:"kind"` // Grid
	Spec struct {
		Display struct {
			Title    string `json:"title"`
			Collapse struct {
				Open bool `json:"open"`
			} `json:"collapse"`
		} `json:"display"`
		Items []persesGridItem `json:"items"`
	} `json:"spec"`
}

type persesGridItem struct {
	X       int               `json:"x"`
	Y       int               `json:"y"`
	Width   int               `json:"width"`
	Height  int               `json:"height"`
	Content map[string]string `json:"content"` // {"$ref": "#/spec/panels/<key>"}
}

// Plugin specs (the Perses core plugins' schemas).

type persesFormat struct {
	Unit          string `json:"unit"`
	DecimalPlaces *int   `json:"decimalPlaces,omitempty"`
}

type persesThresholds struct {
	DefaultColor string                `json:"defaultColor"`
	Steps        []persesThresholdStep `json:"steps,omitempty"`
}

type persesThresholdStep struct {
	Value float64 `json:"value"`
	Color string  `json:"color"`
}

type persesStatChart struct {
	Calculation string           `json:"calculation"`
	Format      persesFormat     `json:"format"`
	Thresholds  persesThresholds `json:"thresholds"`
	Sparkline   struct{}         `json:"sparkline"`
}

type persesTimeSeriesChart struct {
	Legend struct {
		Position string `json:"position"`
		Mode     string `json:"mode"`
	} `json:"legend"`
	YAxis struct {
		Format persesFormat `json:"format"`
		Min    float64      `json:"min"`
	} `json:"yAxis"`
	Visual struct {
		Display     string  `json:"display"`
		LineWidth   float64 `json:"lineWidth"`
		AreaOpacity float64 `json:"areaOpacity"`
		Stack       string  `json:"stack,omitempty"`
	} `json:"visual"`
}

type persesTable struct {
	ColumnSettings []persesColumn `json:"columnSettings"`
}

type persesColumn struct {
	Name string `json:"name"`
	Hide bool   `json:"hide"`
}

// persesUnits maps the Grafana unit IDs of model.go to Perses format units.
var persesUnits = map[Unit]string{
	Short: "decimal", PercentUnit: "percent-decimal", ReqPerSec: "requests/sec", OpsPerSec: "ops/sec", EventsPerSec: "events/sec", Seconds: "seconds",
}

// persesColors are Grafana's named colors, which Perses takes as CSS
// colors.
var persesColors = map[string]string{"green": "#73BF69", "orange": "#FF9830", "red": "#F2495C"}

// persesProject is the Perses project of the dashboard files; the chart's
// PersesDashboard resources take their namespace's.
const persesProject = "cpuslot"

// panelKey names a panel in the Perses spec: its Grafana panel id, so both
// formats name a panel alike.
func panelKey(id int) string { return fmt.Sprintf("panel_%d", id) }

func persesDashboardOf(d Dashboard) (persesDashboard, error) {
	pd := persesDashboard{Kind: "Dashboard", Metadata: persesMetadata{Name: d.UID, Project: persesProject}}
	s := &pd.Spec
	s.Display = persesDisplay{Name: d.Title, Description: d.Description}
	s.Duration, s.RefreshInterval = "1h", "30s"
	s.Variables = append(s.Variables, persesVariable{Kind: "TextVariable", Spec: persesTextVariable{
		Name: d.Job.Name, Display: persesDisplay{Name: d.Job.Name, Hidden: true}, Value: d.Job.Default, Constant: true}})
	for _, v := range d.Vars {
		s.Variables = append(s.Variables, persesVariable{Kind: "ListVariable", Spec: persesListVariable{
			Name: v.Name, Display: persesDisplay{Name: v.Label}, DefaultValue: "$__all",
			AllowAllValue: true, AllowMultiple: true, CustomAllValue: ".*", Sort: "alphabetical-asc",
			Plugin: persesPlugin{Kind: "PrometheusLabelValuesVariable", Spec: map[string]any{
				"labelName": v.LabelName, "matchers": []string{v.Selector}}},
		}})
	}
	s.Panels = map[string]persesPanel{}
	id := 0 // the same numbering as grafanaDashboard: rows and panels
	for _, row := range d.Rows {
		id++
		var l persesLayout
		l.Kind = "Grid"
		l.Spec.Display.Title = row.Title
		l.Spec.Display.Collapse.Open = true
		x, y, rowHeight := 0, 0, 0
		for _, p := range row.Panels {
			id++
			pp, err := persesPanelOf(p)
			if err != nil {
				return pd, fmt.Errorf("%s: panel %q: %w", d.UID, p.Title, err)
			}
			key := panelKey(id)
			s.Panels[key] = pp
			h := p.Kind.height()
			l.Spec.Items = append(l.Spec.Items, persesGridItem{X: x, Y: y, Width: p.Width, Height: h,
				Content: map[string]string{"$ref": "#/spec/panels/" + key}})
			// Left to right, wrapping at 24 columns, as Grafana's grid.
			x, rowHeight = x+p.Width, max(rowHeight, h)
			if x >= 24 {
				x, y, rowHeight = 0, y+rowHeight, 0
			}
		}
		s.Layouts = append(s.Layouts, l)
	}
	return pd, nil
}

func persesPanelOf(p Panel) (persesPanel, error) {
	pp := persesPanel{Kind: "Panel"}
	pp.Spec.Display = persesDisplay{Name: p.Title, Description: p.Description}
	for _, q := range p.Queries {
		var pq persesQuery
		pq.Kind = "TimeSeriesQuery"
		pq.Spec.Plugin = persesPlugin{Kind: "PrometheusTimeSeriesQuery", Spec: persesPromQuery{Query: q.Expr, SeriesNameFormat: q.Legend}}
		pp.Spec.Queries = append(pp.Spec.Queries, pq)
	}
	unit, ok := persesUnits[p.Unit]
	if !ok && p.Kind != Table {
		return pp, fmt.Errorf("unit %q has no Perses unit", p.Unit)
	}
	format := persesFormat{Unit: unit, DecimalPlaces: p.Decimals}
	switch p.Kind {
	case Stat:
		t := persesThresholds{DefaultColor: persesColors[p.Thresholds.Base]}
		if p.Thresholds.Base == "" {
			t.DefaultColor = persesColors["green"]
		}
		for _, st := range p.Thresholds.Steps {
			t.Steps = append(t.Steps, persesThresholdStep{Value: st.Value, Color: persesColors[st.Color]})
		}
		for _, c := range append([]persesThresholdStep{{Color: t.DefaultColor}}, t.Steps...) {
			if c.Color == "" {
				return pp, fmt.Errorf("threshold color not one of green, orange, red")
			}
		}
		pp.Spec.Plugin = persesPlugin{Kind: "StatChart", Spec: persesStatChart{Calculation: "last-number", Format: format, Thresholds: t}}
	case TimeSeries:
		var c persesTimeSeriesChart
		c.Legend.Position, c.Legend.Mode = "bottom", "list"
		if p.LegendRight {
			c.Legend.Position = "right"
		}
		c.YAxis.Format = format
		c.Visual.Display, c.Visual.LineWidth, c.Visual.AreaOpacity = "line", 1, 0.1
		if p.Stacked {
			c.Visual.AreaOpacity, c.Visual.Stack = 0.4, "all"
		}
		pp.Spec.Plugin = persesPlugin{Kind: "TimeSeriesChart", Spec: c}
	case Table:
		var t persesTable
		for _, name := range p.HideColumns {
			t.ColumnSettings = append(t.ColumnSettings, persesColumn{Name: name, Hide: true})
		}
		pp.Spec.Plugin = persesPlugin{Kind: "Table", Spec: t}
	default:
		return pp, fmt.Errorf("unknown kind %d", p.Kind)
	}
	return pp, nil
}

// persesJSON is the dashboard file: Perses' own format, which `percli
// apply` and Perses' file provisioning read, and whose spec the chart puts
// in a PersesDashboard.
func persesJSON(d Dashboard) ([]byte, error) {
	pd, err := persesDashboardOf(d)
	if err != nil {
		return nil, err
	}
	b, err := json.MarshalIndent(pd, "", "  ")
	if err != nil {
		return nil, err
	}
	return append(b, '\n'), nil
}
