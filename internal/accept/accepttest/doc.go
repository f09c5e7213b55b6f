// Package accepttest runs a test's process out of descriptors, for tests
// of accept loops and other code that must outlive a shortage.
//
// It has no types. ExhaustFds (and DialThroughShortage, which uses it)
// changes the whole process's descriptor limit: it is not safe to call
// from parallel tests, nor concurrently.
package accepttest
