package procfs

import (
	"os"
	"os/exec"
	"slices"
	"testing"
)

func TestChildrenAndAlive(t *testing.T) {
	cmd := exec.Command("sleep", "30")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	pid := cmd.Process.Pid
	if !slices.Contains(Children(os.Getpid()), pid) {
		t.Errorf("Children(self) = %v, want it to contain %d", Children(os.Getpid()), pid)
	}
	if !Alive(pid) {
		t.Error("a running child is not Alive")
	}
	_ = cmd.Process.Kill()
	_ = cmd.Wait()
	if Alive(pid) {
		t.Error("a reaped child is Alive")
	}
	if slices.Contains(Children(os.Getpid()), pid) {
		t.Error("a reaped child is still listed")
	}
}
