package main

import (
	"math"
	"testing"
	"time"
)

// TestMeasuredKeepsFourSignificantDigits pins how resadmin prints a
// measured duration: to four significant digits at most, whatever its
// size, so that an estimate reads 6.123ms and not 6.123456ms.
func TestMeasuredKeepsFourSignificantDigits(t *testing.T) {
	for _, tt := range []struct {
		d    time.Duration
		want string
	}{
		{0, "0s"},
		{999, "999ns"},
		{123456, "123.5µs"},
		{6123456, "6.123ms"},
		{6 * time.Millisecond, "6ms"},
		{51234567, "51.23ms"},
		{1234567891, "1.235s"},
		{-6123456, "-6.123ms"},
		{90*time.Minute + 1234567, "1h30m0s"},
		{math.MaxInt64, "2561944h26m40s"},
		{math.MinInt64, "-2562047h47m16.854775808s"},
	} {
		if got := measured(tt.d); got != tt.want {
			t.Errorf("measured(%d) = %q, want %q", int64(tt.d), got, tt.want)
		}
	}
}
