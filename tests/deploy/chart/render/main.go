// render: renders a Helm chart the way `helm template` does, for checking
// deploy/helm/tandem where no helm binary is installed (Debian ships none).
//
// It implements what the chart uses of Helm: the chart's templates parsed
// as one set (text/template with Sprig's functions, less env and
// expandenv, as Helm has them), .Values (values.yaml coalesced with each
// -f file in order, maps merged deeply, a null deleting a key), .Release,
// .Chart (Chart.yaml's fields under Helm's names), .Capabilities
// (KubeVersion, APIVersions.Has; Chart.yaml's kubeVersion must admit
// --kube_version), .Template, .Files (Get and GetBytes of the chart's
// other files: not templates/, Chart.yaml, values.yaml, values.schema.json
// or what .helmignore names, as Helm loads them), and Helm's own functions
// include, tpl, required, toYaml, fromYaml, toJson, fromJson and lookup
// (always empty, as in helm template). Files whose name starts with "_"
// define templates only; NOTES.txt is rendered apart (--notes_out). Missing
// keys render as empty strings, as in Helm.
//
// Output: the manifests on stdout as `helm template` prints them (one
// "# Source:" comment per document). Each document must parse as YAML.
// --json_out FILE writes them as a JSON array of {"source", "object"};
// --values_out FILE writes the coalesced values as JSON (for checking them
// against values.schema.json).
//
// Usage: render [-f VALUES.yaml]... [--name RELEASE] [--namespace NS]
//
//	[--kube_version vX.Y.Z] [--json_out FILE] [--values_out FILE]
//	[--notes_out FILE] CHART_DIR
package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"text/template"

	"github.com/Masterminds/semver"
	"github.com/Masterminds/sprig"
	"sigs.k8s.io/yaml"
)

// chartMetadata holds Chart.yaml under the field names templates see
// (.Chart.Name, .Chart.AppVersion, ...).
type chartMetadata struct {
	APIVersion   string            `json:"apiVersion"`
	Name         string            `json:"name"`
	Version      string            `json:"version"`
	AppVersion   string            `json:"appVersion"`
	KubeVersion  string            `json:"kubeVersion"`
	Description  string            `json:"description"`
	Type         string            `json:"type"`
	Home         string            `json:"home"`
	Icon         string            `json:"icon"`
	Keywords     []string          `json:"keywords"`
	Sources      []string          `json:"sources"`
	Annotations  map[string]string `json:"annotations"`
	Deprecated   bool              `json:"deprecated"`
	Dependencies []interface{}     `json:"dependencies"`
	Maintainers  []interface{}     `json:"maintainers"`
}

// apiVersions answers .Capabilities.APIVersions.Has for the built-in groups
// of the Kubernetes version below.
type apiVersions []string

func (a apiVersions) Has(v string) bool {
	for _, have := range a {
		if have == v {
			return true
		}
	}
	return false
}

type kubeVersion struct {
	Version, Major, Minor, GitVersion string
}

// chartFiles answers .Files.Get and .Files.GetBytes: a file missing is
// empty, as in Helm.
type chartFiles map[string][]byte

func (f chartFiles) Get(name string) string      { return string(f[name]) }
func (f chartFiles) GetBytes(name string) []byte { return f[name] }

// readFiles loads the chart's files that are neither templates nor the
// chart's own metadata, leaving out what .helmignore names (each line a
// pattern matched against the path and the base name; # comments).
func readFiles(chartDir string) (chartFiles, error) {
	var ignore []string
	if data, err := os.ReadFile(filepath.Join(chartDir, ".helmignore")); err == nil {
		for _, line := range strings.Split(string(data), "\n") {
			if line = strings.TrimSpace(line); line != "" && !strings.HasPrefix(line, "#") {
				ignore = append(ignore, strings.TrimSuffix(line, "/"))
			}
		}
	}
	own := map[string]bool{"Chart.yaml": true, "values.yaml": true, "values.schema.json": true,
		"Chart.lock": true, ".helmignore": true}
	files := chartFiles{}
	err := filepath.WalkDir(chartDir, func(path string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(chartDir, path)
		rel = filepath.ToSlash(rel)
		for _, pattern := range ignore {
			if m, _ := filepath.Match(pattern, rel); m {
				return skip(d)
			}
			if m, _ := filepath.Match(pattern, d.Name()); m {
				return skip(d)
			}
		}
		if d.IsDir() {
			if rel == "templates" || rel == "charts" {
				return filepath.SkipDir
			}
			return nil
		}
		if own[rel] {
			return nil
		}
		data, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		files[rel] = data
		return nil
	})
	return files, err
}

func skip(d os.DirEntry) error {
	if d.IsDir() {
		return filepath.SkipDir
	}
	return nil
}

type stringList []string

func (s *stringList) String() string     { return strings.Join(*s, ",") }
func (s *stringList) Set(v string) error { *s = append(*s, v); return nil }

func readYAMLMap(path string) (map[string]interface{}, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	values := map[string]interface{}{}
	if err := yaml.Unmarshal(data, &values); err != nil {
		return nil, fmt.Errorf("%s: %v", path, err)
	}
	if values == nil {
		values = map[string]interface{}{}
	}
	return values, nil
}

// coalesce merges `override` into `base` as `helm -f` does: maps merge key by
// key, anything else replaces, and a null removes the key.
func coalesce(base, override map[string]interface{}) map[string]interface{} {
	out := map[string]interface{}{}
	for k, v := range base {
		out[k] = v
	}
	for k, v := range override {
		if v == nil {
			delete(out, k)
			continue
		}
		baseMap, baseIsMap := out[k].(map[string]interface{})
		overMap, overIsMap := v.(map[string]interface{})
		if baseIsMap && overIsMap {
			out[k] = coalesce(baseMap, overMap)
		} else {
			out[k] = v
		}
	}
	return out
}

func toYAML(v interface{}) string {
	data, err := yaml.Marshal(v)
	if err != nil {
		return ""
	}
	return strings.TrimSuffix(string(data), "\n")
}

func fromYAML(s string) map[string]interface{} {
	m := map[string]interface{}{}
	if err := yaml.Unmarshal([]byte(s), &m); err != nil {
		m["Error"] = err.Error()
	}
	return m
}

func toJSON(v interface{}) string {
	data, err := json.Marshal(v)
	if err != nil {
		return ""
	}
	return string(data)
}

func fromJSON(s string) map[string]interface{} {
	m := map[string]interface{}{}
	if err := json.Unmarshal([]byte(s), &m); err != nil {
		m["Error"] = err.Error()
	}
	return m
}

// funcs returns the function map; include and tpl need the parsed set,
// reached through `root` once it exists.
func funcs(root **template.Template) template.FuncMap {
	f := sprig.TxtFuncMap()
	delete(f, "env")
	delete(f, "expandenv")
	f["toYaml"] = toYAML
	f["fromYaml"] = fromYAML
	f["toJson"] = toJSON
	f["fromJson"] = fromJSON
	f["lookup"] = func(string, string, string, string) (map[string]interface{}, error) {
		return map[string]interface{}{}, nil
	}
	f["required"] = func(message string, v interface{}) (interface{}, error) {
		if v == nil {
			return nil, errors.New(message)
		}
		if s, ok := v.(string); ok && s == "" {
			return nil, errors.New(message)
		}
		return v, nil
	}
	f["include"] = func(name string, data interface{}) (string, error) {
		var buf bytes.Buffer
		if err := (*root).ExecuteTemplate(&buf, name, data); err != nil {
			return "", err
		}
		return buf.String(), nil
	}
	f["tpl"] = func(text string, data interface{}) (string, error) {
		clone, err := (*root).Clone()
		if err != nil {
			return "", err
		}
		t, err := clone.New("tpl").Parse(text)
		if err != nil {
			return "", fmt.Errorf("tpl: %v", err)
		}
		var buf bytes.Buffer
		if err := t.Execute(&buf, data); err != nil {
			return "", fmt.Errorf("tpl: %v", err)
		}
		return strings.ReplaceAll(buf.String(), "<no value>", ""), nil
	}
	return f
}

type manifest struct {
	Source string                 `json:"source"`
	Object map[string]interface{} `json:"object"`
}

var (
	docSeparator = regexp.MustCompile(`(?m)^---[ \t]*$`)
	releaseName  = regexp.MustCompile(`^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$`)
)

func run() error {
	var valueFiles stringList
	flag.Var(&valueFiles, "f", "values file merged over the chart's values.yaml (repeatable)")
	release := flag.String("name", "tandem", "release name")
	namespace := flag.String("namespace", "default", "release namespace")
	jsonOut := flag.String("json_out", "", "write the objects as JSON here")
	valuesOut := flag.String("values_out", "", "write the coalesced values as JSON here")
	notesOut := flag.String("notes_out", "", "write the rendered NOTES.txt here")
	kubeVersionFlag := flag.String("kube_version", "v1.30.0", "the cluster's Kubernetes version")
	flag.Parse()
	if flag.NArg() != 1 {
		return errors.New("usage: render [-f VALUES]... [--name N] [--namespace NS] CHART_DIR")
	}
	chartDir := flag.Arg(0)

	chartBytes, err := os.ReadFile(filepath.Join(chartDir, "Chart.yaml"))
	if err != nil {
		return err
	}
	var meta chartMetadata
	if err := yaml.UnmarshalStrict(chartBytes, &meta); err != nil {
		return fmt.Errorf("Chart.yaml: %v", err)
	}
	if meta.APIVersion != "v2" || meta.Name == "" || meta.Version == "" {
		return errors.New("Chart.yaml: apiVersion v2, name and version are required")
	}

	// Helm's rule for release names.
	if len(*release) > 53 || !releaseName.MatchString(*release) {
		return fmt.Errorf("release name %q: at most 53 characters, lower case letters, digits, '-' and '.'",
			*release)
	}
	kube, err := semver.NewVersion(*kubeVersionFlag)
	if err != nil {
		return fmt.Errorf("--kube_version: %v", err)
	}
	if meta.KubeVersion != "" {
		constraint, err := semver.NewConstraint(meta.KubeVersion)
		if err != nil {
			return fmt.Errorf("Chart.yaml kubeVersion: %v", err)
		}
		if !constraint.Check(kube) {
			return fmt.Errorf("chart requires kubeVersion %s, which is incompatible with Kubernetes %s",
				meta.KubeVersion, *kubeVersionFlag)
		}
	}

	values, err := readYAMLMap(filepath.Join(chartDir, "values.yaml"))
	if err != nil {
		return err
	}
	for _, path := range valueFiles {
		override, err := readYAMLMap(path)
		if err != nil {
			return err
		}
		values = coalesce(values, override)
	}
	if *valuesOut != "" {
		data, err := json.MarshalIndent(values, "", "  ")
		if err != nil {
			return err
		}
		if err := os.WriteFile(*valuesOut, data, 0o644); err != nil {
			return err
		}
	}

	var root *template.Template
	root = template.New(meta.Name).Funcs(funcs(&root)).Option("missingkey=zero")
	var names []string
	templatesDir := filepath.Join(chartDir, "templates")
	err = filepath.WalkDir(templatesDir, func(path string, d os.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		rel, _ := filepath.Rel(chartDir, path)
		name := meta.Name + "/" + filepath.ToSlash(rel)
		text, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		if _, err := root.New(name).Parse(string(text)); err != nil {
			return err
		}
		names = append(names, name)
		return nil
	})
	if err != nil {
		return err
	}
	sort.Strings(names)

	files, err := readFiles(chartDir)
	if err != nil {
		return err
	}
	top := map[string]interface{}{
		"Values": values,
		"Files":  files,
		"Chart":  meta,
		"Release": map[string]interface{}{
			"Name": *release, "Namespace": *namespace, "Service": "Helm",
			"IsInstall": true, "IsUpgrade": false, "Revision": 1,
		},
		"Capabilities": map[string]interface{}{
			"KubeVersion": kubeVersion{Version: "v" + kube.String(), GitVersion: "v" + kube.String(),
				Major: fmt.Sprint(kube.Major()), Minor: fmt.Sprint(kube.Minor())},
			"APIVersions": apiVersions{"v1", "apps/v1", "autoscaling/v2", "policy/v1",
				"networking.k8s.io/v1"},
		},
	}
	execute := func(name string) (string, error) {
		data := map[string]interface{}{}
		for k, v := range top {
			data[k] = v
		}
		data["Template"] = map[string]interface{}{"Name": name, "BasePath": meta.Name + "/templates"}
		var buf bytes.Buffer
		if err := root.ExecuteTemplate(&buf, name, data); err != nil {
			return "", err
		}
		return strings.ReplaceAll(buf.String(), "<no value>", ""), nil
	}

	var out strings.Builder
	var manifests []manifest
	for _, name := range names {
		base := filepath.Base(name)
		if strings.HasPrefix(base, "_") {
			continue
		}
		text, err := execute(name)
		if err != nil {
			return err
		}
		if base == "NOTES.txt" {
			if *notesOut != "" {
				if err := os.WriteFile(*notesOut, []byte(text), 0o644); err != nil {
					return err
				}
			}
			continue
		}
		for i, doc := range docSeparator.Split(text, -1) {
			object := map[string]interface{}{}
			if err := yaml.Unmarshal([]byte(doc), &object); err != nil {
				return fmt.Errorf("%s, document %d is not YAML: %v\n%s", name, i, err, doc)
			}
			if len(object) == 0 {
				continue // Comments or whitespace only, as Helm drops them.
			}
			fmt.Fprintf(&out, "---\n# Source: %s\n%s\n", name, strings.Trim(doc, "\n"))
			manifests = append(manifests, manifest{Source: name, Object: object})
		}
	}
	if *jsonOut != "" {
		data, err := json.MarshalIndent(manifests, "", "  ")
		if err != nil {
			return err
		}
		if err := os.WriteFile(*jsonOut, data, 0o644); err != nil {
			return err
		}
	}
	fmt.Print(out.String())
	return nil
}

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "render:", err)
		os.Exit(1)
	}
}
