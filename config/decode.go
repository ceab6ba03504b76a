package config

import (
	"fmt"
	"math"
	"reflect"
	"sort"
	"strconv"
	"strings"
	"time"

	"gopkg.in/yaml.v3"
)

// ignored are kube-proxy's fields that svcproxy accepts and ignores, with
// why: a kube-proxy configuration file loads unchanged, with a warning each.
var ignored = map[string]string{
	"featureGates":                        "svcproxy has no feature gates",
	"logging":                             "use --log-level and --log-format",
	"bindAddressHardFail":                 "svcproxy always fails when it cannot bind",
	"enableProfiling":                     "not supported",
	"showHiddenMetricsForVersion":         "svcproxy hides no metrics",
	"nftables":                            "svcproxy's nftables mode uses the iptables section",
	"winkernel":                           "svcproxy runs on Linux only",
	"windowsRunAsService":                 "svcproxy runs on Linux only",
	"detectLocalMode":                     "svcproxy does not masquerade by local-traffic detection",
	"detectLocal":                         "svcproxy does not masquerade by local-traffic detection",
	"portRange":                           "svcproxy has no port range",
	"iptables.localhostNodePorts":         "NodePorts on localhost are not served",
	"clientConnection.acceptContentTypes": "svcproxy accepts protobuf and JSON",
}

var durationType = reflect.TypeOf(Duration(0))

// decoder walks a YAML tree into a struct by yaml tags, strictly, gathering
// every problem with its line and field path.
type decoder struct {
	errs     []error
	warnings []string
}

func (d *decoder) errorf(n *yaml.Node, path, format string, args ...any) {
	if path == "" {
		path = "(top level)"
	}
	d.errs = append(d.errs, fmt.Errorf("line %d: %s: %s", n.Line, path, fmt.Sprintf(format, args...)))
}

func join(path, key string) string {
	if path == "" {
		return key
	}
	return path + "." + key
}

// decode sets v (a pointer) from n.
func (d *decoder) decode(n *yaml.Node, v any, path string) {
	d.value(n, reflect.ValueOf(v).Elem(), path)
}

func (d *decoder) value(n *yaml.Node, v reflect.Value, path string) {
	if n.Kind == yaml.AliasNode {
		d.errorf(n, path, "YAML aliases are not supported")
		return
	}
	if n.Kind == yaml.ScalarNode && n.Tag == "!!null" {
		return // null: keep the default
	}
	switch {
	case v.Type() == durationType:
		s, ok := d.scalar(n, path)
		if !ok {
			return
		}
		dur, err := time.ParseDuration(s)
		if err != nil {
			d.errorf(n, path, "want a duration such as 30s or 1m30s, got %q", s)
			return
		}
		v.SetInt(int64(dur))
		return
	case v.Kind() == reflect.Pointer:
		elem := reflect.New(v.Type().Elem())
		d.value(n, elem.Elem(), path)
		v.Set(elem)
		return
	}
	switch v.Kind() {
	case reflect.Struct:
		d.structValue(n, v, path)
	case reflect.Slice:
		if n.Kind != yaml.SequenceNode {
			d.errorf(n, path, "want a list, got %s", describe(n))
			return
		}
		out := reflect.MakeSlice(v.Type(), len(n.Content), len(n.Content))
		for i, item := range n.Content {
			d.value(item, out.Index(i), fmt.Sprintf("%s[%d]", path, i))
		}
		v.Set(out)
	case reflect.String:
		if s, ok := d.scalar(n, path); ok {
			if n.Tag != "!!str" {
				d.errorf(n, path, "want a string, got %s (quote it)", describe(n))
				return
			}
			v.SetString(s)
		}
	case reflect.Bool:
		if s, ok := d.scalar(n, path); ok {
			b, err := strconv.ParseBool(s)
			if err != nil || n.Tag != "!!bool" {
				d.errorf(n, path, "want true or false, got %q", s)
				return
			}
			v.SetBool(b)
		}
	case reflect.Int, reflect.Int32, reflect.Int64:
		if s, ok := d.scalar(n, path); ok {
			i, err := strconv.ParseInt(s, 0, v.Type().Bits())
			if err != nil || n.Tag != "!!int" {
				d.errorf(n, path, "want an integer (%d bits), got %q", v.Type().Bits(), s)
				return
			}
			v.SetInt(i)
		}
	case reflect.Uint16, reflect.Uint32:
		if s, ok := d.scalar(n, path); ok {
			u, err := strconv.ParseUint(s, 0, v.Type().Bits())
			if err != nil || n.Tag != "!!int" {
				d.errorf(n, path, "want an integer in 0-%d, got %q", uint64(1)<<v.Type().Bits()-1, s)
				return
			}
			v.SetUint(u)
		}
	case reflect.Float32:
		if s, ok := d.scalar(n, path); ok {
			f, err := strconv.ParseFloat(s, 32)
			if err != nil || (n.Tag != "!!int" && n.Tag != "!!float") || math.IsNaN(f) || math.IsInf(f, 0) {
				d.errorf(n, path, "want a number, got %q", s)
				return
			}
			v.SetFloat(f)
		}
	default:
		panic(fmt.Sprintf("config: no decoding for %v", v.Type())) // programmer error: a new field type
	}
}

func (d *decoder) scalar(n *yaml.Node, path string) (string, bool) {
	if n.Kind != yaml.ScalarNode {
		d.errorf(n, path, "want a single value, got %s", describe(n))
		return "", false
	}
	return n.Value, true
}

func describe(n *yaml.Node) string {
	switch n.Kind {
	case yaml.MappingNode:
		return "a mapping"
	case yaml.SequenceNode:
		return "a list"
	case yaml.ScalarNode:
		return fmt.Sprintf("%q", n.Value)
	}
	return "something else"
}

func (d *decoder) structValue(n *yaml.Node, v reflect.Value, path string) {
	if n.Kind != yaml.MappingNode {
		d.errorf(n, path, "want a mapping, got %s", describe(n))
		return
	}
	fields := map[string]int{}
	var names []string
	t := v.Type()
	for i := 0; i < t.NumField(); i++ {
		name, _, _ := strings.Cut(t.Field(i).Tag.Get("yaml"), ",")
		if name == "" || name == "-" {
			continue
		}
		fields[name] = i
		names = append(names, name)
	}
	seen := map[string]bool{}
	for i := 0; i+1 < len(n.Content); i += 2 {
		k, val := n.Content[i], n.Content[i+1]
		key := k.Value
		fpath := join(path, key)
		if seen[key] {
			d.errorf(k, fpath, "given more than once")
			continue
		}
		seen[key] = true
		idx, ok := fields[key]
		if !ok {
			if why, known := ignored[fpath]; known {
				d.warnings = append(d.warnings, fmt.Sprintf("line %d: %s: kube-proxy field ignored: %s", k.Line, fpath, why))
				continue
			}
			sort.Strings(names)
			d.errorf(k, fpath, "unknown field (known here: %s)", strings.Join(names, ", "))
			continue
		}
		d.value(val, v.Field(idx), fpath)
	}
}
