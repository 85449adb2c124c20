// Package docs holds the project's documentation; its test checks that
// the documentation's relative links lead somewhere.
package docs

import (
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
)

// link matches a Markdown link or image: [text](target) or [text](target "title").
var link = regexp.MustCompile(`\]\(([^)\s]+)(?:\s+"[^"]*")?\)`)

// pages are the files whose links are checked (README.md, the sub-READMEs,
// docs/*.md), relative to the repository root.
func pages(t *testing.T) []string {
	t.Helper()
	docs, err := filepath.Glob("*.md")
	if err != nil {
		t.Fatal(err)
	}
	out := []string{"README.md", "charts/cpuslot/README.md", "deploy/README.md", "deploy/openwhisk/README.md",
		"deploy/knative/README.md", "e2e/README.md", "runtime-image/README.md", "test/vm/README.md"}
	for _, d := range docs {
		out = append(out, filepath.Join("docs", d))
	}
	return out
}

// TestLinks: every relative link in the READMEs and docs/*.md names a file
// or directory that exists, and a #fragment into a Markdown file names one
// of its headings.
func TestLinks(t *testing.T) {
	root := ".."
	anchors := map[string]map[string]bool{}
	for _, page := range pages(t) {
		b, err := os.ReadFile(filepath.Join(root, page))
		if err != nil {
			t.Fatal(err)
		}
		for _, target := range links(string(b)) {
			if strings.Contains(target, "://") || strings.HasPrefix(target, "mailto:") {
				continue
			}
			file, frag, _ := strings.Cut(target, "#")
			path := filepath.Join(root, filepath.Dir(page), file)
			if file == "" {
				path = filepath.Join(root, page)
			}
			if _, err := os.Stat(path); err != nil {
				t.Errorf("%s: link %s: %v", page, target, err)
				continue
			}
			if frag == "" || !strings.HasSuffix(path, ".md") {
				continue
			}
			if anchors[path] == nil {
				anchors[path] = headings(t, path)
			}
			if !anchors[path][frag] {
				t.Errorf("%s: link %s: no heading #%s in %s", page, target, frag, file)
			}
		}
	}
}

// codeSpan is inline code: `...`, where brackets are not links.
var codeSpan = regexp.MustCompile("`[^`]*`")

// links lists the link targets of a Markdown text outside code blocks and
// inline code.
func links(text string) []string {
	var out []string
	for _, line := range prose(text) {
		for _, m := range link.FindAllStringSubmatch(codeSpan.ReplaceAllString(line, "``"), -1) {
			out = append(out, m[1])
		}
	}
	return out
}

// prose is text's lines outside fenced code blocks.
func prose(text string) []string {
	var out []string
	fenced := false
	for _, line := range strings.Split(text, "\n") {
		if strings.HasPrefix(strings.TrimSpace(line), "```") {
			fenced = !fenced
			continue
		}
		if !fenced {
			out = append(out, line)
		}
	}
	return out
}

// headings are the anchors GitHub makes for a Markdown file's headings:
// lower case, punctuation other than '-' and '_' dropped, spaces as '-',
// a repeated one suffixed -1, -2, ...
func headings(t *testing.T, path string) map[string]bool {
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]bool{}
	seen := map[string]int{}
	for _, line := range prose(string(b)) {
		if !strings.HasPrefix(line, "#") {
			continue
		}
		title := strings.TrimSpace(strings.TrimLeft(line, "#"))
		var slug strings.Builder
		for _, r := range strings.ToLower(title) {
			switch {
			case r == ' ':
				slug.WriteRune('-')
			case r == '-' || r == '_' || r >= 'a' && r <= 'z' || r >= '0' && r <= '9' || r > 127:
				slug.WriteRune(r)
			}
		}
		s := slug.String()
		if n := seen[s]; n > 0 {
			out[s+"-"+strconv.Itoa(n)] = true
		} else {
			out[s] = true
		}
		seen[s]++
	}
	return out
}

// TestLinksSkipsCode: brackets and parentheses in inline code or a fenced
// block are not links (a name pattern such as `[a-z]([-a-z0-9]*)?`).
func TestLinksSkipsCode(t *testing.T) {
	text := "see [the docs](a.md) and `[a-z]([-a-z0-9]*[a-z0-9])?`\n```\n[x](b.md)\n```\n[y](c.md#h)"
	if got := strings.Join(links(text), " "); got != "a.md c.md#h" {
		t.Fatalf("links: %q", got)
	}
}
