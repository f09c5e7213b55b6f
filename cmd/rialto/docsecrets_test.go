package main

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// TestDocsKeepSecretsOffCommandLines: the commands the guides show put no
// secret on a command line, where every user of the machine sees it (ps,
// /proc/PID/cmdline): no --token, --admin-token or --bootstrap-token with
// a value (rialto refuses them: the guides show @FILE, the -file flags or
// the environment), and no curl with a token in its arguments (-H @FILE
// reads the header from a file, or from printf's output: a shell builtin,
// no process of its own).
func TestDocsKeepSecretsOffCommandLines(t *testing.T) {
	docs, err := filepath.Glob(filepath.Join("..", "..", "docs", "*.md"))
	if err != nil || len(docs) < 10 {
		t.Fatalf("docs: %v (%d files)", err, len(docs))
	}
	docs = append(docs, filepath.Join("..", "..", "README.md"))
	secretFlag := regexp.MustCompile(`--(?:bootstrap-|admin-)?token[ =]+["']?([^\s"'` + "`" + `]+)`)
	curlSecret := regexp.MustCompile(`Authorization: Bearer \$|-u +["']?[^\s:]*:\$`)
	for _, doc := range docs {
		b, err := os.ReadFile(doc)
		if err != nil {
			t.Fatal(err)
		}
		for _, c := range docCommands(string(b)) {
			for _, m := range secretFlag.FindAllStringSubmatch(c, -1) {
				if !strings.HasPrefix(m[1], "@") {
					t.Errorf("%s: %q puts a token on the command line (%s)", filepath.Base(doc), c, m[0])
				}
			}
			if strings.Contains(c, "curl ") && curlSecret.MatchString(c) {
				t.Errorf("%s: %q puts a token on curl's command line", filepath.Base(doc), c)
			}
		}
	}
}

// docCommands returns the command lines of a Markdown text: each line of its
// fenced code blocks (a line ending in a backslash joined with the next),
// and its inline code that starts with "rialto " or "curl ".
func docCommands(text string) []string {
	var out, prose []string
	fenced, cont := false, ""
	for _, line := range strings.Split(text, "\n") {
		if strings.HasPrefix(strings.TrimSpace(line), "```") {
			fenced = !fenced
			continue
		}
		if !fenced {
			prose = append(prose, line)
			continue
		}
		if s, ok := strings.CutSuffix(line, `\`); ok {
			cont += s + " "
			continue
		}
		out = append(out, cont+line)
		cont = ""
	}
	for _, m := range regexp.MustCompile("`([^`]+)`").FindAllStringSubmatch(strings.Join(prose, "\n"), -1) {
		if c := strings.Join(strings.Fields(m[1]), " "); strings.HasPrefix(c, "rialto ") || strings.HasPrefix(c, "curl ") {
			out = append(out, c)
		}
	}
	return out
}
