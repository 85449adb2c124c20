package settings

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"
)

// The lines between which docs/settings.md holds the generated tables (of
// Keys, then of AgentKeys), and the chart's templates/_helpers.tpl the
// generated sections of the agent's configuration (a comment that trims
// the newline before it, so the rendered file is the same with or without
// the markers).
const (
	docBegin   = "<!-- BEGIN generated from internal/settings by `make settings-doc`; do not edit -->\n"
	docEnd     = "<!-- END generated -->\n"
	chartBegin = "{{- /* BEGIN generated from internal/settings by `make settings-doc`; do not edit */}}\n"
	chartEnd   = "{{- /* END generated */}}\n"
)

// ErrNoDocMarkers: a page given to RewriteDoc or RewriteChartConfig has no
// place for the generated text.
var ErrNoDocMarkers = errors.New("settings: no generated-table markers")

// RewriteDoc returns page (docs/settings.md) with the text between its
// markers replaced by DocTable and each group's AgentDocTable: the page's
// prose is written by hand, the tables from Keys and AgentKeys.
func RewriteDoc(page string) (string, error) {
	page, err := rewrite(page, docBegin, docEnd, DocTable())
	for _, g := range agentGroups() {
		if err != nil {
			break
		}
		page, err = rewrite(page, agentDocBegin(g), docEnd, AgentDocTable(g))
	}
	return page, err
}

// agentGroups are the groups of AgentKeys with a table each in
// docs/settings.md: "" (the top-level keys) and the top-level sections.
func agentGroups() []string {
	var out []string
	for _, k := range AgentKeys {
		if g := k.group(); !slices.Contains(out, g) {
			out = append(out, g)
		}
	}
	return out
}

// group is the key's top-level section, "" for a top-level key.
func (k Key) group() string {
	g, _, ok := strings.Cut(k.Name, ".")
	if !ok {
		return ""
	}
	return g
}

// agentDocBegin is the line before a group's table in docs/settings.md.
func agentDocBegin(group string) string {
	if group == "" {
		group = "top level"
	}
	return "<!-- BEGIN generated from internal/settings (AgentKeys: " + group + ") by `make settings-doc`; do not edit -->\n"
}

// RewriteChartConfig returns tpl (the chart's templates/_helpers.tpl) with
// the text between its markers replaced by ChartConfig.
func RewriteChartConfig(tpl string) (string, error) {
	return rewrite(tpl, chartBegin, chartEnd, ChartConfig())
}

// rewrite replaces the text between the lines begin and end of page.
func rewrite(page, begin, end, body string) (string, error) {
	head, rest, ok := strings.Cut(page, begin)
	if !ok {
		return "", fmt.Errorf("%w: want a line %q", ErrNoDocMarkers, strings.TrimSpace(begin))
	}
	_, tail, ok := strings.Cut(rest, end)
	if !ok {
		return "", fmt.Errorf("%w: want a line %q", ErrNoDocMarkers, strings.TrimSpace(end))
	}
	return head + begin + body + end + tail, nil
}

// ChartConfig is the sections of the agent's
// configuration file as the chart's template writes them: each key from
// the chart value of its name, in the form its kind needs in YAML (a
// duration or prewarm list quoted, an int an int, a CPU quantity a
// string).
func ChartConfig() string {
	var b strings.Builder
	tree{templateKeys(), func(k Key) string { return k.Name }}.writeTemplate(&b, "", "")
	return b.String()
}

func (t tree) writeTemplate(b *strings.Builder, at, indent string) {
	for _, k := range t.leaves(at) {
		fmt.Fprintf(b, "%s%s: {{ %s }}\n", indent, k.Field(), k.chartValue())
	}
	for _, m := range t.maps(at) {
		b.WriteString(indent + leaf(m) + ":\n")
		t.writeTemplate(b, m, indent+"  ")
	}
}

// chartValue is the template's expression of the key's value.
func (k Key) chartValue() string {
	if k.ChartFrom != "" {
		return k.ChartFrom
	}
	v := ".Values." + k.chartPath()
	switch k.Kind {
	case KindPrewarm, KindDuration, KindString:
		v += " | quote"
	case KindInt:
		v = "int " + v
	case KindQuantity:
		v = `include "cpuslot.quantity" ` + v
	case KindList:
		v = "toJson " + v
	}
	return v
}

// DocTable is the Markdown table of every key: its name (in the file and
// the chart's values), flag, annotation, default, accepted values and
// meaning.
func DocTable() string {
	var b strings.Builder
	b.WriteString("| setting | flag | annotation | chart value | default | accepts | meaning |\n")
	b.WriteString("|---|---|---|---|---|---|---|\n")
	for _, k := range Keys {
		ann := ""
		if k.Annotation != "" {
			ann = "`" + AnnotationPrefix + k.Annotation + "`"
		}
		b.WriteString(row("`"+k.Name+"`", "`--"+k.Flag+"`", ann, "`"+k.Name+"`", k.defaultText(), k.acceptsText(), k.meaning()))
	}
	return b.String()
}

// AgentDocTable is the Markdown table of a group of AgentKeys: name,
// flag, chart value, default, accepted values and meaning.
func AgentDocTable(group string) string {
	var b strings.Builder
	b.WriteString("| setting | flag | chart value | default | accepts | meaning |\n")
	b.WriteString("|---|---|---|---|---|---|\n")
	for _, k := range AgentKeys {
		if k.group() != group {
			continue
		}
		flag, chart := "", "`"+k.chartPath()+"`"
		if k.Flag != "" {
			flag = "`--" + k.Flag + "`"
		}
		switch {
		case k.ChartDoc != "":
			chart = k.ChartDoc
		case k.NoChart:
			chart = "(none)"
		}
		b.WriteString(row("`"+k.Name+"`", flag, chart, k.defaultText(), k.acceptsText(), k.meaning()))
	}
	return b.String()
}

// row is a table's row of cells.
func row(cells ...string) string {
	r := "| " + strings.Join(cells, " | ") + " |\n"
	return strings.ReplaceAll(r, "|  |", "| |") // an empty cell
}

// meaning is the key's text in the docs' tables.
func (k Key) meaning() string {
	if k.Meaning != "" {
		return k.Meaning
	}
	return k.Doc
}

// defaultText is the key's default as the docs write it.
func (k Key) defaultText() string {
	v := k.DefaultText()
	switch {
	case v == "" && k.EmptyMeans != "":
		return k.EmptyMeans
	case k.Kind == KindInt || k.Kind == KindNumber:
		return v
	case k.Kind == KindDuration:
		dur, _ := time.ParseDuration(v)
		return "`" + ShortDuration(dur) + "`"
	case k.Kind == KindList, v == "":
		return "`" + k.yamlDefault() + "`"
	}
	return "`" + v + "`"
}

// acceptsText describes the values Set takes, for the docs.
func (k Key) acceptsText() string {
	var s string
	switch k.Kind {
	case KindPrewarm:
		s = "`QUOTA=COUNT,...`"
	case KindChoice:
		s = "`" + strings.Join(k.Choices, "`, `") + "`"
	case KindQuantity:
		s = "CPU quantity"
	case KindBool:
		s = "`true`, `false`"
	case KindList:
		s = "a list of `" + strings.Join(k.Choices, "`, `") + "`"
	case KindString:
		s = "text"
		if k.Min > 0 || k.Max != noMax {
			s += ", " + strings.TrimPrefix(k.RangeText(), "in ") + " bytes"
		}
		if k.Pattern != "" {
			s += " matching `" + strings.ReplaceAll(k.Pattern, "|", `\|`) + "`"
		}
	default:
		s = strings.TrimPrefix(k.RangeText(), "in ")
	}
	if k.Optional {
		s += "; `\"\"`: " + k.EmptyDoc()
	}
	return s
}

// EmptyDoc is what the empty value of an Optional key means.
func (k Key) EmptyDoc() string {
	if k.EmptyMeans != "" {
		return "the default"
	}
	return "none"
}

// ShortDuration writes 2m rather than time's 2m0s, as the docs do.
func ShortDuration(d time.Duration) string {
	s := d.String()
	if strings.HasSuffix(s, "m0s") {
		s = strings.TrimSuffix(s, "0s")
	}
	if strings.HasSuffix(s, "h0m") {
		s = strings.TrimSuffix(s, "0m")
	}
	return s
}
