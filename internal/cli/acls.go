package cli

import (
	"context"
	"flag"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/mailplane/mailplane/domain"
	"github.com/mailplane/mailplane/internal/config"
	"github.com/mailplane/mailplane/internal/kafka"
	"github.com/mailplane/mailplane/topics"
)

// ACLs is `mailplane acls plan|apply --principals role=user,...`: the
// broker ACLs that give each role only what it needs (topics.ACLPlan),
// printed as rpk commands or applied as a superuser.
func ACLs(ctx context.Context, args []string, out io.Writer) error {
	if len(args) == 0 || (args[0] != "plan" && args[0] != "apply") {
		return usageError("usage: mailplane acls plan|apply --principals api=USER,engine=USER,state=USER,project=USER,sync=USER,analyst=USER")
	}
	sub := args[0]
	fs := flag.NewFlagSet("acls "+sub, flag.ExitOnError)
	brokers := config.RegisterBrokerFlags(fs)
	spec := fs.String("principals", "", "role=SASL user pairs, comma-separated; roles: api, engine, state, project, sync, analyst")
	format := fs.String("format", FormatText, "output: text (rpk commands) or json (for scripts)")
	fs.Parse(args[1:])
	kcfg := brokers.Config("mailplane-acls")
	var act cliAction
	if sub == "apply" {
		act.begin(kcfg, domain.OpsACLApply, domain.OpsParams{Target: domain.CutOpsText(*spec, domain.OpsParamMax)})
	}
	return act.finish(ctx, aclsRun(ctx, sub, kcfg, *spec, *format, out, &act))
}

func aclsRun(ctx context.Context, sub string, kcfg kafka.Config, spec, format string, out io.Writer, act *cliAction) error {
	if err := checkFormat(format); err != nil {
		return err
	}
	principals, err := topics.ParsePrincipals(spec)
	if err != nil {
		return domain.Errorf(domain.CodeInvalid, "%v", err)
	}
	if len(principals) == 0 {
		return domain.Errorf(domain.CodeInvalid, "--principals names no role")
	}
	plan := topics.ACLPlan(kcfg.Namespace, principals)
	if sub == "plan" {
		if format == FormatJSON {
			return writeJSON(out, aclsJSON{Grants: plan})
		}
		_, err := io.WriteString(out, topics.RPK(plan))
		return err
	}
	act.params = domain.OpsParams{Target: principalNames(principals), Count: int64(len(plan))}
	act.started = true // ApplyACLs creates the bindings one by one
	return applyACLs(ctx, kcfg, plan, len(principals), format, out)
}

// principalNames lists a plan's role=user pairs for the audit, in the
// plan's role order.
func principalNames(principals map[topics.Role]string) string {
	var ps []string
	for _, r := range topics.Roles() {
		if u, ok := principals[r]; ok {
			ps = append(ps, string(r)+"="+u)
		}
	}
	return strings.Join(ps, ",")
}

func applyACLs(ctx context.Context, kcfg kafka.Config, plan []topics.Grant, principals int, format string, out io.Writer) error {
	adm, err := kafka.NewAdmin(kcfg)
	if err != nil {
		return err
	}
	defer adm.Close()
	actx, cancel := context.WithTimeout(ctx, 60*time.Second)
	defer cancel()
	if err := topics.ApplyACLs(actx, adm, plan); err != nil {
		return err
	}
	if format == FormatJSON {
		return writeJSON(out, aclsJSON{Grants: plan, Applied: true})
	}
	fmt.Fprintf(out, "%d ACL bindings applied for %d principals\n", len(plan), principals)
	return nil
}

// aclsJSON is the output of `acls plan|apply --format json`.
type aclsJSON struct {
	Grants  []topics.Grant `json:"grants"`
	Applied bool           `json:"applied"`
}
