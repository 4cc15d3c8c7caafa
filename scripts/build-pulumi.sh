#!/usr/bin/env bash
# build-pulumi.sh: make the real Pulumi toolchain (CLI, Python language host,
# dynamic-provider launcher) available, building it from the Go module proxy
# when no suitable `pulumi` is installed.
#
#   bin_dir="$(scripts/build-pulumi.sh)" && export PATH="$bin_dir:$PATH"
#
# stdout: exactly one line, the absolute bin dir. All progress goes to stderr.
# Idempotent and safe to rerun: a complete cached build returns in well under a
# second, and concurrent runs are serialised with flock.
#
# Versions: PULUMI_VERSION, PULUMI_MIN_VERSION and GO_MIN_VERSION come from versions.env at the
# root of the checkout (also read by ale_iac/toolchain.py).
#
# Environment:
#   ALE_IAC_PULUMI_VERSION       Pulumi version to build (default: PULUMI_VERSION of versions.env)
#   ALE_IAC_CACHE                cache root (default ${XDG_CACHE_HOME:-~/.cache}/ale-iac)
#   ALE_IAC_FORCE_PULUMI_BUILD=1 ignore a `pulumi` on PATH and any cached build
#   ALE_IAC_GOCACHE              if set, use $ALE_IAC_GOCACHE/{mod,build} as GOMODCACHE
#                                and GOCACHE instead of Go's defaults
#   ALE_IAC_PULUMI_COMMIT        git commit of the pkg/v3.$VERSION tag, for when the
#                                module proxy does not report it (language host build)
#   ALE_IAC_LANGUAGE_HOST_PYTHON interpreter for the Python stand-in language host (see
#                                below): a path (e.g. <repo>/.venv/bin/python) or a command
#                                name, and it needs the `pulumi` and `grpcio` packages.
#                                Unset: keep the interpreter of an installed stand-in, else
#                                `python3` from PATH.
#
# Language host: the Go `pulumi-language-python` is a module of its own that the module
# proxy may refuse to serve (403). Then ale-iac's Python implementation of the same gRPC
# service (ale_iac/langhost.py) stands in: its launcher scripts/pulumi-language-python is
# installed as bin/pulumi-language-python with its shebang pointed at
# ALE_IAC_LANGUAGE_HOST_PYTHON and this checkout's path and the CLI version filled in; every
# run (cached ones too) re-installs it when the rendered launcher differs from the installed
# one. The launcher imports ale_iac.langhost from this checkout, so edits to that module take
# effect without a reinstall.
#
# Why a wrapper module: `go install pkg@version` refuses modules whose go.mod has
# replace directives, and pkg/go.mod has some. So each binary is built from a
# throwaway module that requires pkg/v3 and sdk/v3 at the same tag and repeats
# the upstream go.mod's non-local replace lines (the local `../sdk`-style ones
# only make sense inside the pulumi/pulumi checkout and are dropped).
set -euo pipefail

ROOT_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VERSIONS_FILE="$ROOT_DIR/versions.env"
[ -f "$VERSIONS_FILE" ] || { printf '[build-pulumi] ERROR: no %s\n' "$VERSIONS_FILE" >&2; exit 1; }
# The pins: PULUMI_VERSION (the CLI to build), PULUMI_MIN_VERSION (the oldest CLI accepted from
# PATH) and GO_MIN_VERSION (only quoted in the "install Go" message).
# shellcheck source=../versions.env
. "$VERSIONS_FILE"
for pin in PULUMI_VERSION PULUMI_MIN_VERSION GO_MIN_VERSION; do
    [ -n "${!pin:-}" ] || { printf '[build-pulumi] ERROR: %s sets no %s\n' "$VERSIONS_FILE" "$pin" >&2; exit 1; }
done
PULUMI_VERSION="${ALE_IAC_PULUMI_VERSION:-$PULUMI_VERSION}"
PULUMI_VERSION="${PULUMI_VERSION#v}"

PKG_MOD="github.com/pulumi/pulumi/pkg/v3"
SDK_MOD="github.com/pulumi/pulumi/sdk/v3"
# Has its own go.mod and no tags of its own: reachable only as a pseudo-version.
HOST_MOD="github.com/pulumi/pulumi/sdk/python/cmd/pulumi-language-python/v3"
VERSION_VAR="$SDK_MOD/go/common/version.Version"

CACHE="${ALE_IAC_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/ale-iac}"
TOOLCHAIN_DIR="$CACHE/toolchain"
FINAL_DIR="$TOOLCHAIN_DIR/pulumi-v$PULUMI_VERSION"
BIN_DIR="$FINAL_DIR/bin"
# Written instead of the language host when it cannot be built, so that reruns
# stay fast; ALE_IAC_FORCE_PULUMI_BUILD=1 retries.
HOST_MISSING_NOTE="LANGUAGE_HOST_MISSING.txt"
# The Python stand-in for the Go language host: the launcher installed as
# bin/pulumi-language-python, and the module it runs.
PY_HOST_LAUNCHER="$ROOT_DIR/scripts/pulumi-language-python"
PY_HOST_MODULE="$ROOT_DIR/ale_iac/langhost.py"

log() { printf '[build-pulumi] %s\n' "$*" >&2; }
warn() { printf '[build-pulumi] WARNING: %s\n' "$*" >&2; }
die() { printf '[build-pulumi] ERROR: %s\n' "$*" >&2; exit 1; }

# version_ge A B: true if version A >= version B (leading "v" ignored).
version_ge() {
    [ "$(printf '%s\n%s\n' "${2#v}" "${1#v}" | sort -V | head -n1)" = "${2#v}" ]
}

# Temp dirs removed on any exit; filled in once created.
WORK=""
STAGE=""
PY_HOST_TMP=""
cleanup() {
    [ -n "$STAGE" ] && rm -rf "$STAGE"
    [ -n "$PY_HOST_TMP" ] && rm -f "$PY_HOST_TMP"
    # The wrapper modules hold nothing worth keeping (the module and build
    # caches live elsewhere).
    [ -n "$WORK" ] && rm -rf "$WORK"
    return 0
}
trap cleanup EXIT

STEP_PREFIX=build-pulumi
# shellcheck source=steps.sh
. "$ROOT_DIR/scripts/steps.sh"  # step DESCRIPTION LOGFILE CMD...

# cached_ok: the final dir holds a complete build of the pinned version.
cached_ok() {
    local f
    for f in pulumi pulumi-resource-pulumi-python; do
        [ -x "$BIN_DIR/$f" ] || return 1
    done
    [ -x "$BIN_DIR/pulumi-language-python" ] || [ -f "$FINAL_DIR/$HOST_MISSING_NOTE" ] || return 1
    [ "$("$BIN_DIR/pulumi" version 2>/dev/null)" = "v$PULUMI_VERSION" ]
}

# is_py_host FILE: FILE is the Python stand-in (a script), not a Go-built host (ELF).
is_py_host() { [ -f "$1" ] && [ "$(head -c 2 "$1")" = "#!" ]; }

# set_buildinfo DIR KEY=VALUE...: replace those keys in DIR/BUILDINFO (atomic rewrite), and drop
# the obsolete language_host_script_sha256 (of the host script that the launcher replaced).
set_buildinfo() {
    local dir="$1" kv keys="|language_host_script_sha256" tmp
    shift
    for kv in "$@"; do keys="$keys|${kv%%=*}"; done
    tmp="$(mktemp "$dir/.BUILDINFO.XXXXXX")"
    { grep -Ev "^(${keys#|})=" "$dir/BUILDINFO" 2>/dev/null || true; printf '%s\n' "$@"; } >"$tmp"
    chmod 0644 "$tmp"
    mv -f "$tmp" "$dir/BUILDINFO"
}

# py_str S: S as a Python string literal (for the constants of the launcher).
py_str() {
    local s="${1//\\/\\\\}"
    s="${s//\"/\\\"}"
    printf '"%s"' "$s"
}

# install_py_host DIR: install or refresh DIR/bin/pulumi-language-python, the launcher of
# ale_iac/langhost.py, unless DIR holds a Go-built host. A few ms when up to date.
install_py_host() {
    local dir="$1" dest="$1/bin/pulumi-language-python" py shebang
    if [ -e "$dest" ] && ! is_py_host "$dest"; then
        return 0
    fi
    if [ ! -f "$PY_HOST_LAUNCHER" ] || [ ! -f "$PY_HOST_MODULE" ]; then
        warn "no $PY_HOST_LAUNCHER or $PY_HOST_MODULE to install as the language host"
        return 0
    fi
    py="${ALE_IAC_LANGUAGE_HOST_PYTHON:-}"
    if [ -z "$py" ] && is_py_host "$dest"; then
        shebang="$(head -n 1 "$dest")" # keep the interpreter chosen by an earlier run
    else
        py="${py:-python3}"
        case "$py" in
            /*) shebang="#!$py" ;;
            # Relative path: make it absolute, but keep the last component unresolved (a
            # venv's bin/python is a symlink out of the venv).
            */*) shebang="#!$(cd "$(dirname "$py")" && pwd)/$(basename "$py")" ;;
            *) shebang="#!/usr/bin/env $py" ;;
        esac
    fi
    PY_HOST_TMP="$(mktemp "$dir/bin/.pulumi-language-python.XXXXXX")"
    {
        printf '%s\n' "$shebang"
        # ENVIRON, not -v: awk would interpret backslashes in -v values.
        ROOT_LITERAL="$(py_str "$ROOT_DIR")" VERSION_LITERAL="$(py_str "$PULUMI_VERSION")" awk '
            NR == 1 { next }
            /^ALE_IAC_ROOT = / { print "ALE_IAC_ROOT = " ENVIRON["ROOT_LITERAL"]; next }
            /^HOST_VERSION = / { print "HOST_VERSION = " ENVIRON["VERSION_LITERAL"]; next }
            { print }
        ' "$PY_HOST_LAUNCHER"
    } >"$PY_HOST_TMP"
    if cmp -s "$PY_HOST_TMP" "$dest"; then
        rm -f "$PY_HOST_TMP"
        PY_HOST_TMP=""
        return 0
    fi
    chmod 0755 "$PY_HOST_TMP"
    # ${shebang#\#!} is unquoted on purpose: "/usr/bin/env python3" is two words.
    # shellcheck disable=SC2086
    if ! ${shebang#\#!} -c 'import importlib.util as u, sys; sys.path.insert(0, sys.argv[1]); sys.exit(not all(u.find_spec(m) for m in ("grpc", "pulumi", "google.protobuf", "ale_iac.langhost")))' "$ROOT_DIR" 2>/dev/null; then
        warn "${shebang#\#!} lacks the pulumi or grpcio package (or does not run): the language host will not start." \
            "Rerun with ALE_IAC_LANGUAGE_HOST_PYTHON=<venv>/bin/python (./scripts/setup.sh does)."
    fi
    mv -f "$PY_HOST_TMP" "$dest"
    PY_HOST_TMP=""
    set_buildinfo "$dir" "language_host=python-stand-in" \
        "language_host_launcher_sha256=$(sha256sum "$dest" | cut -c1-16)" \
        "language_host_module=$PY_HOST_MODULE" \
        "language_host_python=${shebang#\#!}"
    log "installed $PY_HOST_LAUNCHER as bin/pulumi-language-python (runs $PY_HOST_MODULE on ${shebang#\#!})"
}

report_cached() {
    log "cached: pulumi v$PULUMI_VERSION in $BIN_DIR"
    install_py_host "$FINAL_DIR"
    if is_py_host "$BIN_DIR/pulumi-language-python"; then
        log "language host: the Python stand-in ($(head -n 1 "$BIN_DIR/pulumi-language-python"))"
    elif [ ! -x "$BIN_DIR/pulumi-language-python" ]; then
        warn "no pulumi-language-python in the cache (see $FINAL_DIR/$HOST_MISSING_NOTE):" \
            "Python *project* runs need it; Automation API inline programs do not." \
            "Rerun with ALE_IAC_FORCE_PULUMI_BUILD=1 to retry."
    fi
    printf '%s\n' "$BIN_DIR"
}

FORCE="${ALE_IAC_FORCE_PULUMI_BUILD:-0}"
[ "$FORCE" = 1 ] || FORCE=0

# --- 1. A complete cached build: nothing to do. ------------------------------
if [ "$FORCE" = 0 ] && cached_ok; then
    report_cached
    exit 0
fi

# --- 2. A suitable pulumi already installed (not ours): use it. --------------
if [ "$FORCE" = 0 ] && command -v pulumi >/dev/null 2>&1; then
    sys_pulumi="$(readlink -f "$(command -v pulumi)")"
    sys_dir="$(dirname "$sys_pulumi")"
    case "$sys_dir/" in
        "$TOOLCHAIN_DIR"/*) ;; # one of our own builds (other version): ignore
        *)
            sys_ver="$("$sys_pulumi" version 2>/dev/null | head -n1 || true)"
            if [[ "$sys_ver" =~ ^v?[0-9]+\.[0-9]+\.[0-9]+ ]] && version_ge "$sys_ver" "$PULUMI_MIN_VERSION" \
                && [ -x "$sys_dir/pulumi-language-python" ] \
                && [ -x "$sys_dir/pulumi-resource-pulumi-python" ]; then
                log "using installed pulumi $sys_ver at $sys_pulumi (ALE_IAC_FORCE_PULUMI_BUILD=1 builds instead)"
                printf '%s\n' "$sys_dir"
                exit 0
            fi
            log "ignoring installed pulumi at $sys_pulumi (version '${sys_ver:-?}'; need >= $PULUMI_MIN_VERSION" \
                "with pulumi-language-python and pulumi-resource-pulumi-python beside it)"
            ;;
    esac
fi

# --- 3. Go toolchain. ---------------------------------------------------------
no_toolchain() {
    die "no usable Pulumi toolchain: $1.
    Install either Go >= ${2:-$GO_MIN_VERSION} (https://go.dev/dl; put its bin/ on PATH) to let this
    script build Pulumi v$PULUMI_VERSION, or the Pulumi CLI >= $PULUMI_MIN_VERSION
    (https://www.pulumi.com/docs/install/) with pulumi-language-python and
    pulumi-resource-pulumi-python in the same directory as 'pulumi' on PATH.
    Then rerun: $0"
}
command -v go >/dev/null 2>&1 || no_toolchain "'go' is not on PATH and no suitable 'pulumi' is installed"

if [ -n "${ALE_IAC_GOCACHE:-}" ]; then
    export GOMODCACHE="$ALE_IAC_GOCACHE/mod" GOCACHE="$ALE_IAC_GOCACHE/build"
fi
# Static binaries, as in Pulumi's own releases; also means no C compiler needed.
export CGO_ENABLED=0
# Never let go silently fetch a different toolchain: we check the version below.
export GOTOOLCHAIN=local

mkdir -p "$TOOLCHAIN_DIR"
# Serialise concurrent runs for the same version; the winner's result is reused.
if command -v flock >/dev/null 2>&1; then
    exec 9>"$TOOLCHAIN_DIR/.pulumi-v$PULUMI_VERSION.lock"
    if ! flock -n 9; then
        log "another build of v$PULUMI_VERSION is running; waiting for it"
        flock 9
    fi
    if [ "$FORCE" = 0 ] && cached_ok; then
        report_cached
        exit 0
    fi
fi

WORK="$(mktemp -d "${TMPDIR:-/tmp}/ale-iac-pulumi-build.XXXXXX")"
# Staging dir next to the final one (same filesystem) so the final rename is atomic.
STAGE="$(mktemp -d "$TOOLCHAIN_DIR/.pulumi-v$PULUMI_VERSION.tmp.XXXXXX")"
mkdir -p "$STAGE/bin"
TOTAL_START=$SECONDS

# json_field FILE KEY: value of the first `"KEY": "value"` in go's JSON output.
json_field() {
    sed -n 's/^[[:space:]]*"'"$2"'":[[:space:]]*"\(.*\)",\{0,1\}$/\1/p' "$1" | head -n1
}

# nonlocal_replaces GOMOD: print `-replace=old[@v]=new@v` flags for go mod edit,
# one per line, for every replace in GOMOD whose target is a module (not a path).
nonlocal_replaces() {
    awk '
        function emit(line,    n, f, arrow, i, old, new) {
            n = split(line, f, /[[:space:]]+/)
            arrow = 0
            for (i = 1; i <= n; i++) if (f[i] == "=>") arrow = i
            if (arrow == 0) return
            old = f[1]; if (arrow == 3) old = old "@" f[2]
            # Local-path targets have no version after them.
            if (n - arrow != 2) return
            new = f[arrow + 1] "@" f[arrow + 2]
            print "-replace=" old "=" new
        }
        { sub(/\/\/.*/, ""); gsub(/^[[:space:]]+|[[:space:]]+$/, "") }
        inblock && $0 == ")" { inblock = 0; next }
        inblock && $0 != "" { emit($0); next }
        /^replace[[:space:]]*\($/ { inblock = 1; next }
        /^replace[[:space:]]/ { sub(/^replace[[:space:]]+/, ""); emit($0) }
    ' "$1"
}

# --- 4. Fetch pkg/v3 and sdk/v3 at the tag; check the Go version. -------------
# download_mod OUT_JSON MOD@VER...: `go mod download -json`; its errors are
# reported in the JSON on stdout, so show that JSON on failure.
download_mod() {
    local out="$1"
    shift
    (cd "$WORK" && go mod download -json "$@" >"$out") || { cat "$out"; return 1; }
}
download_pulumi() {
    download_mod "$WORK/pkg.json" "$PKG_MOD@v$PULUMI_VERSION" \
        && download_mod "$WORK/sdk.json" "$SDK_MOD@v$PULUMI_VERSION"
}
step "downloading $PKG_MOD and $SDK_MOD v$PULUMI_VERSION" "$WORK/download.log" download_pulumi \
    || die "cannot download Pulumi v$PULUMI_VERSION from the Go module proxy (see above); set ALE_IAC_PULUMI_VERSION to a served version"
PKG_GOMOD="$(json_field "$WORK/pkg.json" GoMod)"
PKG_INFO="$(json_field "$WORK/pkg.json" Info)"
SDK_DIR="$(json_field "$WORK/sdk.json" Dir)"
{ [ -f "$PKG_GOMOD" ] && [ -d "$SDK_DIR" ]; } || die "unexpected 'go mod download' output: $(cat "$WORK/pkg.json" "$WORK/sdk.json")"

GO_NEED="$(awk '$1 == "go" { print $2; exit }' "$PKG_GOMOD")"
GO_HAVE="$(go env GOVERSION)"
GO_HAVE="${GO_HAVE#go}"
if [ -n "$GO_NEED" ] && ! version_ge "${GO_HAVE%%[-+ ]*}" "$GO_NEED"; then
    no_toolchain "Go $GO_HAVE at $(command -v go) is older than the $GO_NEED that $PKG_MOD v$PULUMI_VERSION requires" "$GO_NEED"
fi
log "using Go $GO_HAVE ($(command -v go)); $PKG_MOD v$PULUMI_VERSION needs Go >= ${GO_NEED:-?}"

# make_wrapper DIR GOMOD REQUIRE...: throwaway module in DIR requiring the given
# module@versions, with GOMOD's non-local replace lines.
make_wrapper() {
    local dir="$1" gomod="$2" r
    shift 2
    mkdir -p "$dir"
    local -a args=()
    for r in "$@"; do args+=("-require=$r"); done
    while IFS= read -r r; do args+=("$r"); done < <(nonlocal_replaces "$gomod")
    (
        cd "$dir"
        go mod init ale-iac.invalid/pulumi-build >/dev/null 2>&1
        go mod edit "${args[@]}"
    )
    # Echo the replace lines, for the log and BUILDINFO.
    grep -E '^replace' "$dir/go.mod" || true
}

# go_build DIR OUT PKG: build PKG from wrapper module DIR with the release flags.
# -mod=mod lets go fill in go.sum and the rest of the graph (MVS over pkg/v3's
# own complete go.mod, so the versions match the upstream build).
go_build() {
    (
        cd "$1"
        go build -mod=mod -tags osusergo,grpcnotrace \
            -ldflags "-s -w -X $VERSION_VAR=v$PULUMI_VERSION" \
            -o "$2" "$3"
    )
}

# --- 5. The CLI. ---------------------------------------------------------------
CLI_REPLACES="$(make_wrapper "$WORK/cli" "$PKG_GOMOD" "$PKG_MOD@v$PULUMI_VERSION" "$SDK_MOD@v$PULUMI_VERSION")"
log "CLI wrapper replace lines: ${CLI_REPLACES:-(none)}"
# First run: downloads the whole dependency graph, ~5 min on 2 cores; later ~10 s.
step "building CLI v$PULUMI_VERSION" \
    "$WORK/cli-build.log" go_build "$WORK/cli" "$STAGE/bin/pulumi" "$PKG_MOD/cmd/pulumi" \
    || die "building the Pulumi CLI failed (log above); try another ALE_IAC_PULUMI_VERSION"
got="$("$STAGE/bin/pulumi" version 2>&1 || true)"
[ "$got" = "v$PULUMI_VERSION" ] || die "built CLI reports version '$got', expected v$PULUMI_VERSION"

# --- 6. Non-Go pieces shipped next to the CLI, from the sdk/v3 module tree. ----
# Release archives carry these beside `pulumi` (scripts/prep-for-goreleaser.sh).
copy_from_sdk() { # copy_from_sdk REL_PATH: returns 1 if absent
    [ -f "$SDK_DIR/$1" ] || return 1
    cp "$SDK_DIR/$1" "$STAGE/bin/$(basename "$1")"
    chmod 0755 "$STAGE/bin/$(basename "$1")" # module cache files are read-only
}
if ! copy_from_sdk python/dist/pulumi-resource-pulumi-python; then
    # Fallback only: the dynamic-provider plugin is just this launcher.
    warn "python/dist/pulumi-resource-pulumi-python not in $SDK_MOD v$PULUMI_VERSION; writing a minimal launcher"
    cat >"$STAGE/bin/pulumi-resource-pulumi-python" <<'EOF'
#!/bin/sh
# Minimal stand-in for Pulumi's launcher of Python dynamic providers.
if [ -n "${PULUMI_RUNTIME_VIRTUALENV:-}" ] && [ -x "${PULUMI_RUNTIME_VIRTUALENV%/}/bin/python" ]; then
    exec "${PULUMI_RUNTIME_VIRTUALENV%/}/bin/python" -u -m pulumi.dynamic "$@"
fi
exec "${PULUMI_PYTHON_CMD:-python3}" -u -m pulumi.dynamic "$@"
EOF
    chmod 0755 "$STAGE/bin/pulumi-resource-pulumi-python"
fi
copy_from_sdk python/cmd/pulumi-language-python-exec || true
copy_from_sdk python/dist/pulumi-analyzer-policy-python || true

# --- 7. The Python language host (best effort). --------------------------------
# Needed to run a Python *project* (`pulumi up` in a dir with Pulumi.yaml);
# Automation API inline programs run without it (the CLI talks to the Python
# process over --client).
HOST_ERR=""
build_host() {
    local commit="${ALE_IAC_PULUMI_COMMIT:-}" pseudo host_gomod
    if [ -z "$commit" ]; then
        # The proxy's .info carries Origin.Hash only when it fetched the tag itself.
        # (.info is one line of JSON, unlike `go mod download -json` output.)
        commit="$(grep -o '"Hash": *"[0-9a-f]*"' "$PKG_INFO" | head -n1 | sed 's/.*"\([0-9a-f]*\)"$/\1/' || true)"
    fi
    if [ -z "$commit" ]; then
        HOST_ERR="the module proxy gives no commit for tag pkg/v$PULUMI_VERSION ($PKG_INFO has no Origin.Hash); set ALE_IAC_PULUMI_COMMIT to that tag's git commit"
        return 1
    fi
    log "commit of tag pkg/v$PULUMI_VERSION: $commit"
    if ! step "resolving $HOST_MOD@${commit:0:12}" "$WORK/host-resolve.log" \
        download_mod "$WORK/host.json" "$HOST_MOD@$commit"; then
        HOST_ERR="$(sed -n 's/^[[:space:]]*"Error": "\(.*\)"$/\1/p' "$WORK/host-resolve.log" | head -n1)"
        [ -n "$HOST_ERR" ] || HOST_ERR="$(grep -v '^[[:space:]]*$' "$WORK/host-resolve.log" | tail -n 3)"
        return 1
    fi
    pseudo="$(json_field "$WORK/host.json" Version)"
    host_gomod="$(json_field "$WORK/host.json" GoMod)"
    local host_replaces
    host_replaces="$(make_wrapper "$WORK/host" "$host_gomod" "$HOST_MOD@$pseudo" \
        "$PKG_MOD@v$PULUMI_VERSION" "$SDK_MOD@v$PULUMI_VERSION")"
    log "language host $pseudo; wrapper replace lines: ${host_replaces:-(none)}"
    if ! step "building pulumi-language-python v$PULUMI_VERSION" "$WORK/host-build.log" \
        go_build "$WORK/host" "$STAGE/bin/pulumi-language-python" "$HOST_MOD"; then
        HOST_ERR="$(tail -n 5 "$WORK/host-build.log")"
        return 1
    fi
    HOST_VERSION="$pseudo"
}
HOST_VERSION=""
if ! build_host; then
    warn "could not build pulumi-language-python; installing the Python stand-in ($PY_HOST_LAUNCHER, running $PY_HOST_MODULE) instead."
    warn "cause: $HOST_ERR"
    {
        echo "pulumi-language-python could not be built for Pulumi v$PULUMI_VERSION on $(date -u +%FT%TZ)."
        echo "bin/pulumi-language-python is the Python stand-in instead: scripts/pulumi-language-python, which runs ale_iac/langhost.py."
        echo "Rerun with ALE_IAC_FORCE_PULUMI_BUILD=1 to retry (ALE_IAC_PULUMI_COMMIT=<commit of tag pkg/v$PULUMI_VERSION> may help)."
        echo
        echo "$HOST_ERR"
    } >"$STAGE/$HOST_MISSING_NOTE"
fi

# --- 8. Record what was built and move it into place. --------------------------
{
    echo "pulumi_version=v$PULUMI_VERSION"
    echo "go_version=$GO_HAVE"
    echo "built_at=$(date -u +%FT%TZ)"
    echo "language_host=${HOST_VERSION:-missing}"
    echo "cli_replaces=$(echo "$CLI_REPLACES" | tr '\n' ';')"
} >"$STAGE/BUILDINFO"
[ -n "$HOST_VERSION" ] || install_py_host "$STAGE"
chmod 0755 "$STAGE"

# Two renames: the old dir (if any, e.g. a forced rebuild) moves aside, the new
# one takes its name. Readers see either a complete old or a complete new dir,
# apart from a sub-millisecond window with none.
if [ -e "$FINAL_DIR" ]; then
    OLD="$(mktemp -d "$TOOLCHAIN_DIR/.pulumi-v$PULUMI_VERSION.old.XXXXXX")"
    mv -T "$FINAL_DIR" "$OLD/dir"
    mv -T "$STAGE" "$FINAL_DIR"
    rm -rf "$OLD"
else
    mv -T "$STAGE" "$FINAL_DIR"
fi
STAGE=""

log "installed pulumi v$PULUMI_VERSION in $BIN_DIR (total $((SECONDS - TOTAL_START)) s)"
printf '%s\n' "$BIN_DIR"
