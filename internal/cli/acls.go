package cli

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"time"

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
	if err := checkFormat(*format); err != nil {
		return err
	}
	principals, err := topics.ParsePrincipals(*spec)
	if err != nil {
		return err
	}
	if len(principals) == 0 {
		return errors.New("--principals names no role")
	}
	kcfg := brokers.Config("mailplane-acls")
	plan := topics.ACLPlan(kcfg.Namespace, principals)
	if sub == "plan" {
		if *format == FormatJSON {
			return writeJSON(out, aclsJSON{Grants: plan})
		}
		_, err := io.WriteString(out, topics.RPK(plan))
		return err
	}
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
	if *format == FormatJSON {
		return writeJSON(out, aclsJSON{Grants: plan, Applied: true})
	}
	fmt.Fprintf(out, "%d ACL bindings applied for %d principals\n", len(plan), len(principals))
	return nil
}

// aclsJSON is the output of `acls plan|apply --format json`.
type aclsJSON struct {
	Grants  []topics.Grant `json:"grants"`
	Applied bool           `json:"applied"`
}
