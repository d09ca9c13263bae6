package sdktest_test

import (
	"context"
	"strings"
	"testing"

	v1 "github.com/k7-dev/k7/api/v1"
	"github.com/k7-dev/k7/sdk"
	"github.com/k7-dev/k7/sdk/sdktest"
)

func TestServer(t *testing.T) {
	srv := sdktest.NewServer(t)
	c, err := sdk.New(srv.Host)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	sb, err := c.CreateSandbox(ctx, v1.CreateSandboxRequest{Image: "alpine:3", Name: "web"})
	if err != nil {
		t.Fatal(err)
	}
	var out strings.Builder
	res, err := c.Exec(ctx, sb.ID, v1.ExecRequest{Args: []string{"echo", "hi"}}, sdk.ExecIO{Stdout: &out})
	if err != nil || res.Code != 0 || out.String() != "hi\n" {
		t.Fatalf("exec echo hi = %+v, %q, %v", res, out.String(), err)
	}
	srv.SetState("web", v1.StateDead)
	if got, _ := srv.Sandbox(sb.ID); got.State != v1.StateDead {
		t.Errorf("state = %q, want dead", got.State)
	}
}
