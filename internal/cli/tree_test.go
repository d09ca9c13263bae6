package cli

import (
	"bytes"
	"testing"

	v1 "github.com/k7-dev/k7/api/v1"
)

func TestPrintTreeNode(t *testing.T) {
	root := v1.TreeNode{Kind: "sandbox", ID: "0123456789abcdef", Name: "web", State: "running", Children: []v1.TreeNode{
		{Kind: "sandbox", ID: "1111111111111111", Name: "web-1", State: "running", Children: []v1.TreeNode{
			{Kind: "snapshot", ID: "snap"},
		}},
		{Kind: "sandbox", ID: "2222222222222222", State: "deleted"},
	}}
	var b bytes.Buffer
	printTreeNode(&b, root, "", "")
	want := `web (0123456789ab) running
├── web-1 (111111111111) running
│   └── snapshot snap
└── 222222222222 deleted
`
	if got := b.String(); got != want {
		t.Errorf("tree:\n%s\nwant:\n%s", got, want)
	}
}
