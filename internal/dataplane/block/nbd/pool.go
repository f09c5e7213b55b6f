package nbd

import (
	"math/bits"
	"sync"
)

// Buffers are pooled in power-of-two size classes from 4 KiB to 32 MiB so
// that the data path does not allocate per request.
const (
	minClassShift = 12
	maxClassShift = 25
)

var bufPools [maxClassShift - minClassShift + 1]sync.Pool

func classOf(n int) int {
	if n <= 1<<minClassShift {
		return 0
	}
	return bits.Len(uint(n-1)) - minClassShift
}

// getBuf returns a buffer of length n; putBuf gives it back.
func getBuf(n int) *[]byte {
	c := classOf(n)
	if c >= len(bufPools) {
		b := make([]byte, n)
		return &b
	}
	if v := bufPools[c].Get(); v != nil {
		b := v.(*[]byte)
		*b = (*b)[:n]
		return b
	}
	b := make([]byte, n, 1<<(c+minClassShift))
	return &b
}

func putBuf(b *[]byte) {
	if b == nil {
		return
	}
	c := cap(*b)
	if c < 1<<minClassShift || c > 1<<maxClassShift || c&(c-1) != 0 {
		return
	}
	bufPools[classOf(c)].Put(b)
}

// zeroes is a shared read-only block of zero bytes.
var zeroes = make([]byte, 1<<20)
