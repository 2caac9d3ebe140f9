package agent

import (
	"fmt"
	"os"

	"github.com/google/nftables"
	"github.com/google/nftables/expr"
	"k8s.io/utils/ptr"
)

// fenceNetns puts the fence into the network namespace pinned at path, or
// takes it away.
func fenceNetns(path string, lift bool) error {
	f, err := os.Open(path)
	if err != nil {
		return fmt.Errorf("open its network namespace: %w", err)
	}
	defer f.Close()
	c, err := nftables.New(nftables.WithNetNSFd(int(f.Fd())))
	if err != nil {
		return fmt.Errorf("reach the firewall of %s: %w", path, err)
	}
	table := &nftables.Table{Family: nftables.TableFamilyINet, Name: fenceTable}
	// Adding a table that exists changes nothing; deleting it then takes
	// its chains with it: one batch that ends with no fence, or a new one.
	c.AddTable(table)
	c.DelTable(table)
	if !lift {
		c.AddTable(table)
		for _, hook := range []struct {
			name   string
			num    *nftables.ChainHook
			device expr.MetaKey
		}{{"input", nftables.ChainHookInput, expr.MetaKeyIIFNAME}, {"output", nftables.ChainHookOutput, expr.MetaKeyOIFNAME}} {
			chain := c.AddChain(&nftables.Chain{
				Name: hook.name, Table: table, Type: nftables.ChainTypeFilter,
				Hooknum: hook.num, Priority: nftables.ChainPriorityFilter, Policy: ptr.To(nftables.ChainPolicyDrop),
			})
			c.AddRule(&nftables.Rule{Table: table, Chain: chain, Exprs: []expr.Any{
				&expr.Meta{Key: hook.device, Register: 1},
				&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: interfaceName("lo")},
				&expr.Verdict{Kind: expr.VerdictAccept},
			}})
		}
	}
	if err := c.Flush(); err != nil {
		what := "fence"
		if lift {
			what = "lift the fence of"
		}
		return fmt.Errorf("%s %s: %w", what, path, err)
	}
	return nil
}

// Fenced reports whether the network namespace pinned at path has the
// fence.
func Fenced(path string) (bool, error) {
	f, err := os.Open(path)
	if err != nil {
		return false, err
	}
	defer f.Close()
	c, err := nftables.New(nftables.WithNetNSFd(int(f.Fd())))
	if err != nil {
		return false, err
	}
	tables, err := c.ListTablesOfFamily(nftables.TableFamilyINet)
	if err != nil {
		return false, err
	}
	for _, t := range tables {
		if t.Name == fenceTable {
			return true, nil
		}
	}
	return false, nil
}

// interfaceName is name as the kernel compares interface names: padded
// with NULs to IFNAMSIZ.
func interfaceName(name string) []byte {
	b := make([]byte, 16)
	copy(b, name)
	return b
}
