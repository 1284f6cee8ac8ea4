package cli

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"text/tabwriter"

	"github.com/mailplane/mailplane/domain"
)

const policyUsage = `Usage:
  mailplane policy validate FILE
      check a policy document: exit 0 valid, 1 refused (each field problem
      is printed as "field: code: message")
  mailplane policy show [--format text|json]
      print the default policy; --format json prints a document that
      policy validate accepts as it is
  mailplane policy diff A B [--format text|json]
      compare two policies field by field (A or B: a FILE, or "-" or
      "default" for the default policy)

The policy is one versioned JSON document holding every tunable rule of
health scoring and placement (docs/operating.md, "The policy document").
The policy in force is today's defaults (what show prints, with the
MAILPLANE_PLACEMENT_* settings over them) until policy apply exists; it
does not yet.

Flags:
`

// Policy is `mailplane policy validate|show|diff`: the policy document's
// offline commands.
func Policy(args []string, out io.Writer) error {
	if len(args) == 0 {
		return usageError("usage: mailplane policy validate FILE | show [--format text|json] | diff A B [--format text|json]")
	}
	sub := args[0]
	fs := flag.NewFlagSet("policy "+sub, flag.ContinueOnError)
	fs.SetOutput(out)
	format := fs.String("format", FormatText, "output: text or json")
	fs.Usage = func() { fmt.Fprint(fs.Output(), policyUsage); fs.PrintDefaults() }
	pos, err := parseInterleaved(fs, args[1:])
	if errors.Is(err, flag.ErrHelp) {
		return nil
	}
	if err != nil {
		return usageError(err.Error())
	}
	if err := checkFormat(*format); err != nil {
		return err
	}
	switch {
	case sub == "validate" && len(pos) == 1:
		return policyValidate(pos[0], out)
	case sub == "show" && len(pos) == 0:
		return policyShow(*format, out)
	case sub == "diff" && len(pos) == 2:
		return policyDiff(pos[0], pos[1], *format, out)
	}
	return usageError(fmt.Sprintf("policy %s: wrong arguments %q (see mailplane policy %s -h)", sub, pos, sub))
}

// parseInterleaved parses flags before, between and after positional
// arguments, which it returns.
func parseInterleaved(fs *flag.FlagSet, args []string) ([]string, error) {
	var pos []string
	for {
		if err := fs.Parse(args); err != nil {
			return nil, err
		}
		args = fs.Args()
		if len(args) == 0 {
			return pos, nil
		}
		pos, args = append(pos, args[0]), args[1:]
	}
}

// readPolicy reads and checks the policy document in file; "-" and
// "default" are the default policy. A document refused prints its
// problems to out.
func readPolicy(file string, out io.Writer) (domain.Policy, error) {
	if file == "-" || file == "default" {
		return domain.DefaultPolicy(), nil
	}
	f, err := os.Open(file)
	if err != nil {
		return domain.Policy{}, err
	}
	defer f.Close()
	// One byte past the bound is enough for ParsePolicy to refuse it.
	raw, err := io.ReadAll(io.LimitReader(f, domain.MaxPolicyBytes+1))
	if err != nil {
		return domain.Policy{}, err
	}
	p, ps := domain.ParsePolicy(raw)
	if len(ps) > 0 {
		for _, pr := range ps {
			fmt.Fprintln(out, pr.String())
		}
		return domain.Policy{}, &domain.Error{Code: ps.Code(), Message: fmt.Sprintf("%s: refused, %d problem(s), printed above", file, len(ps)), Problems: ps}
	}
	return p, nil
}

func policyValidate(file string, out io.Writer) error {
	p, err := readPolicy(file, out)
	if err != nil {
		return err
	}
	_, err = fmt.Fprintf(out, "%s: a valid policy (version %d)\n", file, p.Version)
	return err
}

func policyShow(format string, out io.Writer) error {
	p := domain.DefaultPolicy()
	if format == FormatJSON {
		return writeJSON(out, p)
	}
	tw := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
	fmt.Fprintf(tw, "the default policy (in force, with the MAILPLANE_PLACEMENT_* settings over it, until policy apply exists)\n")
	for _, f := range domain.PolicyFields(p) {
		fmt.Fprintf(tw, "%s\t%s\n", f.Field, f.Value)
	}
	return tw.Flush()
}

// policyDiffJSON is diff's --format json: differences is empty, never
// null, when the policies are the same.
type policyDiffJSON struct {
	Differences []domain.PolicyChange `json:"differences"`
}

func policyDiff(a, b, format string, out io.Writer) error {
	pa, err := readPolicy(a, out)
	if err != nil {
		return err
	}
	pb, err := readPolicy(b, out)
	if err != nil {
		return err
	}
	ch := domain.DiffPolicies(pa, pb)
	if format == FormatJSON {
		return writeJSON(out, policyDiffJSON{Differences: append([]domain.PolicyChange{}, ch...)})
	}
	if len(ch) == 0 {
		_, err := fmt.Fprintln(out, "no differences")
		return err
	}
	tw := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
	for _, c := range ch {
		fmt.Fprintf(tw, "%s\t%s\t→ %s\n", c.Field, orNone(c.From), orNone(c.To))
	}
	return tw.Flush()
}

func orNone(s string) string {
	if s == "" {
		return "(none)"
	}
	return s
}
