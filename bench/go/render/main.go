// Command render is the Go half of bootplate's render peer benchmark (bench/render-vs-go.sh):
// it renders kubeadm.tmpl, the text/template twin of render/benches/kubeadm.yaml, with the data
// `render-bench data` prints (the same render context and merged values bootplate renders
// with) N times and prints the rate, like `render-bench render`. Standard library only.
//
//	go run . -data data.json -iterations 20000 -output out.yaml
package main

import (
	"bytes"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"syscall"
	"text/template"
	"time"
)

type endpoint struct {
	Host string `json:"host"`
	Port int    `json:"port"`
}

type network struct {
	Pods          []string `json:"pods"`
	Services      []string `json:"services"`
	ServiceDomain string   `json:"serviceDomain"`
}

type cluster struct {
	Name                 string            `json:"name"`
	Namespace            string            `json:"namespace"`
	ControlPlaneEndpoint endpoint          `json:"controlPlaneEndpoint"`
	Network              network           `json:"network"`
	Labels               map[string]string `json:"labels"`
}

type machine struct {
	Name          string            `json:"name"`
	Namespace     string            `json:"namespace"`
	Version       string            `json:"version"`
	FailureDomain string            `json:"failureDomain"`
	Labels        map[string]string `json:"labels"`
	Role          string            `json:"role"`
}

type join struct {
	Token             string   `json:"token"`
	APIServerEndpoint string   `json:"apiServerEndpoint"`
	CACertHashes      []string `json:"caCertHashes"`
}

type keyPair struct {
	Cert string `json:"cert"`
	Key  string `json:"key"`
}

type certificates struct {
	CA             keyPair `json:"ca"`
	Etcd           keyPair `json:"etcd"`
	FrontProxy     keyPair `json:"frontProxy"`
	ServiceAccount keyPair `json:"serviceAccount"`
}

type meta struct {
	Object   string `json:"object"`
	Revision string `json:"revision"`
}

// data is what the template sees: typed context, variables as a map (they are user-defined).
type data struct {
	Cluster cluster                `json:"cluster"`
	Machine machine                `json:"machine"`
	Join    *join                  `json:"join"`
	Certs   *certificates          `json:"certs"`
	Values  map[string]interface{} `json:"values"`
	Meta    meta                   `json:"meta"`
}

type file struct {
	Path, Permissions, Content string
}

// text is a scalar as text: strings as they are, numbers and booleans as written, nil empty.
func text(v interface{}) string {
	if v == nil {
		return ""
	}
	if s, ok := v.(string); ok {
		return s
	}
	return fmt.Sprint(v)
}

// yamlQuote is a YAML double-quoted scalar that YAML 1.1 and 1.2 readers read back unchanged.
func yamlQuote(v interface{}) string {
	s := text(v)
	var b strings.Builder
	b.Grow(len(s) + 2)
	b.WriteByte('"')
	for _, c := range s {
		switch {
		case c == '"':
			b.WriteString(`\"`)
		case c == '\\':
			b.WriteString(`\\`)
		case c == '\n':
			b.WriteString(`\n`)
		case c == '\t':
			b.WriteString(`\t`)
		case c == '\r':
			b.WriteString(`\r`)
		case c == '\u2028':
			b.WriteString(`\L`)
		case c == '\u2029':
			b.WriteString(`\P`)
		case c == '\u0085':
			b.WriteString(`\N`)
		case c < 0x20 || (c >= 0x7f && c <= 0x9f):
			fmt.Fprintf(&b, `\x%02x`, c)
		case c == '\ufeff' || c == '\ufffe' || c == '\uffff':
			fmt.Fprintf(&b, `\u%04x`, c)
		default:
			b.WriteRune(c)
		}
	}
	b.WriteByte('"')
	return b.String()
}

func toJSON(v interface{}) (string, error) {
	var b bytes.Buffer
	enc := json.NewEncoder(&b)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(v); err != nil {
		return "", err
	}
	return strings.TrimSuffix(b.String(), "\n"), nil
}

func quote(s string) string {
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
}

// shellQuote single-quotes a word, or each item of a list (joined by spaces).
func shellQuote(v interface{}) string {
	if items, ok := v.([]interface{}); ok {
		words := make([]string, len(items))
		for i, item := range items {
			words[i] = quote(text(item))
		}
		return strings.Join(words, " ")
	}
	return quote(text(v))
}

func joinList(v interface{}, sep string) string {
	switch items := v.(type) {
	case []string:
		return strings.Join(items, sep)
	case []interface{}:
		words := make([]string, len(items))
		for i, item := range items {
			words[i] = text(item)
		}
		return strings.Join(words, sep)
	}
	return ""
}

func defaultValue(v, fallback interface{}) interface{} {
	if v == nil || v == "" {
		return fallback
	}
	return v
}

// literalChomping is the block scalar indicator for s, or "" with ok false when s must be a
// double-quoted scalar (one line, leading white space, or characters a block cannot hold).
func literalChomping(s string) (string, bool) {
	body := strings.TrimRight(s, "\n")
	if !strings.Contains(body, "\n") && len(body) == len(s) {
		return "", false
	}
	if body == "" || body[0] == ' ' || body[0] == '\t' || body[0] == '\n' {
		return "", false
	}
	for _, c := range s {
		ok := c == '\t' || c == '\n' || (c >= 0x20 && c < 0x7f) ||
			(c >= 0xa0 && c < 0xd800 && c != 0x2028 && c != 0x2029) ||
			(c >= 0xe000 && c <= 0xfffd && c != 0xfeff) || c >= 0x10000
		if !ok {
			return "", false
		}
	}
	switch len(s) - len(body) {
	case 0:
		return "-", true
	case 1:
		return "", true
	}
	return "+", true
}

// scalar writes s as a YAML value: a literal block indented by `indent`, or double-quoted.
// The last line break is left to the template.
func scalar(indent int, s string) string {
	chomp, ok := literalChomping(s)
	if !ok {
		return yamlQuote(s)
	}
	var b strings.Builder
	b.Grow(len(s) + len(s)/8*indent + 8)
	b.WriteByte('|')
	b.WriteString(chomp)
	pad := strings.Repeat(" ", indent)
	for _, line := range strings.Split(strings.TrimRight(s, "\n"), "\n") {
		b.WriteByte('\n')
		if line != "" {
			b.WriteString(pad)
			b.WriteString(line)
		}
	}
	for i := 1; i < len(s)-len(strings.TrimRight(s, "\n")); i++ {
		b.WriteByte('\n')
	}
	return b.String()
}

func parse(path string) (*template.Template, error) {
	var tmpl *template.Template
	funcs := template.FuncMap{
		"yamlQuote":  yamlQuote,
		"json":       toJSON,
		"shellQuote": shellQuote,
		"join":       joinList,
		"default":    defaultValue,
		"scalar":     scalar,
		"file": func(path, permissions, content string) file {
			return file{Path: path, Permissions: permissions, Content: content}
		},
		// Helm's include: a named template's output as a string, to pipe on.
		"include": func(name string, data interface{}) (string, error) {
			var b strings.Builder
			err := tmpl.ExecuteTemplate(&b, name, data)
			return b.String(), err
		},
	}
	tmpl, err := template.New(filepath.Base(path)).Option("missingkey=error").Funcs(funcs).ParseFiles(path)
	return tmpl, err
}

func main() {
	dataPath := flag.String("data", "data.json", "the render data (`render-bench data`)")
	tmplPath := flag.String("template", "kubeadm.tmpl", "the template")
	iterations := flag.Int("iterations", 10000, "how many renders to time")
	output := flag.String("output", "", "write the last output here")
	flag.Parse()

	raw, err := os.ReadFile(*dataPath)
	check(err)
	var d data
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.UseNumber() // 1048576 prints as 1048576, not 1.048576e+06
	check(dec.Decode(&d))
	tmpl, err := parse(*tmplPath)
	check(err)

	render := func() []byte {
		var b bytes.Buffer
		check(tmpl.ExecuteTemplate(&b, "cloud-config", &d))
		return b.Bytes()
	}
	// Warm-up, as the Rust side does.
	out := render()
	for i := 0; i < *iterations/10; i++ {
		out = render()
	}
	runtime.GC()
	started, cpuStarted := time.Now(), cpuSeconds()
	for i := 0; i < *iterations; i++ {
		out = render()
	}
	seconds := time.Since(started).Seconds()
	cpu := cpuSeconds() - cpuStarted
	if *output != "" {
		check(os.WriteFile(*output, out, 0o644))
	}
	fmt.Printf("engine=go-text/template renders=%d seconds=%.4f per_sec=%.1f cpu_seconds=%.3f per_cpu_sec=%.1f bytes=%d gomaxprocs=%d\n",
		*iterations, seconds, float64(*iterations)/seconds, cpu, float64(*iterations)/cpu, len(out), runtime.GOMAXPROCS(0))
}

// cpuSeconds is the CPU time (user + system) of the whole process, garbage collector included.
func cpuSeconds() float64 {
	var usage syscall.Rusage
	check(syscall.Getrusage(syscall.RUSAGE_SELF, &usage))
	return float64(usage.Utime.Nano()+usage.Stime.Nano()) / 1e9
}

func check(err error) {
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
}
