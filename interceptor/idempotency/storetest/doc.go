// Package storetest is a conformance suite for implementations of
// idempotency.Store. A store's tests call [Run] with a function that makes a
// fresh, empty store:
//
//	func TestConformance(t *testing.T) {
//		storetest.Run(t, func(t *testing.T) storetest.Harness {
//			s, err := idempotency.NewMemoryStore(idempotency.WithNow(clk.Now))
//			...
//			return storetest.Harness{Store: s, Advance: clk.Advance, MaxRecordBytes: n}
//		})
//	}
//
// The suite checks the contract documented on idempotency.Store: the four
// outcomes of Claim, that the fingerprint is checked before anything is
// revealed, that Complete and Release act only for the owner, that leases and
// records end, that tokens are not reused, that concurrent claimers of one
// key get exactly one Owned, and, for a store over the network whose
// harness can make its backend stop answering (Harness.Stall), that every
// method returns when its context ends and that a Claim so abandoned frees
// its key by the end of its lease.
//
// The suite is a testify suite ([Suite]): each Test method gets a fresh
// harness from SetupTest, and runs as a subtest named after the method, so
// one check runs alone with -run 'TestConformance/TestLeaseEnds'.
package storetest
