package main

import (
	"fmt"
	"net/url"
	"strconv"
	"strings"

	"github.com/spf13/cobra"
	apiapp "k8s.io/kubernetes/cmd/kube-apiserver/app"
)

// newAPIServerCommand is the upstream kube-apiserver command plus one flag,
// --loopback-service, that replaces the apiserver's Service resolver.
//
// Why: admission webhooks (and aggregated APIs) referenced by
// clientConfig.service are dialled at the Service's ClusterIP with the default
// --enable-aggregator-routing=false (buildServiceResolver in
// k8s.io/kubernetes/cmd/kube-apiserver/app/server.go ->
// k8s.io/kube-aggregator/pkg/apiserver/resolvers.go). This cluster has no
// kube-proxy, so a ClusterIP is unreachable, and EndpointSlices cannot hold
// loopback addresses either. Upstream integration tests solve exactly this
// with app.SetServiceResolverForTests (test/integration/apiserver/admissionwebhook);
// we expose it as a flag. The webhook client still sets the TLS ServerName to
// "<name>.<namespace>.svc" (k8s.io/apiserver/pkg/util/webhook/client.go), so
// serving certificates are verified exactly as in a real cluster; only the
// dial address changes.
func newAPIServerCommand() *cobra.Command {
	cmd := apiapp.NewAPIServerCommand()
	var specs []string
	cmd.Flags().StringSliceVar(&specs, "loopback-service", nil,
		"minik8s only: route Service references (webhooks, APIServices) to https://127.0.0.1. "+
			"Entries NAMESPACE/NAME:PORT[=LOCALPORT]; NAMESPACE, NAME and PORT may be '*'. "+
			"Without =LOCALPORT the Service port is used. References that match no entry fail to resolve "+
			"(so nothing is ever dialled at a ClusterIP). Unset = upstream ClusterIP resolver.")
	upstream := cmd.RunE
	cmd.RunE = func(c *cobra.Command, args []string) error {
		if len(specs) > 0 {
			r, err := parseLoopbackResolver(specs)
			if err != nil {
				return fmt.Errorf("--loopback-service: %w", err)
			}
			// Must happen before RunE builds the server config; the
			// returned reset func is irrelevant for a one-shot process.
			apiapp.SetServiceResolverForTests(r)
		}
		return upstream(c, args)
	}
	return cmd
}

type loopbackRule struct {
	namespace, name string // "*" matches any
	port            int32  // 0 matches any
	localPort       int32  // 0 = use the Service port
}

// loopbackResolver implements k8s.io/apiserver/pkg/util/webhook.ServiceResolver.
type loopbackResolver struct{ rules []loopbackRule }

func parseLoopbackResolver(specs []string) (*loopbackResolver, error) {
	r := &loopbackResolver{}
	for _, spec := range specs {
		var rule loopbackRule
		s := spec
		if i := strings.IndexByte(s, '='); i >= 0 {
			p, err := parsePort(s[i+1:])
			if err != nil || p == 0 {
				return nil, fmt.Errorf("%q: bad local port", spec)
			}
			rule.localPort, s = p, s[:i]
		}
		nsName, port, ok := strings.Cut(s, ":")
		if !ok {
			return nil, fmt.Errorf("%q: want NAMESPACE/NAME:PORT[=LOCALPORT]", spec)
		}
		ns, name, ok := strings.Cut(nsName, "/")
		if !ok || ns == "" || name == "" {
			return nil, fmt.Errorf("%q: want NAMESPACE/NAME:PORT[=LOCALPORT]", spec)
		}
		rule.namespace, rule.name = ns, name
		if port != "*" {
			p, err := parsePort(port)
			if err != nil {
				return nil, fmt.Errorf("%q: %w", spec, err)
			}
			rule.port = p
		}
		r.rules = append(r.rules, rule)
	}
	return r, nil
}

func parsePort(s string) (int32, error) {
	p, err := strconv.ParseUint(s, 10, 16)
	if err != nil || p == 0 {
		return 0, fmt.Errorf("bad port %q", s)
	}
	return int32(p), nil
}

func (r *loopbackResolver) ResolveEndpoint(namespace, name string, port int32) (*url.URL, error) {
	for _, rule := range r.rules {
		if (rule.namespace == "*" || rule.namespace == namespace) &&
			(rule.name == "*" || rule.name == name) &&
			(rule.port == 0 || rule.port == port) {
			p := port
			if rule.localPort != 0 {
				p = rule.localPort
			}
			return &url.URL{Scheme: "https", Host: "127.0.0.1:" + strconv.Itoa(int(p))}, nil
		}
	}
	return nil, fmt.Errorf("minik8s: service %s/%s:%d matches no --loopback-service rule", namespace, name, port)
}
