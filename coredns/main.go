// The cluster DNS server of podwire's local Kubernetes stack: CoreDNS with only the plugins
// its Corefile uses (the Kubernetes zone from the API, forwarding, health, readiness, metrics,
// cache, logs), so the build stays small. scripts/build-coredns builds it.
package main

import (
	"github.com/coredns/coredns/core/dnsserver"
	"github.com/coredns/coredns/coremain"

	_ "github.com/coredns/coredns/plugin/cache"
	_ "github.com/coredns/coredns/plugin/errors"
	_ "github.com/coredns/coredns/plugin/forward"
	_ "github.com/coredns/coredns/plugin/health"
	_ "github.com/coredns/coredns/plugin/kubernetes"
	_ "github.com/coredns/coredns/plugin/log"
	_ "github.com/coredns/coredns/plugin/metrics"
	_ "github.com/coredns/coredns/plugin/ready"
)

// The order in which the server runs its plugins on a query, as CoreDNS's own list orders
// these (a Corefile's order does not matter).
var plugins = []string{"errors", "log", "health", "ready", "prometheus", "cache", "kubernetes", "forward"}

func init() {
	dnsserver.Directives = plugins
}

func main() {
	coremain.Run()
}
