// Package nbdkittest starts nbdkit for tests, as a real NBD server to
// compare against or compose over. It is imported only by tests.
//
// Start listens on a Unix socket itself and hands it to nbdkit by systemd
// socket activation, so the socket accepts connections as soon as Start
// returns, with no waiting for nbdkit to come up. The process is killed
// when the test ends. There is no state; functions are safe for
// concurrent use.
package nbdkittest
