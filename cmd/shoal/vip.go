package main

import (
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"os"
	"time"

	"github.com/spf13/cobra"
	"github.com/vishvananda/netns"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/shoalfs/shoal/internal/vip"
	"github.com/shoalfs/shoal/meta"
)

func newVIPCmd() *cobra.Command {
	var (
		metaURL, node, address, iface string
		httpAddr, config              string
		lease                         time.Duration
	)
	cmd := &cobra.Command{
		Use:   "vip",
		Args:  cobra.NoArgs,
		Short: "Hold the cluster's service address on this host while this host's MDS leads",
		Long: `Run one shoal vip on every MDS host. It follows the MDS election in etcd and
adds the service address (the one address NFS clients mount) to --interface
while the leading MDS is this host's (--node), then announces it with
gratuitous ARP. An etcd key under its own lease keeps two hosts from holding
the address at once: a host removes the address before giving the key up, and
removes it by itself when it cannot renew the lease in time, so that the next
holder, which waits for the key, never overlaps with it. It runs beside the
MDS rather than inside it, because an MDS that is killed or stopped cannot
remove the address. See docs/service-address.md.`,
		Example: `  shoal vip --meta etcd://10.0.0.1:2379,10.0.0.2:2379,10.0.0.3:2379/shoal --address 10.9.0.100/24 --interface eth0
  shoal vip --config /etc/shoal/vip.yaml`,
		RunE: func(cmd *cobra.Command, args []string) error {
			if _, err := loadConfig[struct{}](cmd, config); err != nil {
				return err
			}
			if metaURL == "" {
				return errors.New("--meta is required: the etcd cluster the MDSes elect their leader in, etcd://HOST:PORT[,HOST:PORT...]/PREFIX")
			}
			opts, err := meta.ParseEtcdURL(metaURL)
			if err != nil {
				return fmt.Errorf("--meta: %w", err)
			}
			if address == "" || iface == "" {
				return errors.New("--address and --interface are required")
			}
			addr, err := netip.ParsePrefix(address)
			if err != nil || !addr.Addr().Is4() {
				return fmt.Errorf("--address %q: want an IPv4 address with its prefix length, such as 10.9.0.100/24", address)
			}
			if node == "" {
				if node, err = os.Hostname(); err != nil {
					return fmt.Errorf("--node not given and no hostname: %w", err)
				}
			}
			cli, err := clientv3.New(clientv3.Config{
				Endpoints: opts.Endpoints, DialTimeout: 5 * time.Second,
				// Errors reach the supervisor's log; the client's own
				// reconnect logging would only be noise.
				Logger: zap.NewNop(),
			})
			if err != nil {
				return fmt.Errorf("etcd %v: %w", opts.Endpoints, err)
			}
			defer cli.Close()
			link, err := vip.NewNetlink(netns.None(), iface)
			if err != nil {
				return err
			}
			defer link.Close()
			web, err := startWeb(httpAddr)
			if err != nil {
				return err
			}
			s, err := vip.New(vip.Config{
				Client: cli, Prefix: opts.Prefix, Node: node, Address: addr, Net: link, Lease: lease,
				Logger: slog.Default(), Registerer: web.registerer(),
			})
			if err != nil {
				return err
			}
			slog.Info("shoal vip ready", "node", node, "address", addr, "interface", iface, "meta", metaURL, statusAttr(web))
			return s.Run(cmd.Context())
		},
	}
	cmd.Flags().StringVar(&config, "config", "", "YAML configuration file: the flags as keys (address, interface, ...); flags given override it")
	cmd.Flags().StringVar(&metaURL, "meta", "", "the etcd cluster the MDSes elect their leader in, as their --meta: etcd://HOST:PORT[,HOST:PORT...]/PREFIX")
	cmd.Flags().StringVar(&node, "node", "", "this host's MDS node name, as in the election (default: the hostname, as for shoal mds)")
	cmd.Flags().StringVar(&address, "address", "", "the service address with its prefix length, such as 10.9.0.100/24 (IPv4)")
	cmd.Flags().StringVar(&iface, "interface", "", "the network interface that carries the service address, such as eth0")
	cmd.Flags().DurationVar(&lease, "lease", vip.DefaultLease, "TTL of this supervisor's etcd lease, in whole seconds: a host cut off from etcd drops the address within it, and a failover after such a cut waits as long")
	httpFlag(cmd, &httpAddr, "serve Prometheus metrics at /metrics on this address (host:port)")
	return cmd
}
