// Package sdktest provides a fake k7 daemon for tests of SDK users, in the
// spirit of net/http/httptest: NewServer starts an in-memory k7d that serves
// the /v1 API on a unix socket (or, with WithTCP, on loopback HTTP) and is
// closed when the test ends.
//
//	srv := sdktest.NewServer(t)
//	c, err := sdk.New(srv.Host)
//
// The fake keeps sandboxes, files, logs, images, snapshots and the fork tree
// in memory. It knows one image, "alpine:3"; pulls succeed unless the
// reference contains "missing". Exec runs canned commands instead of
// programs:
//
//	echo ARGS...   prints ARGS
//	cat            copies stdin to stdout
//	exit N         exits with N
//	stderr MSG     prints MSG on stderr, exits 1
//	env            prints the request's env, cwd, user, tty and timeout
//	wait           waits for a control message: a resize is printed, a
//	               signal ends the command with 128+15
//	other          not found (exit 127, with a start error)
//
// Tests reach into the fake's state with the Server's methods, for example
// SetState to make a sandbox dead behind the client's back.
package sdktest
