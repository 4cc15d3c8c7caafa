# steps.sh: sourced by the build scripts (build-pulumi.sh, kube-cluster.sh) for their timed steps.
#
#   STEP_PREFIX=build-pulumi; . "$ROOT_DIR/scripts/steps.sh"
#   step "building the CLI" "$WORK/cli.log" go build ...
#
# step DESCRIPTION LOGFILE CMD...: run CMD with its output in LOGFILE and report the time it took on stderr
# ("[<prefix>] DESCRIPTION ... done (N s)"). Returns CMD's status; on failure the log's tail goes to stderr.
step() {
    local desc="$1" logfile="$2" start=$SECONDS rc=0
    shift 2
    printf '[%s] %s ... ' "$STEP_PREFIX" "$desc" >&2
    "$@" >"$logfile" 2>&1 || rc=$?
    if [ "$rc" -eq 0 ]; then
        printf 'done (%d s)\n' "$((SECONDS - start))" >&2
    else
        printf 'FAILED (%d s, exit %d)\n' "$((SECONDS - start))" "$rc" >&2
        tail -n 30 "$logfile" | sed 's/^/    /' >&2
    fi
    return "$rc"
}
