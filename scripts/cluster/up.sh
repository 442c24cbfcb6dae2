#!/usr/bin/env bash
# Start a real one-node Kubernetes 1.20 cluster (etcd, kube-apiserver, kube-controller-manager,
# kube-scheduler, containerd, kubelet, kube-proxy) from what build.sh produced. Everything runs in
# a network namespace of its own, held by a sleeping process: the node's address, the pod bridge,
# the service routes and every iptables rule live there, and no packet can leave it (it has no
# route out). Run commands in it with $WORK/run/in-node (kubectl, curl, pytest ...).
# Needs root. Env: WORK (as for build.sh), NODE_NAME. Stop with down.sh.
set -euo pipefail
WORK=${OVSERVE_CLUSTER_CACHE:-${WORK:-$HOME/.cache/ovserve/cluster}}
NODE_NAME=${NODE_NAME:-testbed-node}
POD_CIDR=10.244.0.0/24 NODE_IP=10.244.0.1        # node address = pod bridge's gateway
SERVICE_CIDR=10.96.0.0/24 API_SERVICE_IP=10.96.0.1
mkdir -p "$WORK" && WORK=$(cd "$WORK" && pwd)
BIN=$WORK/bin RUN=$WORK/run
PKI=$RUN/pki LOGS=$RUN/logs SOCK=$RUN/containerd/containerd.sock
T0=$(date +%s%3N)
log() { echo "cluster-testbed up: $(awk -v a="$T0" -v b="$(date +%s%3N)" 'BEGIN{printf "%5.1fs", (b-a)/1000}') $*" >&2; }
for b in etcd kube-apiserver kube-controller-manager kube-scheduler kubelet kube-proxy kubectl; do
  [ -x "$BIN/$b" ] || { echo "missing $BIN/$b: run build.sh first" >&2; exit 1; }
done
[ ! -e "$RUN/pids" ] || { echo "$RUN/pids exists: the cluster is up (or was not taken down): run down.sh" >&2; exit 1; }
rm -rf "$RUN"; mkdir -p "$PKI" "$LOGS" "$RUN"/{etcd,containerd,kubelet,cni/net.d,cni/ipam}
export PATH="$BIN:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

# Every process started here goes into one pids cgroup, so down.sh can find each of them
# (containerd's shims included) by PID; the pods' processes go to the kubelet's /kubepods.
CG=/sys/fs/cgroup/pids/cluster-testbed
mkdir -p "$CG" && echo $$ > "$CG/cgroup.procs" || { echo "needs the cgroup v1 pids hierarchy at ${CG%/*}" >&2; exit 1; }
# The kubelet (pod logs, device-plugin socket), containerd's shims (sockets) and the CNI library
# (result cache) write under these fixed paths: note which ones this run creates, for down.sh
for d in /var/log/pods /var/log/containers /var/lib/kubelet /run/containerd /var/lib/cni; do [ -e "$d" ] || echo "$d" >> "$RUN/created-dirs"; done

# 1. The node's network namespace
setsid unshare --net sleep infinity >/dev/null 2>&1 </dev/null & NETNS_PID=$!
echo "netns $NETNS_PID" >> "$RUN/pids"
for _ in $(seq 100); do   # until the holder has left this namespace, or ip would act on the host's
  [ "$(readlink "/proc/$NETNS_PID/ns/net")" = "$(readlink /proc/self/ns/net)" ] || break; sleep 0.05
done
[ "$(readlink "/proc/$NETNS_PID/ns/net")" != "$(readlink /proc/self/ns/net)" ] || { echo "no network namespace" >&2; exit 1; }
IN=(nsenter --net=/proc/$NETNS_PID/ns/net --)
"${IN[@]}" ip link set lo up
"${IN[@]}" ip link add cni0 type bridge
"${IN[@]}" ip addr add "$NODE_IP/24" dev cni0
"${IN[@]}" ip link set cni0 up
"${IN[@]}" ip route add "$SERVICE_CIDR" dev cni0   # ClusterIPs need a route; kube-proxy DNATs them to pods
"${IN[@]}" sysctl -qw net.ipv4.ip_forward=1
cat > "$RUN/in-node" <<EOF
#!/bin/sh
# Run a command in the cluster's network namespace, with its kubectl and admin kubeconfig.
exec nsenter --net=/proc/$NETNS_PID/ns/net -- env KUBECONFIG="$RUN/admin.kubeconfig" PATH="$BIN:\$PATH" "\$@"
EOF
chmod +x "$RUN/in-node"

# 2. Credentials: a CA, the API server's certificate, its client certificate towards the kubelet,
# the service-account key, and static tokens for the admin and the components.
cd "$PKI"
openssl req -x509 -new -nodes -newkey rsa:2048 -keyout ca.key -out ca.crt -days 30 -subj /CN=cluster-testbed-ca 2>/dev/null
sign() {  # NAME SUBJECT [SUBJECT_ALT_NAMES]
  openssl req -new -nodes -newkey rsa:2048 -keyout "$1.key" -out "$1.csr" -subj "$2" 2>/dev/null
  [ -z "${3:-}" ] || echo "subjectAltName=$3" > "$1.ext"
  openssl x509 -req -in "$1.csr" -CA ca.crt -CAkey ca.key -CAcreateserial -days 30 -out "$1.crt" \
    ${3:+-extfile "$1.ext"} 2>/dev/null
}
sign apiserver /CN=kube-apiserver "IP:127.0.0.1,IP:$NODE_IP,IP:$API_SERVICE_IP,DNS:localhost,DNS:kubernetes,DNS:kubernetes.default,DNS:kubernetes.default.svc,DNS:kubernetes.default.svc.cluster.local"
sign kubelet-client "/O=system:masters/CN=kube-apiserver-kubelet-client"
openssl genrsa -out sa.key 2048 2>/dev/null
: > tokens.csv
kubeconfig() {  # NAME USER GROUPS: a token in tokens.csv and $RUN/NAME.kubeconfig
  local token; token=$(openssl rand -hex 16)
  echo "$token,$2,$2${3:+,\"$3\"}" >> tokens.csv
  cat > "$RUN/$1.kubeconfig" <<EOF
apiVersion: v1
kind: Config
clusters: [{name: testbed, cluster: {server: "https://127.0.0.1:6443", certificate-authority: "$PKI/ca.crt"}}]
users: [{name: $1, user: {token: "$token"}}]
contexts: [{name: testbed, context: {cluster: testbed, user: $1}}]
current-context: testbed
EOF
}
kubeconfig admin admin system:masters
kubeconfig kubelet "system:node:$NODE_NAME" system:nodes
kubeconfig controller-manager system:kube-controller-manager
kubeconfig scheduler system:kube-scheduler
kubeconfig proxy system:kube-proxy
cd "$RUN"
log "namespace and credentials ready"

start() {  # NAME CMD...: run CMD in the node's namespace, detached, logging to $LOGS/NAME.log
  local name=$1; shift
  setsid "${IN[@]}" "$@" >"$LOGS/$name.log" 2>&1 </dev/null &
  echo "$name $!" >> "$RUN/pids"
}
wait_for() {  # WHAT SECONDS CMD...
  local what=$1 secs=$2; shift 2
  for _ in $(seq "$((secs * 4))"); do "$@" >/dev/null 2>&1 && { log "$what"; return 0; }; sleep 0.25; done
  echo "cluster-testbed up: timed out waiting for $what; logs in $LOGS; clean up with down.sh" >&2; exit 1
}
kc() { "${IN[@]}" kubectl --kubeconfig "$RUN/admin.kubeconfig" "$@"; }

# 3. Control plane
start etcd etcd --name node --data-dir "$RUN/etcd" --unsafe-no-fsync --log-level warn --logger zap \
  --listen-client-urls http://127.0.0.1:2379 --advertise-client-urls http://127.0.0.1:2379 \
  --listen-peer-urls http://127.0.0.1:2380 --initial-advertise-peer-urls http://127.0.0.1:2380 \
  --initial-cluster node=http://127.0.0.1:2380
start kube-apiserver kube-apiserver --etcd-servers=http://127.0.0.1:2379 \
  --bind-address=0.0.0.0 --secure-port=6443 --advertise-address="$NODE_IP" --insecure-port=0 \
  --cert-dir="$PKI" --tls-cert-file="$PKI/apiserver.crt" --tls-private-key-file="$PKI/apiserver.key" \
  --client-ca-file="$PKI/ca.crt" --token-auth-file="$PKI/tokens.csv" \
  --authorization-mode=Node,RBAC --enable-admission-plugins=NodeRestriction --allow-privileged=true \
  --service-cluster-ip-range="$SERVICE_CIDR" \
  --service-account-issuer=https://kubernetes.default.svc.cluster.local \
  --service-account-key-file="$PKI/sa.key" --service-account-signing-key-file="$PKI/sa.key" \
  --kubelet-client-certificate="$PKI/kubelet-client.crt" --kubelet-client-key="$PKI/kubelet-client.key" \
  --kubelet-preferred-address-types=InternalIP
wait_for "kube-apiserver ready" 90 kc get --raw /readyz
start kube-controller-manager kube-controller-manager --kubeconfig="$RUN/controller-manager.kubeconfig" \
  --authentication-kubeconfig="$RUN/controller-manager.kubeconfig" \
  --authorization-kubeconfig="$RUN/controller-manager.kubeconfig" --authentication-skip-lookup \
  --leader-elect=false --bind-address=127.0.0.1 --port=0 --use-service-account-credentials=true \
  --service-account-private-key-file="$PKI/sa.key" --root-ca-file="$PKI/ca.crt"
start kube-scheduler kube-scheduler --kubeconfig="$RUN/scheduler.kubeconfig" \
  --authentication-kubeconfig="$RUN/scheduler.kubeconfig" --authorization-kubeconfig="$RUN/scheduler.kubeconfig" \
  --authentication-skip-lookup \
  --leader-elect=false --bind-address=127.0.0.1 --port=0

# 4. Container runtime: containerd's CRI with cgroupfs, runc, Debian's CNI plugins, local images only
SANDBOX_IMAGE=localhost/cluster-testbed/pause:1
cat > "$RUN/cni/net.d/10-testbed.conflist" <<EOF
{"cniVersion": "0.4.0", "name": "testbed", "plugins": [
  {"type": "bridge", "bridge": "cni0", "isGateway": true, "ipMasq": false, "hairpinMode": true,
   "ipam": {"type": "host-local", "dataDir": "$RUN/cni/ipam", "routes": [{"dst": "0.0.0.0/0"}],
            "ranges": [[{"subnet": "$POD_CIDR", "gateway": "$NODE_IP"}]]}},
  {"type": "portmap", "capabilities": {"portMappings": true}}]}
EOF
cat > "$RUN/containerd/config.toml" <<EOF
version = 2
root = "$RUN/containerd/root"
state = "$RUN/containerd/state"
[grpc]
  address = "$SOCK"
[plugins."io.containerd.internal.v1.opt"]
  path = "$RUN/containerd/opt"
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "$SANDBOX_IMAGE"
  restrict_oom_score_adj = true          # no CAP_SYS_RESOURCE: never lower oom_score_adj
  netns_mounts_under_state_dir = true    # pod network namespaces under \$RUN, not /run/netns
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        SystemdCgroup = false
        Root = "$RUN/containerd/runc"      # runc's state, instead of /run/containerd/runc
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "/usr/lib/cni"
    conf_dir = "$RUN/cni/net.d"
EOF
start containerd containerd --config "$RUN/containerd/config.toml"
wait_for "containerd ready" 30 ctr -a "$SOCK" version
for img in "$WORK"/images/*.tar; do ctr -a "$SOCK" -n k8s.io images import "$img" >/dev/null; done
log "images imported: $(ctr -a "$SOCK" -n k8s.io images ls -q | grep -v '^sha256:' | paste -sd' ')"

# 5. Node agents
echo "# cluster-testbed: no DNS" > "$RUN/kubelet/resolv.conf"
cat > "$RUN/kubelet/config.yaml" <<EOF
apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
address: $NODE_IP
readOnlyPort: 0
healthzBindAddress: 127.0.0.1
authentication: {anonymous: {enabled: false}, webhook: {enabled: true}, x509: {clientCAFile: "$PKI/ca.crt"}}
authorization: {mode: Webhook}
cgroupDriver: cgroupfs
failSwapOn: false
oomScoreAdj: 0                    # lowering it needs CAP_SYS_RESOURCE
nodeStatusUpdateFrequency: 1s     # report Ready as soon as it is (default 10s)
resolvConf: "$RUN/kubelet/resolv.conf"   # no name servers: there is no DNS to ask in the namespace
clusterDomain: cluster.local
imageGCHighThresholdPercent: 100  # never garbage-collect the imported images
evictionHard: {memory.available: 100Mi, nodefs.available: 1%, imagefs.available: 1%}
EOF
start kubelet kubelet --config="$RUN/kubelet/config.yaml" --kubeconfig="$RUN/kubelet.kubeconfig" \
  --root-dir="$RUN/kubelet" --cert-dir="$RUN/kubelet/pki" --volume-plugin-dir="$RUN/kubelet/volume-plugins" \
  --container-runtime=remote --container-runtime-endpoint="unix://$SOCK" \
  --hostname-override="$NODE_NAME" --node-ip="$NODE_IP"
start kube-proxy kube-proxy --kubeconfig="$RUN/proxy.kubeconfig" --proxy-mode=iptables \
  --hostname-override="$NODE_NAME" --cluster-cidr="$POD_CIDR" --nodeport-addresses="$NODE_IP/32" \
  --healthz-bind-address=127.0.0.1:10256 --metrics-bind-address=127.0.0.1:10249 \
  --conntrack-max-per-core=0 --conntrack-tcp-timeout-established=0 --conntrack-tcp-timeout-close-wait=0
wait_for "node $NODE_NAME Ready" 120 kc wait --for=condition=Ready "node/$NODE_NAME" --timeout=1s
wait_for "service account default/default" 60 kc get serviceaccount default
proxy_rules() { "${IN[@]}" iptables -t nat -S KUBE-SERVICES | grep -q 'default/kubernetes:https cluster IP'; }
wait_for "kube-proxy rules" 60 proxy_rules
log "cluster up"
cat <<EOF
KUBECONFIG=$RUN/admin.kubeconfig   (server https://127.0.0.1:6443, inside the node's network namespace)
PIDs: $RUN/pids   logs: $LOGS/   containerd: $SOCK
run in the node's namespace: $RUN/in-node kubectl get nodes
EOF
