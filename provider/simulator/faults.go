package simulator

import (
	"fmt"

	"github.com/idemcoord/idem/provider"
)

func validMode(m provider.FaultMode) bool {
	switch m {
	case provider.FaultNone, provider.FaultFail, provider.FaultDecline, provider.FaultSlow, provider.FaultLoseAnswer:
		return true
	}
	return false
}

// normalizeFault validates f and fills defaults.
func normalizeFault(f provider.Fault) (provider.Fault, error) {
	if f.Mode == "" {
		f.Mode = provider.FaultNone
	}
	if !validMode(f.Mode) {
		return provider.Fault{}, fmt.Errorf("unknown fault mode; modes are %s, %s, %s, %s and %s", provider.FaultNone, provider.FaultFail, provider.FaultDecline, provider.FaultSlow, provider.FaultLoseAnswer)
	}
	if f.Times < 0 {
		return provider.Fault{}, fmt.Errorf("times must be >= 0, got %d", f.Times)
	}
	if f.Delay < 0 {
		return provider.Fault{}, fmt.Errorf("delay must be >= 0, got %s", f.Delay)
	}
	switch f.Mode {
	case provider.FaultNone:
		return provider.Fault{Mode: provider.FaultNone}, nil
	case provider.FaultSlow:
		if f.Delay == 0 {
			f.Delay = provider.DefaultSlowDelay
		}
	default:
		f.Delay = 0
	}
	return f, nil
}

// Fault returns the active fault.
func (s *Server) Fault() provider.Fault {
	s.faultMu.Lock()
	defer s.faultMu.Unlock()
	return s.fault
}

// SetFault replaces the active fault, after validating it and filling
// defaults (see [provider.Fault]).
func (s *Server) SetFault(f provider.Fault) (provider.Fault, error) {
	f, err := normalizeFault(f)
	if err != nil {
		return provider.Fault{}, fmt.Errorf("provider: %w", err)
	}
	s.faultMu.Lock()
	s.fault = f
	s.faultMu.Unlock()
	s.log.Info("provider: fault set", "mode", f.Mode, "times", f.Times, "delay", f.Delay)
	return f, nil
}

// takeFault consumes one unit of the active fault for a charge request and
// returns the fault that applies to it.
func (s *Server) takeFault() provider.Fault {
	s.faultMu.Lock()
	defer s.faultMu.Unlock()
	f := s.fault
	if f.Mode != provider.FaultNone && f.Times > 0 {
		s.fault.Times--
		if s.fault.Times == 0 {
			s.fault = provider.Fault{Mode: provider.FaultNone}
		}
	}
	return f
}
