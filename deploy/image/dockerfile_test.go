package main

import (
	"bufio"
	"encoding/json"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/moby/patternmatcher"
	"github.com/moby/patternmatcher/ignorefile"
)

// TestDockerfileGoVersion: deploy/Dockerfile builds with go.mod's Go.
func TestDockerfileGoVersion(t *testing.T) {
	mod, err := os.ReadFile("../../go.mod")
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`(?m)^go (\S+)$`).FindSubmatch(mod)
	if m == nil {
		t.Fatal("go.mod has no go line")
	}
	goVersion := string(m[1])
	if tc := regexp.MustCompile(`(?m)^toolchain go(\S+)$`).FindSubmatch(mod); tc != nil {
		goVersion = string(tc[1])
	}
	df, err := os.ReadFile("../Dockerfile")
	if err != nil {
		t.Fatal(err)
	}
	from := regexp.MustCompile(`(?m)^FROM golang:(\S+?)(-\S+)? `).FindSubmatch(df)
	if from == nil {
		t.Fatal("deploy/Dockerfile: no FROM golang:<version> stage")
	}
	if string(from[1]) != goVersion {
		t.Errorf("deploy/Dockerfile builds with golang:%s, go.mod says go %s", from[1], goVersion)
	}
}

// TestDockerignore: the Docker build context holds every file the
// Dockerfile's go build reads (the main module's sources of cmd/svcproxy
// and what they embed, go.mod, go.sum) and none of what it must not carry.
func TestDockerignore(t *testing.T) {
	f, err := os.Open("../../.dockerignore")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	patterns, err := ignorefile.ReadAll(f)
	if err != nil {
		t.Fatal(err)
	}
	pm, err := patternmatcher.New(patterns)
	if err != nil {
		t.Fatal(err)
	}
	root, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	excluded := func(rel string) bool {
		ex, err := pm.MatchesOrParentMatches(filepath.ToSlash(rel))
		if err != nil {
			t.Fatal(err)
		}
		return ex
	}

	needed := []string{"go.mod", "go.sum"}
	out, err := exec.Command("go", "list", "-deps", "-json=Dir,Module,GoFiles,EmbedFiles,SFiles", "github.com/svcproxy/svcproxy/cmd/svcproxy").Output()
	if err != nil {
		t.Fatalf("go list: %v", err)
	}
	dec := json.NewDecoder(strings.NewReader(string(out)))
	for {
		var p struct {
			Dir                         string
			Module                      *struct{ Path string }
			GoFiles, EmbedFiles, SFiles []string
		}
		if err := dec.Decode(&p); err == io.EOF {
			break
		} else if err != nil {
			t.Fatal(err)
		}
		if p.Module == nil || p.Module.Path != "github.com/svcproxy/svcproxy" {
			continue
		}
		for _, files := range [][]string{p.GoFiles, p.EmbedFiles, p.SFiles} {
			for _, file := range files {
				rel, err := filepath.Rel(root, filepath.Join(p.Dir, file))
				if err != nil {
					t.Fatal(err)
				}
				needed = append(needed, rel)
			}
		}
	}
	if len(needed) < 20 {
		t.Fatalf("go list found only %d files cmd/svcproxy is built from", len(needed))
	}
	for _, file := range needed {
		if excluded(file) {
			t.Errorf(".dockerignore leaves out %s, which building cmd/svcproxy reads", file)
		}
	}

	// Every line of .gitignore (build output, results, test binaries)
	// stays out too, and the repository's history and bulky artefacts.
	mustNot := []string{".git/HEAD", "bin/svcproxy", "results/2026/results.md", "docs/bench/results.md", "test/go.mod",
		"forwarder/forwarder.test", "cpu.prof", "svcproxy", "source/file/testdata/fuzz/FuzzParse/x"}
	gi, err := os.Open("../../.gitignore")
	if err != nil {
		t.Fatal(err)
	}
	defer gi.Close()
	sc := bufio.NewScanner(gi)
	for sc.Scan() {
		line := strings.Trim(strings.TrimSpace(sc.Text()), "/")
		if line != "" && !strings.HasPrefix(line, "#") {
			mustNot = append(mustNot, strings.ReplaceAll(line, "*", "x"))
		}
	}
	for _, file := range mustNot {
		if !excluded(file) {
			t.Errorf(".dockerignore lets %s into the build context", file)
		}
	}
}
