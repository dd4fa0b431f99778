package trail

import (
	"context"
	"sync"
	"testing"
)

func TestTrailRemembersPicksAndTheEarlierAddress(t *testing.T) {
	c := NewContext(context.Background(), "10.0.0.1:80")
	tr := FromContext(c)
	if tr == nil {
		t.Fatal("FromContext(NewContext) = nil")
	}
	if !tr.Has(7, []string{"10.0.0.2:80", "10.0.0.1:80"}) {
		t.Error("Has: the earlier address not recognised")
	}
	if tr.Has(7, []string{"10.0.0.2:80"}) {
		t.Error("Has: an unused endpoint reported used")
	}
	tr.Add(7)
	if !tr.Has(7, nil) {
		t.Error("Has: a recorded pick not found")
	}
	if FromContext(context.Background()) != nil {
		t.Error("FromContext(Background) != nil")
	}
	type other struct{}
	if v := context.WithValue(c, other{}, 1); FromContext(v) != tr || v.Value(other{}) != 1 {
		t.Error("values of the parent and children lost")
	}
}

func TestTrailForgetsPicksPastSize(t *testing.T) {
	tr := FromContext(NewContext(context.Background(), ""))
	for id := range uint64(Size + 3) {
		tr.Add(id + 1)
	}
	if !tr.Has(Size, nil) || tr.Has(Size+1, nil) {
		t.Error("Has after overflow: want the first Size picks only")
	}
}

func TestTrailConcurrentAdds(t *testing.T) {
	tr := FromContext(NewContext(context.Background(), ""))
	var wg sync.WaitGroup
	for i := range uint64(4) {
		wg.Go(func() { tr.Add(i + 1); tr.Has(i+1, nil) })
	}
	wg.Wait()
	for i := range uint64(4) {
		if !tr.Has(i+1, nil) {
			t.Errorf("pick %d lost", i+1)
		}
	}
}
