package render

import (
	"fmt"

	"github.com/kubectl-migrate/kubectl-migrate/pkg/conformance"
)

// ConformanceHeader names the image under test.
func ConformanceHeader(image string) string {
	return fmt.Sprintf("%s %s\n", titleStyle.Render("kubectl migrate conformance"), image)
}

// ConformanceClause is one clause's line; under a broken one, the error and
// what the contract says.
func ConformanceClause(r conformance.Result) string {
	switch {
	case r.Skip != "":
		return fmt.Sprintf("%s %s", SkipMark, Dim.Render(r.Clause+"  not checked: "+r.Skip))
	case r.Err != nil:
		return fmt.Sprintf("%s %s: %v\n    %s", FailMark, r.Clause, r.Err, warnStyle.Render("→ the contract: "+r.Spec))
	}
	return fmt.Sprintf("%s %s", DoneMark, r.Clause)
}

// ConformanceVerdict says whether the image keeps the contract.
func ConformanceVerdict(image string, results []conformance.Result) string {
	kept, skipped := 0, 0
	for _, r := range results {
		switch {
		case r.Err != nil:
			return "\n" + badStyle.Render(fmt.Sprintf("%s breaks the MS2M contract: fix the first ✗ (docs/contract.md) and check again", image))
		case r.Skip != "":
			skipped++
		default:
			kept++
		}
	}
	verdict := okStyle.Render(fmt.Sprintf("%s keeps the MS2M contract: %d clauses kept", image, kept))
	if skipped > 0 {
		verdict += Dim.Render(fmt.Sprintf(", %d not checked", skipped))
	}
	return "\n" + verdict
}
