// Package images builds the container images of idem with the local Docker
// engine only, from nothing pulled: a Debian base made with debootstrap and
// `docker import`, PostgreSQL 15 (and optionally Patroni) installed on it
// from Debian's packages, and the idem image FROM scratch holding static
// idemd, idemctl, etcd and etcdctl built on the host from the versions
// pinned in go.mod.
//
// Every image carries a content tag (a hash of what it is built from), and
// a build is skipped when the engine already has the image with that tag,
// so a second Build costs a few docker inspects. `idemctl images build`
// drives it; package idemtest and the container tests find the images by
// the same tags (Tags).
package images

import (
	"bytes"
	"context"
	"crypto/sha256"
	_ "embed"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"time"
)

// Repositories of the images, and their moving tags (the last build).
const (
	DebianRepo   = "idem/debian"
	PostgresRepo = "idem/postgres"
	PatroniRepo  = "idem/patroni"
	IdemRepo     = "idem/idem"
	GolangRepo   = "idem/golang"

	// DebianSuite is the Debian release of the base image.
	DebianSuite = "bookworm"
	// PostgresMajor is the PostgreSQL version of the store image.
	PostgresMajor = "15"
	// hostCABundle is the host's CA bundle, copied into the images.
	hostCABundle = "/etc/ssl/certs/ca-certificates.crt"
	// DefaultMirror is the Debian mirror debootstrap and apt use.
	DefaultMirror = "http://deb.debian.org/debian"
)

var (
	//go:embed idem.Dockerfile
	idemDockerfile []byte
	//go:embed postgres.Dockerfile
	postgresDockerfile []byte
	//go:embed postgres-entrypoint.sh
	postgresEntrypoint []byte
	//go:embed patroni.Dockerfile
	patroniDockerfile []byte
	//go:embed golang.Dockerfile
	golangDockerfile []byte
)

// Set is the content-tagged names of the images for one source tree.
type Set struct {
	Debian   string // idem/debian:bookworm
	Postgres string // idem/postgres:15-<hash>
	Patroni  string // idem/patroni:15-<hash>
	Idem     string // idem/idem:<hash>
	Golang   string // idem/golang:<go version>, the host's toolchain
}

// Tags returns the image names for the module rooted at root (the directory
// holding go.mod): the idem image's tag hashes the Go version, go.mod,
// go.sum and every non-test .go file; the PostgreSQL and Patroni tags hash
// their Dockerfiles and entrypoint.
func Tags(root string) (Set, error) {
	root, err := filepath.Abs(root)
	if err != nil {
		return Set{}, err
	}
	src, err := sourceHash(root)
	if err != nil {
		return Set{}, err
	}
	caBundle, _ := os.ReadFile(hostCABundle) // missing: Build says so
	pg := shortHash(postgresDockerfile, postgresEntrypoint, []byte(DebianSuite))
	debian, postgres := RunImages()
	return Set{
		Debian:   debian,
		Postgres: postgres,
		Patroni:  PatroniRepo + ":" + PostgresMajor + "-" + shortHash([]byte(pg), patroniDockerfile),
		Idem:     IdemRepo + ":" + src,
		Golang:   GolangRepo + ":" + strings.TrimPrefix(runtime.Version(), "go") + "-" + shortHash(golangDockerfile, caBundle),
	}, nil
}

// RunImages returns the names of the Debian base image and the PostgreSQL
// image, which need no source tree: the docker environment of the cluster
// package runs host-built binaries on the first and its store on the
// second.
func RunImages() (debian, postgres string) {
	return DebianRepo + ":" + DebianSuite,
		PostgresRepo + ":" + PostgresMajor + "-" + shortHash(postgresDockerfile, postgresEntrypoint, []byte(DebianSuite))
}

// ModuleRoot returns the repository's root: the closest directory at or
// above dir whose go.mod is the library module's (github.com/idemcoord/idem),
// so that the tooling modules nested in it (idemtest, cmd/idemctl, chaos)
// find the root their images are built from; else the closest directory
// holding any go.mod.
func ModuleRoot(dir string) (string, error) {
	dir, err := filepath.Abs(dir)
	if err != nil {
		return "", err
	}
	nearest := ""
	for d := dir; ; d = filepath.Dir(d) {
		if b, err := os.ReadFile(filepath.Join(d, "go.mod")); err == nil {
			if nearest == "" {
				nearest = d
			}
			if modulePath(b) == rootModule {
				return d, nil
			}
		}
		if filepath.Dir(d) == d {
			if nearest != "" {
				return nearest, nil
			}
			return "", fmt.Errorf("images: no go.mod at or above %s", dir)
		}
	}
}

// rootModule is the library module, at the repository's root.
const rootModule = "github.com/idemcoord/idem"

// modulePath is the path a go.mod's module directive names.
func modulePath(gomod []byte) string {
	for _, line := range strings.Split(string(gomod), "\n") {
		if rest, ok := strings.CutPrefix(strings.TrimSpace(line), "module "); ok {
			return strings.Trim(strings.TrimSpace(rest), `"`)
		}
	}
	return ""
}

func shortHash(parts ...[]byte) string {
	h := sha256.New()
	for _, p := range parts {
		fmt.Fprintf(h, "%d:", len(p))
		h.Write(p)
	}
	return hex.EncodeToString(h.Sum(nil))[:12]
}

// idemctlTags are the build tags of the image's idemctl: the operator build,
// the operator's commands without the chaos harness, the local cluster
// launcher and the benchmarks (and without toxiproxy, porcupine and
// testcontainers in the image).
const idemctlTags = "operator"

// sourceHash hashes what the idem image is built from: the Go version,
// go.mod, go.sum and every file (Go sources and embedded files, such as the
// migrations) of the module's packages that idemd and idemctl are built
// from, as `go list -deps` names them.
func sourceHash(root string) (string, error) {
	cmd := exec.Command("go", "list", "-deps", "-tags", idemctlTags, "-f",
		"{{if and .Module .Module.Main}}{{.Dir}}{{range .GoFiles}}\t{{.}}{{end}}{{range .EmbedFiles}}\t{{.}}{{end}}{{end}}",
		"./cmd/idemd", "./cmd/idemctl")
	cmd.Dir = root
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0", "GOOS=linux")
	var errOut bytes.Buffer
	cmd.Stderr = &errOut
	out, err := cmd.Output()
	if err != nil {
		return "", fmt.Errorf("images: go list: %w: %s", err, tail(errOut.Bytes(), 1000))
	}
	files := []string{filepath.Join(root, "go.mod"), filepath.Join(root, "go.sum")}
	for _, line := range strings.Split(string(out), "\n") {
		f := strings.Split(line, "\t")
		for _, name := range f[1:] {
			files = append(files, filepath.Join(f[0], name))
		}
	}
	slices.Sort(files)
	h := sha256.New()
	fmt.Fprintf(h, "go %s %s/%s\n", runtime.Version(), runtime.GOOS, runtime.GOARCH)
	fmt.Fprintf(h, "dockerfile %x\n", sha256.Sum256(idemDockerfile))
	fmt.Fprintf(h, "idemctl tags %s\n", idemctlTags)
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			return "", fmt.Errorf("images: hashing sources: %w", err)
		}
		rel, _ := filepath.Rel(root, f)
		fmt.Fprintf(h, "%s %d %x\n", filepath.ToSlash(rel), len(b), sha256.Sum256(b))
	}
	return hex.EncodeToString(h.Sum(nil))[:12], nil
}

// Options configures Build. The zero value builds the Debian base, the
// PostgreSQL image and the idem image of the module in the current
// directory.
type Options struct {
	// Root is the module root (default: found from the current directory).
	Root string
	// Mirror is the Debian mirror (default DefaultMirror).
	Mirror string
	// Patroni also builds the Patroni image on the PostgreSQL one.
	Patroni bool
	// Golang also builds idem/golang, the host's Go toolchain on the
	// Debian base: deploy/Dockerfile's default build image.
	Golang bool
	// Force rebuilds images the engine already has.
	Force bool
	// Docker is the docker command (default "docker"); Debootstrap likewise.
	Docker, Debootstrap string
	// Logger receives progress (default: discarded).
	Logger *slog.Logger
	// Output receives the build tools' output (default: discarded, but the
	// tail of a failing step's output is in its error).
	Output io.Writer
}

// Result is one image of a Build.
type Result struct {
	Image   string        // content-tagged name
	Built   bool          // false: the engine had it already
	Elapsed time.Duration // time spent on it, including the check
	Size    int64         // bytes, as the engine reports it
	Note    string        // what was left out, if anything
}

// Build builds the images missing from the engine, in dependency order, and
// tags each also with its moving tag (idem/idem:dev, idem/postgres:15,
// idem/patroni:15).
func Build(ctx context.Context, o Options) ([]Result, error) {
	if o.Root == "" {
		root, err := ModuleRoot(".")
		if err != nil {
			return nil, err
		}
		o.Root = root
	}
	if o.Mirror == "" {
		o.Mirror = DefaultMirror
	}
	if o.Docker == "" {
		o.Docker = "docker"
	}
	if o.Debootstrap == "" {
		o.Debootstrap = "debootstrap"
	}
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
	if o.Output == nil {
		o.Output = io.Discard
	}
	tags, err := Tags(o.Root)
	if err != nil {
		return nil, err
	}
	b := &builder{o: o, tags: tags}
	type step struct {
		image, moving string
		build         func(context.Context) (string, error)
	}
	steps := []step{
		{tags.Debian, "", b.debian},
		{tags.Postgres, PostgresRepo + ":" + PostgresMajor, b.postgres},
	}
	if o.Patroni {
		steps = append(steps, step{tags.Patroni, PatroniRepo + ":" + PostgresMajor, b.patroni})
	}
	if o.Golang {
		steps = append(steps, step{tags.Golang, GolangRepo + ":" + goMinor(), b.golang})
	}
	steps = append(steps, step{tags.Idem, IdemRepo + ":dev", b.idem})
	var out []Result
	for _, s := range steps {
		began := time.Now()
		r := Result{Image: s.image}
		if o.Force || !b.exists(ctx, s.image) {
			o.Logger.Info("images: building", "image", s.image)
			note, err := s.build(ctx)
			if err != nil {
				return out, fmt.Errorf("images: %s: %w", s.image, err)
			}
			r.Built, r.Note = true, note
		} else {
			o.Logger.Info("images: present, skipped", "image", s.image)
		}
		if s.moving != "" {
			if _, err := b.run(ctx, nil, o.Docker, "tag", s.image, s.moving); err != nil {
				return out, fmt.Errorf("images: tag %s: %w", s.moving, err)
			}
		}
		r.Elapsed = time.Since(began)
		r.Size = b.size(ctx, s.image)
		out = append(out, r)
	}
	return out, nil
}

type builder struct {
	o    Options
	tags Set
}

// exists reports whether the engine has image.
func (b *builder) exists(ctx context.Context, image string) bool {
	_, err := b.run(ctx, nil, b.o.Docker, "image", "inspect", "--format", "{{.Id}}", image)
	return err == nil
}

func (b *builder) size(ctx context.Context, image string) int64 {
	out, err := b.run(ctx, nil, b.o.Docker, "image", "inspect", "--format", "{{.Size}}", image)
	if err != nil {
		return 0
	}
	var n int64
	fmt.Sscan(strings.TrimSpace(out), &n)
	return n
}

// run runs a command, its output copied to Output, and returns its
// standard output; a failure's error holds the tail of its output.
func (b *builder) run(ctx context.Context, cmdf func(*exec.Cmd), name string, args ...string) (string, error) {
	cmd := exec.CommandContext(ctx, name, args...)
	var stdout, combined bytes.Buffer
	cmd.Stdout = io.MultiWriter(&stdout, &combined)
	cmd.Stderr = &combined
	if cmdf != nil {
		cmdf(cmd)
	}
	if args[0] != "image" { // inspects are checks, not build output
		cmd.Stdout = io.MultiWriter(cmd.Stdout, b.o.Output)
		cmd.Stderr = io.MultiWriter(cmd.Stderr, b.o.Output)
	}
	if err := cmd.Run(); err != nil {
		return stdout.String(), fmt.Errorf("%s %s: %w: %s", name, strings.Join(args, " "), err, tail(combined.Bytes(), 2000))
	}
	return stdout.String(), nil
}

func tail(b []byte, n int) string {
	b = bytes.TrimSpace(b)
	if len(b) > n {
		b = b[len(b)-n:]
	}
	return string(b)
}

// dockerBuild builds dir with the classic builder: this engine has no
// BuildKit front end to pull, and the images need nothing it adds.
func (b *builder) dockerBuild(ctx context.Context, dir string, args ...string) error {
	all := append([]string{"build", "--network", "host"}, args...)
	all = append(all, dir)
	_, err := b.run(ctx, func(c *exec.Cmd) { c.Env = append(os.Environ(), "DOCKER_BUILDKIT=0") }, b.o.Docker, all...)
	return err
}

// debian makes the base image: debootstrap a minimal bookworm and import it.
func (b *builder) debian(ctx context.Context) (string, error) {
	if _, err := exec.LookPath(b.o.Debootstrap); err != nil {
		return "", fmt.Errorf("debootstrap is not installed (Debian: apt-get install debootstrap): %w", err)
	}
	dir, err := os.MkdirTemp("", "idem-debootstrap-")
	if err != nil {
		return "", err
	}
	defer os.RemoveAll(dir)
	rootfs := filepath.Join(dir, "rootfs")
	if _, err := b.run(ctx, nil, b.o.Debootstrap, "--variant=minbase", DebianSuite, rootfs, b.o.Mirror); err != nil {
		return "", err
	}
	// The package lists debootstrap fetched are stale by the time an image
	// uses them; apt-get update fetches them again.
	_ = os.RemoveAll(filepath.Join(rootfs, "var/lib/apt/lists"))
	_ = os.MkdirAll(filepath.Join(rootfs, "var/lib/apt/lists/partial"), 0o755)
	_ = os.RemoveAll(filepath.Join(rootfs, "var/cache/apt/archives"))
	_ = os.MkdirAll(filepath.Join(rootfs, "var/cache/apt/archives/partial"), 0o755)
	tar := exec.CommandContext(ctx, "tar", "--numeric-owner", "-C", rootfs, "-c", ".")
	imp := exec.CommandContext(ctx, b.o.Docker, "import",
		"--change", "ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
		"--change", "CMD [\"/bin/bash\"]",
		"-", b.tags.Debian)
	pipe, err := tar.StdoutPipe()
	if err != nil {
		return "", err
	}
	imp.Stdin = pipe
	var errOut bytes.Buffer
	tar.Stderr = &errOut
	imp.Stdout, imp.Stderr = b.o.Output, &errOut
	if err := tar.Start(); err != nil {
		return "", fmt.Errorf("tar: %w", err)
	}
	ierr := imp.Run()
	terr := tar.Wait()
	if err := errors.Join(ierr, terr); err != nil {
		return "", fmt.Errorf("docker import: %w: %s", err, tail(errOut.Bytes(), 2000))
	}
	return "", nil
}

// postgres installs PostgreSQL 15 on the base image.
func (b *builder) postgres(ctx context.Context) (string, error) {
	dir, err := os.MkdirTemp("", "idem-postgres-")
	if err != nil {
		return "", err
	}
	defer os.RemoveAll(dir)
	if err := os.WriteFile(filepath.Join(dir, "Dockerfile"), postgresDockerfile, 0o644); err != nil {
		return "", err
	}
	if err := os.WriteFile(filepath.Join(dir, "postgres-entrypoint.sh"), postgresEntrypoint, 0o755); err != nil {
		return "", err
	}
	return "", b.dockerBuild(ctx, dir, "--build-arg", "BASE_IMAGE="+b.tags.Debian, "-t", b.tags.Postgres)
}

// patroni installs Patroni on the PostgreSQL image.
func (b *builder) patroni(ctx context.Context) (string, error) {
	dir, err := os.MkdirTemp("", "idem-patroni-")
	if err != nil {
		return "", err
	}
	defer os.RemoveAll(dir)
	if err := os.WriteFile(filepath.Join(dir, "Dockerfile"), patroniDockerfile, 0o644); err != nil {
		return "", err
	}
	return "", b.dockerBuild(ctx, dir, "--build-arg", "BASE_IMAGE="+b.tags.Postgres, "-t", b.tags.Patroni)
}

// idem builds the binaries statically on the host and copies them, with the
// host's CA certificates, into an image FROM scratch.
func (b *builder) idem(ctx context.Context) (string, error) {
	dir, err := os.MkdirTemp("", "idem-image-")
	if err != nil {
		return "", err
	}
	defer os.RemoveAll(dir)
	bin := filepath.Join(dir, "bin")
	for _, d := range []string{bin, "etc/ssl/certs", "var/lib/idem", "var/lib/etcd", "tmp"} {
		if err := os.MkdirAll(filepath.Join(dir, d), 0o755); err != nil && d != bin {
			return "", err
		}
	}
	if err := os.Chmod(filepath.Join(dir, "tmp"), 0o1777); err != nil {
		return "", err
	}
	goEnv := func(c *exec.Cmd) {
		c.Dir = b.o.Root
		c.Env = append(os.Environ(), "CGO_ENABLED=0", "GOOS=linux", "GOFLAGS=-trimpath -buildvcs=false")
	}
	if _, err := b.run(ctx, goEnv, "go", "build", "-o", bin+"/", "./cmd/idemd"); err != nil {
		return "", err
	}
	if _, err := b.run(ctx, goEnv, "go", "build", "-tags", idemctlTags, "-o", bin+"/", "./cmd/idemctl"); err != nil {
		return "", err
	}
	if _, err := b.run(ctx, goEnv, "go", "build", "-o", filepath.Join(bin, "etcd"), "go.etcd.io/etcd/server/v3"); err != nil {
		return "", err
	}
	note := ""
	if err := b.etcdctl(ctx, goEnv, filepath.Join(bin, "etcdctl")); err != nil {
		note = "etcdctl left out: " + err.Error()
		b.o.Logger.Warn("images: "+note, "image", b.tags.Idem)
	}
	ca, err := os.ReadFile(hostCABundle)
	if err != nil {
		return "", fmt.Errorf("CA certificates (Debian: apt-get install ca-certificates): %w", err)
	}
	files := map[string]string{
		"etc/ssl/certs/ca-certificates.crt": string(ca),
		"etc/passwd":                        "root:x:0:0:root:/root:/sbin/nologin\nidem:x:65532:65532:idem:/var/lib/idem:/sbin/nologin\n",
		"etc/group":                         "root:x:0:\nidem:x:65532:\n",
		"etc/nsswitch.conf":                 "hosts: files dns\n",
		"Dockerfile":                        string(idemDockerfile) + "LABEL org.idemcoord.source=\"" + strings.TrimPrefix(b.tags.Idem, IdemRepo+":") + "\"\n",
		".dockerignore":                     "Dockerfile\n.dockerignore\n",
	}
	for name, content := range files {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(content), 0o644); err != nil {
			return "", err
		}
	}
	// Empty directories are not kept by COPY without a file in them.
	for _, d := range []string{"var/lib/idem", "var/lib/etcd"} {
		if err := os.WriteFile(filepath.Join(dir, d, ".keep"), nil, 0o644); err != nil {
			return "", err
		}
	}
	if err := os.Chmod(filepath.Join(dir, "var/lib/etcd"), 0o700); err != nil {
		return "", err
	}
	return note, b.dockerBuild(ctx, dir, "-t", b.tags.Idem)
}

// etcdctl builds etcdctl at the version of the etcd server in go.mod. It
// is a module of its own with replace directives, which `go install
// pkg@version` refuses; building it as a dependency of a throwaway module
// works and ignores them.
func (b *builder) etcdctl(ctx context.Context, goEnv func(*exec.Cmd), out string) error {
	v, err := b.run(ctx, goEnv, "go", "list", "-m", "-f", "{{.Version}}", "go.etcd.io/etcd/server/v3")
	if err != nil {
		return err
	}
	v = strings.TrimSpace(v)
	tmp, err := os.MkdirTemp("", "idem-etcdctl-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(tmp)
	inTmp := func(c *exec.Cmd) {
		goEnv(c)
		c.Dir = tmp
		c.Env = append(c.Env, "GOFLAGS=-trimpath -buildvcs=false -mod=mod")
	}
	for _, args := range [][]string{
		{"mod", "init", "etcdtools"},
		{"get", "go.etcd.io/etcd/etcdctl/v3@" + v},
		{"build", "-o", out, "go.etcd.io/etcd/etcdctl/v3"},
	} {
		if _, err := b.run(ctx, inTmp, "go", args...); err != nil {
			return err
		}
	}
	return nil
}

// goMinor is the Go version without its patch number ("1.26").
func goMinor() string {
	v := strings.TrimPrefix(runtime.Version(), "go")
	if parts := strings.SplitN(v, ".", 3); len(parts) >= 2 {
		return parts[0] + "." + parts[1]
	}
	return v
}

// golang copies the host's GOROOT onto the Debian base.
func (b *builder) golang(ctx context.Context) (string, error) {
	goroot, err := b.run(ctx, nil, "go", "env", "GOROOT")
	if err != nil {
		return "", err
	}
	dir, err := os.MkdirTemp("", "idem-golang-")
	if err != nil {
		return "", err
	}
	defer os.RemoveAll(dir)
	if err := os.WriteFile(filepath.Join(dir, "Dockerfile"), golangDockerfile, 0o644); err != nil {
		return "", err
	}
	ca, err := os.ReadFile(hostCABundle)
	if err != nil {
		return "", fmt.Errorf("CA certificates (Debian: apt-get install ca-certificates): %w", err)
	}
	if err := os.WriteFile(filepath.Join(dir, "ca-certificates.crt"), ca, 0o644); err != nil {
		return "", err
	}
	if _, err := b.run(ctx, nil, "cp", "-a", strings.TrimSpace(goroot), filepath.Join(dir, "go")); err != nil {
		return "", err
	}
	return "", b.dockerBuild(ctx, dir, "--build-arg", "BASE_IMAGE="+b.tags.Debian, "-t", b.tags.Golang)
}
