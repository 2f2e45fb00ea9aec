//go:build !operator

package main

import (
	"bytes"
	"context"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/idemcoord/idem/chaos"
)

// TestChaosList prints every scenario of the catalogue, one per line.
func TestChaosList(t *testing.T) {
	var stdout, stderr bytes.Buffer
	env := &Env{Stdout: &stdout, Stderr: &stderr, Getenv: func(string) string { return "" }}
	if code := Run(context.Background(), []string{"chaos", "list"}, env); code != 0 {
		t.Fatalf("exit %d; stderr:\n%s", code, stderr.String())
	}
	lines := strings.Split(strings.TrimSpace(stdout.String()), "\n")
	cat := chaos.Catalogue()
	if len(lines) != len(cat) {
		t.Fatalf("%d lines, want %d:\n%s", len(lines), len(cat), stdout.String())
	}
	for i, s := range cat {
		name, desc, _ := strings.Cut(lines[i], " ")
		if name != s.Name || strings.TrimSpace(desc) != s.Description {
			t.Errorf("line %d: %q, want %s and its description", i, lines[i], s.Name)
		}
	}
}

// TestChaosUsage checks the command-line mistakes "chaos" refuses with exit
// status 2, before starting anything.
func TestChaosUsage(t *testing.T) {
	for _, args := range [][]string{
		{"chaos"},
		{"chaos", "nope"},
		{"chaos", "list", "extra"},
		{"chaos", "run"},
		{"chaos", "run", "--scenario", "no-such-scenario"},
		{"chaos", "run", "--scenario", "completed-replay,nope"},
		{"chaos", "run", "--scenario", "all", "--break", "off-by-one"},
		{"chaos", "run", "--scenario", "all", "--duration", "1s"},
		{"chaos", "run", "--scenario", "all", "--clients", "0"},
		{"chaos", "run", "--scenario", "all", "--regions", "solo"},
		{"chaos", "run", "--scenario", "all", "extra"},
		{"chaos", "run", "--no-such-flag"},
	} {
		var stderr bytes.Buffer
		env := &Env{Stdout: io.Discard, Stderr: &stderr, Getenv: func(string) string { return "" }}
		if code := Run(context.Background(), args, env); code != 2 {
			t.Errorf("%q: exit %d, want 2; stderr:\n%s", args, code, stderr.String())
		}
	}
}

// TestChaosOptions checks how flags (and IDEM_* variables) become options.
func TestChaosOptions(t *testing.T) {
	env := &Env{Stdout: io.Discard, Stderr: io.Discard, Getenv: func(k string) string {
		return map[string]string{"IDEM_SEED": "42"}[k]
	}}
	opts, err := chaosOptions([]string{"--scenario", "stale-owner", "--break", "no-fencing", "--duration", "12s",
		"--clients", "3", "--regions", "a, b", "--out", "/tmp/x", "--min-rate", "2", "--tls"}, env)
	if err != nil {
		t.Fatal(err)
	}
	if opts.Scenario != "stale-owner" || opts.Break != "no-fencing" || opts.Duration.String() != "12s" || opts.Clients != 3 ||
		strings.Join(opts.Regions, ",") != "a,b" || opts.OutDir != "/tmp/x" || opts.Seed != 42 || opts.MinRate != 2 || !opts.TLS {
		t.Errorf("options %+v", opts)
	}
}

// TestChaosRunMissingBinary fails (exit 1) without starting a cluster when
// idemd does not exist.
func TestChaosRunMissingBinary(t *testing.T) {
	var stderr bytes.Buffer
	env := &Env{Stdout: io.Discard, Stderr: &stderr, Getenv: func(string) string { return "" }}
	dir := t.TempDir()
	missing := filepath.Join(dir, "idemd")
	etcd := filepath.Join(dir, "etcd")
	if err := os.WriteFile(etcd, []byte("#!/bin/sh\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	code := Run(context.Background(), []string{"chaos", "run", "--scenario", "completed-replay", "--idemd", missing, "--etcd", etcd, "--out", dir}, env)
	if code != 1 || !strings.Contains(stderr.String(), "binary") {
		t.Errorf("exit %d, want 1; stderr:\n%s", code, stderr.String())
	}
}

// TestChaosRunNeedsFailpointsBuild: chaos run refuses an idemd built without
// -tags failpoints and says how to build one.
func TestChaosRunNeedsFailpointsBuild(t *testing.T) {
	var stderr bytes.Buffer
	env := &Env{Stdout: io.Discard, Stderr: &stderr, Getenv: func(string) string { return "" }}
	dir := t.TempDir()
	idemd, etcd := filepath.Join(dir, "idemd"), filepath.Join(dir, "etcd")
	for _, p := range []string{idemd, etcd} {
		if err := os.WriteFile(p, []byte("#!/bin/sh\n"), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	code := Run(context.Background(), []string{"chaos", "run", "--scenario", "completed-replay", "--idemd", idemd, "--etcd", etcd, "--out", dir}, env)
	if code != 1 || !strings.Contains(stderr.String(), "built without -tags failpoints") || !strings.Contains(stderr.String(), chaos.BuildCommand) {
		t.Errorf("exit %d, want 1 naming the failpoints build; stderr:\n%s", code, stderr.String())
	}
}
