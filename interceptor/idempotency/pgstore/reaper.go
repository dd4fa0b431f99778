package pgstore

import (
	"context"
	"time"
)

// reaper deletes rows past their end, in batches, every interval, from
// one goroutine that [Store.Close] stops.
type reaper struct {
	cancel context.CancelFunc // ends the goroutine's context; immutable
	done   chan struct{}      // closed when the goroutine has returned
}

func startReaper(s *Store) *reaper {
	ctx, cancel := context.WithCancel(context.Background())
	r := &reaper{cancel: cancel, done: make(chan struct{})}
	go r.run(ctx, s)
	return r
}

// run reaps at every tick until ctx ends: batch after batch while a batch
// comes back full, so a backlog drains in one tick.
func (r *reaper) run(ctx context.Context, s *Store) {
	defer close(r.done)
	t := time.NewTicker(s.opts.reapInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		for ctx.Err() == nil {
			n, err := s.Reap(ctx)
			if err != nil {
				if ctx.Err() == nil {
					s.opts.logger.Warn("pgstore: reaping rows past their end failed; trying again at the next interval",
						"schema", s.opts.schema, "error", err)
				}
				break
			}
			if n < s.opts.reapBatch {
				break
			}
		}
	}
}

// stop ends the goroutine, cancelling a reap under way, and waits for it.
func (r *reaper) stop() {
	r.cancel()
	<-r.done
}
