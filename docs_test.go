package ratelimit

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"

	"github.com/ratesync/caddy-ratelimit/internal/testpki"
)

// docExample is one fenced ```caddyfile or ```json block of a Markdown
// file.
type docExample struct {
	file string
	line int    // of the opening fence
	lang string // caddyfile or json
	// fragment is how the block is wrapped into a whole config, from an
	// HTML comment <!-- fragment: <kind> --> on the line before the
	// fence; empty for a whole config. See wrapExample.
	fragment string
	body     string
}

var fragmentMark = regexp.MustCompile(`^<!--\s*fragment:\s*([a-z_]+)\s*-->$`)

// docExamples returns every ```caddyfile and ```json block of the files.
// Blocks of other languages (sh, go, output) are not configs and are
// skipped.
func docExamples(t *testing.T, files []string) []docExample {
	t.Helper()
	var out []docExample
	for _, f := range files {
		data, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		var (
			in       bool
			cur      docExample
			body     strings.Builder
			indent   string
			fence    string
			prevLine string // the last non-blank line outside a block
		)
		sc := bufio.NewScanner(bytes.NewReader(data))
		for n := 1; sc.Scan(); n++ {
			line := sc.Text()
			trimmed := strings.TrimLeft(line, " \t")
			if !in {
				if strings.HasPrefix(trimmed, "```") {
					in = true
					indent = line[:len(line)-len(trimmed)]
					fence = trimmed[:len(trimmed)-len(strings.TrimLeft(trimmed, "`"))]
					info := strings.Fields(strings.TrimPrefix(trimmed, fence))
					cur = docExample{file: f, line: n}
					if len(info) > 0 {
						cur.lang = strings.ToLower(info[0])
					}
					if m := fragmentMark.FindStringSubmatch(strings.TrimSpace(prevLine)); m != nil {
						cur.fragment = m[1]
					}
					body.Reset()
					continue
				}
				if strings.TrimSpace(line) != "" {
					prevLine = line
				}
				continue
			}
			if strings.TrimSpace(line) == fence {
				in = false
				prevLine = ""
				if cur.lang == "caddyfile" || cur.lang == "json" {
					cur.body = body.String()
					out = append(out, cur)
				} else if cur.fragment != "" {
					t.Errorf("%s:%d: a fragment mark on a ```%s block, which is not checked", f, cur.line, cur.lang)
				}
				continue
			}
			body.WriteString(strings.TrimPrefix(line, indent))
			body.WriteByte('\n')
		}
		if err := sc.Err(); err != nil {
			t.Fatal(err)
		}
		if in {
			t.Errorf("%s:%d: the block never ends", f, cur.line)
		}
	}
	return out
}

// wrapExample makes a whole config of an example. Caddyfile fragments:
// "site" holds a site block's directives (wrapped in a site on :8080, plain
// HTTP), "global" the global options block's options, "rate_limit" the
// rate_limit global option's zones, namespaces and settings. JSON
// fragments: "handler" is one HTTP handler (wrapped in a route with a
// static_response after it, in a config that declares the namespace it
// names, local only), "rate_limit" the rate_limit app's JSON. A JSON
// object with a "handler" field and no "apps" is a handler fragment
// without a mark (docs/accuracy.md, which a harness writes, has one). A
// whole config is returned as it is.
func wrapExample(ex docExample) (string, error) {
	if ex.lang == "json" && ex.fragment == "" {
		var probe map[string]json.RawMessage
		if err := json.Unmarshal([]byte(ex.body), &probe); err == nil && probe["handler"] != nil && probe["apps"] == nil {
			ex.fragment = "handler"
		}
	}
	switch ex.lang + ":" + ex.fragment {
	case "caddyfile:":
		return ex.body, nil
	case "caddyfile:site":
		return ":8080 {\n" + indentLines(ex.body, "\t") + "}\n", nil
	case "caddyfile:global":
		return "{\n" + indentLines(ex.body, "\t") + "}\n", nil
	case "caddyfile:rate_limit":
		return "{\n\trate_limit {\n" + indentLines(ex.body, "\t\t") + "\t}\n}\n", nil
	case "json:":
		return ex.body, nil
	case "json:handler":
		var h struct {
			Namespace string `json:"namespace"`
		}
		if err := json.Unmarshal([]byte(ex.body), &h); err != nil {
			return "", fmt.Errorf("a handler fragment: %w", err)
		}
		app := ""
		if h.Namespace != "" && h.Namespace != "default" {
			ns, _ := json.Marshal(h.Namespace)
			app = `"rate_limit": {"namespaces": {` + string(ns) + `: {}}}, `
		}
		return `{"apps": {` + app + `"http": {"servers": {"srv0": {"listen": [":8080"], "routes": [{"handle": [` +
			ex.body + `, {"handler": "static_response", "body": "ok"}]}]}}}}}`, nil
	case "json:rate_limit":
		return `{"apps": {"rate_limit": ` + ex.body + `}}`, nil
	}
	return "", fmt.Errorf("unknown fragment kind %q for a %s block", ex.fragment, ex.lang)
}

// TestDocExamples checks every ```caddyfile and ```json block of README.md
// and docs/*.md: a Caddyfile must be formatted as caddy fmt formats it,
// and must adapt without warnings; every config must then validate (be
// provisioned, as caddy validate does, which never contacts a store).
// Fragments are wrapped into a config first (see wrapExample). Secrets and
// files come from the environment this test sets: REDIS_PASSWORD,
// DATABASE_URL, PGPASSWORD, and REDIS_CA, REDIS_CERT and REDIS_KEY, PEM
// files it writes.
func TestDocExamples(t *testing.T) {
	dir := t.TempDir()
	// Caddy's TLS app keeps its storage under the data directory, even
	// when nothing is obtained.
	t.Setenv("XDG_DATA_HOME", filepath.Join(dir, "data"))
	t.Setenv("XDG_CONFIG_HOME", filepath.Join(dir, "config"))
	t.Setenv("REDIS_PASSWORD", "s3cret{not-a-placeholder}")
	t.Setenv("PGPASSWORD", "s3cret")
	t.Setenv("DATABASE_URL", "postgres://rl:s3cret@127.0.0.1:5432/ratelimit?sslmode=disable")
	pki := testpki.Write(t, dir)
	t.Setenv("REDIS_CA", pki.CA)
	t.Setenv("REDIS_CERT", pki.ClientCert)
	t.Setenv("REDIS_KEY", pki.ClientKey)

	docs, err := filepath.Glob("docs/*.md")
	if err != nil {
		t.Fatal(err)
	}
	examples := docExamples(t, append([]string{"README.md"}, docs...))
	if len(examples) == 0 {
		t.Fatal("no examples found")
	}
	for _, ex := range examples {
		t.Run(fmt.Sprintf("%s:%d", ex.file, ex.line), func(t *testing.T) {
			t.Logf("a ```%s block, fragment %q", ex.lang, ex.fragment)
			src, err := wrapExample(ex)
			if err != nil {
				t.Fatal(err)
			}
			cfgJSON := []byte(src)
			if ex.lang == "caddyfile" {
				if formatted := caddyfile.Format([]byte(ex.body)); !bytes.Equal(formatted, []byte(ex.body)) {
					t.Errorf("not formatted as caddy fmt formats it; formatted:\n%s", formatted)
				}
				var warnings []string
				out, warns, err := caddyAdapt(src)
				if err != nil {
					t.Fatalf("adapting: %v\n%s", err, src)
				}
				for _, w := range warns {
					warnings = append(warnings, w.String())
				}
				if len(warnings) > 0 {
					t.Errorf("adapting: warnings: %s", strings.Join(warnings, "; "))
				}
				cfgJSON = out
			}
			var cfg caddy.Config
			dec := json.NewDecoder(bytes.NewReader(cfgJSON))
			dec.DisallowUnknownFields()
			if err := dec.Decode(&cfg); err != nil {
				t.Fatalf("decoding the config: %v\n%s", err, cfgJSON)
			}
			if err := caddy.Validate(&cfg); err != nil {
				t.Fatalf("validating: %v\n%s", err, src)
			}
		})
	}
	t.Logf("%d examples checked", len(examples))
}

// indentLines prefixes every non-blank line of s with prefix.
func indentLines(s, prefix string) string {
	lines := strings.SplitAfter(s, "\n")
	for i, l := range lines {
		if strings.TrimSpace(l) != "" {
			lines[i] = prefix + l
		}
	}
	return strings.Join(lines, "")
}
