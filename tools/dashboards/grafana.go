package main

import (
	"encoding/json"
	"fmt"

	"github.com/grafana/grafana-foundation-sdk/go/cog"
	"github.com/grafana/grafana-foundation-sdk/go/cog/variants"
	"github.com/grafana/grafana-foundation-sdk/go/common"
	"github.com/grafana/grafana-foundation-sdk/go/dashboard"
	"github.com/grafana/grafana-foundation-sdk/go/prometheus"
	"github.com/grafana/grafana-foundation-sdk/go/stat"
	"github.com/grafana/grafana-foundation-sdk/go/table"
	"github.com/grafana/grafana-foundation-sdk/go/timeseries"
)

// Every query and variable reads from the data source the user picks in
// the dashboard's "datasource" variable.
var promDS = common.DataSourceRef{Type: cog.ToPtr("prometheus"), Uid: cog.ToPtr("${datasource}")}

// grafanaDashboard builds d with the Grafana Foundation SDK's builders,
// which check the dashboard model as they go.
func grafanaDashboard(d Dashboard) (dashboard.Dashboard, error) {
	linkTitle, ok := titleOf(d.Link)
	if !ok {
		return dashboard.Dashboard{}, fmt.Errorf("link to %q: no such dashboard", d.Link)
	}
	b := dashboard.NewDashboardBuilder(d.Title).
		Uid(d.UID).
		Description(d.Description).
		Tags([]string{"cpuslot"}).
		Editable().
		Tooltip(dashboard.DashboardCursorSyncCrosshair).
		Timezone("browser").
		Refresh("30s").
		Time("now-1h", "now").
		LiveNow(false).
		Version(1).
		Annotation(dashboard.NewAnnotationQueryBuilder().
			Name("Annotations & Alerts").
			BuiltIn(1).
			Type("dashboard").
			Datasource(common.DataSourceRef{Type: cog.ToPtr("grafana"), Uid: cog.ToPtr("-- Grafana --")}).
			Enable(true).
			Hide(true).
			IconColor("rgba(0, 211, 255, 1)")).
		Link(dashboard.NewDashboardLinkBuilder(linkTitle).
			Type(dashboard.DashboardLinkTypeLink).
			Url("/d/" + d.Link).
			KeepTime(true).
			IncludeVars(false)).
		WithVariable(dashboard.NewDatasourceVariableBuilder("datasource").
			Label("Data source").
			Type("prometheus")).
		WithVariable(dashboard.NewConstantVariableBuilder(d.Job.Name).
			Value(dashboard.StringOrMap{String: cog.ToPtr(d.Job.Default)}))
	for _, v := range d.Vars {
		q := fmt.Sprintf("label_values(%s, %s)", v.Selector, v.LabelName)
		b.WithVariable(dashboard.NewQueryVariableBuilder(v.Name).
			Label(v.Label).
			Datasource(promDS).
			Definition(q).
			Query(dashboard.StringOrMap{String: cog.ToPtr(q)}).
			Multi(true).
			IncludeAll(true).
			AllValue(".*").
			Current(dashboard.VariableOption{
				Selected: cog.ToPtr(true),
				Text:     dashboard.StringOrArrayOfString{ArrayOfString: []string{"All"}},
				Value:    dashboard.StringOrArrayOfString{ArrayOfString: []string{"$__all"}},
			}).
			Refresh(dashboard.VariableRefreshOnTimeRangeChanged).
			Sort(dashboard.VariableSortAlphabeticalAsc))
	}
	id := uint32(0)
	for _, row := range d.Rows {
		id++
		b.WithRow(dashboard.NewRowBuilder(row.Title).Id(id))
		for _, p := range row.Panels {
			id++
			b.WithPanel(grafanaPanel(id, p))
		}
	}
	return b.Build()
}

func titleOf(uid string) (string, bool) {
	for _, d := range Dashboards {
		if d.UID == uid {
			return d.Title, true
		}
	}
	return "", false
}

// grafanaPanel is the builder of p's Grafana panel: stat, timeseries or
// table.
func grafanaPanel(id uint32, p Panel) cog.Builder[dashboard.Panel] {
	var targets []cog.Builder[variants.Dataquery]
	for i, q := range p.Queries {
		t := prometheus.NewDataqueryBuilder().
			RefId(string(rune('A' + i))).
			Datasource(promDS).
			Expr(q.Expr).
			LegendFormat(legendOf(q))
		if p.Kind == Table {
			t.Instant().Format(prometheus.PromQueryFormatTable)
		} else {
			t.Range()
		}
		targets = append(targets, t)
	}
	w, h := uint32(p.Width), uint32(p.Kind.height())
	switch p.Kind {
	case Stat:
		b := stat.NewPanelBuilder().Id(id).Title(p.Title).Datasource(promDS).Span(w).Height(h).Targets(targets).
			Unit(string(p.Unit)).
			ColorScheme(dashboard.NewFieldColorBuilder().Mode(dashboard.FieldColorModeIdThresholds)).
			Thresholds(grafanaThresholds(p.Thresholds)).
			ReduceOptions(common.NewReduceDataOptionsBuilder().Calcs([]string{"lastNotNull"}).Fields("").Values(false)).
			ColorMode(common.BigValueColorModeValue).
			GraphMode(common.BigValueGraphModeArea).
			JustifyMode(common.BigValueJustifyModeAuto).
			TextMode(common.BigValueTextModeAuto).
			Orientation(common.VizOrientationAuto)
		if p.Description != "" {
			b.Description(p.Description)
		}
		if p.Decimals != nil {
			b.Decimals(float64(*p.Decimals))
		}
		return b
	case TimeSeries:
		b := timeseries.NewPanelBuilder().Id(id).Title(p.Title).Datasource(promDS).Span(w).Height(h).Targets(targets).
			Unit(string(p.Unit)).
			Min(0).
			LineWidth(1).
			FillOpacity(10).
			ShowPoints(common.VisibilityModeNever).
			SpanNulls(common.BoolOrFloat64{Bool: cog.ToPtr(false)}).
			Legend(common.NewVizLegendOptionsBuilder().DisplayMode(common.LegendDisplayModeList).Placement(common.LegendPlacementBottom).ShowLegend(true)).
			Tooltip(common.NewVizTooltipOptionsBuilder().Mode(common.TooltipDisplayModeMulti).Sort(common.SortOrderDescending))
		if p.LegendRight {
			b.Legend(common.NewVizLegendOptionsBuilder().DisplayMode(common.LegendDisplayModeList).Placement(common.LegendPlacementRight).ShowLegend(true))
		}
		if p.Stacked {
			b.FillOpacity(40).Stacking(common.NewStackingConfigBuilder().Mode(common.StackingModeNormal).Group("A"))
		}
		if p.Description != "" {
			b.Description(p.Description)
		}
		if p.Decimals != nil {
			b.Decimals(float64(*p.Decimals))
		}
		return b
	case Table:
		hide := map[string]bool{}
		for _, c := range p.HideColumns {
			hide[c] = true
		}
		b := table.NewPanelBuilder().Id(id).Title(p.Title).Datasource(promDS).Span(w).Height(h).Targets(targets).
			ShowHeader(true).
			// The SDK's default footer has reducer null, which its own
			// strict decoder refuses.
			Footer(common.NewTableFooterOptionsBuilder().Show(false).Reducer([]string{}).CountRows(false)).
			WithTransformation(dashboard.DataTransformerConfig{Id: "organize", Options: map[string]any{"excludeByName": hide}})
		if p.Description != "" {
			b.Description(p.Description)
		}
		return b
	}
	panic(fmt.Sprintf("panel %q: unknown kind %d", p.Title, p.Kind))
}

// legendOf is Grafana's legend format: __auto names a series by its
// labels.
func legendOf(q Query) string {
	if q.Legend == "" {
		return "__auto"
	}
	return q.Legend
}

func grafanaThresholds(t Thresholds) *dashboard.ThresholdsConfigBuilder {
	base := t.Base
	if base == "" {
		base = "green"
	}
	steps := []dashboard.Threshold{{Color: base}}
	for _, s := range t.Steps {
		steps = append(steps, dashboard.Threshold{Value: cog.ToPtr(s.Value), Color: s.Color})
	}
	return dashboard.NewThresholdsConfigBuilder().Mode(dashboard.ThresholdsModeAbsolute).Steps(steps)
}

// grafanaJSON is the dashboard file: the SDK's model as indented JSON.
func grafanaJSON(d Dashboard) ([]byte, error) {
	gd, err := grafanaDashboard(d)
	if err != nil {
		return nil, fmt.Errorf("grafana dashboard %s: %w", d.UID, err)
	}
	b, err := json.MarshalIndent(gd, "", "  ")
	if err != nil {
		return nil, err
	}
	return append(b, '\n'), nil
}
