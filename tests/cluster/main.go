// Command minik8s is a multi-call ("hyperkube style") binary that runs one
// Kubernetes control-plane component per process, built from the
// k8s.io/kubernetes Go module at the version pinned in go.mod:
//
//	minik8s etcd               [etcd flags]       embedded etcd server (etcdmain, as go.etcd.io/etcd/server/v3/main.go)
//	minik8s apiserver          [kube-apiserver flags] [--loopback-service=NS/NAME:PORT ...]
//	minik8s scheduler          [kube-scheduler flags]
//	minik8s controller-manager [kube-controller-manager flags]
//	minik8s certs              --dir DIR [...]    CA, serving/client certs, SA keys, kubeconfigs
//	minik8s version
//
// It exists so the dra-quota end-to-end tests can run against a real control
// plane without containers or downloaded release binaries.
//
// Why one component per process: kube-apiserver's NewAPIServerCommand calls
// genericapiserver.SetupSignalContext, which panics when called twice
// (k8s.io/apiserver/pkg/server/signal.go), and the components share global
// feature gates, klog flags and metric registries. A single link keeps build
// time and disk use down; separate processes keep the components as
// independent as in a real cluster.
package main

import (
	"fmt"
	"os"
	"path/filepath"
	_ "time/tzdata" // as cmd/kube-apiserver and cmd/kube-controller-manager: CronJob time zones

	"github.com/spf13/cobra"
	"go.etcd.io/etcd/server/v3/etcdmain"
	"k8s.io/component-base/cli"
	_ "k8s.io/component-base/logs/json/register"          // JSON log format, as the upstream mains
	_ "k8s.io/component-base/metrics/prometheus/clientgo" // client-go metrics, as the upstream mains
	_ "k8s.io/component-base/metrics/prometheus/version"  // version metric, as the upstream mains
	"k8s.io/component-base/version"
	cmapp "k8s.io/kubernetes/cmd/kube-controller-manager/app"
	schedapp "k8s.io/kubernetes/cmd/kube-scheduler/app"
)

const usage = `usage: minik8s <etcd|apiserver|scheduler|controller-manager|certs|version> [flags]

One Kubernetes control-plane component per process; see tests/cluster/README.md.
`

func main() {
	if len(os.Args) < 2 {
		fmt.Fprint(os.Stderr, usage)
		os.Exit(2)
	}
	sub, rest := os.Args[1], os.Args[2:]
	// Each component parses os.Args[1:] itself (cobra) or takes args
	// explicitly (etcd); present the subcommand as argv[0] so usage and log
	// lines carry the component's name.
	os.Args = append([]string{filepath.Base(os.Args[0]) + " " + sub}, rest...)

	switch sub {
	case "etcd":
		// etcdmain.Main parses args[1:] and exits the process itself on
		// fatal errors; it returns only after the server stopped.
		etcdmain.Main(os.Args)
	case "apiserver", "kube-apiserver":
		os.Exit(cli.Run(newAPIServerCommand()))
	case "scheduler", "kube-scheduler":
		os.Exit(cli.Run(schedapp.NewSchedulerCommand()))
	case "controller-manager", "kube-controller-manager":
		os.Exit(cli.Run(cmapp.NewControllerManagerCommand()))
	case "certs":
		os.Exit(runCobra(newCertsCommand()))
	case "version", "--version":
		fmt.Println(version.Get().GitVersion)
	case "-h", "--help", "help":
		fmt.Print(usage)
	default:
		fmt.Fprintf(os.Stderr, "minik8s: unknown subcommand %q\n%s", sub, usage)
		os.Exit(2)
	}
}

// runCobra runs a plain (non-component) command; cli.Run would also set up
// klog and component-base logging flags, which the certs command has no use for.
func runCobra(cmd *cobra.Command) int {
	cmd.SilenceUsage = true
	if err := cmd.Execute(); err != nil {
		return 1
	}
	return 0
}
