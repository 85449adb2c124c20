package settings

import (
	"errors"
	"fmt"
	"strings"
	"time"
)

// The lines between which docs/settings.md holds the generated table.
const (
	docBegin = "<!-- BEGIN generated from internal/settings by `make settings-doc`; do not edit -->\n"
	docEnd   = "<!-- END generated -->\n"
)

// ErrNoDocMarkers: a page given to RewriteDoc has no place for the table.
var ErrNoDocMarkers = errors.New("settings: no generated-table markers")

// RewriteDoc returns page (docs/settings.md) with the text between its
// markers replaced by DocTable: the page's prose is written by hand, the
// table from Keys.
func RewriteDoc(page string) (string, error) {
	head, rest, ok := strings.Cut(page, docBegin)
	if !ok {
		return "", fmt.Errorf("%w: want a line %q", ErrNoDocMarkers, strings.TrimSpace(docBegin))
	}
	_, tail, ok := strings.Cut(rest, docEnd)
	if !ok {
		return "", fmt.Errorf("%w: want a line %q", ErrNoDocMarkers, strings.TrimSpace(docEnd))
	}
	return head + docBegin + DocTable() + docEnd + tail, nil
}

// DocTable is the Markdown table of every key: its name (in the file and
// the chart's values), flag, annotation, default, accepted values and
// meaning.
func DocTable() string {
	var b strings.Builder
	b.WriteString("| setting | flag | annotation | chart value | default | accepts | meaning |\n")
	b.WriteString("|---|---|---|---|---|---|---|\n")
	d := Default()
	for _, k := range Keys {
		ann := ""
		if k.Annotation != "" {
			ann = "`" + AnnotationPrefix + k.Annotation + "`"
		}
		meaning := k.Meaning
		if meaning == "" {
			meaning = k.Doc
		}
		cells := []string{"`" + k.Name + "`", "`--" + k.Flag + "`", ann, "`" + k.Name + "`",
			k.defaultText(d), k.acceptsText(), meaning}
		row := "| " + strings.Join(cells, " | ") + " |\n"
		b.WriteString(strings.ReplaceAll(row, "|  |", "| |")) // an empty cell
	}
	return b.String()
}

// defaultText is the key's default as the docs write it.
func (k Key) defaultText(d Pool) string {
	v := d.Get(k.Name)
	switch {
	case v == "" && k.EmptyMeans != "":
		return k.EmptyMeans
	case k.Kind == KindInt || k.Kind == KindNumber:
		return v
	case k.Kind == KindDuration:
		dur, _ := time.ParseDuration(v)
		return "`" + shortDuration(dur) + "`"
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

// shortDuration writes 2m rather than time's 2m0s.
func shortDuration(d time.Duration) string {
	s := d.String()
	if strings.HasSuffix(s, "m0s") {
		s = strings.TrimSuffix(s, "0s")
	}
	if strings.HasSuffix(s, "h0m") {
		s = strings.TrimSuffix(s, "0m")
	}
	return s
}
