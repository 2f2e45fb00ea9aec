//go:build !operator

package main

import (
	"context"
	"flag"
	"fmt"
	"log/slog"
	"text/tabwriter"
	"time"

	"github.com/idemcoord/idem/internal/cli"
	"github.com/idemcoord/idem/internal/images"
)

// runImages builds (images build) or names (images tags) the container
// images, with the local Docker engine only: nothing is pulled.
func runImages(ctx context.Context, args []string, env *Env) error {
	if len(args) == 0 {
		return usageError{fmt.Errorf("usage: idemctl images build [--patroni] [--golang] [--force] [--mirror URL] [-v] | images tags")}
	}
	switch args[0] {
	case "build":
		return runImagesBuild(ctx, args[1:], env)
	case "tags":
		root, err := images.ModuleRoot(".")
		if err != nil {
			return err
		}
		tags, err := images.Tags(root)
		if err != nil {
			return err
		}
		fmt.Fprintf(env.Stdout, "%s\n%s\n%s\n%s\n%s\n", tags.Debian, tags.Postgres, tags.Patroni, tags.Golang, tags.Idem)
		return nil
	default:
		return usageError{fmt.Errorf("unknown images command %q (build, tags)", args[0])}
	}
}

func runImagesBuild(ctx context.Context, args []string, env *Env) error {
	fs := flag.NewFlagSet("images build", flag.ContinueOnError)
	fs.SetOutput(env.Stderr)
	patroni := fs.Bool("patroni", false, "also build the Patroni image (idem/patroni) on the PostgreSQL one")
	golang := fs.Bool("golang", false, "also build idem/golang (this machine's Go toolchain on the Debian base), deploy/Dockerfile's build image")
	force := fs.Bool("force", false, "rebuild images the engine already has")
	mirror := fs.String("mirror", images.DefaultMirror, "Debian mirror for debootstrap and apt")
	verbose := fs.Bool("v", false, "show the output of debootstrap, go build and docker build")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if err := cli.ApplyEnv(fs, env.Getenv); err != nil {
		return usageError{err}
	}
	root, err := images.ModuleRoot(".")
	if err != nil {
		return fmt.Errorf("run it from the idem module (a directory holding its go.mod): %w", err)
	}
	o := images.Options{
		Root:    root,
		Mirror:  *mirror,
		Patroni: *patroni,
		Golang:  *golang,
		Force:   *force,
		Logger:  slog.New(slog.NewTextHandler(env.Stderr, nil)),
	}
	if *verbose {
		o.Output = env.Stderr
	}
	began := time.Now()
	res, err := images.Build(ctx, o)
	w := tabwriter.NewWriter(env.Stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(w, "IMAGE\tBUILT\tTIME\tSIZE\tNOTE")
	for _, r := range res {
		fmt.Fprintf(w, "%s\t%v\t%s\t%.1f MB\t%s\n", r.Image, r.Built, r.Elapsed.Round(100*time.Millisecond), float64(r.Size)/1e6, r.Note)
	}
	_ = w.Flush()
	if err != nil {
		return err
	}
	fmt.Fprintf(env.Stdout, "images ready in %s\n", time.Since(began).Round(100*time.Millisecond))
	return nil
}
