package main

import (
	"bytes"
	"errors"
	"log/slog"
	"strings"
	"testing"
)

// TestLogShowsNoHiddenCharacters: a pod's strings reach the agent's log
// (an action name, an error quoting an annotation); bidi overrides,
// invisible characters and line separators must not reorder, hide or
// forge what the line shows.
func TestLogShowsNoHiddenCharacters(t *testing.T) {
	var b bytes.Buffer
	log := newLogger(&b, slog.LevelInfo)
	hostile := "guest/\u202Eemag\u200B\u2028{\"level\":\"ERROR\"}\u2029\uFEFF\u2066"
	log.Info("acquire "+hostile, "action", hostile, "err", errors.New("bad "+hostile), "names", []string{hostile})
	out := b.String()
	for _, r := range []rune{'\u202E', '\u200B', '\u2028', '\u2029', '\uFEFF', '\u2066'} {
		// JSON may escape a character (\u2028): the raw one must not be there.
		if strings.ContainsRune(out, r) {
			t.Errorf("log line carries %U: %s", r, out)
		}
	}
	if n := strings.Count(out, "guest/?emag?"); n != 4 {
		t.Errorf("want the message, action, err and names with hidden characters replaced, found %d: %s", n, out)
	}
}
