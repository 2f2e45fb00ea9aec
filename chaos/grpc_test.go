package chaos

import "testing"

// TestGRPCChecksCatch: the gRPC checks pass a clean command and fail each
// violation they exist for.
func TestGRPCChecksCatch(t *testing.T) {
	ok := GRPCAnswer{Code: "OK", Transfer: "tr_7"}
	replay := ok
	replay.Replayed, replay.Sweep = true, true
	lost := GRPCAnswer{Code: "UNAVAILABLE", ErrorCode: "OUTCOME_UNKNOWN"}
	key := func(effects []int64, answers ...GRPCAnswer) *grpcKey {
		return &grpcKey{Key: "run-grpc0-0", Answers: answers, Effects: effects}
	}
	passed := func(res CheckResult) bool { return res.Passed && !res.Skipped }
	clean := &grpcResult{keys: []*grpcKey{key([]int64{7}, lost, ok, replay)}}
	if r := checkGRPCSingleExecution(&checkInput{grpc: clean}); !passed(r) {
		t.Errorf("clean: %+v", r)
	}
	if r := checkGRPCAnswers(&checkInput{grpc: clean}); !passed(r) {
		t.Errorf("clean: %+v", r)
	}
	for name, g := range map[string]*grpcResult{
		"executed twice":     {keys: []*grpcKey{key([]int64{7, 8}, ok, replay)}},
		"never executed":     {keys: []*grpcKey{key(nil, ok, replay)}},
		"another execution":  {keys: []*grpcKey{key([]int64{8}, ok, replay)}},
		"a stray execution":  {keys: []*grpcKey{key([]int64{7}, ok, replay)}, stray: map[string]int{"run-grpc9-9": 1}},
		"no traffic at all":  {},
		"executed, unlisted": {keys: []*grpcKey{key([]int64{7, 9}, lost)}},
	} {
		if r := checkGRPCSingleExecution(&checkInput{grpc: g}); r.Passed {
			t.Errorf("%s passed single execution", name)
		}
	}
	other := ok
	other.Transfer = "tr_8"
	notReplay := ok
	notReplay.Sweep = true
	for name, k := range map[string]*grpcKey{
		"answers differ":  key([]int64{7}, ok, other, replay),
		"sweep executed":  key([]int64{7}, ok, notReplay),
		"never answered":  key([]int64{7}, lost, lost),
		"not swept":       key([]int64{7}, ok),
		"false reuse":     key([]int64{7}, GRPCAnswer{Code: "FAILED_PRECONDITION", ErrorCode: "IDEMPOTENCY_KEY_REUSED_WITH_DIFFERENT_REQUEST"}, ok, replay),
		"internal answer": key([]int64{7}, GRPCAnswer{Code: "INTERNAL"}, ok, replay),
	} {
		if r := checkGRPCAnswers(&checkInput{grpc: &grpcResult{keys: []*grpcKey{k}}}); r.Passed {
			t.Errorf("%s passed identical answers", name)
		}
	}
	if r := checkGRPCSingleExecution(&checkInput{}); !r.Skipped || !r.Passed {
		t.Errorf("no gRPC: %+v", r)
	}
}
