package drain

import (
	"context"
	"slices"
	"sync"
)

// scheduler hands the drain's moves to its workers: the moves of one chain
// (see chainKey) one after another, and no more moves of a
// PodDisruptionBudget's pods at once than it allows disruptions.
type scheduler struct {
	limits map[string]int // disruptions each budget allows

	mu      sync.Mutex
	wakeUp  *sync.Cond
	pending []Move
	busy    map[string]bool // chains with a move running
	inUse   map[string]int  // moves running, by budget
	running int
	stopped bool
	// held are the moves no budget lets start while nothing else runs
	// (which could free one): they are not migrated.
	held []Move
}

// newScheduler orders moves so that the longest chains start first and the
// rest run beside them.
func newScheduler(moves []Move, limits map[string]int) *scheduler {
	chain := map[string]int{}
	for _, mv := range moves {
		chain[mv.chainKey()]++
	}
	pending := slices.Clone(moves)
	slices.SortStableFunc(pending, func(a, b Move) int { return chain[b.chainKey()] - chain[a.chainKey()] })
	s := &scheduler{limits: limits, pending: pending, busy: map[string]bool{}, inUse: map[string]int{}}
	s.wakeUp = sync.NewCond(&s.mu)
	return s
}

// next waits for a move it may start and takes it, or returns false when
// none is left to start (all taken, stopped, ctx ended, or held).
func (s *scheduler) next(ctx context.Context) (Move, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for {
		if s.stopped || ctx.Err() != nil || len(s.pending) == 0 {
			return Move{}, false
		}
		if i := slices.IndexFunc(s.pending, s.allowed); i >= 0 {
			mv := s.pending[i]
			s.pending = slices.Delete(s.pending, i, i+1)
			s.busy[mv.chainKey()] = true
			for _, b := range mv.Budgets {
				s.inUse[b]++
			}
			s.running++
			return mv, true
		}
		if s.running == 0 {
			// Nothing runs that could free a budget.
			s.held, s.pending = s.pending, nil
			return Move{}, false
		}
		s.wakeUp.Wait()
	}
}

// allowed: mv's chain is idle and each of its budgets has room.
func (s *scheduler) allowed(mv Move) bool {
	if s.busy[mv.chainKey()] {
		return false
	}
	for _, b := range mv.Budgets {
		if s.inUse[b] >= s.limits[b] {
			return false
		}
	}
	return true
}

// done returns mv's chain and budgets; with stop, no further move starts.
func (s *scheduler) done(mv Move, stop bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.busy, mv.chainKey())
	for _, b := range mv.Budgets {
		s.inUse[b]--
	}
	s.running--
	s.stopped = s.stopped || stop
	s.wakeUp.Broadcast()
}

// wake lets waiting workers see that their context ended.
func (s *scheduler) wake() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.wakeUp.Broadcast()
}

// stoppedEarly: moves were left untried (a stop, or ctx ended).
func (s *scheduler) stoppedEarly(ctx context.Context) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.stopped || ctx.Err() != nil || len(s.pending) > 0
}
