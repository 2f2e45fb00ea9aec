package main

import (
	"context"
	"strings"
	"testing"

	"github.com/idemcoord/idem/internal/pgserver"
)

// emptyDatabase starts a throwaway PostgreSQL with an empty database,
// stopped when the test ends, and returns the database's URL.
func emptyDatabase(t *testing.T) string {
	t.Helper()
	ctx := context.Background()
	srv, err := pgserver.Start(ctx, pgserver.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = srv.Stop(context.Background()) })
	url, err := srv.CreateDatabase(ctx, "idem_migrate")
	if err != nil {
		t.Fatal(err)
	}
	return url
}

// TestMigrateStatus: migrate status lists each set's applied and pending
// versions, one line each, before and after migrate applies them.
func TestMigrateStatus(t *testing.T) {
	url := emptyDatabase(t)
	status := func(wantLines ...string) {
		t.Helper()
		code, out := idemctlRun(t, map[string]string{"IDEM_DATABASE_URL": url}, "migrate", "status")
		if code != 0 {
			t.Fatalf("idemctl migrate status: exit %d\n%s", code, out)
		}
		if got := strings.Split(strings.TrimSuffix(out, "\n"), "\n"); strings.Join(got, "\n") != strings.Join(wantLines, "\n") {
			t.Errorf("idemctl migrate status:\n%s\nwant:\n%s", out, strings.Join(wantLines, "\n"))
		}
	}
	status(
		"engine    applied none; pending 0001 0004 0006 0007 0008 0010 0011 0012",
		"payments  applied none; pending 0002 0003 0005 0009",
	)
	if code, out := idemctlRun(t, nil, "migrate", "--database-url", url); code != 0 || out != "migrations applied\n" {
		t.Fatalf("idemctl migrate: exit %d\n%s", code, out)
	}
	status(
		"engine    applied 0001 0004 0006 0007 0008 0010 0011 0012; pending none",
		"payments  applied 0002 0003 0005 0009; pending none",
	)
	for _, args := range [][]string{
		{"migrate", "status"},
		{"migrate", "--database-url", url, "status"},
		{"migrate", "apply", "--database-url", url},
	} {
		if code, out := idemctlRun(t, nil, args...); code != 2 {
			t.Errorf("idemctl %q: exit %d, want 2 (usage)\n%s", args, code, out)
		}
	}
}
