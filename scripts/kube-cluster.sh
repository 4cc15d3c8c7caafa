#!/usr/bin/env bash
# kube-cluster.sh: a private single-node Kubernetes cluster on this host, built from the Go module proxy
# and Debian's containerd, for the `kubernetes` profile's tests (docs/kubernetes.md).
#
#   scripts/kube-cluster.sh build [--check] [cluster|provider]...   build (cached) the binaries; stdout: the bin dir
#                                                          (--check: only say whether they are built)
#   scripts/kube-cluster.sh start                          start the cluster; stdout: the kubeconfig path
#   scripts/kube-cluster.sh stop                           stop it and remove everything it made
#   scripts/kube-cluster.sh status                         exit 0 and print the kubeconfig if it is up
#   scripts/kube-cluster.sh load ARCHIVE...                import OCI archives into the node's containerd
#   scripts/kube-cluster.sh env                            shell lines: KUBECONFIG, the bin dir, the socket
#
# build: etcd, kube-apiserver, kube-controller-manager, kube-scheduler, kubelet and kubectl (`cluster`) and the
# Pulumi Kubernetes provider plugin pulumi-resource-kubernetes (`provider`), no argument meaning both, into
# ${ALE_IAC_CACHE:-~/.cache/ale-iac}/kubernetes/v<KUBERNETES_VERSION>/bin. Each binary is recorded in BUILDINFO
# with the pins it was built from (versions.env) and rebuilt only when they change; a cached build returns in
# well under a second; concurrent builds are serialised with flock. Cold, on 2 cores: ~23 min (the API server
# ~9 min, the provider plugin ~10 min), 2.3 GB of module cache, ~8 GB of Go build cache (ALE_IAC_GOCACHE moves
# both; the build cache can be deleted afterwards).
#
# start: nothing it makes is shared with the host or a cluster the user runs. A dummy network interface with an
# address of the benchmarking range 198.18.0.0/15 (never routed off the machine) carries the node; the API server
# listens on 127.0.0.1 only, etcd, the controller manager, the scheduler and the kubelet on 127.0.0.1 or the
# dummy address, all on private ports; its own containerd (root, state and socket under the state dir); pods on a
# bridge of their own. State: ${ALE_IAC_KUBE_STATE:-/run/ale-iac-kube} (PIDs, certificates, logs, kubeconfig).
# Needs root and Debian's containerd, runc, containernetworking-plugins, busybox-static and openssl.
#
# Progress lines go to stderr as `[kube-cluster] ...`.
set -euo pipefail

ROOT_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VERSIONS_FILE="$ROOT_DIR/versions.env"
# shellcheck source=../versions.env
. "$VERSIONS_FILE"
for pin in KUBERNETES_VERSION ETCD_VERSION PULUMI_KUBERNETES_VERSION PULUMI_KUBERNETES_PROVIDER_MODULE \
    PULUMI_KUBERNETES_GO_SDK_VERSION; do
    [ -n "${!pin:-}" ] || { printf '[kube-cluster] ERROR: %s sets no %s\n' "$VERSIONS_FILE" "$pin" >&2; exit 1; }
done

CACHE="${ALE_IAC_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/ale-iac}"
KUBE_DIR="$CACHE/kubernetes/v$KUBERNETES_VERSION"
BIN_DIR="$KUBE_DIR/bin"
STATE="${ALE_IAC_KUBE_STATE:-/run/ale-iac-kube}"

K8S_MOD="k8s.io/kubernetes"
ETCD_MOD="go.etcd.io/etcd/server/v3"
PROVIDER_MOD="github.com/pulumi/pulumi-kubernetes/provider/v4"
PROVIDER_SDK_MOD="github.com/pulumi/pulumi-kubernetes/sdk/v4"
KUBE_BINS=(kube-apiserver kube-controller-manager kube-scheduler kubelet kubectl)

log() { printf '[kube-cluster] %s\n' "$*" >&2; }
die() { printf '[kube-cluster] ERROR: %s\n' "$*" >&2; exit 1; }

WORK=""
cleanup() {
    [ -n "$WORK" ] && rm -rf "$WORK"
    return 0
}
trap cleanup EXIT

STEP_PREFIX=kube-cluster
# shellcheck source=steps.sh
. "$ROOT_DIR/scripts/steps.sh"  # step DESCRIPTION LOGFILE CMD...

# ----------------------------------------------------------------------------------------------- build

# stamp NAME: what BUILDINFO records for binary NAME (the pins it is built from).
stamp() {
    case "$1" in
        etcd) echo "etcd=$ETCD_MOD@v$ETCD_VERSION" ;;
        pulumi-resource-kubernetes)
            echo "pulumi-resource-kubernetes=$PROVIDER_MOD@$PULUMI_KUBERNETES_PROVIDER_MODULE" \
                "version=$PULUMI_KUBERNETES_VERSION sdk=v$PULUMI_KUBERNETES_GO_SDK_VERSION" ;;
        *) echo "$1=$K8S_MOD@v$KUBERNETES_VERSION" ;;
    esac
}

# built NAME: the cache holds NAME built from the current pins.
built() {
    [ -x "$BIN_DIR/$1" ] && grep -qxF "$(stamp "$1")" "$KUBE_DIR/BUILDINFO" 2>/dev/null
}

# record NAME: move the freshly built $WORK/out/NAME into the cache (atomic rename) and record its stamp.
record() {
    local name="$1" tmp
    mv -f "$WORK/out/$name" "$BIN_DIR/$name"
    tmp="$(mktemp "$KUBE_DIR/.BUILDINFO.XXXXXX")"
    { grep -v "^$name=" "$KUBE_DIR/BUILDINFO" 2>/dev/null || true; stamp "$name"; } >"$tmp"
    chmod 0644 "$tmp"
    mv -f "$tmp" "$KUBE_DIR/BUILDINFO"
}

# download OUT_JSON MOD@VER: `go mod download -json` (its errors are in the JSON on stdout).
download() {
    (cd "$WORK" && go mod download -json "$2" >"$1") || { cat "$1"; return 1; }
}
json_field() {
    sed -n 's/^[[:space:]]*"'"$2"'":[[:space:]]*"\(.*\)",\{0,1\}$/\1/p' "$1" | head -n1
}

# wrapper DIR ARGS...: a throwaway module in DIR, edited with `go mod edit ARGS...`.
wrapper() {
    local dir="$1"
    shift
    mkdir -p "$dir"
    (cd "$dir" && go mod init ale-iac.invalid/kube-build >/dev/null 2>&1 && go mod edit "$@")
}

gobuild() { # gobuild DIR OUT LDFLAGS PKG
    (cd "$1" && nice -n "${ALE_IAC_BUILD_NICE:-15}" go build -p 1 -mod=mod -trimpath -ldflags "-s -w $3" -o "$2" "$4")
}

build_kube() {
    local missing=() name
    for name in "${KUBE_BINS[@]}"; do built "$name" || missing+=("$name"); done
    [ "${#missing[@]}" -gt 0 ] || return 0
    step "downloading $K8S_MOD v$KUBERNETES_VERSION" "$WORK/k8s-dl.log" \
        download "$WORK/k8s.json" "$K8S_MOD@v$KUBERNETES_VERSION" || die "cannot download $K8S_MOD v$KUBERNETES_VERSION"
    local gomod minor
    gomod="$(json_field "$WORK/k8s.json" GoMod)"
    minor="${KUBERNETES_VERSION#*.}"
    # Each staging module (`k8s.io/x => ./staging/src/k8s.io/x`) at its published v0.<minor>.<patch>.
    local -a args=("-require=$K8S_MOD@v$KUBERNETES_VERSION")
    while IFS= read -r mod; do
        args+=("-replace=$mod=$mod@v0.$minor")
    done < <(awk '$2 == "=>" && $3 ~ /^\.\/staging\// { print $1 }' "$gomod")
    [ "${#args[@]}" -gt 20 ] || die "found no staging replace lines in $gomod"
    wrapper "$WORK/k8s" "${args[@]}"
    local v="v$KUBERNETES_VERSION" major="${KUBERNETES_VERSION%%.*}" kminor
    kminor="${minor%%.*}"
    local ld=""
    for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
        ld="$ld -X $pkg.gitVersion=$v -X $pkg.gitMajor=$major -X $pkg.gitMinor=$kminor -X $pkg.gitTreeState=clean"
    done
    for name in "${missing[@]}"; do
        step "building $name $v" "$WORK/$name.log" gobuild "$WORK/k8s" "$WORK/out/$name" "$ld" "$K8S_MOD/cmd/$name" \
            || die "building $name failed (log above)"
        record "$name"
    done
}

build_etcd() {
    built etcd && return 0
    wrapper "$WORK/etcd" "-require=$ETCD_MOD@v$ETCD_VERSION"
    step "building etcd v$ETCD_VERSION" "$WORK/etcd.log" gobuild "$WORK/etcd" "$WORK/out/etcd" "" "$ETCD_MOD" \
        || die "building etcd failed (log above)"
    record etcd
}

build_provider() {
    built pulumi-resource-kubernetes && return 0
    local ver="$PULUMI_KUBERNETES_PROVIDER_MODULE"
    step "downloading $PROVIDER_MOD $ver" "$WORK/prov-dl.log" download "$WORK/prov.json" "$PROVIDER_MOD@$ver" \
        || die "cannot download $PROVIDER_MOD@$ver"
    local dir gomod
    dir="$(json_field "$WORK/prov.json" Dir)"
    gomod="$(json_field "$WORK/prov.json" GoMod)"
    # The module's main.go embeds schema-embed.json and terraform-mapping-embed.json, which its generate.go makes
    # (and the zip lacks): main.go is copied into a module of ours with the two files made the same way.
    local -a args=("-require=$PROVIDER_MOD@$ver" "-replace=$PROVIDER_SDK_MOD=$PROVIDER_SDK_MOD@v$PULUMI_KUBERNETES_GO_SDK_VERSION")
    while IFS= read -r r; do args+=("$r"); done < <(awk '
        { sub(/\/\/.*/, ""); gsub(/^[[:space:]]+|[[:space:]]+$/, "") }
        inblock && $0 == ")" { inblock = 0; next }
        /^replace[[:space:]]*\($/ { inblock = 1; next }
        /^replace[[:space:]]/ { sub(/^replace[[:space:]]+/, "") ; line = $0 }
        inblock { line = $0 }
        line != "" {
            n = split(line, f, /[[:space:]]+/); arrow = 0
            for (i = 1; i <= n; i++) if (f[i] == "=>") arrow = i
            if (arrow > 0 && n - arrow == 2) { old = f[1]; if (arrow == 3) old = old "@" f[2]; print "-replace=" old "=" f[arrow+1] "@" f[arrow+2] }
            line = ""
        }' "$gomod")
    wrapper "$WORK/prov" "${args[@]}"
    cp "$dir/cmd/pulumi-resource-kubernetes/main.go" "$WORK/prov/main.go"
    chmod u+w "$WORK/prov/main.go"
    python3 - "$dir/cmd/pulumi-resource-kubernetes" "$WORK/prov" "$PULUMI_KUBERNETES_VERSION" <<'EOF'
import json, sys
src, dst, version = sys.argv[1:]
with open(f"{src}/schema.json", encoding="utf-8") as f:
    schema = json.load(f)
schema["version"] = version
with open(f"{dst}/schema-embed.json", "w", encoding="utf-8") as f:
    json.dump(schema, f, separators=(",", ":"))
with open(f"{src}/terraform-mapping.json", encoding="utf-8") as f:
    mapping = json.load(f)
with open(f"{dst}/terraform-mapping-embed.json", "w", encoding="utf-8") as f:
    json.dump(mapping, f, separators=(",", ":"))
EOF
    step "building pulumi-resource-kubernetes $PULUMI_KUBERNETES_VERSION" "$WORK/prov.log" gobuild "$WORK/prov" \
        "$WORK/out/pulumi-resource-kubernetes" "-X $PROVIDER_MOD/pkg/version.Version=$PULUMI_KUBERNETES_VERSION" . \
        || die "building the provider plugin failed (log above)"
    record pulumi-resource-kubernetes
}

cmd_build() {
    local want_cluster=0 want_provider=0 what check=0
    if [ "${1:-}" = --check ]; then
        check=1
        shift
    fi
    [ "$#" -gt 0 ] || set -- cluster provider
    for what in "$@"; do
        case "$what" in
            cluster) want_cluster=1 ;;
            provider) want_provider=1 ;;
            *) die "build: unknown part '$what' (cluster or provider)" ;;
        esac
    done
    all_built() {
        local name
        if [ "$want_cluster" = 1 ]; then
            for name in etcd "${KUBE_BINS[@]}"; do built "$name" || return 1; done
        fi
        if [ "$want_provider" = 1 ]; then built pulumi-resource-kubernetes || return 1; fi
    }
    if all_built; then
        log "cached: $* in $BIN_DIR"
        printf '%s\n' "$BIN_DIR"
        return 0
    fi
    [ "$check" = 0 ] || { log "not built: $*"; return 1; }
    command -v go >/dev/null 2>&1 || die "'go' is not on PATH: it builds the cluster's binaries from the Go module proxy"
    mkdir -p "$BIN_DIR"
    exec 9>"$KUBE_DIR/.build.lock"
    if ! flock -n 9; then
        log "another build is running; waiting for it"
        flock 9
    fi
    if all_built; then
        log "cached: $* in $BIN_DIR"
        printf '%s\n' "$BIN_DIR"
        return 0
    fi
    if [ -n "${ALE_IAC_GOCACHE:-}" ]; then
        export GOMODCACHE="$ALE_IAC_GOCACHE/mod" GOCACHE="$ALE_IAC_GOCACHE/build"
    fi
    export CGO_ENABLED=0 GOTOOLCHAIN=local GOFLAGS="${GOFLAGS:-}"
    WORK="$(mktemp -d "${TMPDIR:-/tmp}/ale-iac-kube-build.XXXXXX")"
    mkdir -p "$WORK/out"
    local t0=$SECONDS
    [ "$want_cluster" = 1 ] && { build_etcd; build_kube; }
    [ "$want_provider" = 1 ] && build_provider
    log "built $* in $BIN_DIR ($((SECONDS - t0)) s)"
    printf '%s\n' "$BIN_DIR"
}

# --------------------------------------------------------------------------------------------- cluster

# Private ports and names: none of them is a default of etcd, Kubernetes or containerd, so a cluster or a
# containerd the user runs is never met. Every listener is on 127.0.0.1 or NODE_IP (below), nothing on 0.0.0.0.
ETCD_PORT="${ALE_IAC_KUBE_ETCD_PORT:-23790}"
ETCD_PEER_PORT="${ALE_IAC_KUBE_ETCD_PEER_PORT:-23800}"
API_PORT="${ALE_IAC_KUBE_API_PORT:-26443}"
CM_PORT="${ALE_IAC_KUBE_CM_PORT:-20257}"
SCHED_PORT="${ALE_IAC_KUBE_SCHED_PORT:-20259}"
KUBELET_PORT="${ALE_IAC_KUBE_KUBELET_PORT:-20250}"
KUBELET_HEALTH_PORT="${ALE_IAC_KUBE_KUBELET_HEALTH_PORT:-20248}"
# The node's own device (a dummy interface, or a bridge without ports where the kernel lacks the dummy
# driver: both only carry local addresses) and the pods' bridge, from 198.18.0.0/15 (RFC 2544, benchmarking:
# routed nowhere). The pods' bridge gets no address: pods have no route off it, to the host or beyond.
NODE_DEV="alekube-node"
NODE_IP="${ALE_IAC_KUBE_NODE_IP:-198.18.0.1}"
POD_BRIDGE="alekube-pods"
POD_CIDR="${ALE_IAC_KUBE_POD_CIDR:-198.18.16.0/24}"
SERVICE_CIDR="${ALE_IAC_KUBE_SERVICE_CIDR:-198.18.32.0/24}"
NODE_NAME="ale-iac-node"
PAUSE_IMAGE="ale-iac.local/pause:1"
COMPONENTS=(containerd etcd kube-apiserver kube-controller-manager kube-scheduler kubelet)
KUBECONFIG_FILE="$STATE/admin.kubeconfig"
SECCOMP_PROFILE="ale-iac/sandbox.json"
# The kubelet's cgroups (kubepods and below) go under this root in every hierarchy, never beside a user's kubelet's.
CGROUP_ROOT="ale-iac-kube"
POD_PIDS_LIMIT=1024 # the kubelet's podPidsLimit: every pod's task limit (the isolation suite checks it)
KUBELET_DISK_GB="${ALE_IAC_KUBE_KUBELET_DISK_GB:-32}" # the kubelet's own file system (kubelet_root_mount), sparse

cgroup_dirs() { # the cgroup root's folder in each mounted hierarchy (v1: one per controller; v2: one)
    local m
    awk '$3 == "cgroup" || $3 == "cgroup2" { print $2 }' /proc/self/mounts | while read -r m; do
        echo "$m/$CGROUP_ROOT"
    done
}

need_root() { [ "$(id -u)" = 0 ] || die "$1 needs root (network devices, containerd, the kubelet)"; }

pidfile() { echo "$STATE/run/$1.pid"; }
recorded_pid() { # recorded_pid NAME: the PID launch recorded for it (fails when there is none)
    local pid
    pid="$(cat "$(pidfile "$1")" 2>/dev/null)" && [ -n "$pid" ] && echo "$pid"
}
alive() { # alive NAME: its recorded process runs
    local pid
    pid="$(recorded_pid "$1")" && kill -0 "$pid" 2>/dev/null
}

# launch NAME CMD...: start CMD in a session of its own, its output in $STATE/log/NAME.log, its PID recorded.
launch() {
    local name="$1"
    shift
    setsid "$@" >"$STATE/log/$name.log" 2>&1 </dev/null &
    echo "$!" >"$(pidfile "$name")"
}

# wait_for DESC SECONDS CMD...: poll CMD (every 0.2 s) until it succeeds; die with the logs after SECONDS.
wait_for() {
    local desc="$1" limit="$2" start=$SECONDS f
    shift 2
    until "$@" >/dev/null 2>&1; do
        if [ $((SECONDS - start)) -ge "$limit" ]; then
            for f in "$STATE"/log/*.log; do
                [ -f "$f" ] && { echo "--- $f" >&2; tail -n 15 "$f" >&2; }
            done
            die "$desc: not ready after $limit s (logs above; scripts/kube-cluster.sh stop cleans up)"
        fi
        sleep 0.2
    done
}

cert() { # cert NAME CN [O] [SAN]: a key and a certificate signed by the cluster's CA
    local name="$1" cn="$2" org="${3:-}" san="${4:-}" subj="/CN=$2" d="$STATE/pki"
    [ -n "$org" ] && subj="/O=$org/CN=$cn"
    openssl genrsa -out "$d/$name.key" 2048 2>/dev/null
    openssl req -new -key "$d/$name.key" -subj "$subj" -out "$d/$name.csr" 2>/dev/null
    {
        echo "basicConstraints=CA:FALSE"
        echo "keyUsage=critical,digitalSignature,keyEncipherment"
        if [ -n "$san" ]; then
            echo "extendedKeyUsage=serverAuth,clientAuth"
            echo "subjectAltName=$san"
        else
            echo "extendedKeyUsage=clientAuth"
        fi
    } >"$d/$name.ext"
    openssl x509 -req -in "$d/$name.csr" -CA "$d/ca.crt" -CAkey "$d/ca.key" -CAcreateserial -days 30 \
        -extfile "$d/$name.ext" -out "$d/$name.crt" 2>/dev/null
    rm -f "$d/$name.csr" "$d/$name.ext"
    chmod 0600 "$d/$name.key"
}

kubeconfig() { # kubeconfig FILE CERT_NAME
    cat >"$1" <<EOF
apiVersion: v1
kind: Config
clusters:
- name: ale-iac-kube
  cluster:
    server: https://127.0.0.1:$API_PORT
    certificate-authority: $STATE/pki/ca.crt
users:
- name: $2
  user:
    client-certificate: $STATE/pki/$2.crt
    client-key: $STATE/pki/$2.key
contexts:
- name: ale-iac-kube
  context: {cluster: ale-iac-kube, user: $2}
current-context: ale-iac-kube
EOF
    chmod 0600 "$1"
}

make_pki() {
    local d="$STATE/pki" who
    mkdir -p "$d"
    chmod 0700 "$d"
    openssl genrsa -out "$d/ca.key" 2048 2>/dev/null
    openssl req -x509 -new -key "$d/ca.key" -subj "/CN=ale-iac-kube-ca" -days 30 -out "$d/ca.crt" 2>/dev/null
    cert apiserver kube-apiserver "" \
        "IP:127.0.0.1,DNS:localhost,DNS:kubernetes,DNS:kubernetes.default,DNS:kubernetes.default.svc,IP:${SERVICE_CIDR%.*}.1"
    cert admin ale-iac-admin system:masters
    cert apiserver-kubelet kube-apiserver-kubelet-client system:masters
    cert controller-manager system:kube-controller-manager
    cert scheduler system:kube-scheduler
    cert kubelet "system:node:$NODE_NAME" system:nodes
    openssl genrsa -out "$d/sa.key" 2048 2>/dev/null
    openssl rsa -in "$d/sa.key" -pubout -out "$d/sa.pub" 2>/dev/null
    chmod 0600 "$d/sa.key"
    for who in admin controller-manager scheduler kubelet; do kubeconfig "$STATE/$who.kubeconfig" "$who"; done
}

make_network() {
    ip link show "$NODE_DEV" >/dev/null 2>&1 && ip link del "$NODE_DEV"
    ip link add "$NODE_DEV" type dummy 2>/dev/null || ip link add "$NODE_DEV" type bridge
    ip addr add "$NODE_IP/32" dev "$NODE_DEV"
    ip link set "$NODE_DEV" up
    mkdir -p "$STATE/cni/net.d" "$STATE/cni/ipam"
    cat >"$STATE/cni/net.d/10-ale-iac.conflist" <<EOF
{
  "cniVersion": "0.4.0",
  "name": "ale-iac-pods",
  "plugins": [
    {"type": "bridge", "bridge": "$POD_BRIDGE", "isGateway": false, "ipMasq": false, "hairpinMode": false,
     "ipam": {"type": "host-local", "dataDir": "$STATE/cni/ipam", "ranges": [[{"subnet": "$POD_CIDR"}]], "routes": []}}
  ]
}
EOF
}

containerd_config() {
    local c="$STATE/containerd"
    mkdir -p "$c/root" "$c/state"
    cat >"$c/config.toml" <<EOF
version = 2
root = "$c/root"
state = "$c/state"
disabled_plugins = ["io.containerd.snapshotter.v1.btrfs", "io.containerd.snapshotter.v1.zfs", "io.containerd.snapshotter.v1.devmapper", "io.containerd.snapshotter.v1.aufs"]
[grpc]
  address = "$c/containerd.sock"
[ttrpc]
  address = "$c/containerd.sock.ttrpc"
[debug]
  address = ""
[metrics]
  address = ""
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "$PAUSE_IMAGE"
  restrict_oom_score_adj = true
  netns_mounts_under_state_dir = true
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"
  enable_selinux = false
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "/usr/lib/cni"
    conf_dir = "$STATE/cni/net.d"
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        SystemdCgroup = false
        Root = "$c/runc"
EOF
}

kubelet_config() {
    local d
    mkdir -p "$STATE/kubelet/seccomp/ale-iac" "$STATE/pod-logs"
    for d in $(cgroup_dirs); do mkdir -p "$d" 2>/dev/null || true; done
    : >"$STATE/resolv.conf" # pods resolve nothing through the host's resolver
    cat >"$STATE/kubelet.yaml" <<EOF
apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
address: $NODE_IP
port: $KUBELET_PORT
readOnlyPort: 0
healthzBindAddress: 127.0.0.1
healthzPort: $KUBELET_HEALTH_PORT
authentication:
  anonymous: {enabled: false}
  webhook: {enabled: false}
  x509: {clientCAFile: $STATE/pki/ca.crt}
authorization: {mode: AlwaysAllow}
cgroupDriver: cgroupfs
cgroupRoot: /$CGROUP_ROOT
podLogsDir: $STATE/pod-logs
failCgroupV1: false
failSwapOn: false
resolvConf: $STATE/resolv.conf
clusterDomain: cluster.local
serializeImagePulls: false
imageGCHighThresholdPercent: 99
imageGCLowThresholdPercent: 98
evictionHard: {memory.available: "100Mi", nodefs.available: "1%", imagefs.available: "1%"}
maxPods: 110
podPidsLimit: $POD_PIDS_LIMIT
EOF
}

# The kubelet's root folder (pods' emptyDir volumes, projected secrets, /etc/hosts) is a file system of its own:
# a sparse ext4 image of KUBELET_DISK_GB mounted nosuid,nodev. A bind of a subfolder keeps its source mount's
# flags, so every volume a pod gets is nosuid and nodev inside, and a setuid file a pod's root plants there runs
# setuid nowhere; a pod's mountinfo names paths inside that file system only, none of the host's; and the pods'
# volumes together can fill it, not the host's disk.
kubelet_root_mount() {
    truncate -s "${KUBELET_DISK_GB}G" "$STATE/kubelet.img"
    mkfs.ext4 -q -F -m 0 -E lazy_itable_init=1,lazy_journal_init=1 "$STATE/kubelet.img"
    mkdir -p "$STATE/kubelet"
    mount -o loop,nosuid,nodev "$STATE/kubelet.img" "$STATE/kubelet"
}

ctr_() { ctr --address "$STATE/containerd/containerd.sock" "$@"; }

# The pod sandbox's image: busybox's sleep (killed, not signalled, when a pod stops), packed as an OCI archive.
pause_image() {
    local dir="$STATE/pause"
    mkdir -p "$dir/rootfs/bin"
    cp /bin/busybox "$dir/rootfs/bin/busybox"
    PYTHONPATH="$ROOT_DIR" python3 -m ale_iac.oci_archive --rootfs "$dir/rootfs" --name "$PAUSE_IMAGE" \
        --entrypoint /bin/busybox --entrypoint sleep --entrypoint 2147483647 --out "$dir/pause.tar" >/dev/null
    ctr_ -n k8s.io images import "$dir/pause.tar" >/dev/null
    rm -rf "$dir"
}

seccomp_profile() { # the project's seccomp policy, where the kubelet's Localhost profiles are
    local py="${ALE_IAC_PYTHON:-python3}"
    [ -x "$ROOT_DIR/.venv/bin/python" ] && py="$ROOT_DIR/.venv/bin/python"
    SECCOMP_OUT="$STATE/kubelet/seccomp/$SECCOMP_PROFILE" PYTHONPATH="$ROOT_DIR" "$py" -c \
        'import json, os; from ale_iac.substrates.seccomp import docker_profile; open(os.environ["SECCOMP_OUT"], "w").write(json.dumps(docker_profile()))' \
        2>/dev/null || log "no seccomp profile installed (ale_iac.substrates.seccomp did not load): units get RuntimeDefault"
}

start_control_plane() {
    launch etcd "$BIN_DIR/etcd" --name ale-iac --data-dir "$STATE/etcd" \
        --listen-client-urls "http://127.0.0.1:$ETCD_PORT" --advertise-client-urls "http://127.0.0.1:$ETCD_PORT" \
        --listen-peer-urls "http://127.0.0.1:$ETCD_PEER_PORT" \
        --initial-advertise-peer-urls "http://127.0.0.1:$ETCD_PEER_PORT" \
        --initial-cluster "ale-iac=http://127.0.0.1:$ETCD_PEER_PORT" --log-level warn
    wait_for etcd 30 curl -sf "http://127.0.0.1:$ETCD_PORT/health"
    local p="$STATE/pki"
    launch kube-apiserver "$BIN_DIR/kube-apiserver" --etcd-servers "http://127.0.0.1:$ETCD_PORT" \
        --bind-address 127.0.0.1 --advertise-address 127.0.0.1 --secure-port "$API_PORT" \
        --endpoint-reconciler-type none --service-cluster-ip-range "$SERVICE_CIDR" \
        --tls-cert-file "$p/apiserver.crt" --tls-private-key-file "$p/apiserver.key" --client-ca-file "$p/ca.crt" \
        --kubelet-client-certificate "$p/apiserver-kubelet.crt" --kubelet-client-key "$p/apiserver-kubelet.key" \
        --kubelet-preferred-address-types InternalIP \
        --service-account-issuer https://kubernetes.default.svc --service-account-key-file "$p/sa.pub" \
        --service-account-signing-key-file "$p/sa.key" --authorization-mode Node,RBAC \
        --enable-admission-plugins NodeRestriction --allow-privileged=false --profiling=false
    wait_for kube-apiserver 180 kubectl_ get --raw /readyz
    local cm="$STATE/controller-manager.kubeconfig" sc="$STATE/scheduler.kubeconfig"
    launch kube-controller-manager "$BIN_DIR/kube-controller-manager" --kubeconfig "$cm" \
        --authentication-kubeconfig "$cm" --authorization-kubeconfig "$cm" \
        --bind-address 127.0.0.1 --secure-port "$CM_PORT" --service-account-private-key-file "$p/sa.key" \
        --root-ca-file "$p/ca.crt" --use-service-account-credentials=true --leader-elect=false --profiling=false
    launch kube-scheduler "$BIN_DIR/kube-scheduler" --kubeconfig "$sc" \
        --authentication-kubeconfig "$sc" --authorization-kubeconfig "$sc" \
        --bind-address 127.0.0.1 --secure-port "$SCHED_PORT" --leader-elect=false --profiling=false
}

kubectl_() { "$BIN_DIR/kubectl" --kubeconfig "$KUBECONFIG_FILE" "$@"; }

node_ready() {
    [ "$(kubectl_ get node "$NODE_NAME" -o 'jsonpath={.status.conditions[?(@.type=="Ready")].status}' 2>/dev/null)" = True ]
}

cmd_start() {
    need_root start
    if cmd_status >/dev/null 2>&1; then
        log "already running"
        printf '%s\n' "$KUBECONFIG_FILE"
        return 0
    fi
    local f
    for f in containerd runc ctr openssl curl mkfs.ext4 /bin/busybox /usr/lib/cni/bridge /usr/lib/cni/host-local; do
        command -v "$f" >/dev/null 2>&1 || die "missing $f (Debian: containerd runc busybox-static openssl curl e2fsprogs containernetworking-plugins)"
    done
    for f in etcd "${KUBE_BINS[@]}"; do built "$f" || die "no $f in $BIN_DIR: run scripts/kube-cluster.sh build cluster"; done
    [ -e "$STATE" ] && cmd_stop
    local t0=$SECONDS
    mkdir -p "$STATE/run" "$STATE/log" "$STATE/etcd"
    chmod 0700 "$STATE" "$STATE/etcd"
    make_pki
    make_network
    containerd_config
    kubelet_root_mount
    kubelet_config
    seccomp_profile
    launch containerd containerd --config "$STATE/containerd/config.toml"
    wait_for containerd 30 ctr_ version
    pause_image
    start_control_plane
    launch kubelet "$BIN_DIR/kubelet" --config "$STATE/kubelet.yaml" --kubeconfig "$STATE/kubelet.kubeconfig" \
        --root-dir "$STATE/kubelet" --cert-dir "$STATE/kubelet/pki" --node-ip "$NODE_IP" \
        --hostname-override "$NODE_NAME" --container-runtime-endpoint "unix://$STATE/containerd/containerd.sock"
    wait_for "the node" 120 node_ready
    wait_for "the default service account" 60 kubectl_ get serviceaccount default -n default
    log "cluster up in $((SECONDS - t0)) s: API server https://127.0.0.1:$API_PORT, node $NODE_NAME ($NODE_IP), state in $STATE"
    printf '%s\n' "$KUBECONFIG_FILE"
}

any_alive() { # any_alive NAME...: whether one of their recorded processes still runs
    local name
    for name in "$@"; do
        alive "$name" && return 0
    done
    return 1
}

# stop_all NAME...: TERM the recorded processes and their sessions (launch used setsid) all at once, then KILL
# what is left after 10 s. Together: each takes 1.5 to 3 s to shut down on TERM, and one after the other the six
# took 13 s of every stop (the state they would keep is deleted next).
stop_all() {
    local name pid i
    for name in "$@"; do
        pid="$(recorded_pid "$name")" || continue
        kill -TERM -- "-$pid" 2>/dev/null || kill -TERM "$pid" 2>/dev/null || true
    done
    for i in $(seq 100); do
        any_alive "$@" || break
        sleep 0.1
    done
    for name in "$@"; do
        pid="$(recorded_pid "$name")" && { kill -KILL -- "-$pid" 2>/dev/null || true; }
        rm -f "$(pidfile "$name")"
    done
}

# The processes of this cluster's pods: containerd's shims run in sessions of their own, and each one
# names this state dir in its command line (its containerd's socket).
shim_pids() {
    local pid
    for pid in $(pgrep -f containerd-shim || true); do
        tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null | grep -qF -- "$STATE/containerd" && echo "$pid"
    done
    return 0
}

cmd_stop() {
    need_root stop
    local t0=$SECONDS id pid m
    if [ -d "$STATE" ]; then
        stop_all kubelet # first: it would restart what is stopped under it
        if alive containerd; then
            for id in $(ctr_ -n k8s.io tasks ls -q 2>/dev/null || true); do
                ctr_ -n k8s.io tasks kill -s SIGKILL "$id" >/dev/null 2>&1 || true
            done
        fi
        # The API server before etcd: stopped together, etcd waits for the API server's streams and the API
        # server for etcd, until the KILL 10 s later.
        stop_all kube-scheduler kube-controller-manager kube-apiserver
        stop_all etcd containerd
        stop_all "${COMPONENTS[@]}" # any other (those stopped above have no pid file left)
        for pid in $(shim_pids); do
            # the shim's children (the pods' processes) first, then the shim
            pkill -KILL -P "$pid" 2>/dev/null || true
            kill -KILL "$pid" 2>/dev/null || true
        done
        # Mounts under the state dir (kubelet volumes, containerd's snapshots and shm, the pods' network
        # namespaces: netns_mounts_under_state_dir), deepest first.
        awk -v s="$STATE/" 'index($2, s) == 1 { print $2 }' /proc/self/mounts | sort -r | while read -r m; do
            umount -l "$m" 2>/dev/null || true
        done
    fi
    # The kubelet's links in /var/log/containers (a path it does not let us move) into this cluster's pod logs.
    for m in /var/log/containers/*.log; do
        [ -L "$m" ] && case "$(readlink "$m")" in "$STATE"/*) rm -f "$m" ;; esac
    done
    # The cgroups of this cluster's pods, deepest first (their processes are gone).
    for m in $(cgroup_dirs); do
        [ -d "$m" ] && find "$m" -depth -type d -exec rmdir {} + 2>/dev/null || true
    done
    ip link del "$POD_BRIDGE" 2>/dev/null || true
    ip link del "$NODE_DEV" 2>/dev/null || true
    rm -rf "$STATE"
    log "stopped; removed $STATE and the network devices ($((SECONDS - t0)) s)"
}

cmd_status() {
    local name
    [ -f "$KUBECONFIG_FILE" ] || { echo "not running (no $KUBECONFIG_FILE)"; return 1; }
    for name in "${COMPONENTS[@]}"; do
        alive "$name" || { echo "not running: $name is not"; return 1; }
    done
    kubectl_ get --raw /readyz >/dev/null 2>&1 || { echo "the API server is not ready"; return 1; }
    node_ready || { echo "node $NODE_NAME is not ready"; return 1; }
    printf '%s\n' "$KUBECONFIG_FILE"
}

# load ARCHIVE...: import OCI archives (`ale-iac images build desktop --export oci`) into the node's containerd,
# where pods of `imagePullPolicy: Never` find them. Idempotent: an image already there is imported again in
# seconds (its layer is content-addressed).
cmd_load() {
    need_root load
    [ "$#" -gt 0 ] || die "load: name an OCI archive (ale-iac images build desktop --export oci prints one)"
    alive containerd || die "the cluster is not running (scripts/kube-cluster.sh start)"
    local archive t0=$SECONDS
    for archive in "$@"; do
        [ -f "$archive" ] || die "load: no file $archive"
        ctr_ -n k8s.io images import "$archive" >&2 || die "ctr images import $archive failed"
    done
    log "imported $* into the node's containerd ($((SECONDS - t0)) s)"
}

cmd_env() {
    printf 'KUBECONFIG=%q\n' "$KUBECONFIG_FILE"
    printf 'ALE_IAC_KUBE_BIN=%q\n' "$BIN_DIR"
    printf 'ALE_IAC_KUBE_CONTAINERD=%q\n' "$STATE/containerd/containerd.sock"
    printf 'ALE_IAC_KUBE_SECCOMP=%q\n' "$SECCOMP_PROFILE"
}

# ---------------------------------------------------------------------------------------------- main

usage() { sed -n '2,11p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//' >&2; exit 2; }
[ "$#" -ge 1 ] || usage
cmd="$1"
shift
case "$cmd" in
    build) cmd_build "$@" ;;
    start) cmd_start ;;
    stop) cmd_stop ;;
    status) cmd_status ;;
    load) cmd_load "$@" ;;
    env) cmd_env ;;
    *) usage ;;
esac
