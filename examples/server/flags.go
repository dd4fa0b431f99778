package main

import (
	"errors"
	"strconv"
	"strings"
)

// setFailRate parses -fail-rate: a fraction from 0 to 1, or a percentage
// such as "30%". A bare number above 1 is refused rather than guessed at.
func (c *config) setFailRate(s string) error {
	pct, isPct := strings.CutSuffix(strings.TrimSpace(s), "%")
	f, err := strconv.ParseFloat(pct, 64)
	if isPct {
		f /= 100
	}
	if err != nil || !(f >= 0 && f <= 1) {
		return errors.New("want a fraction from 0 to 1, such as 0.3, or a percentage such as 30%")
	}
	c.failRate = f
	return nil
}
