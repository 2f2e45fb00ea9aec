package chaos

import (
	"cmp"
	"fmt"
	"hash/fnv"
	"slices"
	"sort"
	"time"

	"github.com/anishathalye/porcupine"
)

// The linearizability model: each scoped key (tenant, key, epoch) is a
// register that starts unbound, is bound to the first command that claims
// it, and is then answered once; every later call of that command replays
// the answer and a call of another command is refused.
//
//	state {cmd, answer}: cmd "" = unbound; answer "" = not answered yet,
//	"*" = answered with something no call has observed yet.
//
// Calls whose effect is unknown (a timeout, a 5xx, 202 PAYMENT_OUTCOME_UNKNOWN)
// are non-deterministic: they may have done nothing, bound the key, or bound
// it and (later, through recovery) answered it; their return time is taken
// as infinite, since recovery may complete them long after the client gave
// up.

// keyState is one state of a key's register.
type keyState struct {
	Cmd    string
	Answer string
}

// unknownAnswer is keyState.Answer for an answer given but not yet seen.
const unknownAnswer = "*"

// modelInput is an operation's input.
type modelInput struct {
	Cmd    string
	Region string
	Desc   string
}

// modelOutput is an operation's output.
type modelOutput struct {
	Class    string
	Answer   string // answer hash, for ClassFinal
	Replayed bool
	Desc     string
}

// newModel returns the register model. With reexecuteSameAnswer, a fresh
// (not replayed) final answer is also accepted after the key was answered,
// provided it is the same answer: a new home region that reconciles a key
// its old region answered, after a failover, executes it again with the same
// derived identity and must answer the same bytes.
func newModel(reexecuteSameAnswer bool) porcupine.Model {
	nm := porcupine.NondeterministicModel{
		Init: func() []any { return []any{keyState{}} },
		Step: func(st, in, out any) []any {
			return step(st.(keyState), in.(modelInput), out.(modelOutput), reexecuteSameAnswer)
		},
		Equal: func(a, b any) bool { return a.(keyState) == b.(keyState) },
		Hash: func(s any) uint64 {
			h := fnv.New64a()
			k := s.(keyState)
			h.Write([]byte(k.Cmd))
			h.Write([]byte{0})
			h.Write([]byte(k.Answer))
			return h.Sum64()
		},
		Partition: partitionByKey,
		DescribeOperation: func(in, out any) string {
			return in.(modelInput).Desc + " → " + out.(modelOutput).Desc
		},
		DescribeState: func(s any) string {
			k := s.(keyState)
			switch {
			case k.Cmd == "":
				return "unbound"
			case k.Answer == "":
				return "bound to " + k.Cmd + ", unanswered"
			case k.Answer == unknownAnswer:
				return "bound to " + k.Cmd + ", answered (unseen)"
			}
			return "bound to " + k.Cmd + ", answered " + k.Answer
		},
	}
	return nm.ToModel()
}

// step returns the states a key can be in after one call.
func step(s keyState, in modelInput, out modelOutput, reexecute bool) []any {
	switch out.Class {
	case ClassFinal:
		if s.Cmd != "" && s.Cmd != in.Cmd {
			return nil
		}
		next := keyState{Cmd: in.Cmd, Answer: out.Answer}
		switch {
		case out.Replayed && (s.Answer == out.Answer || s.Answer == unknownAnswer):
			return []any{next}
		case out.Replayed:
			return nil
		case s.Answer == "":
			return []any{next}
		case reexecute && (s.Answer == out.Answer || s.Answer == unknownAnswer):
			return []any{next}
		}
		return nil
	case ClassConflict:
		if s.Cmd != "" && s.Cmd != in.Cmd {
			return []any{s}
		}
		return nil
	case ClassInProgress:
		if s.Cmd == in.Cmd {
			return []any{s}
		}
		return nil
	case ClassAmbiguous:
		next := []any{s}
		if s.Cmd == "" {
			next = append(next, keyState{Cmd: in.Cmd})
		}
		if (s.Cmd == "" || s.Cmd == in.Cmd) && s.Answer == "" {
			next = append(next, keyState{Cmd: in.Cmd, Answer: unknownAnswer})
		}
		return next
	}
	return []any{s} // rejected before anything was stored
}

// partitionByKey splits a history by scoped key.
func partitionByKey(history []porcupine.Operation) [][]porcupine.Operation {
	byKey := map[string][]porcupine.Operation{}
	var keys []string
	for _, op := range history {
		k := op.Metadata.(opMeta).partition
		if _, ok := byKey[k]; !ok {
			keys = append(keys, k)
		}
		byKey[k] = append(byKey[k], op)
	}
	sort.Strings(keys)
	out := make([][]porcupine.Operation, 0, len(keys))
	for _, k := range keys {
		out = append(out, byKey[k])
	}
	return out
}

// opMeta is an operation's metadata: its partition and the recorded op.
type opMeta struct {
	partition string
	op        *Op
}

func (m opMeta) String() string {
	return fmt.Sprintf("op %d, client %d, %s %s", m.op.ID, m.op.Client, m.op.Region, m.op.Node)
}

// maxVisualized bounds the keys porcupine's visualisation shows.
const maxVisualized = 20

// infinity is the return time of ambiguous calls.
const infinity = int64(1) << 62

// porcupineOps converts ops into porcupine operations.
func porcupineOps(ops []*Op) []porcupine.Operation {
	// Dense client ids (a client and its lane) keep the visualisation
	// compact.
	type lane struct{ client, lane int }
	var lanes []lane
	for _, o := range ops {
		lanes = append(lanes, lane{o.Client, o.Lane})
	}
	slices.SortFunc(lanes, func(a, b lane) int { return cmp.Or(cmp.Compare(a.client, b.client), cmp.Compare(a.lane, b.lane)) })
	lanes = slices.Compact(lanes)
	out := make([]porcupine.Operation, 0, len(ops))
	for _, o := range ops {
		id, _ := slices.BinarySearchFunc(lanes, lane{o.Client, o.Lane}, func(a, b lane) int {
			return cmp.Or(cmp.Compare(a.client, b.client), cmp.Compare(a.lane, b.lane))
		})
		class := o.Class()
		ret := int64(o.End)
		if class == ClassAmbiguous {
			ret = infinity
		}
		out = append(out, porcupine.Operation{
			ClientId: id,
			Input:    modelInput{Cmd: o.CommandID, Region: o.Region, Desc: describeCall(o)},
			Call:     int64(o.Start),
			Output:   modelOutput{Class: class, Answer: o.RespHash, Replayed: o.Replayed, Desc: o.Outcome() + shortHash(o)},
			Return:   ret,
			Metadata: opMeta{partition: o.partitionKey(), op: o},
		})
	}
	return out
}

func describeCall(o *Op) string {
	reused := ""
	if o.Reused {
		reused = " (different command)"
	}
	return fmt.Sprintf("%s %s #%d → %s: %s%s", o.Tenant, o.Key, o.Attempt, o.Region, o.Command, reused)
}

func shortHash(o *Op) string {
	if o.RespHash == "" {
		return ""
	}
	return " [" + o.RespHash[:min(8, len(o.RespHash))] + "]"
}

// LinearizabilityResult is the outcome of checking a history.
type LinearizabilityResult struct {
	Result porcupine.CheckResult
	// Illegal lists the partitions (keys) that are not linearizable.
	Illegal []string
	// Visualization is the path of porcupine's HTML, when written.
	Visualization string
}

// checkLinearizable checks ops with porcupine and, when they are not
// linearizable and vizPath is set, writes porcupine's visualisation there.
func checkLinearizable(ops []*Op, reexecute bool, timeout time.Duration, vizPath string) (LinearizabilityResult, error) {
	model := newModel(reexecute)
	history := porcupineOps(ops)
	res, info := porcupine.CheckOperationsVerbose(model, history, timeout)
	out := LinearizabilityResult{Result: res}
	if res != porcupine.Illegal {
		return out, nil
	}
	// Find the offending keys (each partition on its own), and visualise
	// only those (at most maxVisualized of them).
	var illegal []porcupine.Operation
	for _, part := range partitionByKey(history) {
		if !porcupine.CheckOperations(model, part) {
			out.Illegal = append(out.Illegal, part[0].Metadata.(opMeta).partition)
			if len(out.Illegal) <= maxVisualized {
				illegal = append(illegal, part...)
			}
		}
	}
	if vizPath != "" {
		if len(out.Illegal) > 0 {
			_, info = porcupine.CheckOperationsVerbose(model, illegal, timeout)
		}
		if err := porcupine.VisualizePath(model, info, vizPath); err != nil {
			return out, fmt.Errorf("chaos: write linearizability visualisation: %w", err)
		}
		out.Visualization = vizPath
	}
	return out, nil
}
