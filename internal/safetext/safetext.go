// Package safetext makes text from outside the agent (a pod's action names,
// annotations, cgroup names, errors quoting them) safe to show an operator
// in metric labels and logs: nothing in it can hide, reorder or forge what
// is shown around it.
package safetext

import (
	"fmt"
	"log/slog"
	"strings"
	"unicode"
	"unicode/utf8"
)

// Replacement stands in for each character Text removes.
const Replacement = '?'

// hidden reports whether r changes how text around it is shown rather
// than showing itself: control characters (C0, C1 with NEL), format
// characters (bidi overrides and isolates, zero-width characters, BOM)
// and the line and paragraph separators.
func hidden(r rune) bool {
	return unicode.IsControl(r) || unicode.In(r, unicode.Cf, unicode.Zl, unicode.Zp)
}

// Clean reports whether s is valid UTF-8 with no hidden character.
func Clean(s string) bool {
	if !utf8.ValidString(s) {
		return false
	}
	for _, r := range s {
		if hidden(r) {
			return false
		}
	}
	return true
}

// Text returns s with invalid bytes as U+FFFD and every hidden character
// as Replacement; clean text is returned as it is.
func Text(s string) string {
	if Clean(s) {
		return s
	}
	return strings.Map(func(r rune) rune {
		if hidden(r) {
			return Replacement
		}
		return r
	}, strings.ToValidUTF8(s, "\uFFFD"))
}

// ReplaceAttr is a slog.HandlerOptions.ReplaceAttr that passes every
// string of a record (its message, string fields, errors and Stringers)
// through Text: a log line shows what a pod sent, not what it wants seen.
func ReplaceAttr(_ []string, a slog.Attr) slog.Attr {
	switch a.Value.Kind() {
	case slog.KindString:
		if s := a.Value.String(); !Clean(s) {
			a.Value = slog.StringValue(Text(s))
		}
	case slog.KindAny:
		switch v := a.Value.Any().(type) {
		case error:
			a.Value = slog.StringValue(Text(v.Error()))
		case fmt.Stringer:
			a.Value = slog.StringValue(Text(v.String()))
		case []string:
			c := make([]string, len(v))
			for i, s := range v {
				c[i] = Text(s)
			}
			a.Value = slog.AnyValue(c)
		}
	}
	return a
}
